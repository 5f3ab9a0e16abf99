"""The reconciler racing a command, in both orders, at the same coordinator `now` (EXE-12).

The reconciler is `decide_timers` run until nothing is due. For each timer rule (lease expiry,
deadline, end of a cancel's grace period, input expiry) a state is built where the timer and a
command meet at one `now`, and both orders are decided from that same state:

(a) command first, then the reconciler;
(b) the reconciler first, then the command.

Each order is deterministic (deciding the same state, command and `now` twice gives identical
events), the order that lost is refused with a specific code and changes nothing, and the
outcomes are consistent with EXE-1/EXE-5/EXE-7/EXE-8/EXE-10: a success never overrides a stop,
a missing confirmation never becomes a false `cancelled`, and where the boundary is strict
(`now >= expires_at`) both orders end in the very same state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from services.common.contracts import (
    AttemptReported,
    CancelRun,
    DeadlineReached,
    InputProvided,
    LeaseAtRisk,
    LeaseExpired,
    ProvideInput,
    RequestInput,
    RetryRun,
    RunCancelled,
    RunCancelRequested,
    RunCommand,
    RunEvent,
    RunFailed,
    RunInterrupted,
    RunRequeued,
)
from services.lease_coordinator.domain import (
    TERMINAL_STATUSES,
    Decision,
    LeaseCertainty,
    LeasePolicy,
    Rejection,
    RejectionCode,
    RunState,
    RunStatus,
    StopKind,
    decide,
    decide_timers,
    evolve,
    next_timer_at,
)
from tests.support.lease_run import T0, claim_cmd, renew_cmd, report_cmd

from .strategies import submit_command

GRACE_MS = 30_000
POLICY = LeasePolicy(stop_grace_ms=GRACE_MS)
_MAX_TIMER_ROUNDS = 8


# --- a run frozen at one moment, and the two orders ------------------------------------------


@dataclasses.dataclass(frozen=True)
class Scene:
    """A run's state and the coordinator's `now`; immutable, so both orders start from it."""

    state: RunState
    now: int
    policy: LeasePolicy = POLICY

    def at(self, now: int) -> Scene:
        assert now >= self.now, "the coordinator's clock never goes back"
        return dataclasses.replace(self, now=now)

    def decide(self, command: RunCommand) -> Decision:
        return decide(self.state, command, self.now, self.policy)

    def accept(self, command: RunCommand) -> Scene:
        decision = self.decide(command)
        assert not isinstance(decision, Rejection), decision
        return self.applied(decision)

    def applied(self, events: tuple[RunEvent, ...]) -> Scene:
        state = self.state
        for event in events:
            state = evolve(state, event)
        return dataclasses.replace(self, state=state)

    def reconcile(self) -> tuple[tuple[RunEvent, ...], Scene]:
        """`decide_timers` until nothing is due, as the coordinator's timer tick does."""
        scene: Scene = self
        emitted: tuple[RunEvent, ...] = ()
        for _ in range(_MAX_TIMER_ROUNDS):
            events = decide_timers(scene.state, scene.now, scene.policy)
            if not events:
                due = next_timer_at(scene.state)
                assert due is None or due > scene.now, "a due timer was left undecided"
                return emitted, scene
            emitted, scene = (*emitted, *events), scene.applied(events)
        raise AssertionError(f"the reconciler never settled: {emitted}")


@dataclasses.dataclass(frozen=True)
class Outcome:
    decision: Decision
    timer_events: tuple[RunEvent, ...]
    final: RunState

    @property
    def refused(self) -> Rejection:
        assert isinstance(self.decision, Rejection), f"expected a refusal, got {self.decision}"
        return self.decision

    @property
    def accepted(self) -> tuple[RunEvent, ...]:
        assert not isinstance(self.decision, Rejection), f"expected events, got {self.decision}"
        return self.decision


def command_then_timers(scene: Scene, command: RunCommand) -> Outcome:
    decision = scene.decide(command)
    after = scene if isinstance(decision, Rejection) else scene.applied(decision)
    if isinstance(decision, Rejection):
        assert after.state == scene.state
    timer_events, final = after.reconcile()
    return Outcome(decision, timer_events, final.state)


