"""A command whose handling raises is set aside, and its partition goes on (issue 10, DUR-1).

Before: any exception from `decide`, `evolve` or the encoding of a command's events escaped the
processor's `handle`; the stream runtime retried the batch five times and exited, and the next
incarnation met the same command first: its partition crash-looped for good. Now the processors
decide each command on values only and, if that raises, commit in the batch's transaction a dead
letter (reason, exception, short traceback, source topic/partition/offset/key, command id and
type) and a CommandRejected (the caller's answer, and the refusal that drops a redelivery); the
rest of the batch and the next batches are decided as usual, and the stored state stays the
log's fold (DUR-1). Timer work that raises is set aside the same way and skipped until its run
changes. The failing commands here are real ones where the domain has a defect (a deeply nested
executionSpec, an executionSpec whose canonical form outgrows a Kafka record, pivot-gate checks
that are not objects) and injected ones (a decide, an evolve or an event encoding that raises).
"""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.contracts import CommandRejected, LeaseAtRisk, RecordPivotGate, RunSubmitted
from services.common.eventlog import MemoryEventLog
from services.common.kafka import InboundRecord
from services.common.messages import MAX_RECORD_BYTES, deadletter_record, record_bytes
from services.common.poison import COMMAND_FAILED, RECORD_TOO_LARGE, TIMER_FAILED
from services.common.store import MemoryStore
from services.common.topics import (
    DEADLETTER,
    RUNS_COMMANDS,
    RUNS_EVENTS,
    RUNS_REJECTIONS,
    TRAJECTORIES_COMMANDS,
    TRAJECTORIES_REJECTIONS,
)
from services.lease_coordinator import processor as run_processor
from services.lease_coordinator.domain import Rejection, RejectionCode, RunStatus, decide
from services.saga_orchestrator import processor as saga_processor
from tests.support.lease_run import renew_cmd

from .strategies import cancel_command, command_sequences, submit_command
from .test_lease_timers_processor import AT_RISK_MS, T0, Coordinator, _claimed, _submitted
from .test_run_processor import (
    CODEC,
    CommandTopic,
    _batches,
    assert_log_is_well_formed,
    assert_state_is_fold_of_log_dur_1,
    log_records,
    logged_events,
    new_processor,
    stored_states,
)
from .test_trajectory_processor import Client, Harness, records

# --- helpers -----------------------------------------------------------------------------------


def header(record: InboundRecord, name: str) -> str:
    values = [v for k, v in record.headers if k == name]
    assert len(values) == 1, f"expected one {name} header, got {values}"
    return values[0].decode()


def dead_letters(log: MemoryEventLog) -> list[InboundRecord]:
    return log_records(log, DEADLETTER.name)


def refusals(log: MemoryEventLog, topic: str = RUNS_REJECTIONS.name) -> list[CommandRejected]:
    return [CODEC.decode(r.value) for r in log_records(log, topic)]


def sample(processor: Any, name: str, **labels: str) -> float:
    value = processor.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else float(value)


def assert_set_aside(letter: InboundRecord, source: InboundRecord, command: Any, reason: str) -> None:
    """The dead letter carries the evidence: bytes, reason, exception, coordinates, command."""
    assert letter.value == source.value and letter.key == source.key, "the original record, untouched"
    assert header(letter, "tenure-dlq-reason") == reason
    assert header(letter, "tenure-dlq-source-topic") == source.topic
    assert int(header(letter, "tenure-dlq-source-partition")) == source.partition
    assert int(header(letter, "tenure-dlq-source-offset")) == source.offset
    assert header(letter, "tenure-dlq-command-id") == command.command_id
    assert header(letter, "tenure-dlq-command-type") == type(command).__name__
    assert header(letter, "tenure-dlq-run-id") == command.run_id
    assert header(letter, "tenure-dlq-exception")
    assert "Traceback" in header(letter, "tenure-dlq-traceback")
    assert header(letter, "tenure-dlq-detail").startswith(header(letter, "tenure-dlq-exception"))


