"""The contract every aggregate definition must pass on the one runtime (issue 11, DUR-1, EXE-2).

One suite, parametrised over the definitions (the eventsourcing library's pattern): the Run
(services/lease_coordinator/processor.py), the Trajectory (services/saga_orchestrator/
processor.py), the Watchdog (services/watchdog/processor.py, WD-1..WD-5) and the Breaker
(services/breakers/processor.py, BRK-1, BRK-2) run on
services/common/aggregate. A new aggregate adds a `Case` below and gets the
whole suite. Each case supplies a command generator that looks at the current states (like the
aggregate's real clients do), so the streams mix accepted commands, refusals, redeliveries and,
for an aggregate with timers, timer work between batches. Asserted, for every definition:

  * replay equals incremental: each stored state is the fold of the committed events with the
    definition's own `evolve`, versions go 1, 2, 3 ... and the checkpoints follow the log (DUR-1);
  * restore equals rebuild: a fresh processor on an EMPTY store restored from the log holds the
    same store (states, indexes, refused ids, context), checkpoints aside;
  * a redelivered batch produces nothing new, to the same processor or a restored one, and a
    refused command stays refused after a restore;
  * a poison command is dead-lettered and refused, the batch goes on, a redelivery is not tried;
  * a failed commit leaves no state change, and a crash at any step of the commit path followed
    by redelivery to a new incarnation writes exactly what a crash-free run writes (all of the
    log, side outputs aside: those are at-least-once).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import random
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from services.breakers.processor import BreakerProcessor
from services.common.aggregate import AggregateProcessor
from services.common.clock import ManualClock
from services.common.contracts import (
    AbortTrajectory,
    AcknowledgeRollback,
    ConfigureWatchdog,
    FinishTrajectory,
    ObserveStep,
    ProposeStep,
    RecordCompensationOutcome,
    RecordLeaseRevocation,
    RecordPivotGate,
    RecordStepOutcome,
    ResolveIncident,
    StartTrajectory,
)
from services.common.eventlog import MemoryEventLog
from services.common.ids import action_hash, run_id_for
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec
from services.common.poison import COMMAND_FAILED
from services.common.routing import partition_for_endpoint, partition_for_run, partition_for_schedule
from services.common.store import MemoryStore
from services.common.topics import (
    BREAKERS_COMMANDS,
    DEADLETTER,
    PROGRESS_OBSERVATIONS,
    QUARANTINE_COMMANDS,
    RUNS_COMMANDS,
    SCHEDULES_COMMANDS,
    TRAJECTORIES_COMMANDS,
)
from services.lease_coordinator.domain import attempt_id_for
from services.lease_coordinator.processor import RunCommandProcessor
from services.quarantine.processor import QuarantineProcessor
from services.quarantine.routing import partition_for_aggregate
from services.saga_orchestrator.domain import (
    DispatchStep,
    EvaluateGate,
    RevokeLease,
    RunCompensator,
    pending_work,
)
from services.saga_orchestrator.processor import TrajectoryProcessor
from services.schedules.processor import ScheduleProcessor
from services.watchdog.processor import WatchdogProcessor
from tests.unit.breakers import support as breaker
from tests.unit.quarantine import contract_case as quarantine
from tests.unit.schedules import contract_case as schedule
from tests.unit.strategies import SPEC_TEXTS, cancel_command, submit_command
from tests.unit.test_lease_domain import claim_cmd, renew_cmd, report_cmd
from tests.unit.test_trajectory_decide import CATALOG, OUTPUTS, PARAMS

CODEC = MessageCodec()
PARTITIONS = 4
T0 = 1_767_225_600_000
SEEDS = (1, 2, 3)
Load = Callable[[str], Any]


@dataclass(frozen=True)
class Case:
    name: str
    commands_topic: str
    build: Callable[[Any, Any, ManualClock], AggregateProcessor[Any, Any, Any, Any]]
    commands: Callable[[random.Random, Load, int], list[Any]]
    fresh: Callable[[str], Any]  # a command creating a new aggregate (its key names it)
    # Command types the definition deduplicates by something else than their id, so that a
    # redelivery after they were accepted is refused (a second answer) instead of dropped. The
    # suite allows exactly that second refusal, nothing else: no event, no state change.
    answered_again: frozenset[str] = frozenset()
    # The partition a command's aggregate id routes to; None: a run id's (services.common.routing).
    route: Callable[[str], int] | None = None


# --- the Run -----------------------------------------------------------------------------------

RUN_SLOTS = tuple((tenant, f"r{i}") for tenant in ("acme", "globex", "initech") for i in range(3))
RUN_KINDS = ("submit",) * 3 + ("claim",) * 3 + ("renew",) * 4 + ("report", "cancel", "conflict")


def run_commands(rng: random.Random, load: Load, step: int) -> list[Any]:
    commands: list[Any] = []
    for i in range(rng.randint(1, 6)):
        tenant, key = rng.choice(RUN_SLOTS)
        run_id, state, tag = run_id_for(tenant, key), load(run_id_for(tenant, key)), f"{step}-{i}"
        lease = state.lease if state is not None else None
        attempt = lease.attempt_id if lease else attempt_id_for(run_id, 1)
        epoch, sequence = (lease.epoch, lease.last_sequence + 1) if lease else (1, 1)
        kind = rng.choice(RUN_KINDS)
        if kind == "submit":  # the same command id every time: a client retry
            commands.append(submit_command(tenant, key, retry_safe=True, command_id=f"s-{run_id}"))
        elif kind == "claim":
            commands.append(claim_cmd(run_id, command_id=f"c-{tag}"))
        elif kind == "renew":
            commands.append(renew_cmd(run_id, attempt, epoch, sequence, command_id=f"r-{tag}"))
        elif kind == "report":
            outcome = rng.choice(("succeeded", "failed"))
            commands.append(report_cmd(run_id, attempt, epoch, sequence, outcome, command_id=f"p-{tag}"))
        elif kind == "cancel":
            commands.append(cancel_command(run_id, command_id=f"k-{tag}"))
        else:  # a conflicting submit: refused once the run exists
            commands.append(submit_command(tenant, key, spec=SPEC_TEXTS[2], command_id=f"x-{tag}"))
    return commands


RUN = Case(
    "run",
    RUNS_COMMANDS.name,
    lambda log, store, clock: RunCommandProcessor(log, store, CODEC, clock),
    run_commands,
    lambda key: submit_command("acme", key, command_id=f"s-{key}"),
    # The Run deduplicates renewals by their sequence, not their id (lease_coordinator/domain/
    # run.py `_remembered`): a redelivered renewal is refused DUPLICATE_SEQUENCE (LEASE_RELEASED
    # once the lease ended). A known deviation of the domain, reported on issue 11.
    answered_again=frozenset({"RenewLease"}),
)


# --- the Trajectory ----------------------------------------------------------------------------

TRAJECTORY_SLOTS = (("acme", "t1"), ("globex", "t2"), ("initech", "t3"))
TOOLS = ("vm.provision", "ip.reserve", "cache.warm", "sandbox.compile", "dns.publish")


def trajectory_command(kind: type[Any], run_id: str, command_id: str, **fields: Any) -> Any:
    if kind in (StartTrajectory, ProposeStep, FinishTrajectory, AbortTrajectory):
        fields.setdefault("attempt_id", "att-1")
        fields.setdefault("lease_epoch", 1)
    return kind(command_id=command_id, run_id=run_id, issued_at=0, correlation_id=run_id, actor="t", **fields)


def trajectory_commands(rng: random.Random, load: Load, step: int) -> list[Any]:
    commands: list[Any] = []
    for i in range(rng.randint(1, 4)):
        run_id = run_id_for(*rng.choice(TRAJECTORY_SLOTS))
        state, tag = load(run_id), f"{run_id}-{step}-{i}"
        if state is None or rng.random() < 0.1:  # the same command id every time: a retry
            commands.append(trajectory_command(StartTrajectory, run_id, f"start-{run_id}"))
            continue
        work = pending_work(state)
        if isinstance(work, DispatchStep):
            tool = state.steps[work.step_index].tool
            failed = rng.random() < 0.3
            outcome = (
                {"outcome": "failed", "error_kind": "conflict", "error_status": 409}
                if failed
                else {
                    "outcome": "committed",
                    "output": json.dumps(OUTPUTS[tool]),
                }
            )
            where = {"step_index": work.step_index, "dispatch": work.dispatch}
            commands.append(trajectory_command(RecordStepOutcome, run_id, tag, **where, **outcome))
        elif isinstance(work, EvaluateGate):
            checks = '[{"name":"lease","passed":true}]'
            where = {"step_index": work.step_index}
            commands.append(trajectory_command(RecordPivotGate, run_id, tag, **where, checks=checks))
        elif isinstance(work, RunCompensator):
            outcome = rng.choice(("compensated", "compensated", "fatal"))
            commands.append(
                trajectory_command(
                    RecordCompensationOutcome,
                    run_id,
                    tag,
                    step_index=work.step_index,
                    attempt=work.attempt,
                    outcome=outcome,
                    error_kind="corrupted" if outcome == "fatal" else "",
                )
            )
        elif isinstance(work, RevokeLease):
            commands.append(
                trajectory_command(
                    RecordLeaseRevocation, run_id, tag, incident_id=work.incident_id, revoked_epoch=work.epoch
                )
            )
        elif state.incident is not None and state.status.value == "frozen":
            commands.append(
                trajectory_command(
                    ResolveIncident, run_id, tag, incident_id=state.incident.incident_id, resolution="manual"
                )
            )
        elif rng.random() < 0.1:
            commands.append(trajectory_command(FinishTrajectory, run_id, tag))
        elif state.steps and rng.random() < 0.15:  # give up before the pivot: the saga unwinds
            commands.append(trajectory_command(AbortTrajectory, run_id, tag, reason="enough"))
        else:  # a known tool, or now and then an unknown one (refused)
            tool = rng.choice(TOOLS) if rng.random() < 0.9 else "rm.rf"
            params = json.dumps(PARAMS.get(tool, {}))
            commands.append(trajectory_command(ProposeStep, run_id, tag, tool=tool, params=params))
    return commands


TRAJECTORY = Case(
    "trajectory",
    TRAJECTORIES_COMMANDS.name,
    lambda log, store, clock: TrajectoryProcessor(log, store, CODEC, clock, CATALOG),
    trajectory_commands,
    lambda key: trajectory_command(StartTrajectory, run_id_for("acme", key), f"start-{key}"),
)


# --- the Watchdog ------------------------------------------------------------------------------

WATCHDOG_SLOTS = (("acme", "w1"), ("globex", "w2"), ("initech", "w3"))
# Few states and few actions, so that runs loop (cycles, repeated failures) and climb the ladder.
WATCHDOG_STATES = tuple(hashlib.sha256(name.encode()).hexdigest() for name in ("a", "b", "c", "d"))
WATCHDOG_ACTIONS = tuple(action_hash("fs.edit", {"line": i}) for i in range(3))


def watchdog_command(kind: type[Any], run_id: str, command_id: str, **fields: Any) -> Any:
    return kind(command_id=command_id, run_id=run_id, issued_at=0, correlation_id=run_id, actor="t", **fields)


def observation(run_id: str, command_id: str, seq: int, rng: random.Random) -> ObserveStep:
    return watchdog_command(
        ObserveStep,
        run_id,
        command_id,
        source="runner",
        step_seq=seq,
        tool="fs.edit",
        action_hash=rng.choice(WATCHDOG_ACTIONS),
        state_hash=rng.choice(WATCHDOG_STATES),
        metrics=(float(rng.choice((3, 4))),),
        error_kind=rng.choice(("none", "none", "application", "transient")),
    )


def watchdog_commands(rng: random.Random, load: Load, step: int) -> list[Any]:
    commands: list[Any] = []
    for i in range(rng.randint(1, 5)):
        run_id = run_id_for(*rng.choice(WATCHDOG_SLOTS))
        state, tag = load(run_id), f"{run_id}-{step}-{i}"
        seq = state.last_runner_seq + 1 if state is not None else 0
        roll = rng.random()
        if state is not None and state.pending_rollback and roll < 0.4:
            commands.append(
                watchdog_command(
                    AcknowledgeRollback, run_id, f"ack-{tag}", intervention_id=state.pending_rollback,
                    checkpoint_step=-1,
                )
            )
        elif roll < 0.08:  # a retry of the first observation: the same command id every time
            commands.append(observation(run_id, f"obs-{run_id}-0", 0, random.Random(run_id)))
        elif roll < 0.14:
            # No rollback budget (level 3 at the second violation), or K=40, out of bounds: refused.
            override = rng.choice(({"rollback_budget": 0}, {"max_period": 2}, {"max_period": 40}))
            commands.append(watchdog_command(ConfigureWatchdog, run_id, f"cfg-{tag}", **override))
        elif roll < 0.2:  # refused: not a hash
            commands.append(replace(observation(run_id, f"bad-{tag}", seq, rng), action_hash="nope"))
        elif roll < 0.25:  # refused: no rollback awaited
            unknown = {"intervention_id": "itv_x", "checkpoint_step": 0}
            commands.append(watchdog_command(AcknowledgeRollback, run_id, f"ack-{tag}", **unknown))
        else:
            commands.append(observation(run_id, f"obs-{tag}", seq, rng))
    return commands


WATCHDOG = Case(
    "watchdog",
    PROGRESS_OBSERVATIONS.name,
    lambda log, store, clock: WatchdogProcessor(log, store, CODEC, clock),
    watchdog_commands,
    # A watchdog's first observation also records the thresholds in force (two events): a fresh
    # watchdog with one event is a ConfigureWatchdog that keeps the deployment's thresholds.
    lambda key: watchdog_command(ConfigureWatchdog, run_id_for("acme", key), f"cfg-{key}"),
)


# --- the Breaker (BRK-1, BRK-2) ------------------------------------------------------------------

BREAKER = Case(
    "breaker",
    BREAKERS_COMMANDS.name,
    lambda log, store, clock: BreakerProcessor(log, store, CODEC, clock, breaker.CONTRACT_POLICY),
    breaker.contract_commands,
    lambda key: breaker.outcome(1, "success", endpoint=key, command_id=f"o-{key}"),
    route=lambda endpoint: partition_for_endpoint(endpoint, PARTITIONS),
)


# --- the Schedule (EXE-14) -------------------------------------------------------------------------

SCHEDULE = Case(
    "schedule",
    SCHEDULES_COMMANDS.name,
    lambda log, store, clock: ScheduleProcessor(log, store, CODEC, clock),
    schedule.contract_commands,
    schedule.fresh,
    route=lambda schedule_id: partition_for_schedule(schedule_id, PARTITIONS),
)


# --- Quarantine and taint (QUA-1, QUA-2): runs' quarantines and a tenant's graph ---------------------

QUARANTINE = Case(
    "quarantine",
    QUARANTINE_COMMANDS.name,
    lambda log, store, clock: QuarantineProcessor(log, store, CODEC, clock),
    quarantine.contract_commands,
    quarantine.fresh,
    route=lambda aggregate_id: partition_for_aggregate(aggregate_id, PARTITIONS),
)


@pytest.fixture(params=[RUN, TRAJECTORY, WATCHDOG, BREAKER, SCHEDULE, QUARANTINE], ids=lambda case: case.name)
def case(request: pytest.FixtureRequest) -> Case:
    return request.param  # type: ignore[no-any-return]


# --- driving a processor -------------------------------------------------------------------------


class Topic:
    """A commands topic as a consumer sees it: routed by run id, offsets increasing per partition."""

    def __init__(self, name: str, route: Callable[[str], int] | None = None) -> None:
        self.name = name
        self.route = route or (lambda aggregate_id: partition_for_run(aggregate_id, PARTITIONS))
        self._next: dict[int, int] = defaultdict(int)

    def record(self, command: Any) -> InboundRecord:
        partition = self.route(command.run_id)
        out = CODEC.outbound(self.name, command.run_id, command, partition)
        offset = self._next[partition]
        self._next[partition] += 1
        return InboundRecord(out.topic, partition, offset, out.key, out.value, out.headers)


@dataclass
class Step:
    at_ms: int
    batch: list[InboundRecord] | None  # None: a timer tick


@dataclass
class Drive:
    log: MemoryEventLog
    store: MemoryStore
    processor: AggregateProcessor[Any, Any, Any, Any]
    steps: list[Step] = field(default_factory=list)


def drive(case: Case, seed: int, batches: int = 16) -> Drive:
    """Commands generated against the current states, batch by batch, a tick after each."""
    rng, topic, clock = random.Random(seed), Topic(case.commands_topic, case.route), ManualClock(T0)
    log, store = MemoryEventLog(PARTITIONS), MemoryStore()
    run = Drive(log, store, case.build(log, store, clock))
    run.processor.restore_partitions(set(range(PARTITIONS)))
    for step in range(batches):
        clock.advance(rng.choice((1_000, 20_000, 50_000)))
        batch = [topic.record(c) for c in case.commands(rng, run.processor.load, step)]
        run.steps += [Step(clock.now_ms(), batch), Step(clock.now_ms(), None)]
        run.processor.handle(batch)
        run.processor.tick()
    return run


class Incarnation:
    """One process of the aggregate's processor on a log and a disk, replaying recorded steps."""

    def __init__(self, case: Case, log: Any, store: Any) -> None:
        self.clock = ManualClock(T0)
        self.processor = case.build(log, store, self.clock)
        self.processor.restore_partitions(set(range(PARTITIONS)))  # assigned before delivered

    def run(self, *steps: Step) -> Incarnation:
        for step in steps:
            self.clock.advance(step.at_ms - self.clock.now_ms())
            if step.batch is None:
                self.processor.tick()
            else:
                self.processor.handle(step.batch)
        return self