def timers_then_command(scene: Scene, command: RunCommand) -> Outcome:
    timer_events, after = scene.reconcile()
    decision = after.decide(command)
    if isinstance(decision, Rejection):
        return Outcome(decision, timer_events, after.state)
    return Outcome(decision, timer_events, after.applied(decision).state)


def _types(events: tuple[RunEvent, ...]) -> list[str]:
    return [type(e).__name__ for e in events]


# --- building the scenes ----------------------------------------------------------------------


def running(
    *, timeout_seconds: int = 3600, retry_safe: bool = False, lease_seconds: int = 60, max_attempts: int = 3
) -> Scene:
    """Submitted and claimed at T0 by runner-a, first heartbeat at T0 + 1 s: running."""
    submit = submit_command(
        command_id=f"race-submit-{timeout_seconds}-{retry_safe}-{lease_seconds}",
        timeout_seconds=timeout_seconds,
        retry_safe=retry_safe,
        max_attempts=max_attempts,
    )
    decision = decide(None, submit, T0, POLICY)
    assert not isinstance(decision, Rejection)
    state = None
    for event in decision:
        state = evolve(state, event)
    assert state is not None
    scene = Scene(state, T0).accept(
        claim_cmd(state.run_id, "runner-a", lease_seconds=lease_seconds, command_id="race-claim")
    )
    lease = scene.state.lease
    assert lease is not None
    scene = scene.at(T0 + 1_000).accept(
        renew_cmd(state.run_id, lease.attempt_id, lease.epoch, 1, command_id="race-renew-1")
    )
    assert scene.state.status is RunStatus.RUNNING
    return scene


def success_report(scene: Scene, *, sequence: int = 2, verified: bool = True) -> RunCommand:
    lease = scene.state.lease
    assert lease is not None
    command = report_cmd(
        scene.state.run_id, lease.attempt_id, lease.epoch, sequence, "succeeded", command_id="race-report"
    )
    return dataclasses.replace(command, manifest_verified=verified)


def cancel_confirmation(scene: Scene, *, outcome: str = "cancelled") -> RunCommand:
    lease = scene.state.lease
    assert lease is not None
    return report_cmd(
        scene.state.run_id, lease.attempt_id, lease.epoch, 2, outcome, command_id=f"race-confirm-{outcome}"
    )


def cancel(scene: Scene, command_id: str = "race-cancel") -> CancelRun:
    return CancelRun(
        command_id=command_id,
        run_id=scene.state.run_id,
        issued_at=scene.now,
        correlation_id="corr-cancel",
        actor="user:alice",
        reason="not needed any more",
    )


def request_input(scene: Scene, expires_at: int) -> RequestInput:
    lease = scene.state.lease
    assert lease is not None
    return RequestInput(
        command_id="race-input",
        run_id=scene.state.run_id,
        issued_at=scene.now,
        correlation_id=lease.attempt_id,
        actor="runner",
        attempt_id=lease.attempt_id,
        lease_epoch=lease.epoch,
        sequence=2,
        checkpoint_digest="sha256:" + "c" * 64,
        input_schema='{"type":"string"}',
        prompt="Which branch should I deploy?",
        expires_at=expires_at,
    )


def answer(scene: Scene, response_id: str = "resp-1", command_id: str = "race-answer") -> ProvideInput:
    return ProvideInput(
        command_id=command_id,
        run_id=scene.state.run_id,
        issued_at=scene.now,
        correlation_id="corr-answer",
        actor="user:alice",
        response_id=response_id,
        answer='"main"',
    )


def waiting_for_input(*, expires_in_ms: int = 10_000, timeout_seconds: int = 3600) -> Scene:
    scene = running(timeout_seconds=timeout_seconds).at(T0 + 2_000)
    scene = scene.accept(request_input(scene, expires_at=scene.now + expires_in_ms))
    assert scene.state.status is RunStatus.WAITING_INPUT
    return scene


def cancelling(*, grace_ms: int = GRACE_MS) -> Scene:
    """Running with a 60 s lease renewed at T0 + 1 s; the user cancels at T0 + 2 s."""
    scene = running(lease_seconds=60).at(T0 + 2_000)
    scene = dataclasses.replace(scene, policy=LeasePolicy(stop_grace_ms=grace_ms)).accept(cancel(scene))
    assert scene.state.status is RunStatus.CANCELLING and scene.state.stop is not None
    return scene


