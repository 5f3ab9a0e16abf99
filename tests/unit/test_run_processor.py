"""RunCommandProcessor over the in-memory twins: the log's fold is the state, through crashes.

Proves DUR-1 for the Run processor: after every batch the stored state equals `fold` of the
events on runs.events and the checkpoint is the last event offset + 1; a crash at any step of
the commit order (module docstring of services/common/aggregate/processor.py) followed by
redelivery of the unacknowledged batch to a NEW processor leaves a log without duplicate or
missing versions and a state equal to the replay of that log. Also EXE-2 (the events of one
command are committed atomically) and the dead-letter contract.
"""

from __future__ import annotations

import contextlib
import dataclasses
import zlib
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from services.common.clock import ManualClock
from services.common.contracts import CommandRejected, RunCommand, RunEvent, RunSubmitted
from services.common.eventlog import MemoryEventLog
from services.common.ids import run_id_for
from services.common.kafka import InboundRecord, OutboundRecord
from services.common.messages import MessageCodec
from services.common.routing import partition_for_run
from services.common.store import MemoryStore
from services.common.topics import DEADLETTER, RUNS_COMMANDS, RUNS_EVENTS, RUNS_REJECTIONS
from services.lease_coordinator.domain import RunState, RunStatus, decide, fold
from services.lease_coordinator.processor import RunCommandProcessor, checkpoint_key, state_key
from services.lease_coordinator.state_codec import decode_state, encode_state

from .strategies import SPEC_TEXTS, cancel_command, command_sequences, submit_command

CODEC = MessageCodec()
PARTITIONS = RUNS_COMMANDS.partitions


def partition_of(run_id: str) -> int:
    """The partition producers route a run's commands to (services.common.routing)."""
    try:
        return partition_for_run(run_id, PARTITIONS)
    except ValueError:  # a forged or malformed run id: any partition will do for the test
        return zlib.crc32(run_id.encode("utf-8")) % PARTITIONS


class CommandTopic:
    """runs.commands as a consumer sees it: records keyed by runId, offsets increasing per partition."""

    def __init__(self) -> None:
        self._next: dict[int, int] = defaultdict(int)

    def _take(self, partition: int) -> int:
        offset = self._next[partition]
        self._next[partition] += 1
        return offset

    def record(self, message: Any, *, key: str | None = None, partition: int | None = None) -> InboundRecord:
        key = message.run_id if key is None else key
        partition = partition_of(key) if partition is None else partition
        out = CODEC.outbound(RUNS_COMMANDS.name, key, message, partition)
        return InboundRecord(out.topic, partition, self._take(partition), out.key, out.value, out.headers)

    def raw(self, value: bytes, *, key: bytes | None, partition: int) -> InboundRecord:
        return InboundRecord(RUNS_COMMANDS.name, partition, self._take(partition), key, value)


def log_records(log: MemoryEventLog, topic: str) -> list[InboundRecord]:
    return [r for (t, _), records in sorted(log.topics.items()) if t == topic for r in records]


def logged_events(log: MemoryEventLog) -> dict[str, list[RunEvent]]:
    by_run: dict[str, list[RunEvent]] = defaultdict(list)
    for record in log_records(log, RUNS_EVENTS.name):
        event = CODEC.decode(record.value)
        assert record.key == event.run_id.encode(), "events are keyed by runId"
        by_run[event.run_id].append(event)
    return dict(by_run)


def stored_states(store: MemoryStore) -> dict[str, RunState]:
    return {key.removeprefix("run/"): decode_state(raw) for key, raw in store.scan("run/")}


def snapshot(store: Any) -> dict[str, bytes]:
    return dict(store.scan(""))


def assert_log_is_well_formed(log: MemoryEventLog) -> None:
    """No duplicate and no missing (runId, version); every run's events on one partition."""
    partitions_of_run: dict[str, set[int]] = defaultdict(set)
    for record in log_records(log, RUNS_EVENTS.name):
        partitions_of_run[record.key.decode()].add(record.partition)  # type: ignore[union-attr]
    for run_id, events in logged_events(log).items():
        assert [e.version for e in events] == list(range(1, len(events) + 1)), run_id
        assert len({e.event_id for e in events}) == len(events)
        assert partitions_of_run[run_id] == {partition_of(run_id)}, "co-partitioned with commands"


