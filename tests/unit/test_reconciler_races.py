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

import pytest

from services.common.contracts import (
    AttemptReported,
    DeadlineReached,
    InputProvided,
    LeaseAtRisk,
    RunCancelled,
    RunFailed,
    RunInterrupted,
    RunRequeued,
)
from services.lease_coordinator.domain import (
    LeaseCertainty,
    RejectionCode,
    RunStatus,
    StopKind,
    next_timer_at,
)
from tests.support.lease_run import T0, claim_cmd, report_cmd
from tests.support.race_scene import (
    GRACE_MS,
    answer,
    at_deadline,
    cancel,
    cancel_confirmation,
    cancelling,
    command_then_timers,
    event_types,
    running,
    success_report,
    timers_then_command,
    waiting_for_input,
)

# --- lease expiry vs. a success report (EXE-4, EXE-5, LEASE-5) --------------------------------


def test_report_one_ms_before_lease_expiry_stands_in_both_orders_lease_4_exe_4() -> None:
    """Before `expires_at` the holder still holds: at-risk is jeopardy, not loss (LEASE-4)."""
    scene = running(lease_seconds=60)
    lease = scene.state.lease
    assert lease is not None
    scene = scene.at(lease.expires_at - 1)
    report = success_report(scene)

    first = command_then_timers(scene, report)
    assert event_types(first.accepted) == ["AttemptReported"]
    assert first.timer_events == (), "the run ended: the reconciler finds nothing to do"
    assert first.final.status is RunStatus.SUCCEEDED

    second = timers_then_command(scene, report)
    assert all(isinstance(e, LeaseAtRisk) for e in second.timer_events) and second.timer_events
    assert event_types(second.accepted) == ["AttemptReported"]
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
    assert event_types(first.timer_events) == expected
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


def test_deadline_vs_success_report_command_first_the_verified_success_stands_exe_10() -> None:
    scene = at_deadline()
    outcome = command_then_timers(scene, success_report(scene))
    assert event_types(outcome.accepted) == ["AttemptReported"]
    assert outcome.final.status is RunStatus.SUCCEEDED
    assert outcome.timer_events == (), "the run ended: the deadline has nothing left to stop"
    assert next_timer_at(outcome.final) is None


def test_deadline_vs_success_report_timers_first_the_report_only_confirms_the_stop_exe_10() -> None:
    """The deadline asked the runner to stop; a success arriving now is its confirmation of
    that stop, so the run ends `failed` (EXE-10), never `succeeded`."""
    scene = at_deadline()
    outcome = timers_then_command(scene, success_report(scene))
    (reached,) = outcome.timer_events
    assert isinstance(reached, DeadlineReached) and reached.stop_requested
    assert reached.grace_until == scene.now + GRACE_MS
    (reported,) = outcome.accepted
    assert isinstance(reported, AttemptReported)
    assert outcome.final.status is RunStatus.FAILED


def test_deadline_vs_unverified_success_both_orders_fail_exe_1_exe_10() -> None:
    scene = at_deadline()
    report = success_report(scene, verified=False)
    first = command_then_timers(scene, report)
    (reported,) = first.accepted
    assert isinstance(reported, AttemptReported) and reported.error_code == "MANIFEST_INVALID"
    second = timers_then_command(scene, report)
    for outcome in (first, second):
        assert outcome.final.status is RunStatus.FAILED


def test_deadline_stop_never_confirmed_interrupts_then_the_late_report_is_revoked_exe_10() -> None:
    scene = at_deadline()
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
    assert event_types(first.accepted) == ["AttemptReported"]
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
    assert event_types(outcome.accepted) == ["AttemptReported"]
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
        assert event_types(outcome.accepted) == ["AttemptReported"]
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
    assert event_types(first.accepted) == ["InputProvided"]
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
    assert event_types(first.accepted) == ["RunCancelRequested"]
    assert event_types(first.timer_events) == ["LeaseExpired"], "no automatic retry after a cancel"
    assert first.final.status is RunStatus.INTERRUPTED
    assert first.final.cancel_accepted_at == scene.now

    second = timers_then_command(scene, command)
    (cancelled,) = second.accepted
    assert isinstance(cancelled, RunCancelled)
    assert second.final.status is RunStatus.CANCELLED