# --- lease expiry vs. a success report (EXE-4, EXE-5, LEASE-5) --------------------------------


def test_report_one_ms_before_lease_expiry_stands_in_both_orders_lease_4_exe_4() -> None:
    """Before `expires_at` the holder still holds: at-risk is jeopardy, not loss (LEASE-4)."""
    scene = running(lease_seconds=60)
    lease = scene.state.lease
    assert lease is not None
    scene = scene.at(lease.expires_at - 1)
    report = success_report(scene)

    first = command_then_timers(scene, report)
    assert _types(first.accepted) == ["AttemptReported"]
    assert first.timer_events == (), "the run ended: the reconciler finds nothing to do"
    assert first.final.status is RunStatus.SUCCEEDED

    second = timers_then_command(scene, report)
    assert all(isinstance(e, LeaseAtRisk) for e in second.timer_events) and second.timer_events
    assert _types(second.accepted) == ["AttemptReported"]
    assert second.final.status is RunStatus.SUCCEEDED
    for outcome in (first, second):
        assert outcome.final.lease is not None
        assert outcome.final.lease.certainty is LeaseCertainty.RELEASED
        assert next_timer_at(outcome.final) is None


@pytest.mark.parametrize("retry_safe", [False, True], ids=["not-retry-safe", "retry-safe"])
@pytest.mark.parametrize("late_ms", [0, 1, 45_000])
def test_report_at_or_after_lease_expiry_is_refused_in_both_orders_same_end_exe_4_exe_5(
    retry_safe: bool, late_ms: int
) -> None:
    """At `now >= expires_at` the fence and the timer agree: the report is refused
    LEASE_EXPIRED whoever goes first, and both orders end in the very same state."""
    scene = running(lease_seconds=60, retry_safe=retry_safe)
    lease = scene.state.lease
    assert lease is not None
    scene = scene.at(lease.expires_at + late_ms)
    report = success_report(scene)

    first = command_then_timers(scene, report)
    second = timers_then_command(scene, report)
    assert first.refused.code is RejectionCode.LEASE_EXPIRED
    assert second.refused.code is RejectionCode.LEASE_EXPIRED
    assert first.timer_events == second.timer_events, "the refused report changed nothing"
    assert first.final == second.final
    expected = ["LeaseExpired", "RunRequeued"] if retry_safe else ["LeaseExpired"]
    assert _types(first.timer_events) == expected
    assert first.final.status is (RunStatus.QUEUED if retry_safe else RunStatus.INTERRUPTED)


def test_expired_holders_report_after_the_run_was_claimed_again_is_stale_epoch_lease_3() -> None:
    scene = running(lease_seconds=60, retry_safe=True)
    old = scene.state.lease
    assert old is not None
    _, scene = scene.at(old.expires_at).reconcile()
    assert scene.state.status is RunStatus.QUEUED
    scene = scene.accept(claim_cmd(scene.state.run_id, "runner-b", command_id="race-claim-b"))
    late = report_cmd(scene.state.run_id, old.attempt_id, old.epoch, 2, "succeeded", command_id="race-late")

    outcome = command_then_timers(scene, late)
    assert outcome.refused.code is RejectionCode.STALE_EPOCH
    assert outcome.final == scene.state, "a stale epoch changes nothing (EXE-4)"
    assert outcome.timer_events == ()


# --- deadline vs. a success report (EXE-10, EXE-1) --------------------------------------------


def _at_deadline(offset_ms: int = 0) -> Scene:
    scene = running(timeout_seconds=20, lease_seconds=60)  # deadline T0 + 20 s, lease to T0 + 61 s
    deadline = scene.state.deadline_at
    assert deadline == T0 + 20_000
    return scene.at(deadline + offset_ms)


def test_deadline_vs_success_report_command_first_the_verified_success_stands_exe_10() -> None:
    scene = _at_deadline()
    outcome = command_then_timers(scene, success_report(scene))
    assert _types(outcome.accepted) == ["AttemptReported"]
    assert outcome.final.status is RunStatus.SUCCEEDED
    assert outcome.timer_events == (), "the run ended: the deadline has nothing left to stop"
    assert next_timer_at(outcome.final) is None


