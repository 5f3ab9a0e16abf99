"""TrajectoryProcessor over the in-memory twins: the saga's single writer, restored from its log.

Proves for the saga orchestrator what test_run_processor.py proves for runs: events land on
trajectories.events in the partition of their command and rejections on trajectories.rejections
(EXE-2: one transaction per batch); a redelivered batch adds nothing; the store is only a cache of
the log's fold (DUR-1: a new processor over the same log and an EMPTY store restores the same
states, the repair statistics of REC-4 included); undecodable records are dead-lettered without
stopping the batch; and every TrajectoryFrozen publishes an IncidentOpened naming its exact log
offset, again after a restore, with the same incidentId (REC-7, at-least-once).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import pytest

from services.common.clock import ManualClock
from services.common.contracts import (
    CommandRejected,
    FinishTrajectory,
    IncidentOpened,
    IncidentResolved,
    ProposeStep,
    RecordCompensationOutcome,
    RecordPivotGate,
    RecordStepOutcome,
    ResolveIncident,
    StartTrajectory,
    TrajectoryEvent,
    TrajectoryFrozen,
)
from services.common.eventlog import MemoryEventLog
from services.common.ids import run_id_for
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec
from services.common.routing import partition_for_run
from services.common.store import MemoryStore
from services.common.topics import (
    DEADLETTER,
    INCIDENTS,
    TRAJECTORIES_COMMANDS,
    TRAJECTORIES_EVENTS,
    TRAJECTORIES_REJECTIONS,
)
from services.saga_orchestrator.domain import (
    DispatchStep,
    EvaluateGate,
    RunCompensator,
    TrajectoryState,
    TrajectoryStatus,
    Work,
    fold,
    pending_work,
)
from services.saga_orchestrator.processor import BatchOutcome, TrajectoryProcessor
from tests.support.trajectory_saga import CATALOG, OUTPUTS, PARAMS

CODEC = MessageCodec()
PARTITIONS = TRAJECTORIES_COMMANDS.partitions
T = TrajectoryStatus


class CommandTopic:
    """trajectories.commands as a consumer sees it: keyed by runId, offsets increasing per partition."""

    def __init__(self) -> None:
        self._next: dict[int, int] = defaultdict(int)

    def _take(self, partition: int) -> int:
        offset = self._next[partition]
        self._next[partition] += 1
        return offset

    def record(self, message: Any, *, key: str | None = None) -> InboundRecord:
        key = message.run_id if key is None else key
        partition = partition_for_run(message.run_id, PARTITIONS)
        out = CODEC.outbound(TRAJECTORIES_COMMANDS.name, key, message, partition)
        return InboundRecord(out.topic, partition, self._take(partition), out.key, out.value, out.headers)

    def raw(self, value: bytes, *, key: bytes | None, partition: int) -> InboundRecord:
        return InboundRecord(TRAJECTORIES_COMMANDS.name, partition, self._take(partition), key, value)


class Harness:
    """A processor over a log and a store; incidents and dead letters have one partition, as in Kafka."""

    def __init__(self, log: MemoryEventLog | None = None, store: MemoryStore | None = None) -> None:
        self.log = log or MemoryEventLog(partitions=1)
        self.store = store or MemoryStore()
        self.clock = ManualClock()
        self.topic = CommandTopic()
        self.changed: list[list[TrajectoryState]] = []
        self.processor = TrajectoryProcessor(
            self.log,
            self.store,
            CODEC,
            self.clock,
            CATALOG,
            on_changed=lambda s: self.changed.append(list(s)),
        )

    def handle(self, *commands: Any) -> BatchOutcome:
        self.clock.advance(1_000)
        return self.processor.handle([self.topic.record(c) for c in commands])

    def reopen(self, store: MemoryStore | None = None) -> Harness:
        """A new incarnation over the same log (and, unless given, an EMPTY store)."""
        again = Harness(self.log, store or MemoryStore())
        again.topic = self.topic
        return again


class Client:
    """The runner, executor and operator of one run, writing commands as the real ones do."""

    def __init__(self, harness: Harness, tenant: str, key: str = "k1") -> None:
        self.harness = harness
        self.run_id = run_id_for(tenant, key)
        self.partition = partition_for_run(self.run_id, PARTITIONS)
        self.issued = 0

    def command(self, kind: type[Any], **fields: Any) -> Any:
        self.issued += 1
        if kind in (StartTrajectory, ProposeStep, FinishTrajectory):
            fields.setdefault("attempt_id", "att-1")
            fields.setdefault("lease_epoch", 1)
        fields.setdefault("command_id", f"{self.run_id}-cmd-{self.issued}")
        return kind(run_id=self.run_id, issued_at=0, correlation_id=self.run_id, actor="test", **fields)

    def state(self) -> TrajectoryState:
        state = self.harness.processor.load(self.run_id)
        assert state is not None
        return state

    def work(self) -> Work | None:
        return pending_work(self.state())

    def start(self, **fields: Any) -> Any:
        return self.command(StartTrajectory, **fields)

    def propose(self, tool: str, **fields: Any) -> Any:
        return self.command(ProposeStep, tool=tool, params=json.dumps(PARAMS[tool]), **fields)

    def outcome(self, outcome: str = "committed", **fields: Any) -> Any:
        work = self.work()
        assert isinstance(work, DispatchStep), work
        if outcome == "committed":
            fields.setdefault("output", json.dumps(OUTPUTS[self.state().steps[work.step_index].tool]))
        return self.command(
            RecordStepOutcome, step_index=work.step_index, dispatch=work.dispatch, outcome=outcome, **fields
        )

    def gate(self) -> Any:
        work = self.work()
        assert isinstance(work, EvaluateGate), work
        return self.command(
            RecordPivotGate, step_index=work.step_index, checks='[{"name":"lease","passed":true}]'
        )

    def compensation(self, outcome: str = "compensated", **fields: Any) -> Any:
        work = self.work()
        assert isinstance(work, RunCompensator), work
        return self.command(
            RecordCompensationOutcome,
            step_index=work.step_index,
            attempt=work.attempt,
            outcome=outcome,
            **fields,
        )

    def run_step(self, tool: str) -> None:
        self.harness.handle(self.propose(tool))
        if isinstance(self.work(), EvaluateGate):
            self.harness.handle(self.gate())
        self.harness.handle(self.outcome())


# --- reading the log ---------------------------------------------------------------------------


def records(log: MemoryEventLog, topic: str) -> list[InboundRecord]:
    return [r for (t, _), rs in sorted(log.topics.items()) if t == topic for r in rs]


def logged_events(log: MemoryEventLog) -> dict[str, list[TrajectoryEvent]]:
    by_run: dict[str, list[TrajectoryEvent]] = defaultdict(list)
    for record in records(log, TRAJECTORIES_EVENTS.name):
        event = CODEC.decode(record.value)
        assert record.key == event.run_id.encode(), "keyed by runId"
        assert record.partition == partition_for_run(event.run_id, PARTITIONS), "on the run's partition"
        by_run[event.run_id].append(event)
    return dict(by_run)


def snapshot(log: MemoryEventLog) -> dict[tuple[str, int], list[InboundRecord]]:
    return {key: list(value) for key, value in log.topics.items()}


def assert_store_is_fold_of_log_dur_1(harness: Harness) -> None:
    for run_id, events in logged_events(harness.log).items():
        assert [e.version for e in events] == list(range(1, len(events) + 1)), run_id
        assert len({e.event_id for e in events}) == len(events)
        assert harness.processor.load(run_id) == fold(events)
    for (topic, partition), logged in harness.log.topics.items():
        if topic in (TRAJECTORIES_EVENTS.name, TRAJECTORIES_REJECTIONS.name):
            stored = harness.store.get(f"checkpoint/{topic}/{partition}")
            assert stored is not None and int(stored) == logged[-1].offset + 1


def clients_on_distinct_partitions(harness: Harness) -> tuple[Client, Client]:
    first, second = Client(harness, "acme"), Client(harness, "globex")
    assert first.partition != second.partition
    return first, second


# --- batches -----------------------------------------------------------------------------------


def test_a_batch_writes_events_on_the_commands_partition_and_rejections_beside_them() -> None:
    harness = Harness()
    a, b = clients_on_distinct_partitions(harness)
    nobody = Client(harness, "initech")
    outcome = harness.handle(
        a.start(),
        b.start(),
        a.propose("vm.provision"),
        b.command(ProposeStep, tool="rm.rf", params="{}", attempt_id="att-1", lease_epoch=1),
        nobody.propose("vm.provision"),
    )
    assert (outcome.commands, outcome.events, outcome.rejections, outcome.deadlettered) == (5, 3, 2, 0)
    events = logged_events(harness.log)
    assert [type(e).__name__ for e in events[a.run_id]] == ["TrajectoryStarted", "StepIntentRecorded"]
    assert [type(e).__name__ for e in events[b.run_id]] == ["TrajectoryStarted"]
    assert nobody.run_id not in events
    rejected = {}
    for record in records(harness.log, TRAJECTORIES_REJECTIONS.name):
        refusal = CODEC.decode(record.value)
        assert isinstance(refusal, CommandRejected)
        assert record.key == refusal.run_id.encode()
        assert record.partition == partition_for_run(refusal.run_id, PARTITIONS)
        rejected[refusal.run_id] = (refusal.code, refusal.command_type, refusal.current_status)
    assert rejected == {
        b.run_id: ("UNKNOWN_TOOL", "ProposeStep", "forward"),
        nobody.run_id: ("TRAJECTORY_NOT_FOUND", "ProposeStep", None),
    }
    assert_store_is_fold_of_log_dur_1(harness)
    assert a.state().steps[0].idempotency_key == f"{a.run_id}/s0/d1"


def test_a_redelivered_batch_produces_nothing_new() -> None:
    harness = Harness()
    a, b = clients_on_distinct_partitions(harness)
    harness.handle(a.start(), b.start())
    batch = [
        a.propose("vm.provision"),
        b.command(ProposeStep, tool="nope", params="{}", attempt_id="x", lease_epoch=1),
    ]
    first = harness.handle(*batch)
    assert (first.events, first.rejections) == (1, 1)
    before, stored = snapshot(harness.log), dict(harness.store.scan(""))
    changes = len(harness.changed)

    again = harness.handle(*batch)
    assert (again.events, again.rejections, again.duplicates) == (0, 0, 2)
    assert snapshot(harness.log) == before
    assert dict(harness.store.scan("")) == stored
    assert len(harness.changed) == changes, "nothing changed, nobody is told"

    # a new incarnation, even with an empty store, recognises both from the log
    reopened = harness.reopen()
    again = reopened.handle(*batch)
    assert (again.events, again.rejections, again.duplicates) == (0, 0, 2)
    assert snapshot(harness.log) == before


def test_a_new_processor_with_an_empty_store_restores_the_same_states_dur_1() -> None:
    harness = Harness()
    deploy, other = clients_on_distinct_partitions(harness)
    harness.handle(deploy.start(rerun_cost_ms=46_000, rerun_cost_money=0.162), other.start())
    for tool in ("vm.provision", "ip.reserve"):
        deploy.run_step(tool)
    # a repair: its outcome feeds the repair statistics (REC-4), which the store keeps
    harness.handle(deploy.propose("sandbox.compile"))
    harness.handle(deploy.outcome("failed", error_kind="compile-error", error_message="ImportError: x"))
    assert deploy.state().status is T.AWAITING_REPAIR
    harness.handle(deploy.propose("sandbox.compile", repair_of=2))
    harness.handle(deploy.outcome())
    assert harness.processor.stats().samples("compile-error") == 1
    other.run_step("cache.warm")
    harness.handle(other.command(FinishTrajectory))
    assert other.state().status is T.COMPLETED
    assert_store_is_fold_of_log_dur_1(harness)

    reopened = harness.reopen()
    restored = reopened.processor.restore_partitions(set(range(PARTITIONS)))
    assert sum(restored.values()) == sum(len(e) for e in logged_events(harness.log).values())
    for client in (deploy, other):
        assert reopened.processor.load(client.run_id) == harness.processor.load(client.run_id)
    assert reopened.processor.stats() == harness.processor.stats()
    original, rebuilt = dict(harness.store.scan("")), dict(reopened.store.scan(""))
    extra = {key: value for key, value in rebuilt.items() if key not in original}
    assert {key: rebuilt[key] for key in original} == original
    assert all(key.startswith("checkpoint/") and value == b"0" for key, value in extra.items()), extra
    assert_store_is_fold_of_log_dur_1(reopened)
    live = reopened.processor.active_states(set(range(PARTITIONS)))
    assert [s.run_id for s in live] == [deploy.run_id], "an ended saga is not handed to the executor"
    # ... and goes on from there: the next command is decided against the restored state
    deploy.harness = reopened
    reopened.handle(deploy.propose("firewall.write"))
    assert deploy.state().steps[3].idempotency_key == f"{deploy.run_id}/s3/d1"
    assert_store_is_fold_of_log_dur_1(reopened)


def test_restore_is_lazy_the_first_command_of_a_partition_triggers_it_dur_1() -> None:
    harness = Harness()
    client = Client(harness, "acme")
    harness.handle(client.start())
    client.run_step("vm.provision")
    reopened = harness.reopen()
    client.harness = reopened
    outcome = reopened.handle(client.propose("ip.reserve"))
    assert outcome.events == 1
    assert [e.version for e in logged_events(harness.log)[client.run_id]] == [1, 2, 3, 4]
    assert_store_is_fold_of_log_dur_1(reopened)


# --- dead letters ------------------------------------------------------------------------------


def header(record: InboundRecord, name: str) -> str:
    values = [value for key, value in record.headers if key == name]
    assert len(values) == 1, (name, values)
    return values[0].decode()


def test_an_undecodable_command_is_dead_lettered_and_the_rest_of_the_batch_is_processed() -> None:
    harness = Harness()
    a, b = clients_on_distinct_partitions(harness)
    harness.handle(a.start())
    an_event = logged_events(harness.log)[a.run_id][0]
    topic = harness.topic
    bad = [
        topic.raw(b"this is not avro", key=a.run_id.encode(), partition=a.partition),
        topic.record(an_event),  # well-formed, but an event on the commands topic
        topic.record(b.propose("vm.provision"), key=a.run_id),  # keyed by another run
    ]
    batch = [topic.record(a.propose("vm.provision")), *bad, topic.record(b.start())]
    harness.clock.advance(1_000)
    outcome = harness.processor.handle(batch)
    assert (outcome.commands, outcome.deadlettered, outcome.events) == (5, 3, 2)
    dead = records(harness.log, DEADLETTER.name)
    assert [header(r, "tenure-dlq-reason") for r in dead] == ["BAD_MAGIC", "NOT_A_COMMAND", "KEY_MISMATCH"]
    for letter, source in zip(dead, bad, strict=True):
        assert letter.value == source.value, "the original bytes, untouched"
        assert header(letter, "tenure-dlq-source-topic") == TRAJECTORIES_COMMANDS.name
        assert int(header(letter, "tenure-dlq-source-partition")) == source.partition
        assert int(header(letter, "tenure-dlq-source-offset")) == source.offset
    events = logged_events(harness.log)
    assert [type(e).__name__ for e in events[a.run_id]] == ["TrajectoryStarted", "StepIntentRecorded"]
    assert [type(e).__name__ for e in events[b.run_id]] == ["TrajectoryStarted"]
    assert_store_is_fold_of_log_dur_1(harness)


# --- incidents (REC-7) -------------------------------------------------------------------------


def drive_to_unwind(client: Client) -> None:
    """The seed's deploy: four committed steps, the DNS pivot fails with a 409, the unwind starts."""
    client.harness.handle(client.start())
    for tool in ("vm.provision", "ip.reserve", "sandbox.compile", "firewall.write"):
        client.run_step(tool)
    client.harness.handle(client.propose("dns.publish"))
    client.harness.handle(client.gate())
    client.harness.handle(client.outcome("failed", error_kind="conflict", error_status=409))
    assert client.state().status is T.UNWINDING


