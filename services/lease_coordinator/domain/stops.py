"""Stopping a run that a runner holds: cancel (EXE-7), deadline (EXE-10), and retries (EXE-5).

A run held by a runner is never declared cancelled or failed on the coordinator's word alone:
the runner is asked to stop (the run is `cancelling`) and must confirm with a terminal report
before the grace period ends. Without a confirmation the run ends `interrupted`, never a false
`cancelled`, and its lease is revoked so that nothing the old holder sends is accepted.
"""

from __future__ import annotations

from typing import Any

from services.common.contracts import (
    CancelRun,
    DeadlineReached,
    RetryRun,
    RunCancelRequested,
    RunEvent,
    RunFailed,
    RunInterrupted,
    RunRetried,
)
from services.common.frozen import replace as replace_fields
from services.lease_coordinator.domain.lifecycle import (
    TERMINAL_STATUSES,
    LeaseCertainty,
    RunStatus,
    check_lease_transition,
    check_transition,
)
from services.lease_coordinator.domain.state import (
    COORDINATOR_ACTOR,
    Decision,
    LeasePolicy,
    Rejection,
    RejectionCode,
    RunState,
    StopKind,
    StopRequest,
    command_event_header,
    event_header,
)

__all__ = [
    "decide_cancel_held",
    "decide_retry",
    "decide_stop_timers",
    "evolve_stop",
    "next_stop_timer_at",
]

_HELD = (RunStatus.PREPARING, RunStatus.RUNNING)


def decide_cancel_held(state: RunState, command: CancelRun, now_ms: int, policy: LeasePolicy) -> Decision:
    """EXE-7: a run a runner holds goes to `cancelling`; the runner is told and must confirm."""
    if state.status is RunStatus.CANCELLING:
        return Rejection(RejectionCode.CANCEL_ALREADY_REQUESTED, f"run {state.run_id} is already stopping")
    lease = state.lease
    if state.status not in _HELD or lease is None or not lease.held:
        return Rejection(RejectionCode.INVALID_TRANSITION, f"run {state.run_id} is {state.status.value}")
    return (
        RunCancelRequested(
            **command_event_header(state, command, "RunCancelRequested", now_ms),
            reason=command.reason,
            previous_status=state.status.value,
            attempt_id=lease.attempt_id,
            epoch=lease.epoch,
            grace_until=now_ms + policy.stop_grace_ms,
        ),
    )


def decide_retry(state: RunState, command: RetryRun, now_ms: int) -> Decision:
    """EXE-5: an explicit retry of an interrupted run, only with the user's acknowledgement."""
    if state.status in TERMINAL_STATUSES:
        return Rejection(
            RejectionCode.RUN_ALREADY_TERMINAL,
            f"run {state.run_id} ended {state.status.value}; retrying it creates a new run with parentRunId",
        )
    if state.status is not RunStatus.INTERRUPTED:
        return Rejection(
            RejectionCode.INVALID_TRANSITION, f"run {state.run_id} is {state.status.value}, not interrupted"
        )
    if not command.acknowledge_repeated_effects:
        return Rejection(
            RejectionCode.RETRY_NEEDS_ACKNOWLEDGEMENT,
            "external actions of the interrupted attempt may repeat; "
            "retry with acknowledgeRepeatedEffects=true",
        )
    if state.attempts_used >= state.max_attempts:
        return Rejection(
            RejectionCode.ATTEMPTS_EXHAUSTED, f"run {state.run_id} used all {state.max_attempts} attempts"
        )
    return (
        RunRetried(
            **command_event_header(state, command, "RunRetried", now_ms),
            acknowledged_repeated_effects=True,
            reason=command.reason,
            attempts_used=state.attempts_used,
            previous_status=state.status.value,
        ),
    )


def _deadline_handled(state: RunState) -> bool:
    # A stop at the deadline was already asked for: confirmed, it failed the run; unconfirmed, it
    # interrupted it for good. Either way the deadline has had its say.
    return state.stop is not None and state.stop.kind is StopKind.DEADLINE


def next_stop_timer_at(state: RunState) -> int | None:
    if state.status in TERMINAL_STATUSES:
        return None
    if state.status is RunStatus.CANCELLING and state.stop is not None:
        return state.stop.grace_until
    due = [] if _deadline_handled(state) or state.deadline_at is None else [state.deadline_at]
    if state.status is RunStatus.WAITING_INPUT and state.input_wait is not None:
        due.append(state.input_wait.expires_at)
    return min(due) if due else None