def test_deadline_vs_success_report_timers_first_the_report_only_confirms_the_stop_exe_10() -> None:
    """The deadline asked the runner to stop; a success arriving now is its confirmation of
    that stop, so the run ends `failed` (EXE-10), never `succeeded`."""
    scene = _at_deadline()
    outcome = timers_then_command(scene, success_report(scene))
    (reached,) = outcome.timer_events
    assert isinstance(reached, DeadlineReached) and reached.stop_requested
    assert reached.grace_until == scene.now + GRACE_MS
    (reported,) = outcome.accepted
    assert isinstance(reported, AttemptReported)
    assert outcome.final.status is RunStatus.FAILED


def test_deadline_vs_unverified_success_both_orders_fail_exe_1_exe_10() -> None:
    scene = _at_deadline()
    report = success_report(scene, verified=False)
    first = command_then_timers(scene, report)
    (reported,) = first.accepted
    assert isinstance(reported, AttemptReported) and reported.error_code == "MANIFEST_INVALID"
    second = timers_then_command(scene, report)
    for outcome in (first, second):
        assert outcome.final.status is RunStatus.FAILED


def test_deadline_stop_never_confirmed_interrupts_then_the_late_report_is_revoked_exe_10() -> None:
    scene = _at_deadline()
    _, stopping = scene.reconcile()
    assert stopping.state.status is RunStatus.CANCELLING
    stop = stopping.state.stop
    assert stop is not None and stop.kind is StopKind.DEADLINE
    # The 60 s lease outlives the 30 s grace, so it is the grace timer that decides.
    report_at_grace_end = success_report(stopping.at(stop.grace_until))

    outcome = timers_then_command(stopping.at(stop.grace_until), report_at_grace_end)
    (interrupted,) = outcome.timer_events
    assert isinstance(interrupted, RunInterrupted) and interrupted.reason == "DEADLINE_UNCONFIRMED"
    assert outcome.refused.code is RejectionCode.LEASE_REVOKED
    assert outcome.final.status is RunStatus.INTERRUPTED, "EXE-10: unconfirmed -> interrupted"
    # ... for good: no automatic retry, and the deadline does not fire a second time.
    assert next_timer_at(outcome.final) is None

    first = command_then_timers(stopping.at(stop.grace_until), report_at_grace_end)
    assert _types(first.accepted) == ["AttemptReported"]
    assert first.final.status is RunStatus.FAILED, "confirmed in time: failed, DEADLINE_EXCEEDED"
    assert first.timer_events == ()


# --- the end of a cancel's grace period vs. the runner's confirmation (EXE-7) ------------------


@pytest.mark.parametrize("reported", ["cancelled", "succeeded", "failed"])
def test_confirmation_at_grace_end_command_first_ends_cancelled_exe_7(reported: str) -> None:
    """Whatever the runner reports, it confirms the stop: a late success does not override
    the user's accepted cancel."""
    scene = cancelling()
    stop = scene.state.stop
    assert stop is not None
    scene = scene.at(stop.grace_until)
    outcome = command_then_timers(scene, cancel_confirmation(scene, outcome=reported))
    assert _types(outcome.accepted) == ["AttemptReported"]
    assert outcome.final.status is RunStatus.CANCELLED
    assert outcome.timer_events == (), "confirmed: the grace timer finds nothing to do"
    assert next_timer_at(outcome.final) is None


@pytest.mark.parametrize("reported", ["cancelled", "succeeded", "failed"])
def test_confirmation_at_grace_end_timers_first_is_revoked_never_a_false_cancel_exe_7(
    reported: str,
) -> None:
    scene = cancelling()
    stop = scene.state.stop
    assert stop is not None
    scene = scene.at(stop.grace_until)
    outcome = timers_then_command(scene, cancel_confirmation(scene, outcome=reported))
    (interrupted,) = outcome.timer_events
    assert isinstance(interrupted, RunInterrupted) and interrupted.reason == "CANCEL_UNCONFIRMED"
    assert outcome.refused.code is RejectionCode.LEASE_REVOKED
    assert outcome.final.status is RunStatus.INTERRUPTED, "EXE-7: interrupted, never a false cancelled"
    assert outcome.final.lease is not None
    assert outcome.final.lease.certainty is LeaseCertainty.REVOKED, "the runner is fenced off"