def decoded(log: MemoryEventLog, topic: str) -> Iterator[tuple[InboundRecord, Any]]:
    for (name, _), records in sorted(log.topics.items()):
        if name == topic:
            yield from ((r, CODEC.decode(r.value)) for r in records)


def events_by_aggregate(run: Drive) -> dict[str, list[Any]]:
    by_id: dict[str, list[Any]] = defaultdict(list)
    definition = run.processor.definition
    for record, event in decoded(run.log, definition.events_topic):
        by_id[definition.aggregate_id(event)].append((record.partition, event))
    for aggregate_id, located in by_id.items():
        assert len({p for p, _ in located}) == 1, f"{aggregate_id}: one aggregate, one partition"
    return {aggregate_id: [e for _, e in located] for aggregate_id, located in by_id.items()}


def log_of(log: MemoryEventLog, *topics: str) -> dict[tuple[str, int], list[tuple[bytes | None, bytes]]]:
    return {k: [(r.key, r.value) for r in v] for k, v in log.topics.items() if k[0] in topics}


def without_checkpoints(store: MemoryStore) -> dict[str, bytes]:
    return {k: v for k, v in store.scan("") if not k.startswith("checkpoint/")}


def assert_state_is_the_fold_of_the_log(run: Drive) -> None:
    definition = run.processor.definition
    history = events_by_aggregate(run)
    assert history, "the stream must produce events"
    for aggregate_id, events in history.items():
        assert [definition.event_version(e) for e in events] == list(range(1, len(events) + 1))
        state = None
        for event in events:
            state = definition.evolve(state, event)
        assert run.processor.load(aggregate_id) == state, aggregate_id
    prefix = definition.layout.state_prefix
    assert {k.removeprefix(prefix) for k, _ in run.store.scan(prefix)} == set(history)
    for (topic, partition), records in run.log.topics.items():
        if topic in (definition.events_topic, definition.rejections_topic):
            assert run.processor.checkpoint(partition, topic) == records[-1].offset + 1


