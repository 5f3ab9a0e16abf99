"""The pure Run aggregate: `decide` (command -> events | rejection) and `evolve`/`fold` (replay).

Proves EXE-2 (submission records the Run with its queue reservation, deterministic ids),
EXE-7 (cancel of a queued run releases the reservation and ends it at once), EXE-9 (the spec is
immutable for the life of a Run) and the replay half of DUR-1 (state == fold of its events).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import itertools
import json
import time
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from services.common.contracts import RunCancelled, RunCommand, RunEvent, RunSubmitted, SubmitRun
from services.common.ids import run_id_for
from services.common.sequencing import VersionGap
from services.lease_coordinator.domain import (
    TERMINAL_STATUSES,
    IllegalTransition,
    Rejection,
    RejectionCode,
    RunState,
    RunStatus,
    decide,
    evolve,
    fold,
)
from services.lease_coordinator.domain.run import MAX_ATTEMPTS_LIMIT, MAX_TIMEOUT_SECONDS, rejection_event

from .strategies import (
    RUN_SLOTS,
    SPEC_TEXTS,
    cancel_command,
    command_sequences,
    json_objects,
    reversed_key_order_json,
    submit_command,
)

NOW = 1_767_225_600_500


def _canonical(value: Any) -> str:
    # Written out independently of services.common.ids: sorted keys, no insignificant whitespace.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(_canonical(value).encode("utf-8")).hexdigest()


def _events(decision: object) -> tuple[RunEvent, ...]:
    assert not isinstance(decision, Rejection), f"expected events, got {decision}"
    assert isinstance(decision, tuple)
    return decision


def _rejection(decision: object) -> Rejection:
    assert isinstance(decision, Rejection), f"expected a rejection, got {decision}"
    return decision


def _submitted(command: SubmitRun | None = None, now: int = NOW) -> tuple[RunState, RunSubmitted]:
    command = command or submit_command()
    (event,) = _events(decide(None, command, now))
    assert isinstance(event, RunSubmitted)
    return evolve(None, event), event


# --- SubmitRun ---------------------------------------------------------------------------------


def test_submit_records_the_run_with_its_queue_reservation_exe_2() -> None:
    command = submit_command(retry_safe=True, timeout_seconds=7200, max_attempts=5)
    (event,) = _events(decide(None, command, NOW))

    assert isinstance(event, RunSubmitted)
    assert event.run_id == run_id_for("acme", "key-1") == command.run_id
    assert event.version == 1
    assert event.causation_id == command.command_id
    assert event.correlation_id == command.correlation_id
    assert event.actor == command.actor
    assert (event.tenant, event.idempotency_key) == ("acme", "key-1")
    assert (event.retry_safe, event.timeout_seconds, event.max_attempts) == (True, 7200, 5)
    spec = json.loads(SPEC_TEXTS[0])
    assert event.execution_spec == _canonical(spec)
    assert event.spec_digest == _digest(spec)
    # EXE-2: the reservation is part of the same (single, atomic) event as the Run itself.
    assert event.queue_reservation_id
    state = evolve(None, event)
    assert state.status is RunStatus.QUEUED
    assert state.queue_reservation_id == event.queue_reservation_id
    assert state.handled_commands == (command.command_id,)


def test_submit_is_deterministic_same_command_same_state_same_events_exe_2() -> None:
    """Redelivery safety: deciding one command twice on one state yields identical events."""
    command = submit_command()
    assert decide(None, command, NOW) == decide(None, command, NOW)
    other = dataclasses.replace(command, command_id="cmd-other")
    (first,) = _events(decide(None, command, NOW))
    (second,) = _events(decide(None, other, NOW))
    assert first.event_id != second.event_id, "event ids are derived from the causing command"
    # The reservation belongs to the run (dispatch is idempotent by runId), not to the command.
    assert isinstance(first, RunSubmitted) and isinstance(second, RunSubmitted)
    assert first.queue_reservation_id == second.queue_reservation_id


def test_reservations_of_different_runs_differ() -> None:
    _, one = _submitted(submit_command("acme", "key-1"))
    _, two = _submitted(submit_command("acme", "key-2"))
    assert one.queue_reservation_id != two.queue_reservation_id


@settings(max_examples=60, deadline=None)
@given(spec=json_objects())
def test_spec_digest_is_of_canonical_json_key_order_irrelevant(spec: dict[str, Any]) -> None:
    compact = submit_command(spec=json.dumps(spec))
    reordered = submit_command(spec=reversed_key_order_json(spec), command_id="cmd-2")
    (a,) = _events(decide(None, compact, NOW))
    (b,) = _events(decide(None, reordered, NOW))
    assert isinstance(a, RunSubmitted) and isinstance(b, RunSubmitted)
    assert a.spec_digest == b.spec_digest == _digest(spec)
    assert a.execution_spec == b.execution_spec == _canonical(spec)


def test_duplicate_submit_with_the_same_spec_yields_no_events() -> None:
    state, _ = _submitted(submit_command(spec=SPEC_TEXTS[0]))
    again = submit_command(spec=SPEC_TEXTS[1], command_id="cmd-retry")  # same object, keys reordered
    assert decide(state, again, NOW + 1) == ()


def test_duplicate_submit_after_cancel_still_yields_no_events() -> None:
    state, _ = _submitted()
    (cancelled,) = _events(decide(state, cancel_command(state.run_id), NOW + 1))
    state = evolve(state, cancelled)
    assert decide(state, submit_command(command_id="cmd-late-retry"), NOW + 2) == ()


def test_same_key_different_spec_is_an_idempotency_key_conflict() -> None:
    state, first = _submitted(submit_command(spec=SPEC_TEXTS[0]))
    conflicting = submit_command(spec=SPEC_TEXTS[2], command_id="cmd-2")
    rejection = _rejection(decide(state, conflicting, NOW))
    assert rejection.code is RejectionCode.IDEMPOTENCY_KEY_CONFLICT
    assert first.spec_digest in rejection.detail
    assert _digest(json.loads(SPEC_TEXTS[2])) in rejection.detail


def test_run_id_not_derived_from_tenant_and_key_is_rejected() -> None:
    rejection = _rejection(decide(None, submit_command(run_id="run_chosen_by_caller"), NOW))
    assert rejection.code is RejectionCode.RUN_ID_MISMATCH
    assert run_id_for("acme", "key-1") in rejection.detail


@pytest.mark.parametrize(
    ("changes", "detail_fragment"),
    [
        ({"tenant": ""}, "tenant"),
        ({"tenant": "   "}, "tenant"),
        ({"idempotency_key": ""}, "idempotencyKey"),
        ({"idempotency_key": " \t"}, "idempotencyKey"),
        ({"timeout_seconds": 0}, "timeoutSeconds"),
        ({"timeout_seconds": -5}, "timeoutSeconds"),
        ({"timeout_seconds": MAX_TIMEOUT_SECONDS + 1}, "timeoutSeconds"),
        ({"max_attempts": 0}, "maxAttempts"),
        ({"max_attempts": MAX_ATTEMPTS_LIMIT + 1}, "maxAttempts"),
        ({"execution_spec": "{not json"}, "not JSON"),
        ({"execution_spec": ""}, "not JSON"),
        ({"execution_spec": "[1, 2]"}, "JSON object"),
        ({"execution_spec": '"a string"'}, "JSON object"),
        ({"execution_spec": "42"}, "JSON object"),
        ({"execution_spec": "null"}, "JSON object"),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else None,
)
def test_each_invalid_submission_is_rejected_as_invalid_command(
    changes: dict[str, Any], detail_fragment: str
) -> None:
    fields = {"tenant": "acme", "idempotency_key": "key-1", **changes}
    command = dataclasses.replace(
        submit_command(),
        **changes,
        run_id=run_id_for(fields["tenant"], fields["idempotency_key"]),
    )
    rejection = _rejection(decide(None, command, NOW))
    assert rejection.code is RejectionCode.INVALID_COMMAND
    assert detail_fragment in rejection.detail


@pytest.mark.parametrize(
    "changes",
    [
        {"timeout_seconds": 1},
        {"timeout_seconds": MAX_TIMEOUT_SECONDS},
        {"max_attempts": 1},
        {"max_attempts": MAX_ATTEMPTS_LIMIT},
        {"execution_spec": "{}"},
    ],
    ids=repr,
)
def test_boundary_values_are_accepted(changes: dict[str, Any]) -> None:
    (event,) = _events(decide(None, dataclasses.replace(submit_command(), **changes), NOW))
    assert isinstance(event, RunSubmitted)


# --- CancelRun ---------------------------------------------------------------------------------


def test_cancel_of_a_queued_run_ends_it_and_releases_the_reservation_exe_7() -> None:
    state, _ = _submitted()
    command = cancel_command(state.run_id, reason="changed my mind")
    (event,) = _events(decide(state, command, NOW + 10))
    assert isinstance(event, RunCancelled)
    assert (event.run_id, event.version, event.occurred_at) == (state.run_id, 2, NOW + 10)
    assert event.causation_id == command.command_id
    assert event.previous_status == "queued"
    assert event.reservation_released is True
    assert event.reason == "changed my mind"
    after = evolve(state, event)
    assert after.status is RunStatus.CANCELLED
    assert after.queue_reservation_id is None
    assert after.version == 2
    assert after.handled_commands == (*state.handled_commands, command.command_id)
    assert decide(state, command, NOW + 10) == (event,), "deterministic, like submit"


def test_cancel_of_an_unknown_run_is_run_not_found() -> None:
    rejection = _rejection(decide(None, cancel_command("run_nobody"), NOW))
    assert rejection.code is RejectionCode.RUN_NOT_FOUND
    assert "run_nobody" in rejection.detail


def test_cancel_of_a_terminal_run_is_run_already_terminal() -> None:
    state, _ = _submitted()
    (event,) = _events(decide(state, cancel_command(state.run_id), NOW))
    state = evolve(state, event)
    rejection = _rejection(decide(state, cancel_command(state.run_id, command_id="cmd-cancel-2"), NOW))
    assert rejection.code is RejectionCode.RUN_ALREADY_TERMINAL
    assert "cancelled" in rejection.detail


@pytest.mark.parametrize("status", [RunStatus.WAITING_INPUT, RunStatus.INTERRUPTED], ids=lambda s: s.value)
def test_cancel_of_a_run_nobody_holds_ends_it_at_once_exe_7(status: RunStatus) -> None:
    """EXE-7: with no runner holding the run there is nobody to confirm: cancelled at once."""
    state, _ = _submitted()
    state = dataclasses.replace(state, status=status)
    (event,) = _events(decide(state, cancel_command(state.run_id), NOW))
    assert isinstance(event, RunCancelled) and event.previous_status == status.value
    assert evolve(state, event).status is RunStatus.CANCELLED


def test_cancel_of_a_run_already_stopping_is_refused_exe_7() -> None:
    state, _ = _submitted()
    state = dataclasses.replace(state, status=RunStatus.CANCELLING)
    rejection = _rejection(decide(state, cancel_command(state.run_id), NOW))
    assert rejection.code is RejectionCode.CANCEL_ALREADY_REQUESTED


@pytest.mark.parametrize("status", sorted(TERMINAL_STATUSES, key=lambda s: s.value), ids=lambda s: s.value)
def test_cancel_of_any_terminal_status_is_run_already_terminal(status: RunStatus) -> None:
    state, _ = _submitted()
    state = dataclasses.replace(state, status=status)
    rejection = _rejection(decide(state, cancel_command(state.run_id), NOW))
    assert rejection.code is RejectionCode.RUN_ALREADY_TERMINAL


def test_a_redelivered_command_id_yields_no_events() -> None:
    submit = submit_command()
    state, _ = _submitted(submit)
    assert decide(state, submit, NOW + 5) == ()
    cancel = cancel_command(state.run_id)
    (event,) = _events(decide(state, cancel, NOW + 6))
    state = evolve(state, event)
    # Without the handled-command check this would be RUN_ALREADY_TERMINAL: a redelivery must
    # not turn an accepted cancel into a rejection.
    assert decide(state, cancel, NOW + 7) == ()
    assert decide(state, submit, NOW + 8) == ()


def test_rejection_event_answers_the_sender_with_the_current_state() -> None:
    state, _ = _submitted()
    command = submit_command(spec=SPEC_TEXTS[2], command_id="cmd-conflict")
    rejection = _rejection(decide(state, command, NOW))
    answer = rejection_event(state, command, rejection, NOW + 3)
    assert answer.causation_id == "cmd-conflict"
    assert answer.code == "IDEMPOTENCY_KEY_CONFLICT"
    assert answer.command_type == "SubmitRun"
    assert (answer.current_status, answer.current_version, answer.occurred_at) == ("queued", 1, NOW + 3)
    assert answer == rejection_event(state, command, rejection, NOW + 3), "deterministic id"
    missing = rejection_event(None, cancel_command("run_x"), Rejection(RejectionCode.RUN_NOT_FOUND, "x"), NOW)
    assert (missing.current_status, missing.current_version) == (None, 0)


# --- time --------------------------------------------------------------------------------------


def test_occurred_at_is_the_clock_value_passed_in_and_no_clock_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_clock(*_: object) -> float:
        raise AssertionError("the domain read a clock")

    for name in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter"):
        monkeypatch.setattr(time, name, no_clock)

    class FrozenDatetime(datetime.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            raise AssertionError("the domain read a clock")

    monkeypatch.setattr(datetime, "datetime", FrozenDatetime)

    state, submitted = _submitted(now=12345)
    assert submitted.occurred_at == 12345
    assert state.submitted_at == 12345
    (cancelled,) = _events(decide(state, cancel_command(state.run_id), 99))
    assert cancelled.occurred_at == 99, "the domain never 'corrects' a clock value"


# --- evolve ------------------------------------------------------------------------------------


def test_evolve_refuses_a_version_gap() -> None:
    state, _ = _submitted()
    (cancelled,) = _events(decide(state, cancel_command(state.run_id), NOW))
    with pytest.raises(VersionGap) as raised:
        evolve(state, dataclasses.replace(cancelled, version=3))
    assert (raised.value.current, raised.value.received) == (1, 3)
    _, submitted = _submitted()
    with pytest.raises(VersionGap):
        evolve(None, dataclasses.replace(submitted, version=2))
    with pytest.raises(VersionGap):
        fold([submitted, dataclasses.replace(cancelled, version=5)])


def test_evolve_refuses_duplicates() -> None:
    state, submitted = _submitted()
    with pytest.raises(ValueError, match="already applied"):
        evolve(state, submitted)
    (cancelled,) = _events(decide(state, cancel_command(state.run_id), NOW))
    after = evolve(state, cancelled)
    with pytest.raises(ValueError, match="already applied"):
        evolve(after, cancelled)


def test_evolve_refuses_events_out_of_their_lifecycle() -> None:
    state, submitted = _submitted()
    with pytest.raises(ValueError, match="already submitted"):
        evolve(state, dataclasses.replace(submitted, version=2))
    (cancelled,) = _events(decide(state, cancel_command(state.run_id), NOW))
    with pytest.raises(ValueError, match="before it exists"):
        evolve(None, dataclasses.replace(cancelled, version=1))
    after = evolve(state, cancelled)
    with pytest.raises(IllegalTransition):
        evolve(after, dataclasses.replace(cancelled, version=3, event_id="evt_again"))


def test_fold_of_nothing_is_nothing_and_fold_continues_from_a_state() -> None:
    state, submitted = _submitted()
    (cancelled,) = _events(decide(state, cancel_command(state.run_id), NOW))
    assert fold([]) is None
    assert fold([cancelled], state) == fold([submitted, cancelled])


# --- properties over random command streams ----------------------------------------------------


class _Run:
    """Drives decide/evolve over a command stream and records everything the properties need."""

    def __init__(self) -> None:
        self.states: dict[str, RunState] = {}
        self.history: dict[str, list[RunState]] = defaultdict(list)
        self.events: dict[str, list[RunEvent]] = defaultdict(list)
        self.decided: set[str] = set()
        self.now = NOW

    def apply(self, command: RunCommand) -> object:
        self.now += 7
        state = self.states.get(command.run_id)
        decision = decide(state, command, self.now)
        self.decided.add(command.command_id)
        if isinstance(decision, Rejection):
            return decision
        for event in decision:
            assert event.occurred_at == self.now
            state = evolve(state, event)
            self.events[event.run_id].append(event)
            self.history[event.run_id].append(state)
        if state is not None:
            self.states[state.run_id] = state
        return decision


def _assert_invariants(run: _Run) -> None:
    all_events = [e for events in run.events.values() for e in events]
    assert len({e.event_id for e in all_events}) == len(all_events), "an event was produced twice"
    for run_id, events in run.events.items():
        assert [e.version for e in events] == list(range(1, len(events) + 1)), "versions +1 each"
        assert all(e.run_id == run_id for e in events)
        history = run.history[run_id]
        for before, after in itertools.pairwise(history):
            assert before.status not in TERMINAL_STATUSES, f"{run_id} left terminal {before.status}"
            assert after.version == before.version + 1
        assert len({s.spec_digest for s in history}) == 1, "EXE-9: the spec never changes"
        assert len({s.execution_spec for s in history}) == 1
        state = run.states[run_id]
        causes = {e.causation_id for e in events}
        assert causes <= run.decided, "every event is caused by a command that was handled"
        assert causes == set(state.handled_commands)
        assert (state.queue_reservation_id is None) == (state.status is RunStatus.CANCELLED)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commands=command_sequences())
def test_replay_equals_incremental_dur_1(commands: list[RunCommand]) -> None:
    """DUR-1: folding a run's events from scratch gives exactly the incrementally evolved state."""
    run = _Run()
    for command in commands:
        run.apply(command)
    for run_id, state in run.states.items():
        assert fold(run.events[run_id]) == state
        # Any split point works too: a snapshot plus the tail equals the whole replay.
        for cut in range(len(run.events[run_id]) + 1):
            assert fold(run.events[run_id][cut:], fold(run.events[run_id][:cut])) == state


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commands=command_sequences())
def test_random_command_sequences_never_break_an_invariant(commands: list[RunCommand]) -> None:
    """EXE-2/EXE-7/EXE-9 invariants hold after every step of any command stream."""
    run = _Run()
    for command in commands:
        run.apply(command)
        _assert_invariants(run)