def test_confirmation_one_ms_before_grace_end_wins_in_both_orders_exe_7() -> None:
    scene = cancelling()
    stop = scene.state.stop
    assert stop is not None
    scene = scene.at(stop.grace_until - 1)
    confirmation = cancel_confirmation(scene)
    first = command_then_timers(scene, confirmation)
    second = timers_then_command(scene, confirmation)
    assert not any(isinstance(e, RunInterrupted) for e in second.timer_events)
    for outcome in (first, second):
        assert _types(outcome.accepted) == ["AttemptReported"]
        assert outcome.final.status is RunStatus.CANCELLED


def test_unconfirmed_cancel_is_never_retried_automatically_even_if_retry_safe_exe_7() -> None:
    scene = running(lease_seconds=60, retry_safe=True).at(T0 + 2_000)
    scene = scene.accept(cancel(scene))
    stop = scene.state.stop
    assert stop is not None
    events, scene = scene.at(stop.grace_until + 120_000).reconcile()
    assert not any(isinstance(e, RunRequeued) for e in events)
    assert scene.state.status is RunStatus.INTERRUPTED
    assert scene.state.cancel_accepted_at == T0 + 2_000


# --- input expiry vs. the user's answer (EXE-8, EXE-10) ---------------------------------------


def test_answer_at_input_expiry_is_refused_in_both_orders_same_end_exe_10() -> None:
    """At `now >= expiresAt` the answer is late whoever goes first; both orders end failed
    INPUT_EXPIRED in the same state. The code differs only because after the timer the run no
    longer waits: INPUT_EXPIRED before it, INVALID_TRANSITION after it."""
    scene = waiting_for_input(expires_in_ms=10_000)
    wait = scene.state.input_wait
    assert wait is not None
    scene = scene.at(wait.expires_at)
    reply = answer(scene)

    first = command_then_timers(scene, reply)
    assert first.refused.code is RejectionCode.INPUT_EXPIRED
    second = timers_then_command(scene, reply)
    assert second.refused.code is RejectionCode.INVALID_TRANSITION
    assert first.timer_events == second.timer_events
    (failed,) = first.timer_events
    assert isinstance(failed, RunFailed) and failed.code == "INPUT_EXPIRED"
    assert first.final == second.final
    assert first.final.status is RunStatus.FAILED


def test_answer_one_ms_before_input_expiry_queues_the_continuation_in_both_orders_exe_8() -> None:
    scene = waiting_for_input(expires_in_ms=10_000)
    wait = scene.state.input_wait
    assert wait is not None
    scene = scene.at(wait.expires_at - 1)
    reply = answer(scene)
    first = command_then_timers(scene, reply)
    second = timers_then_command(scene, reply)
    assert second.timer_events == (), "nothing is due one ms before the expiry"
    assert first.timer_events == ()
    assert first.final == second.final
    (provided,) = first.accepted
    assert isinstance(provided, InputProvided) and provided.checkpoint_digest == wait.checkpoint_digest
    assert first.final.status is RunStatus.QUEUED and first.final.continuation_of == "resp-1"


def test_a_repeated_response_after_the_continuation_creates_nothing_exe_8() -> None:
    scene = waiting_for_input(expires_in_ms=10_000)
    wait = scene.state.input_wait
    assert wait is not None
    scene = scene.at(wait.expires_at - 1).accept(answer(scene))
    # The same response again (a new command id, e.g. the user pressed twice), after the expiry.
    repeated = answer(scene.at(wait.expires_at), command_id="race-answer-again")
    outcome = command_then_timers(scene.at(wait.expires_at), repeated)
    assert outcome.decision == ()
    assert outcome.final == scene.state