def assert_state_is_fold_of_log_dur_1(log: MemoryEventLog, store: MemoryStore) -> None:
    """DUR-1: stored state == fold(log) per run, and checkpoint == last event offset + 1."""
    expected = {run_id: fold(events) for run_id, events in logged_events(log).items()}
    assert stored_states(store) == expected
    reader = RunCommandProcessor(log, store, CODEC, ManualClock())
    for (topic, partition), records in log.topics.items():
        if topic == RUNS_EVENTS.name:
            assert reader.checkpoint(partition) == records[-1].offset + 1


def new_processor(log: Any, store: Any, clock: ManualClock | None = None) -> RunCommandProcessor:
    return RunCommandProcessor(log, store, CODEC, clock or ManualClock())


# --- the happy path ----------------------------------------------------------------------------


def test_after_handle_state_equals_fold_of_the_log_and_checkpoint_follows_dur_1() -> None:
    log, store, clock, topic = MemoryEventLog(), MemoryStore(), ManualClock(), CommandTopic()
    processor = new_processor(log, store, clock)
    slots = [("acme", "k1"), ("acme", "k2"), ("globex", "k1"), ("initech", "k9"), ("acme", "k3")]
    assert len({partition_of(run_id_for(*s)) for s in slots}) > 1, "spans several partitions"
    first = [topic.record(submit_command(*slot, command_id=f"s-{i}")) for i, slot in enumerate(slots)]
    outcome = processor.handle(first)
    assert (outcome.commands, outcome.events, outcome.rejections, outcome.deadlettered) == (5, 5, 0, 0)
    assert_log_is_well_formed(log)
    assert_state_is_fold_of_log_dur_1(log, store)

    clock.advance(1_000)
    second = [
        topic.record(cancel_command(run_id_for(*slot), command_id=f"c-{i}"))
        for i, slot in enumerate(slots[:3])
    ]
    outcome = processor.handle(second)
    assert outcome.events == 3
    assert_log_is_well_formed(log)
    assert_state_is_fold_of_log_dur_1(log, store)
    states = stored_states(store)
    assert {states[run_id_for(*s)].status for s in slots[:3]} == {RunStatus.CANCELLED}
    assert {states[run_id_for(*s)].status for s in slots[3:]} == {RunStatus.QUEUED}
    cancelled = logged_events(log)[run_id_for(*slots[0])][-1]
    assert cancelled.occurred_at == clock.now_ms(), "occurredAt is the processor's clock"


def test_events_go_to_the_partition_of_their_command() -> None:
    log, topic = MemoryEventLog(), CommandTopic()
    command = submit_command("acme", "k1")
    new_processor(log, MemoryStore()).handle([topic.record(command)])
    [(_, partition)] = [k for k in log.topics if k[0] == RUNS_EVENTS.name]
    assert partition == partition_of(command.run_id)


def test_several_commands_of_one_run_in_one_batch_build_on_each_other() -> None:
    log, store, topic = MemoryEventLog(), MemoryStore(), CommandTopic()
    submit = submit_command()
    batch = [
        topic.record(submit),
        topic.record(submit_command(spec=SPEC_TEXTS[1], command_id="s-retry")),  # same spec
        topic.record(cancel_command(submit.run_id)),
        topic.record(cancel_command(submit.run_id, command_id="c-2")),  # already terminal
    ]
    outcome = new_processor(log, store).handle(batch)
    assert (outcome.events, outcome.duplicates, outcome.rejections) == (2, 1, 1)
    assert [type(e).__name__ for e in logged_events(log)[submit.run_id]] == ["RunSubmitted", "RunCancelled"]
    [rejection] = [CODEC.decode(r.value) for r in log_records(log, RUNS_REJECTIONS.name)]
    assert rejection.code == "RUN_ALREADY_TERMINAL"
    assert_state_is_fold_of_log_dur_1(log, store)


def test_state_codec_round_trips() -> None:
    state = fold([e for e in decide(None, submit_command(), 1) if isinstance(e, RunSubmitted)])
    assert state is not None
    assert decode_state(encode_state(state)) == state
    released = dataclasses.replace(state, queue_reservation_id=None, status=RunStatus.CANCELLED)
    assert decode_state(encode_state(released)) == released


# --- dead letters and rejections ---------------------------------------------------------------


def _deadletters(log: MemoryEventLog) -> list[InboundRecord]:
    return log_records(log, DEADLETTER.name)


def _header(record: InboundRecord, name: str) -> str:
    values = [value for key, value in record.headers if key == name]
    assert len(values) == 1, f"expected exactly one {name} header, got {values}"
    return values[0].decode()