def decide_stop_timers(state: RunState, now_ms: int, policy: LeasePolicy) -> tuple[RunEvent, ...]:
    """Grace periods running out and deadlines passing, on the coordinator's clock (EXE-12)."""
    if state.status in TERMINAL_STATUSES:
        return ()
    lease = state.lease
    if state.status is RunStatus.CANCELLING and state.stop is not None:
        if now_ms < state.stop.grace_until:
            return ()
        reason = "CANCEL_UNCONFIRMED" if state.stop.kind is StopKind.CANCEL else "DEADLINE_UNCONFIRMED"
        return (
            RunInterrupted(
                **event_header(
                    state,
                    f"timer/{state.run_id}/stop/{state.stop.requested_at}",
                    "RunInterrupted",
                    state.run_id,
                    COORDINATOR_ACTOR,
                    now_ms,
                ),
                reason=reason,
                attempt_id=lease.attempt_id if lease is not None else None,
                epoch=lease.epoch if lease is not None else 0,
                detail=f"no confirmation of the {state.stop.kind.value} stop by {state.stop.grace_until}",
            ),
        )
    wait = state.input_wait
    if state.status is RunStatus.WAITING_INPUT and wait is not None and now_ms >= wait.expires_at:
        return (
            RunFailed(
                **event_header(
                    state,
                    f"timer/{state.run_id}/input/{wait.request_id}",
                    "RunFailed",
                    state.run_id,
                    COORDINATOR_ACTOR,
                    now_ms,
                ),
                code="INPUT_EXPIRED",
                detail=f"no answer to input request {wait.request_id} by {wait.expires_at}",
                attempt_id=None,
                epoch=0,
            ),
        )
    if state.deadline_at is None or now_ms < state.deadline_at or _deadline_handled(state):
        return ()
    # The version makes each deadline decision its own event, even if a run meets it twice.
    cause = f"timer/{state.run_id}/deadline/{state.version}"
    held = state.status in _HELD and lease is not None and lease.held
    return (
        DeadlineReached(
            **event_header(state, cause, "DeadlineReached", state.run_id, COORDINATOR_ACTOR, now_ms),
            deadline_at=state.deadline_at,
            previous_status=state.status.value,
            stop_requested=held,
            attempt_id=lease.attempt_id if held and lease is not None else None,
            epoch=lease.epoch if held and lease is not None else 0,
            grace_until=now_ms + policy.stop_grace_ms if held else None,
        ),
    )


def _revoked(state: RunState) -> Any:
    lease = state.lease
    if lease is None or not lease.held:
        return lease
    return replace_fields(lease, certainty=check_lease_transition(lease.certainty, LeaseCertainty.REVOKED))


def evolve_stop(state: RunState, event: RunEvent) -> RunState | None:
    replace = replace_fields
    if isinstance(event, RunCancelRequested):
        stop = StopRequest(StopKind.CANCEL, event.occurred_at, event.grace_until, event.reason)
        return replace(
            state,
            status=check_transition(state.status, RunStatus.CANCELLING),
            stop=stop,
            cancel_accepted_at=event.occurred_at,
        )
    if isinstance(event, DeadlineReached):
        if event.stop_requested:
            assert event.grace_until is not None
            stop = StopRequest(StopKind.DEADLINE, event.occurred_at, event.grace_until, "DEADLINE_EXCEEDED")
            return replace(state, status=check_transition(state.status, RunStatus.CANCELLING), stop=stop)
        return replace(state, status=check_transition(state.status, RunStatus.FAILED), stop=None)
    if isinstance(event, RunInterrupted):
        # The runner never confirmed: it is force-stopped by revoking its lease (fencing).
        return replace(
            state, status=check_transition(state.status, RunStatus.INTERRUPTED), lease=_revoked(state)
        )
    if isinstance(event, RunFailed):
        return replace(
            state,
            status=check_transition(state.status, RunStatus.FAILED),
            lease=_revoked(state),
            input_wait=None,
        )
    if isinstance(event, RunRetried):
        return replace(state, status=check_transition(state.status, RunStatus.QUEUED), stop=None)
    return None