def test_deadline_vs_answer_both_orders_end_failed_exe_10() -> None:
    """The deadline also runs while a run waits for input (EXE-10)."""
    scene = waiting_for_input(expires_in_ms=60_000, timeout_seconds=20)
    deadline = scene.state.deadline_at
    assert deadline is not None
    scene = scene.at(deadline)
    reply = answer(scene)

    first = command_then_timers(scene, reply)
    assert _types(first.accepted) == ["InputProvided"]
    (reached,) = first.timer_events
    assert isinstance(reached, DeadlineReached) and not reached.stop_requested

    second = timers_then_command(scene, reply)
    assert second.refused.code is RejectionCode.INVALID_TRANSITION
    (reached,) = second.timer_events
    assert isinstance(reached, DeadlineReached) and not reached.stop_requested
    for outcome in (first, second):
        assert outcome.final.status is RunStatus.FAILED


# --- lease expiry vs. a user's cancel (EXE-7) -------------------------------------------------


@pytest.mark.parametrize("retry_safe", [False, True], ids=["not-retry-safe", "retry-safe"])
def test_cancel_at_lease_expiry_is_honoured_in_both_orders_exe_7(retry_safe: bool) -> None:
    """The coordinator's cancel takes the lease's certainty as it was last decided; whoever
    goes first, the cancel stands: the run never succeeds and is never retried automatically.
    Command first it was accepted for a holder who never confirms, so it ends `interrupted`
    (EXE-7: never a false `cancelled`); timers first nobody holds it, so it ends at once."""
    scene = running(lease_seconds=60, retry_safe=retry_safe)
    lease = scene.state.lease
    assert lease is not None
    scene = scene.at(lease.expires_at)
    command = cancel(scene)

    first = command_then_timers(scene, command)
    assert _types(first.accepted) == ["RunCancelRequested"]
    assert _types(first.timer_events) == ["LeaseExpired"], "no automatic retry after a cancel"
    assert first.final.status is RunStatus.INTERRUPTED
    assert first.final.cancel_accepted_at == scene.now

    second = timers_then_command(scene, command)
    (cancelled,) = second.accepted
    assert isinstance(cancelled, RunCancelled)
    assert second.final.status is RunStatus.CANCELLED


# --- two defects these races found (now fixed in domain/lease.py and domain/stops.py) ---------


def test_claim_at_the_deadline_is_refused_so_both_orders_end_failed_without_a_lease_exe_10() -> None:
    """EXE-10 bounds the run from first assignment 'including later queueing'; a continuation
    still queued when the deadline passes must not be assigned again. Timers first, the run
    fails at once and the claim is refused. Command first, the claim must be refused as well:
    granting a fresh 90 s lease (and an active slot) to a run already past its deadline only
    forces a stop that the new runner may never confirm (then `interrupted`, not `failed`)."""
    scene = waiting_for_input(expires_in_ms=60_000, timeout_seconds=20)
    scene = scene.at(T0 + 3_000).accept(answer(scene))
    assert scene.state.status is RunStatus.QUEUED and scene.state.continuation_of == "resp-1"
    deadline = scene.state.deadline_at
    assert deadline is not None
    scene = scene.at(deadline)
    claim = claim_cmd(scene.state.run_id, "runner-b", command_id="race-claim-late")

    second = timers_then_command(scene, claim)
    assert second.refused.code is RejectionCode.RUN_NOT_CLAIMABLE
    assert second.final.status is RunStatus.FAILED

    first = command_then_timers(scene, claim)
    assert isinstance(first.decision, Rejection), (
        f"a run past its deadline ({deadline}) was assigned at {scene.now}: {first.decision}"
    )
    assert first.final == second.final


def test_every_deadline_decision_has_its_own_event_id_after_a_user_retry_exe_10_dur_1() -> None:
    """Event ids are derived from their cause so that a redelivery repeats them exactly; two
    *different* events must never share one. Deadline stop, never confirmed -> interrupted;
    the user's retry (if accepted) re-arms the deadline, and the reconciler's second
    DeadlineReached must not reuse the first one's id (its cause was `timer/<run>/deadline`)."""
    scene = _at_deadline()
    log: list[RunEvent] = []
    events, scene = scene.reconcile()
    log += events
    stop = scene.state.stop
    assert stop is not None and stop.kind is StopKind.DEADLINE
    events, scene = scene.at(stop.grace_until).reconcile()
    log += events
    assert scene.state.status is RunStatus.INTERRUPTED
    retry = RetryRun(
        command_id="race-retry",
        run_id=scene.state.run_id,
        issued_at=scene.now,
        correlation_id="corr-retry",
        actor="user:alice",
        acknowledge_repeated_effects=True,
        reason="try once more",
    )
    decision = scene.decide(retry)
    if not isinstance(decision, Rejection):
        log += decision
        scene = scene.applied(decision)
        events, scene = scene.reconcile()
        log += events
    ids = [e.event_id for e in log]
    assert len(ids) == len(set(ids)), f"one event id for two events: {_types(tuple(log))} {ids}"