def test_bad_records_go_to_the_dead_letter_topic_and_the_rest_of_the_batch_is_processed() -> None:
    log, store, topic = MemoryEventLog(), MemoryStore(), CommandTopic()
    good_before = submit_command("acme", "k1", command_id="s-1")
    good_after = submit_command("acme", "k2", command_id="s-2")
    (an_event,) = decide(None, submit_command("globex", "k7", command_id="s-x"), 5)
    mismatched = submit_command("acme", "k3", command_id="s-3")
    valid_submit_bytes = topic.record(submit_command("acme", "k4")).value
    batch = [
        topic.record(good_before),
        topic.raw(b"this is not avro", key=b"run_garbage", partition=1),
        topic.record(an_event),  # a well-formed record, but an event on the commands topic
        topic.record(mismatched, key="run_someone_else"),
        topic.raw(valid_submit_bytes[:-7], key=b"run_truncated", partition=2),
        topic.raw(b"\xc3\x01" + b"\x00" * 8 + b"body", key=None, partition=3),
        topic.record(good_after),
    ]
    bad = batch[1:6]
    outcome = new_processor(log, store).handle(batch)

    assert (outcome.commands, outcome.deadlettered, outcome.events) == (7, 5, 2)
    assert set(logged_events(log)) == {good_before.run_id, good_after.run_id}
    assert_state_is_fold_of_log_dur_1(log, store)
    dead = _deadletters(log)
    assert len(dead) == 5
    by_offset = {
        (int(_header(r, "tenure-dlq-source-partition")), int(_header(r, "tenure-dlq-source-offset"))): r
        for r in dead
    }
    assert set(by_offset) == {(r.partition, r.offset) for r in bad}
    expected_reasons = ["BAD_MAGIC", "NOT_A_COMMAND", "KEY_MISMATCH", "CORRUPT_BODY", "UNKNOWN_FINGERPRINT"]
    for source, reason in zip(bad, expected_reasons, strict=True):
        letter = by_offset[(source.partition, source.offset)]
        assert _header(letter, "tenure-dlq-reason") == reason
        assert _header(letter, "tenure-dlq-source-topic") == RUNS_COMMANDS.name
        assert _header(letter, "tenure-dlq-detail"), "a human-readable detail travels along"
        assert letter.value == source.value, "the original bytes, untouched"
        assert letter.key == (source.key or b"")


def test_a_rejection_goes_to_runs_rejections_and_changes_no_state() -> None:
    log, store, topic = MemoryEventLog(), MemoryStore(), CommandTopic()
    processor = new_processor(log, store)
    submit = submit_command(spec=SPEC_TEXTS[0])
    processor.handle([topic.record(submit)])
    before_states, before_events = stored_states(store), logged_events(log)
    before_checkpoints = [processor.checkpoint(p) for p in range(PARTITIONS)]

    conflict = submit_command(spec=SPEC_TEXTS[2], command_id="s-conflict")
    unknown = cancel_command(run_id_for("acme", "never"), command_id="c-unknown")
    outcome = processor.handle([topic.record(conflict), topic.record(unknown)])

    assert (outcome.rejections, outcome.events) == (2, 0)
    assert stored_states(store) == before_states
    assert [processor.checkpoint(p) for p in range(PARTITIONS)] == before_checkpoints
    assert logged_events(log) == before_events
    decoded = [(r, CODEC.decode(r.value)) for r in log_records(log, RUNS_REJECTIONS.name)]
    codes = {m.causation_id: m.code for _, m in decoded}
    assert codes == {"s-conflict": "IDEMPOTENCY_KEY_CONFLICT", "c-unknown": "RUN_NOT_FOUND"}
    for record, message in decoded:
        assert isinstance(message, CommandRejected)
        assert record.key == message.run_id.encode()
        assert record.partition == partition_of(message.run_id)


# --- crashes -----------------------------------------------------------------------------------


class SimulatedCrash(Exception):
    """The process died here (SIGKILL): nothing after this point of the step happened."""