def incidents(log: MemoryEventLog) -> list[Any]:
    return [CODEC.decode(r.value) for r in records(log, INCIDENTS.name)]


def test_a_frozen_trajectory_publishes_an_incident_naming_its_exact_offset_rec_7() -> None:
    harness = Harness()
    frozen_run = Client(harness, "acme", "deploy")
    neighbour = Client(harness, "acme", "neighbour")
    assert frozen_run.partition == neighbour.partition, "one tenant, one partition"
    drive_to_unwind(frozen_run)
    harness.handle(frozen_run.compensation())  # C4
    # events before and after the frozen one in the same batch and partition
    outcome = harness.handle(
        neighbour.start(),
        frozen_run.compensation("fatal", error_kind="corrupted", error_message="build cache gone"),
        neighbour.propose("vm.provision"),
    )
    assert (outcome.events, outcome.incidents) == (4, 1)  # started; failed + frozen; intent
    partition_log = harness.log.topics[(TRAJECTORIES_EVENTS.name, frozen_run.partition)]
    [(frozen_record, frozen)] = [
        (r, e) for r in partition_log if isinstance(e := CODEC.decode(r.value), TrajectoryFrozen)
    ]
    # the batch wrote: neighbour started, CompensationFailed, TrajectoryFrozen, neighbour's intent
    around = [
        CODEC.decode(r.value) for r in partition_log[frozen_record.offset - 2 : frozen_record.offset + 2]
    ]
    assert [(type(e).__name__, e.run_id) for e in around] == [
        ("TrajectoryStarted", neighbour.run_id),
        ("CompensationFailed", frozen_run.run_id),
        ("TrajectoryFrozen", frozen_run.run_id),
        ("StepIntentRecorded", neighbour.run_id),
    ]
    [incident] = incidents(harness.log)
    assert isinstance(incident, IncidentOpened)
    assert (incident.log_topic, incident.log_partition) == (TRAJECTORIES_EVENTS.name, frozen_run.partition)
    assert incident.log_offset == frozen_record.offset
    assert incident.incident_id == frozen.incident_id
    assert (incident.run_id, incident.failure_mode, incident.failed_step) == (
        frozen_run.run_id,
        "COMPENSATION_CORRUPTED",
        2,
    )
    assert incident.failed_tool == "sandbox.compile"
    assert [r["stepIndex"] for r in json.loads(incident.uncompensated)] == [2, 1, 0]
    assert incident.snapshot_ref == frozen.snapshot_ref and incident.error_context == frozen.error_context
    assert records(harness.log, INCIDENTS.name)[0].key == frozen_run.run_id.encode()

    # restore re-publishes it: at-least-once, the same incidentId and offset
    reopened = harness.reopen()
    reopened.processor.restore_partitions({frozen_run.partition})
    republished = incidents(harness.log)
    assert len(republished) == 2 and republished[1] == incident
    # a restore from a store that is up to date re-publishes nothing
    harness.reopen(harness.store).processor.restore_partitions({frozen_run.partition})
    assert len(incidents(harness.log)) == 2