# --- the contract --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_replay_equals_incremental_and_versions_increase_by_one_dur_1(case: Case, seed: int) -> None:
    run = drive(case, seed)
    assert_state_is_the_fold_of_the_log(run)
    assert any(True for _ in decoded(run.log, run.processor.definition.rejections_topic)), "refusals too"


@pytest.mark.parametrize("seed", SEEDS)
def test_restore_equals_rebuild_dur_1(case: Case, seed: int) -> None:
    run = drive(case, seed)
    fresh = MemoryStore()
    rebuilt = case.build(run.log, fresh, ManualClock(T0))
    restored = rebuilt.restore_partitions(set(range(PARTITIONS)))
    assert sum(restored.values()) == sum(len(e) for e in events_by_aggregate(run).values())
    assert without_checkpoints(fresh) == without_checkpoints(run.store)
    for partition in range(PARTITIONS):
        for topic in (run.processor.definition.events_topic, run.processor.definition.rejections_topic):
            assert rebuilt.checkpoint(partition, topic) == run.log.end_offset(topic, partition)


def answered(definition: Any, log: MemoryEventLog) -> tuple[set[str], set[str]]:
    """(command ids with an event, command ids with a refusal) on the log."""
    accepted = {e.causation_id for _, e in decoded(log, definition.events_topic)}
    return accepted, {r.causation_id for _, r in decoded(log, definition.rejections_topic)}