class FailingDecide:
    """`decide` that raises for the commands named, and counts how often each is decided."""

    def __init__(self, *poisoned: str) -> None:
        self.poisoned = set(poisoned)
        self.calls: dict[str, int] = {}

    def __call__(self, state: Any, command: Any, *args: Any) -> Any:
        self.calls[command.command_id] = self.calls.get(command.command_id, 0) + 1
        if command.command_id in self.poisoned:
            raise KeyError(f"a defect in decide for {command.command_id}")
        return decide(state, command, *args)


# --- the Run processor -------------------------------------------------------------------------


def test_a_command_whose_decide_raises_is_dead_lettered_refused_and_the_partition_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The poison command is on tenure.deadletter with reason and coordinates; the other commands
    of its batch are decided and committed; the next batch is processed; a redelivery of the
    poison command is not decided again (DUR-1: one command id, one answer)."""
    log, store, topic = MemoryEventLog(), MemoryStore(), CommandTopic()
    failing = FailingDecide("s-poison")
    monkeypatch.setattr(run_processor, "decide", failing)
    processor = new_processor(log, store)
    before, poison, after = (
        submit_command("acme", "k1", command_id="s-1"),
        submit_command("acme", "k2", command_id="s-poison"),
        submit_command("acme", "k3", command_id="s-3"),
    )
    batch = [topic.record(before), topic.record(poison), topic.record(after)]

    outcome = processor.handle(batch)

    assert (outcome.commands, outcome.accepted, outcome.failed, outcome.events) == (3, 2, 1, 2)
    assert set(logged_events(log)) == {before.run_id, after.run_id}, "the rest of the batch committed"
    [letter] = dead_letters(log)
    assert_set_aside(letter, batch[1], poison, COMMAND_FAILED)
    assert header(letter, "tenure-dlq-exception") == "KeyError"
    [answer] = refusals(log)
    assert (answer.causation_id, answer.code, answer.command_type) == (
        "s-poison",
        COMMAND_FAILED,
        "SubmitRun",
    )
    assert "KeyError" in answer.detail and "a defect" not in answer.detail, "the type, never the message"
    assert_state_is_fold_of_log_dur_1(log, store)

    # The next batch is processed, and the redelivered poison command is not decided again.
    outcome = processor.handle([batch[1], topic.record(cancel_command(before.run_id, command_id="c-1"))])
    assert (outcome.duplicates, outcome.events, outcome.failed) == (1, 1, 0)
    assert failing.calls["s-poison"] == 1
    assert len(dead_letters(log)) == 1 and len(refusals(log)) == 1
    assert stored_states(store)[before.run_id].status is RunStatus.CANCELLED

    # A new incarnation with an empty store restores the refusal from runs.rejections.
    again = new_processor(log, MemoryStore())
    assert again.handle([batch[1]]).duplicates == 1
    assert failing.calls["s-poison"] == 1
    assert sample(processor, "tenure_deadletters_total", reason=COMMAND_FAILED) == 1
    assert sample(processor, "tenure_processor_commands_total", aggregate="run", outcome="failed") == 1
    assert sample(processor, "tenure_processor_commands_total", aggregate="run", outcome="accepted") == 3


def test_a_failing_command_leaves_no_change_in_the_batch_its_run_is_decided_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Decide against a copy, apply on success: the events of the failing command are decided (a
    cancel), then its evolve raises; the next command of the same run in the same batch sees the
    run as if the failing one had never come (still queued), and nothing of it is written."""
    log, store, topic = MemoryEventLog(), MemoryStore(), CommandTopic()
    real_evolve = run_processor.evolve

    def evolve(state: Any, event: Any) -> Any:
        if event.causation_id == "c-poison":
            raise ArithmeticError("a defect in evolve")
        return real_evolve(state, event)

    monkeypatch.setattr(run_processor, "evolve", evolve)
    submit = submit_command("acme", "k1", command_id="s-1")
    run_id = submit.run_id
    batch = [
        topic.record(submit),
        topic.record(cancel_command(run_id, command_id="c-poison")),
        topic.record(cancel_command(run_id, command_id="c-2", reason="the real cancel")),
    ]
    processor = new_processor(log, store)
    outcome = processor.handle(batch)

    assert (outcome.accepted, outcome.failed) == (2, 1)
    events = logged_events(log)[run_id]
    assert [type(e).__name__ for e in events] == ["RunSubmitted", "RunCancelled"]
    assert events[1].causation_id == "c-2", "decided against the state without the failed command"
    assert [e.version for e in events] == [1, 2]
    assert_set_aside(
        dead_letters(log)[0], batch[1], cancel_command(run_id, command_id="c-poison"), COMMAND_FAILED
    )
    assert_log_is_well_formed(log)
    assert_state_is_fold_of_log_dur_1(log, store)