def test_the_resolution_of_an_incident_is_published_on_the_incidents_topic_rec_7() -> None:
    harness = Harness()
    client = Client(harness, "acme")
    drive_to_unwind(client)
    harness.handle(client.compensation("fatal", error_kind="corrupted"))
    incident = client.state().incident
    assert incident is not None
    outcome = harness.handle(
        client.command(ResolveIncident, incident_id=incident.incident_id, resolution="compensated-manually")
    )
    assert outcome.events == 1 and outcome.incidents == 0
    published = incidents(harness.log)
    assert [type(m).__name__ for m in published] == ["IncidentOpened", "IncidentResolved"]
    assert isinstance(published[1], IncidentResolved) and published[1].incident_id == incident.incident_id
    assert client.state().status is T.ROLLED_BACK
    assert not list(harness.store.scan(f"active/{client.partition}/")), "an ended saga is no longer active"


# --- the executor's hook -----------------------------------------------------------------------


def test_on_changed_receives_exactly_the_changed_states() -> None:
    harness = Harness()
    a, b = clients_on_distinct_partitions(harness)
    harness.handle(a.start(), b.start())
    assert len(harness.changed) == 1
    assert {s.run_id: s for s in harness.changed[0]} == {a.run_id: a.state(), b.run_id: b.state()}
    harness.handle(a.propose("vm.provision"))
    [changed] = harness.changed[1]
    assert changed == a.state() and isinstance(pending_work(changed), DispatchStep)
    harness.handle(b.command(ProposeStep, tool="nope", params="{}", attempt_id="att-1", lease_epoch=1))
    assert len(harness.changed) == 2, "a rejection changes no state"
    # a restore hands every live trajectory of the partitions to the executor
    reopened = harness.reopen()
    reopened.processor.restore_partitions({a.partition, b.partition})
    [restored] = reopened.changed
    assert sorted(s.run_id for s in restored) == sorted((a.run_id, b.run_id))
    assert reopened.processor.rescan() == 2
    assert len(reopened.changed) == 2