@settings(max_examples=100, deadline=None)
@given(commands=command_sequences(), data=st.data())
def test_redelivering_any_accepted_command_changes_nothing(
    commands: list[RunCommand], data: st.DataObject
) -> None:
    run = _Run()
    accepted: list[RunCommand] = []
    for command in commands:
        decision = run.apply(command)
        if isinstance(decision, tuple) and decision:
            accepted.append(command)
    if accepted:
        command = data.draw(st.sampled_from(accepted))
        assert decide(run.states[command.run_id], command, run.now + 1) == ()


class RunAggregateMachine(RuleBasedStateMachine):
    """Submit / cancel / duplicate / redeliver against a tiny reference model of the aggregate."""

    commands = Bundle("commands")

    def __init__(self) -> None:
        super().__init__()
        self.run = _Run()
        self.accepted: set[str] = set()
        self.spec_of: dict[str, str] = {}
        self.counter = 0

    def _next_id(self) -> str:
        self.counter += 1
        return f"m-{self.counter}"

    def _record(self, command: RunCommand) -> object:
        decision = self.run.apply(command)
        if isinstance(decision, tuple) and decision:
            self.accepted.add(command.command_id)
        return decision

    @rule(target=commands, slot=st.sampled_from(RUN_SLOTS), spec=st.sampled_from(SPEC_TEXTS))
    def submit(self, slot: tuple[str, str], spec: str) -> RunCommand:
        command = submit_command(*slot, spec, command_id=self._next_id())
        existing = self.run.states.get(command.run_id)
        decision = self._record(command)
        if existing is None:
            (event,) = _events(decision)
            assert isinstance(event, RunSubmitted) and event.version == 1
            self.spec_of[command.run_id] = spec
        elif _canonical(json.loads(spec)) == existing.execution_spec:
            assert decision == ()
        else:
            assert _rejection(decision).code is RejectionCode.IDEMPOTENCY_KEY_CONFLICT
        return command

    @rule(target=commands, slot=st.sampled_from(RUN_SLOTS))
    def duplicate_submit(self, slot: tuple[str, str]) -> RunCommand:
        run_id = run_id_for(*slot)
        spec = self.spec_of.get(run_id, SPEC_TEXTS[3])
        command = submit_command(*slot, spec, command_id=self._next_id())
        existed = run_id in self.run.states
        decision = self._record(command)
        if existed:
            assert decision == (), "a retried submission with the same spec is the same run"
        else:
            self.spec_of[run_id] = spec
        return command

    @rule(target=commands, slot=st.sampled_from(RUN_SLOTS))
    def cancel(self, slot: tuple[str, str]) -> RunCommand:
        run_id = run_id_for(*slot)
        command = cancel_command(run_id, command_id=self._next_id())
        existing = self.run.states.get(run_id)
        decision = self._record(command)
        if existing is None:
            assert _rejection(decision).code is RejectionCode.RUN_NOT_FOUND
        elif existing.status in TERMINAL_STATUSES:
            assert _rejection(decision).code is RejectionCode.RUN_ALREADY_TERMINAL
        else:
            (event,) = _events(decision)
            assert isinstance(event, RunCancelled) and event.reservation_released
        return command

    @rule(command=commands)
    def redeliver(self, command: RunCommand) -> None:
        # The pure domain remembers accepted commands only (in handled_commands); a rejected one
        # is simply decided again against the state of now. Whether a *processor* may do that
        # is a different question (see test_run_processor.py).
        was_accepted = command.command_id in self.accepted
        before = dict(self.run.states)
        decision = self._record(command)
        if was_accepted:
            assert decision == ()
            assert self.run.states == before

    @invariant()
    def every_run_is_the_fold_of_its_events(self) -> None:
        for run_id, state in self.run.states.items():
            assert fold(self.run.events[run_id]) == state

    @invariant()
    def invariants_hold(self) -> None:
        _assert_invariants(self.run)


TestRunAggregateMachine = RunAggregateMachine.TestCase
TestRunAggregateMachine.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