def answers(case: Case, log: MemoryEventLog, reference: MemoryEventLog) -> dict[str, list[Any]]:
    """The events and refusals of `log`, less the refusals it may hold beyond `reference`: those
    of commands `reference` answered nothing at all (the aggregate dropped them, e.g. a stale
    report; refused when they come again after the state moved on, they contradict no answer),
    and the second answers the case declares (`answered_again`)."""
    definition = case.build(MemoryEventLog(), MemoryStore(), ManualClock()).definition
    accepted, refused = answered(definition, reference)
    accepted_here, _ = answered(definition, log)

    def kept(refusal: Any) -> bool:
        if refusal.causation_id not in accepted | refused:
            return False
        return not (refusal.command_type in case.answered_again and refusal.causation_id in accepted_here)

    return {
        definition.events_topic: [e for _, e in decoded(log, definition.events_topic)],
        definition.rejections_topic: [r for _, r in decoded(log, definition.rejections_topic) if kept(r)],
    }


@pytest.mark.parametrize("seed", SEEDS)
def test_a_redelivered_batch_produces_nothing_new(case: Case, seed: int) -> None:
    """No event, no state change, and no second answer to a command answered before."""
    run = drive(case, seed)
    definition, layout = run.processor.definition, run.processor.definition.layout
    before = MemoryEventLog(PARTITIONS)
    before.topics = {k: list(v) for k, v in run.log.topics.items()}
    store_before = dict(run.store.scan(""))
    for step in run.steps:
        if step.batch is not None:
            outcome = run.processor.handle(step.batch)
            assert (outcome.events, outcome.failed, outcome.deadlettered) == (0, 0, 0)
    assert answers(case, run.log, before) == answers(case, before, before)
    new = [r for key, records in run.log.topics.items() for r in records[len(before.topics.get(key, [])) :]]
    assert {r.topic for r in new} <= {definition.rejections_topic}
    refused_again = {layout.rejected_key(CODEC.decode(r.value).causation_id) for r in new}
    changed = {k for k, v in run.store.scan("") if store_before.get(k) != v}
    rejections_checkpoint = layout.checkpoint_key(definition.rejections_topic, 0)[:-1]
    assert {k for k in changed if not k.startswith(rejections_checkpoint)} == refused_again, changed


