"""The contract every aggregate definition must pass on the one runtime (issue 11, DUR-1, EXE-2).

One suite, parametrised over the definitions (the eventsourcing library's pattern): the Run
(services/lease_coordinator/processor.py), the Trajectory (services/saga_orchestrator/
processor.py), the Watchdog (services/watchdog/processor.py, WD-1..WD-5) and the Breaker
(services/breakers/processor.py, BRK-1, BRK-2) run on
services/common/aggregate. A new aggregate adds a `Case` in aggregate_cases.py and gets
the whole suite. Each case supplies a command generator that looks at the current states (like the
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
import random
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from services.common.aggregate import AggregateProcessor
from services.common.clock import ManualClock
from services.common.eventlog import MemoryEventLog
from services.common.kafka import InboundRecord
from services.common.poison import COMMAND_FAILED
from services.common.routing import partition_for_run
from services.common.store import MemoryStore
from services.common.topics import (
    DEADLETTER,
)
from tests.contract.aggregate_cases import CASES, CODEC, PARTITIONS, SEEDS, T0, Case


@pytest.fixture(params=CASES, ids=lambda case: case.name)
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


def assert_restores_to(
    case: Case, log: MemoryEventLog, run: Drive, every_event: int, how: str, *, from_changelog: bool = False
) -> None:
    """A fresh processor on an EMPTY store, restored from `log`, holds `run`'s store."""
    fresh = MemoryStore()
    rebuilt = case.build(log, fresh, ManualClock(T0))
    restored = rebuilt.restore_partitions(set(range(PARTITIONS)))
    assert sum(restored.values()) == every_event, how
    taken = rebuilt.metrics.registry.get_sample_value(
        "tenure_processor_changelog_states_total", {"aggregate": rebuilt.definition.name}
    )
    assert (taken or 0) == (len(events_by_aggregate(run)) if from_changelog else 0), how
    assert without_checkpoints(fresh) == without_checkpoints(run.store), how
    for partition in range(PARTITIONS):
        for topic in (run.processor.definition.events_topic, run.processor.definition.rejections_topic):
            assert rebuilt.checkpoint(partition, topic) == log.end_offset(topic, partition), how


@pytest.mark.parametrize("seed", SEEDS)
def test_restore_equals_rebuild_dur_1(case: Case, seed: int) -> None:
    """By folding every event, and, for a definition with a state changelog (issue 16), from the
    changelog: its states, then only the events after its checkpoint. A fold from the start
    writes the changelog again, and the next restore takes it."""
    run = drive(case, seed)
    definition = run.processor.definition
    every_event = sum(len(e) for e in events_by_aggregate(run).values())
    folded_log = run.log.without(definition.changelog_topic)
    assert_restores_to(case, folded_log, run, every_event, "by folding the events")
    if definition.changelog_topic is None:
        return
    # The changelog's states are the fold of every event (their versions count them).
    assert_restores_to(
        case, run.log, run, every_event, "from the changelog the batches wrote", from_changelog=True
    )
    assert any(topic == definition.changelog_topic for topic, _ in folded_log.topics), "written again"
    assert_restores_to(
        case, folded_log, run, every_event, "from the changelog the fold wrote again", from_changelog=True
    )


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