class CrashableStore:
    """A KeyValueStore whose `inner` is the disk; the process may die on (or silently lose) a write."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.crash_on_next_write = False
        self.drop_writes = False

    def get(self, key: str) -> bytes | None:
        return self.inner.get(key)

    def write(self, puts: Mapping[str, bytes], deletes: tuple[str, ...] = ()) -> None:
        if self.crash_on_next_write:
            self.crash_on_next_write = False
            raise SimulatedCrash("killed before the store write")
        if not self.drop_writes:
            self.inner.write(puts, deletes)

    def scan(
        self, prefix: str, start_after: str | None = None, *, before: str | None = None
    ) -> Iterator[tuple[str, bytes]]:
        return self.inner.scan(prefix, start_after, before=before)

    def clear(self) -> None:
        self.inner.clear()

    def refresh(self) -> None:
        self.inner.refresh()

    def close(self) -> None:
        self.inner.close()


class CrashableLog:
    """The MemoryEventLog with a kill switch right AFTER a successful commit (before step 4)."""

    def __init__(self, inner: MemoryEventLog, store: CrashableStore) -> None:
        self.inner = inner
        self.store = store
        self.crash_after_next_commit = False

    def commit(self, records: Sequence[OutboundRecord]) -> dict[tuple[str, int], int]:
        written = self.inner.commit(records)
        if self.crash_after_next_commit:
            self.crash_after_next_commit = False
            self.store.crash_on_next_write = True  # the next write is step 4 of this batch
        return written

    def read(self, topic: str, partition: int, start_offset: int) -> Iterator[InboundRecord]:
        return self.inner.read(topic, partition, start_offset)

    def end_offset(self, topic: str, partition: int) -> int:
        return self.inner.end_offset(topic, partition)


def test_crash_i_commit_fails_nothing_in_the_log_store_unchanged_retry_works_dur_1() -> None:
    log, store, topic = MemoryEventLog(), MemoryStore(), CommandTopic()
    processor = new_processor(log, store)
    processor.handle([topic.record(submit_command("acme", "k1", command_id="s-0"))])
    before_store, before_log = snapshot(store), {k: list(v) for k, v in log.topics.items()}

    batch = [
        topic.record(submit_command("acme", "k2", command_id="s-1")),
        topic.record(cancel_command(run_id_for("acme", "k1"))),
    ]
    log.fail_next_commit = True
    with pytest.raises(ConnectionError):
        processor.handle(batch)
    assert log.topics == before_log, "a failed commit leaves nothing behind"
    assert snapshot(store) == before_store, "state is never ahead of the log"

    outcome = processor.handle(batch)  # the stream runtime redelivers the unacked batch
    assert outcome.events == 2
    assert_log_is_well_formed(log)
    assert_state_is_fold_of_log_dur_1(log, store)


def test_crash_i_commit_fails_on_the_very_first_batch_leaves_no_run() -> None:
    log, store, topic = MemoryEventLog(), MemoryStore(), CommandTopic()
    batch = [topic.record(submit_command())]
    log.fail_next_commit = True
    with pytest.raises(ConnectionError):
        new_processor(log, store).handle(batch)
    assert log.topics == {}
    assert stored_states(store) == {}
    new_processor(log, store).handle(batch)
    assert_state_is_fold_of_log_dur_1(log, store)


@pytest.mark.parametrize("loss", ["store_write_dropped", "fresh_store"])
def test_crash_ii_store_write_lost_new_processor_restores_from_the_log_dur_1(loss: str) -> None:
    log, disk, topic = MemoryEventLog(), MemoryStore(), CommandTopic()
    store = CrashableStore(disk)
    first = [topic.record(submit_command("acme", f"k{i}", command_id=f"s-{i}")) for i in range(4)]
    new_processor(log, store).handle(first)
    clock = ManualClock()
    clock.advance(5_000)
    second = [
        topic.record(cancel_command(run_id_for("acme", "k0"), command_id="c-0")),
        topic.record(submit_command("acme", "k9", command_id="s-9")),
        topic.record(submit_command("acme", "k1", command_id="s-1-retry")),
    ]
    store.drop_writes = True  # step 3 lands, step 4 is lost
    new_processor(log, store, clock).handle(second)
    events_after_commit = logged_events(log)
    assert run_id_for("acme", "k9") in events_after_commit
    assert run_id_for("acme", "k9") not in stored_states(disk), "the write really was lost"

    store.drop_writes = False
    runs = {run_id_for("acme", f"k{i}") for i in (0, 1, 2, 3, 9)}
    assert {partition_of(r) for r in runs} <= {r.partition for r in second}, (
        "precondition: the redelivered batch touches every partition that holds a run"
    )
    survivor = CrashableStore(MemoryStore()) if loss == "fresh_store" else store
    restarted = new_processor(log, survivor, clock)
    outcome = restarted.handle(second)  # redelivery of the unacknowledged batch

    assert outcome.events == 0, "the redelivered batch produces no new events"
    assert outcome.duplicates == 3
    assert sum(outcome.restored_events.values()) == (6 if loss == "fresh_store" else 2)
    assert logged_events(log) == events_after_commit, "no duplicate events on the log"
    assert_log_is_well_formed(log)
    assert_state_is_fold_of_log_dur_1(log, survivor.inner)


def test_crash_iii_after_store_write_before_ack_redelivery_is_dropped_dur_1() -> None:
    log, store, topic = MemoryEventLog(), MemoryStore(), CommandTopic()
    submit = submit_command()
    batch = [topic.record(submit), topic.record(cancel_command(submit.run_id))]
    new_processor(log, store).handle(batch)
    before = logged_events(log)
    outcome = new_processor(log, store).handle(batch)
    assert (outcome.events, outcome.duplicates) == (0, 2)
    assert logged_events(log) == before
    assert_state_is_fold_of_log_dur_1(log, store)


def test_a_revoked_partition_is_restored_again_when_it_comes_back() -> None:
    """Another instance owned the partition meanwhile: its events must be folded, not ignored."""
    log, topic = MemoryEventLog(), CommandTopic()
    store_a, store_b = MemoryStore(), MemoryStore()
    a, b = new_processor(log, store_a), new_processor(log, store_b)
    submit = submit_command()
    a.handle([topic.record(submit)])
    a.forget_assignment()
    b.handle([topic.record(cancel_command(submit.run_id))])  # b restores, then cancels
    outcome = a.handle([topic.record(cancel_command(submit.run_id, command_id="c-2"))])
    assert outcome.restored_events == {partition_of(submit.run_id): 1}
    assert outcome.rejections == 1, "a knows the run is already cancelled"
    assert_state_is_fold_of_log_dur_1(log, store_a)


def test_a_rejected_command_redelivered_after_a_crash_gets_the_same_answer_dur_1() -> None:
    """DUR-1 / crash-safe redelivery: one command id must get ONE decision, whenever it crashes.

    The batch holds a CancelRun for a run that does not exist yet, then the run's SubmitRun
    (nothing stops a client from sending them in that order; runId is derivable from tenant and
    Idempotency-Key). The first processing rejects the cancel with RUN_NOT_FOUND (already on
    runs.rejections, possibly already answered to the caller) and creates the run. The process
    dies after the store write but before the ack, so the batch is redelivered: the cancel is
    decided AGAIN, now against the post-batch state, and the same command id becomes an accepted
    RunCancelled. A crash-free run leaves the run queued; the crashed one leaves it cancelled.
    """
    topic = CommandTopic()
    run_id = run_id_for("acme", "k1")
    batch = [
        topic.record(cancel_command(run_id, command_id="c-early")),
        topic.record(submit_command("acme", "k1", command_id="s-1")),
    ]

    calm_log, calm_store = MemoryEventLog(), MemoryStore()
    new_processor(calm_log, calm_store).handle(batch)

    log, store = MemoryEventLog(), MemoryStore()
    new_processor(log, store).handle(batch)
    new_processor(log, store).handle(batch)  # crash before the ack -> redelivery

    answers = [CODEC.decode(r.value) for r in log_records(log, RUNS_REJECTIONS.name)]
    rejected_ids = {a.causation_id for a in answers}
    accepted_ids = {e.causation_id for e in logged_events(log)[run_id]}
    assert not rejected_ids & accepted_ids, (
        f"command(s) {rejected_ids & accepted_ids} were both rejected and accepted"
    )
    assert logged_events(log) == logged_events(calm_log)
    assert stored_states(store) == stored_states(calm_store)


# --- crash at a random step, then redelivery (property) ----------------------------------------

CRASH_POINTS = ("before_commit", "after_commit", "after_store_write")
_MAX_CRASHES_PER_BATCH = 3


def _batches(records: list[InboundRecord], sizes: list[int]) -> list[list[InboundRecord]]:
    batches, start = [], 0
    for size in sizes:
        if start >= len(records):
            break
        batches.append(records[start : start + size])
        start += size
    if start < len(records):
        batches.append(records[start:])
    return batches


def _run_with_crashes(
    commands: list[RunCommand], sizes: list[int], crashes: list[str | None]
) -> tuple[MemoryEventLog, MemoryStore, int]:
    """Feed the commands batch by batch; crash where the plan says, redeliver to a new processor."""
    topic = CommandTopic()
    batches = _batches([topic.record(c) for c in commands], sizes)
    disk, log, clock = MemoryStore(), MemoryEventLog(), ManualClock()
    store = CrashableStore(disk)
    crashed_log = CrashableLog(log, store)
    plan = iter(crashes)
    processor = new_processor(crashed_log, store, clock)
    incarnations = 1
    for batch in batches:
        clock.advance(1_000)
        for attempt in range(_MAX_CRASHES_PER_BATCH + 1):
            crash = next(plan, None) if attempt < _MAX_CRASHES_PER_BATCH else None
            log.fail_next_commit = crash == "before_commit"
            crashed_log.crash_after_next_commit = crash == "after_commit"
            try:
                processor.handle(batch)
            except (ConnectionError, SimulatedCrash):
                crashed = True
            else:
                crashed = crash == "after_store_write"  # handled, but killed before the ack
            log.fail_next_commit = False
            crashed_log.crash_after_next_commit = False
            store.crash_on_next_write = False
            if not crashed:
                break
            processor = new_processor(crashed_log, store, clock)  # restart; same disk, same log
            incarnations += 1
    return log, disk, incarnations


_CRASH_PLANS = st.lists(st.sampled_from((None, None, *CRASH_POINTS)), max_size=12)
_BATCH_SIZES = st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=8)
_CANCEL_BEFORE_SUBMIT = [
    cancel_command(run_id_for("acme", "key-1"), command_id="cmd-0"),
    submit_command("acme", "key-1", command_id="cmd-1"),
]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commands=command_sequences(max_size=16), sizes=_BATCH_SIZES, crashes=_CRASH_PLANS)
@example(commands=_CANCEL_BEFORE_SUBMIT, sizes=[2], crashes=["after_store_write"])
@example(commands=_CANCEL_BEFORE_SUBMIT, sizes=[2], crashes=["after_commit", "before_commit"])
def test_crash_at_a_random_step_then_redelivery_keeps_log_and_state_consistent_dur_1(
    commands: list[RunCommand], sizes: list[int], crashes: list[str | None]
) -> None:
    """DUR-1: whatever step dies, the log has no duplicate or missing versions and the state on
    disk equals the pure replay (fold) of that log, with the checkpoint at its end."""
    log, disk, _ = _run_with_crashes(commands, sizes, crashes)
    assert_log_is_well_formed(log)
    assert_state_is_fold_of_log_dur_1(log, disk)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commands=command_sequences(max_size=16), sizes=_BATCH_SIZES, crashes=_CRASH_PLANS)
@example(commands=_CANCEL_BEFORE_SUBMIT, sizes=[2], crashes=["after_store_write"])
def test_crashes_are_invisible_the_log_equals_a_crash_free_run_dur_1(
    commands: list[RunCommand], sizes: list[int], crashes: list[str | None]
) -> None:
    """DUR-1 (RPO = 0, no phantom decisions): a crashed-and-redelivered run writes exactly the
    events a crash-free run writes, so a caller's answer never depends on when a process died."""
    log, disk, _ = _run_with_crashes(commands, sizes, crashes)
    calm_log, calm_disk, incarnations = _run_with_crashes(commands, sizes, [])
    assert incarnations == 1
    assert logged_events(log) == logged_events(calm_log)
    assert stored_states(disk) == stored_states(calm_disk)