@pytest.mark.parametrize("seed", SEEDS)
def test_a_refused_command_stays_refused_after_a_restore(case: Case, seed: int) -> None:
    run = drive(case, seed)
    definition = run.processor.definition
    refused = {r.causation_id for _, r in decoded(run.log, definition.rejections_topic)}
    assert refused
    answers_before = log_of(run.log, definition.rejections_topic, definition.events_topic)
    incarnation = case.build(run.log, MemoryStore(), ManualClock(T0))  # a new machine: empty store
    for step in run.steps:
        if step.batch is not None:
            redelivered = [r for r in step.batch if definition.command_id(CODEC.decode(r.value)) in refused]
            if redelivered:
                assert incarnation.handle(redelivered).duplicates == len(redelivered)
    assert log_of(run.log, definition.rejections_topic, definition.events_topic) == answers_before


def test_a_poison_command_is_dead_lettered_refused_and_the_batch_goes_on(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, store, topic = MemoryEventLog(PARTITIONS), MemoryStore(), Topic(case.commands_topic, case.route)
    processor = case.build(log, store, ManualClock(T0))
    definition = processor.definition
    first, poison, last = case.fresh("first"), case.fresh("poison"), case.fresh("last")
    real, calls = definition.decide, []

    def decide(state: Any, command: Any, now_ms: int, context: Any) -> Any:
        calls.append(command.command_id)
        if command.command_id == poison.command_id:
            raise ZeroDivisionError("a defect")
        return real(state, command, now_ms, context)

    monkeypatch.setattr(definition, "decide", decide)
    batch = [topic.record(first), topic.record(poison), topic.record(last)]
    outcome = processor.handle(batch)
    assert (outcome.accepted, outcome.failed, outcome.events) == (2, 1, 2)
    [letter] = [r for (t, _), rs in log.topics.items() if t == DEADLETTER.name for r in rs]
    headers = dict(letter.headers)
    assert (headers["tenure-dlq-reason"], headers["tenure-dlq-command-id"]) == (
        COMMAND_FAILED.encode(),
        poison.command_id.encode(),
    )
    [(_, refusal)] = list(decoded(log, definition.rejections_topic))
    assert (refusal.causation_id, refusal.code) == (poison.command_id, COMMAND_FAILED)
    assert processor.load(poison.run_id) is None, "the poison command changed nothing"
    assert processor.handle([batch[1]]).duplicates == 1
    assert calls.count(poison.command_id) == 1, "a redelivery is not decided again"
    assert_state_is_the_fold_of_the_log(Drive(log, store, processor))


@pytest.mark.parametrize("at", [0, 5, 12])
def test_a_failed_commit_leaves_no_state_change_and_the_retry_decides_once_dur_1(case: Case, at: int) -> None:
    calm = drive(case, SEEDS[2])
    batches = [i for i, s in enumerate(calm.steps) if s.batch is not None]
    log, store = MemoryEventLog(PARTITIONS), MemoryStore()
    incarnation = Incarnation(case, log, store).run(*calm.steps[: batches[at]])
    step = calm.steps[batches[at]]
    log_before, store_before = {k: list(v) for k, v in log.topics.items()}, dict(store.scan(""))
    log.fail_next_commit = True
    with pytest.raises(ConnectionError):
        incarnation.run(step)
    assert log.topics == log_before, "a failed commit leaves nothing behind"
    assert dict(store.scan("")) == store_before, "the state is never ahead of the log"
    incarnation.run(*calm.steps[batches[at] :])  # the runtime retries the unacknowledged batch
    assert log.topics == calm.log.topics
    assert_state_is_the_fold_of_the_log(Drive(log, store, incarnation.processor))


class Killed(Exception):
    """The process died here (SIGKILL): nothing after this point happened."""


class KillableStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.kill_on_next_write = False

    def write(self, puts: Mapping[str, bytes], deletes: tuple[str, ...] = ()) -> None:
        if self.kill_on_next_write:
            self.kill_on_next_write = False
            raise Killed("before the store write")
        super().write(puts, deletes)


class KillableLog(MemoryEventLog):
    """Dies right after its next successful commit, before the store write that follows it."""

    def __init__(self, store: KillableStore) -> None:
        super().__init__(PARTITIONS)
        self._store = store
        self.kill_after_next_commit = False

    def commit(self, records: Any) -> dict[tuple[str, int], int]:
        written = super().commit(records)
        if self.kill_after_next_commit:
            self.kill_after_next_commit = False
            self._store.kill_on_next_write = True
        return written


@pytest.mark.parametrize("crash", ["before_commit", "before_store_write", "before_ack"])
def test_a_crash_at_any_step_then_redelivery_writes_what_a_calm_run_writes_dur_1(
    case: Case, crash: str
) -> None:
    """SIGKILL at a step of one batch, a new incarnation on the same disk and log, redelivery."""
    calm = drive(case, SEEDS[2])
    for index, step in enumerate(calm.steps):
        if step.batch is None:
            continue
        store = KillableStore()
        log = KillableLog(store)
        killed = Incarnation(case, log, store).run(*calm.steps[:index])
        log.fail_next_commit = crash == "before_commit"
        log.kill_after_next_commit = crash == "before_store_write"
        with contextlib.suppress(ConnectionError, Killed):
            killed.run(step)
        log.fail_next_commit = log.kill_after_next_commit = store.kill_on_next_write = False
        # A new incarnation on the same disk and log; the batch was never acknowledged.
        survivor = Incarnation(case, log, store).run(*calm.steps[index:])
        assert answers(case, log, calm.log) == answers(case, calm.log, calm.log), (crash, index)
        assert_state_is_the_fold_of_the_log(Drive(log, store, survivor.processor))


def test_the_runtime_imports_no_infrastructure_library_and_no_aggregate() -> None:
    """The aggregate runtime reaches Kafka and RocksDB only through their ports, and knows no
    aggregate: every aggregate depends on it, never the other way round."""
    package = Path(__file__).resolve().parents[2] / "services" / "common" / "aggregate"
    forbidden = ("confluent_kafka", "faust", "rocksdict", "fastavro", "services.common.streams")
    services = (
        "services.lease_coordinator",
        "services.saga_orchestrator",
        "services.projections",
        "services.watchdog",
        "services.breakers",
    )
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert not name.startswith(forbidden + services), f"{path.name} imports {name}"