def test_an_event_the_schema_cannot_hold_fails_its_command_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Encoding is part of handling one command: an Avro long that overflows is set aside."""
    log, store, topic = MemoryEventLog(), MemoryStore(), CommandTopic()

    def decide_overflowing(state: Any, command: Any, *args: Any) -> Any:
        decision = decide(state, command, *args)
        if command.command_id == "s-big":
            (event,) = decision
            return (RunSubmitted(**{**event.__dict__, "timeout_seconds": 2**40}),)
        return decision

    monkeypatch.setattr(run_processor, "decide", decide_overflowing)
    good, bad = (
        submit_command("acme", "k1", command_id="s-1"),
        submit_command("acme", "k2", command_id="s-big"),
    )
    batch = [topic.record(bad), topic.record(good)]
    outcome = new_processor(log, store).handle(batch)
    assert (outcome.accepted, outcome.failed) == (1, 1)
    assert set(logged_events(log)) == {good.run_id}
    assert_set_aside(dead_letters(log)[0], batch[0], bad, COMMAND_FAILED)
    assert_state_is_fold_of_log_dur_1(log, store)


def test_a_deeply_nested_execution_spec_is_set_aside_not_a_crash_loop() -> None:
    """A real defect: json.loads raises RecursionError (not ValueError) in `decide` for deep
    nesting. No injection: the domain as it is."""
    log, store, topic = MemoryEventLog(), MemoryStore(), CommandTopic()
    deep = submit_command("acme", "k-deep", spec="[" * 100_000 + "]" * 100_000, command_id="s-deep")
    good = submit_command("acme", "k1", command_id="s-1")
    batch = [topic.record(deep), topic.record(good)]
    outcome = new_processor(log, store).handle(batch)
    assert (outcome.accepted, outcome.failed) == (1, 1)
    [letter] = dead_letters(log)
    assert_set_aside(letter, batch[0], deep, COMMAND_FAILED)
    assert header(letter, "tenure-dlq-exception") == "RecursionError"
    assert len(header(letter, "tenure-dlq-traceback")) <= 4000, "a short traceback, not a thousand frames"
    assert_state_is_fold_of_log_dur_1(log, store)


def test_an_event_larger_than_a_kafka_record_is_refused_before_the_transaction() -> None:
    """A real defect class: canonical JSON spells 1e15 as 1000000000000000.0, so a 300 kB spec
    becomes a RunSubmitted over 1 MB, which the producer refuses (MSG_SIZE_TOO_LARGE) on every
    attempt. Caught per command, before anything is produced."""
    log, store, topic = MemoryEventLog(), MemoryStore(), CommandTopic()
    spec = json.dumps({"n": [1e15] * 60_000}, separators=(",", ":")).replace("1000000000000000.0", "1e15")
    big = submit_command("acme", "k-big", spec=spec, command_id="s-big")
    good = submit_command("acme", "k1", command_id="s-1")
    batch = [topic.record(big), topic.record(good)]
    assert len(batch[0].value) < MAX_RECORD_BYTES // 3, "the command itself is well within a record"
    outcome = new_processor(log, store).handle(batch)
    assert (outcome.accepted, outcome.failed) == (1, 1)
    assert_set_aside(dead_letters(log)[0], batch[0], big, RECORD_TOO_LARGE)
    [answer] = refusals(log)
    assert answer.code == RECORD_TOO_LARGE and str(MAX_RECORD_BYTES) in answer.detail
    assert all(record_bytes_of(r) <= MAX_RECORD_BYTES for r in log_records(log, RUNS_EVENTS.name))


def record_bytes_of(record: InboundRecord) -> int:
    return len(record.key or b"") + len(record.value) + sum(len(k) + len(v) for k, v in record.headers)


def test_a_dead_letter_of_a_record_near_the_limit_still_fits_in_one_record() -> None:
    """Dead-lettering adds headers; the original bytes are cut to fit, with size and sha256."""
    value = b"\xc3\x01" + b"x" * (MAX_RECORD_BYTES - 10)
    letter = deadletter_record(DEADLETTER.name, RUNS_COMMANDS.name, 0, 7, b"run_x", value, "BAD", "d" * 5000)
    assert record_bytes(letter) <= MAX_RECORD_BYTES
    headers = dict(letter.headers)
    assert headers["tenure-dlq-value-truncated"] == b"1"
    assert int(headers["tenure-dlq-value-bytes"]) == len(value)
    assert value.startswith(letter.value)
    small = deadletter_record(DEADLETTER.name, RUNS_COMMANDS.name, 0, 7, b"run_x", b"abc", "BAD", "d")
    assert small.value == b"abc" and "tenure-dlq-value-truncated" not in dict(small.headers)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    commands=command_sequences(max_size=14),
    sizes=st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=6),
    poisoned_steps=st.sets(st.integers(min_value=0, max_value=13), max_size=5),
)
def test_a_failing_command_is_exactly_a_refused_one_for_the_log_and_the_state_dur_1(
    commands: list[Any], sizes: list[int], poisoned_steps: set[int]
) -> None:
    """The contract, for any stream: the events and states are those of a run where each failing
    command was refused instead; each is dead-lettered once however often it is redelivered;
    the state is the log's fold (DUR-1)."""
    poisoned = {f"cmd-{step}" for step in poisoned_steps} & {c.command_id for c in commands}

    def refusing(state: Any, command: Any, *args: Any) -> Any:
        if command.command_id in poisoned:
            return Rejection(RejectionCode.INVALID_COMMAND, "refused instead")
        return decide(state, command, *args)

    def run(decide_with: Any) -> tuple[MemoryEventLog, MemoryStore]:
        log, store, topic = MemoryEventLog(), MemoryStore(), CommandTopic()
        processor = new_processor(log, store)
        with mock.patch.object(run_processor, "decide", decide_with):
            for batch in _batches([topic.record(c) for c in commands], sizes):
                processor._clock.advance(1_000)  # type: ignore[attr-defined]
                processor.handle(batch)
        return log, store

    failing_log, failing_store = run(FailingDecide(*poisoned))
    refused_log, refused_store = run(refusing)

    assert logged_events(failing_log) == logged_events(refused_log)
    assert stored_states(failing_store) == stored_states(refused_store)
    letters = [
        header(r, "tenure-dlq-command-id")
        for r in dead_letters(failing_log)
        if "tenure-dlq-exception" in dict(r.headers)
    ]
    assert sorted(letters) == sorted(poisoned), "each failing command dead-lettered exactly once"
    failed = [r for r in refusals(failing_log) if r.code == COMMAND_FAILED]
    assert {r.causation_id for r in failed} == poisoned and len(failed) == len(poisoned)
    assert_log_is_well_formed(failing_log)
    assert_state_is_fold_of_log_dur_1(failing_log, failing_store)