def test_the_crash_harness_really_crashes_at_each_step() -> None:
    """Guard for the property above: each crash point leaves the disk where the docstring says."""
    commands = [submit_command("acme", "k1", command_id="s-1")]
    run_id = commands[0].run_id
    for crash, runs_on_disk, checkpoint in (
        ("before_commit", 0, b"0"),
        ("after_commit", 0, b"0"),
        ("after_store_write", 1, b"1"),
    ):
        topic = CommandTopic()
        [record] = [topic.record(c) for c in commands]
        disk, log = MemoryStore(), MemoryEventLog()
        store = CrashableStore(disk)
        crashed_log = CrashableLog(log, store)
        log.fail_next_commit = crash == "before_commit"
        crashed_log.crash_after_next_commit = crash == "after_commit"
        with contextlib.suppress(ConnectionError, SimulatedCrash):
            new_processor(crashed_log, store).handle([record])
        assert len(stored_states(disk)) == runs_on_disk, crash
        assert (disk.get(state_key(run_id)) is not None) is (runs_on_disk == 1), crash
        assert (run_id in logged_events(log)) is (crash != "before_commit"), crash
        # The restore before the batch stored checkpoint 0; only a completed step 4 moves it.
        assert disk.get(checkpoint_key(partition_of(run_id))) == checkpoint, crash