# --- determinism: the same state, command and `now` decide the same ---------------------------


def _scenes() -> list[tuple[str, Callable[[], tuple[Scene, RunCommand]]]]:
    def expiry() -> tuple[Scene, RunCommand]:
        scene = running(lease_seconds=60, retry_safe=True)
        assert scene.state.lease is not None
        scene = scene.at(scene.state.lease.expires_at)
        return scene, success_report(scene)

    def deadline() -> tuple[Scene, RunCommand]:
        scene = _at_deadline()
        return scene, success_report(scene)

    def grace() -> tuple[Scene, RunCommand]:
        scene = cancelling()
        assert scene.state.stop is not None
        scene = scene.at(scene.state.stop.grace_until)
        return scene, cancel_confirmation(scene)

    def input_expiry() -> tuple[Scene, RunCommand]:
        scene = waiting_for_input()
        assert scene.state.input_wait is not None
        scene = scene.at(scene.state.input_wait.expires_at)
        return scene, answer(scene)

    def cancel_at_expiry() -> tuple[Scene, RunCommand]:
        scene = running(lease_seconds=60)
        assert scene.state.lease is not None
        scene = scene.at(scene.state.lease.expires_at)
        return scene, cancel(scene)

    return [
        ("lease-expiry", expiry),
        ("deadline", deadline),
        ("cancel-grace", grace),
        ("input-expiry", input_expiry),
        ("cancel-at-expiry", cancel_at_expiry),
    ]


@pytest.mark.parametrize("build", [b for _, b in _scenes()], ids=[name for name, _ in _scenes()])
def test_both_orders_are_deterministic_exe_12(build: Callable[[], tuple[Scene, RunCommand]]) -> None:
    """Deciding the same (state, command, now) twice gives identical events, and so does each
    whole order: a coordinator that crashes and re-decides after a restart decides the same."""
    scene, command = build()
    assert scene.decide(command) == scene.decide(command)
    assert decide_timers(scene.state, scene.now, scene.policy) == decide_timers(
        scene.state, scene.now, scene.policy
    )
    assert command_then_timers(scene, command) == command_then_timers(scene, command)
    assert timers_then_command(scene, command) == timers_then_command(scene, command)
    # A rebuilt scene (fresh objects, same inputs) decides the same too: nothing hidden leaks in.
    again, same_command = build()
    assert again.state == scene.state and same_command == command
    assert command_then_timers(again, same_command) == command_then_timers(scene, command)
    assert timers_then_command(again, same_command) == timers_then_command(scene, command)


@pytest.mark.parametrize("build", [b for _, b in _scenes()], ids=[name for name, _ in _scenes()])
def test_neither_order_ever_ends_succeeded_after_a_stop_or_with_a_refused_report_exe_7_exe_10(
    build: Callable[[], tuple[Scene, RunCommand]],
) -> None:
    scene, command = build()
    for outcome in (command_then_timers(scene, command), timers_then_command(scene, command)):
        if outcome.final.status is RunStatus.SUCCEEDED:
            assert not isinstance(outcome.decision, Rejection)
            assert outcome.timer_events == ()
        assert outcome.final.status in TERMINAL_STATUSES or outcome.final.status in (
            RunStatus.QUEUED,
            RunStatus.INTERRUPTED,
            RunStatus.CANCELLING,
        )
        cancelled = isinstance(outcome.decision, tuple) and any(
            isinstance(e, (RunCancelRequested, RunCancelled)) for e in outcome.decision
        )
        if cancelled:
            assert outcome.final.status is not RunStatus.SUCCEEDED
            assert not any(isinstance(e, RunRequeued) for e in outcome.timer_events)
        if any(isinstance(e, LeaseExpired) for e in outcome.timer_events):
            assert outcome.final.lease is not None and not outcome.final.lease.held