# --- timers ------------------------------------------------------------------------------------


def test_timer_work_that_raises_is_dead_lettered_once_and_skipped_until_its_run_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The other run's lease still goes at risk; the failing one is set aside once (not every
    tick, not after a restart on the same disk) and tried again once a renewal changes it."""
    coordinator = Coordinator()
    poisoned, healthy = _submitted(coordinator, "k1"), _submitted(coordinator, "k2")
    claimed = _claimed(coordinator, poisoned)
    _claimed(coordinator, healthy)
    real = run_processor.decide_timers
    calls: list[str] = []
    healed = False

    def decide_timers(state: Any, now: int, policy: Any) -> Any:
        calls.append(state.run_id)
        if state.run_id == poisoned and not healed:
            raise IndexError("a defect in decide_timers")
        return real(state, now, policy)

    monkeypatch.setattr(run_processor, "decide_timers", decide_timers)
    coordinator.at(T0 + AT_RISK_MS + 1)
    new = coordinator.tick()
    assert [(type(e), e.run_id) for e in new] == [(LeaseAtRisk, healthy)]
    [letter] = dead_letters(coordinator.log)
    assert header(letter, "tenure-dlq-reason") == TIMER_FAILED
    assert header(letter, "tenure-dlq-run-id") == poisoned
    assert int(header(letter, "tenure-dlq-state-version")) == coordinator.state(poisoned).version
    assert header(letter, "tenure-dlq-exception") == "IndexError"
    assert sample(coordinator.processor, "tenure_deadletters_total", reason=TIMER_FAILED) == 1

    coordinator.tick()
    restarted = coordinator.restart(keep_store=True)
    restarted.own(poisoned, healthy)
    restarted.tick()
    assert calls.count(poisoned) == 1, "skipped while its state is unchanged, across a restart"
    assert len(dead_letters(coordinator.log)) == 1

    healed = True
    restarted.send(renew_cmd(poisoned, claimed.attempt_id, claimed.epoch, 1))
    assert restarted.store.get(f"timerfail/{poisoned}") is None, "a change clears the skip marker"
    restarted.at(T0 + 2 * AT_RISK_MS + 2)
    assert any(e.run_id == poisoned for e in restarted.tick()), "tried again after the run changed"
    restarted.assert_consistent(poisoned, healthy)


# --- the saga orchestrator ---------------------------------------------------------------------


def test_pivot_gate_checks_that_are_not_objects_fail_one_command_and_the_saga_goes_on() -> None:
    """A real defect in the saga's decide: checks "[1]" raises AttributeError. The command is
    dead-lettered and refused on trajectories.rejections; another run's step in the same batch
    proceeds; a redelivery is dropped."""
    harness = Harness()
    broken, healthy = Client(harness, "acme"), Client(harness, "globex")
    harness.handle(broken.start(), healthy.start())
    harness.handle(broken.propose("dns.publish"))
    gate = broken.work()
    bad = broken.command(RecordPivotGate, step_index=gate.step_index, checks="[1]")  # type: ignore[union-attr]
    step = healthy.propose("vm.provision")
    harness.clock.advance(1_000)
    batch = [harness.topic.record(bad), harness.topic.record(step)]
    outcome = harness.processor.handle(batch)

    assert (outcome.failed, outcome.accepted) == (1, 1)
    [letter] = records(harness.log, DEADLETTER.name)
    assert_set_aside(letter, batch[0], bad, COMMAND_FAILED)
    assert header(letter, "tenure-dlq-source-topic") == TRAJECTORIES_COMMANDS.name
    assert header(letter, "tenure-dlq-exception") == "AttributeError"
    [answer] = [CODEC.decode(r.value) for r in records(harness.log, TRAJECTORIES_REJECTIONS.name)]
    assert (answer.causation_id, answer.code) == (bad.command_id, COMMAND_FAILED)
    assert healthy.state().steps, "the other run's step was proposed"
    assert broken.state().steps[0].status.value == "awaiting-gate", "the broken run is unchanged"

    again = harness.processor.handle([batch[0]])
    assert (again.duplicates, again.failed) == (1, 0)
    assert len(records(harness.log, DEADLETTER.name)) == 1
    assert sample(harness.processor, "tenure_deadletters_total", reason=COMMAND_FAILED) == 1


def test_the_saga_discards_the_state_and_statistics_of_a_command_whose_decide_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = saga_processor.decide

    def decide(state: Any, command: Any, now: int, context: Any) -> Any:
        if command.command_id.endswith("-poison"):
            raise MemoryError("a defect")
        return real(state, command, now, context)

    monkeypatch.setattr(saga_processor, "decide", decide)
    harness = Harness()
    client = Client(harness, "acme")
    poison = client.start(command_id=f"{client.run_id}-poison")
    outcome = harness.handle(poison, client.start())
    assert (outcome.failed, outcome.accepted) == (1, 1)
    assert client.state().version == 1
    fresh = harness.reopen()
    assert fresh.handle(poison).duplicates == 1, "restored as refused from the rejections topic"