def handled(outcomes: Sequence[BatchOutcome]) -> int:
    return sum(o.commands for o in outcomes)


def test_outcome_counts_add_up() -> None:
    harness = Harness()
    a = Client(harness, "acme")
    start = a.start()
    outcomes = [harness.handle(start), harness.handle(start), harness.handle(a.propose("vm.provision"))]
    assert handled(outcomes) == 3
    assert [(o.events, o.duplicates) for o in outcomes] == [(1, 0), (0, 1), (1, 0)]


# --- crashes between the steps of the commit order -----------------------------------------------


class FlakyStore(MemoryStore):
    """Fails the next write, as a SIGKILL between the Kafka commit and the RocksDB write would."""

    fail_next_write = False

    def write(self, puts: Any, deletes: tuple[str, ...] = ()) -> None:
        if self.fail_next_write:
            self.fail_next_write = False
            raise OSError("simulated crash before the store write")
        super().write(puts, deletes)


def test_a_crash_after_the_log_commit_is_healed_by_redelivery_dur_1() -> None:
    harness = Harness(store=FlakyStore())
    client = Client(harness, "acme")
    harness.handle(client.start())
    propose = client.propose("vm.provision")
    assert isinstance(harness.store, FlakyStore)
    harness.store.fail_next_write = True
    with pytest.raises(OSError):
        harness.handle(propose)
    events = logged_events(harness.log)[client.run_id]
    assert [type(e).__name__ for e in events] == ["TrajectoryStarted", "StepIntentRecorded"], "committed"
    assert len(client.state().steps) == 0, "the store missed it"
    # the unacknowledged batch comes again: the processor trusts the log, not its memory
    outcome = harness.handle(propose)
    assert (outcome.events, outcome.duplicates) == (0, 1)
    assert len(logged_events(harness.log)[client.run_id]) == 2
    assert_store_is_fold_of_log_dur_1(harness)


def test_a_failed_log_commit_leaves_nothing_and_redelivery_decides_once_dur_1() -> None:
    harness = Harness()
    client = Client(harness, "acme")
    harness.handle(client.start())
    propose = client.propose("vm.provision")
    harness.log.fail_next_commit = True
    with pytest.raises(ConnectionError):
        harness.handle(propose)
    assert len(logged_events(harness.log)[client.run_id]) == 1
    outcome = harness.handle(propose)
    assert outcome.events == 1
    assert_store_is_fold_of_log_dur_1(harness)
