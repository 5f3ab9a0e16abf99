"""Leases, fencing epochs and effect records of a Run (LEASE-1..8, EXE-3..6): pure decisions.

Every decision that depends on who holds the run checks the attempt id and the epoch against
the current lease: a holder with an older epoch is refused (STALE_EPOCH) and changes nothing.
Time enters only as `now_ms`, the coordinator's clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from services.common.contracts import (
    AttemptClaimed,
    AttemptReported,
    ClaimRun,
    EffectIntentRecorded,
    EffectOutcomeRecorded,
    LeaseAtRisk,
    LeaseExpired,
    LeaseRenewed,
    LeaseTakenOver,
    RecordEffectIntent,
    RecordEffectOutcome,
    RenewLease,
    ReportAttempt,
    RunEvent,
    RunFailed,
    RunRequeued,
    TakeOverLease,
)
from services.common.frozen import replace as replace_fields
from services.lease_coordinator.domain.lifecycle import (
    LeaseCertainty,
    RunStatus,
    check_lease_transition,
    check_transition,
)
from services.lease_coordinator.domain.state import (
    COORDINATOR_ACTOR,
    Decision,
    EffectRecord,
    LeasePolicy,
    LeaseState,
    Rejection,
    RejectionCode,
    RunState,
    StopKind,
    attempt_id_for,
    command_event_header,
    event_header,
    lease_id_for,
)
from services.lease_coordinator.domain.stops import decide_stop_timers, next_stop_timer_at

__all__ = [
    "HOLDER_KINDS",
    "REPORT_OUTCOMES",
    "decide_claim",
    "decide_effect_intent",
    "decide_effect_outcome",
    "decide_renew",
    "decide_report",
    "decide_takeover",
    "decide_timers",
    "evolve_lease",
    "fence",
    "is_keepalive",
    "next_timer_at",
    "superseded_lease",
]

HOLDER_KINDS = ("runner", "human")
REPORT_OUTCOMES = ("succeeded", "failed", "cancelled", "preparation_failed")
EFFECT_OUTCOMES = ("committed", "failed", "unknown")
_HELD_STATUSES = (RunStatus.PREPARING, RunStatus.RUNNING)


def _terms(
    policy: LeasePolicy, lease_seconds: int, heartbeat_seconds: int
) -> tuple[int, int, int] | Rejection:
    lease_ms = lease_seconds * 1000 if lease_seconds > 0 else policy.default_lease_ms
    heartbeat_ms = heartbeat_seconds * 1000 if heartbeat_seconds > 0 else policy.default_heartbeat_ms
    if not policy.min_lease_ms <= lease_ms <= policy.max_lease_ms:
        return Rejection(
            RejectionCode.INVALID_COMMAND,
            f"leaseSeconds must be between {policy.min_lease_ms // 1000} and "
            f"{policy.max_lease_ms // 1000}, got {lease_ms / 1000:g}",
        )
    if heartbeat_seconds > 0 and heartbeat_ms * 2 > lease_ms:
        return Rejection(
            RejectionCode.INVALID_COMMAND,
            f"heartbeatSeconds ({heartbeat_ms // 1000}) must be at most half of leaseSeconds "
            f"({lease_ms // 1000}) so that one lost heartbeat does not lose the lease",
        )
    # Heartbeats are whole seconds on the wire; never promise a renewal interval of zero.
    heartbeat_ms = max(1000, min(heartbeat_ms, lease_ms // 3) // 1000 * 1000)
    return lease_ms, heartbeat_ms, int(lease_ms * policy.at_risk_fraction)


# --- claim, renew, report --------------------------------------------------------------------


def decide_claim(state: RunState, command: ClaimRun, now_ms: int, policy: LeasePolicy) -> Decision:
    if state.status is not RunStatus.QUEUED:
        return Rejection(
            RejectionCode.RUN_NOT_CLAIMABLE,
            f"run {state.run_id} is {state.status.value}; only a queued run can be claimed",
        )
    if state.deadline_at is not None and now_ms >= state.deadline_at:
        # EXE-10: the deadline bounds the whole run; assigning it now would only start a stop.
        return Rejection(
            RejectionCode.RUN_NOT_CLAIMABLE, f"run {state.run_id} is past its deadline ({state.deadline_at})"
        )
    if state.continuation_of is None and state.attempts_used >= state.max_attempts:
        return Rejection(
            RejectionCode.ATTEMPTS_EXHAUSTED,
            f"run {state.run_id} used all {state.max_attempts} attempts",
        )
    if command.holder_kind not in HOLDER_KINDS or not command.runner_id.strip():
        return Rejection(RejectionCode.INVALID_COMMAND, "runnerId is required; holderKind is runner or human")
    terms = _terms(policy, command.lease_seconds, command.heartbeat_seconds)
    if isinstance(terms, Rejection):
        return terms
    lease_ms, heartbeat_ms, at_risk_ms = terms
    epoch = state.epoch + 1
    return (
        AttemptClaimed(
            **command_event_header(state, command, "AttemptClaimed", now_ms),
            attempt_id=attempt_id_for(state.run_id, epoch),
            attempt_number=state.attempts_started + 1,
            lease_id=lease_id_for(state.run_id, epoch),
            epoch=epoch,
            holder=command.runner_id,
            holder_kind=command.holder_kind,
            capabilities=tuple(command.capabilities),
            lease_seconds=lease_ms // 1000,
            heartbeat_seconds=heartbeat_ms // 1000,
            at_risk_after_ms=at_risk_ms,
            expires_at=now_ms + lease_ms,
            # EXE-10: fixed at the first assignment; a continuation keeps it.
            deadline_at=state.deadline_at or now_ms + state.timeout_seconds * 1000,
        ),
    )


def fence(state: RunState, attempt_id: str, epoch: int, now_ms: int) -> LeaseState | Rejection:
    """The current lease if `attempt_id`/`epoch` hold it right now, else why not (EXE-4)."""
    lease = state.lease
    if lease is None or epoch > state.epoch:
        return Rejection(
            RejectionCode.UNKNOWN_ATTEMPT, f"attempt {attempt_id} with epoch {epoch} was never issued"
        )
    if epoch < lease.epoch or attempt_id != lease.attempt_id:
        return Rejection(
            RejectionCode.STALE_EPOCH,
            f"epoch {epoch} of attempt {attempt_id} is stale: run {state.run_id} is at epoch {lease.epoch}",
        )
    if lease.certainty is LeaseCertainty.REVOKED:
        return Rejection(RejectionCode.LEASE_REVOKED, f"lease {lease.lease_id} was revoked")
    if lease.certainty is LeaseCertainty.RELEASED:
        return Rejection(RejectionCode.LEASE_RELEASED, f"lease {lease.lease_id} was released")
    if lease.certainty is LeaseCertainty.EXPIRED or now_ms >= lease.expires_at:
        return Rejection(
            RejectionCode.LEASE_EXPIRED,
            f"lease {lease.lease_id} expired at {lease.expires_at} (now {now_ms})",
        )
    return lease


def decide_renew(state: RunState, command: RenewLease, now_ms: int) -> Decision:
    lease = fence(state, command.attempt_id, command.lease_epoch, now_ms)
    if isinstance(lease, Rejection):
        return lease
    if command.sequence == lease.last_sequence:
        return Rejection(
            RejectionCode.DUPLICATE_SEQUENCE,
            f"sequence {command.sequence} was already renewed; the lease expires at {lease.expires_at}",
        )
    if command.sequence < lease.last_sequence:
        return Rejection(
            RejectionCode.SEQUENCE_NOT_INCREASING,
            f"sequence {command.sequence} is below the last renewal's {lease.last_sequence}",
        )
    return (
        LeaseRenewed(
            **command_event_header(state, command, "LeaseRenewed", now_ms),
            attempt_id=lease.attempt_id,
            lease_id=lease.lease_id,
            epoch=lease.epoch,
            sequence=command.sequence,
            expires_at=now_ms + lease.lease_ms,
            run_started=state.status is RunStatus.PREPARING,
        ),
    )


def is_keepalive(state: RunState, events: Sequence[RunEvent], policy: LeasePolicy) -> bool:
    """Whether a decision may stay off runs.events (issue 16, services/common/aggregate/
    keepalives.py): a bare renewal of an active lease that starts nothing, while the lease's last
    renewal on runs.events (`state` is their fold) is younger than `keepalive_fraction` TTLs.
    So the log holds a renewal at least that often (by default an hour: a periodic summary), and
    every renewal is on runs.renewals. Only below (1 - heartbeat / TTL) does a view folded from
    runs.events alone never show a live lease as expired; the API's views merge runs.renewals."""
    if len(events) != 1 or not isinstance(events[0], LeaseRenewed):
        return False
    renewed, lease = events[0], state.lease
    return (
        lease is not None
        and not renewed.run_started
        and lease.certainty is LeaseCertainty.ACTIVE
        and renewed.lease_id == lease.lease_id
        and renewed.occurred_at - lease.last_renewal_at < lease.lease_ms * policy.keepalive_fraction
    )


def decide_report(state: RunState, command: ReportAttempt, now_ms: int, policy: LeasePolicy) -> Decision:
    lease = fence(state, command.attempt_id, command.lease_epoch, now_ms)
    if isinstance(lease, Rejection):
        return lease
    if command.outcome not in REPORT_OUTCOMES:
        return Rejection(RejectionCode.INVALID_COMMAND, f"outcome must be one of {REPORT_OUTCOMES}")
    if command.sequence <= lease.last_sequence:
        return Rejection(
            RejectionCode.SEQUENCE_NOT_INCREASING,
            f"sequence {command.sequence} is not above the last renewal's {lease.last_sequence}",
        )
    stopping = state.status is RunStatus.CANCELLING
    if state.status not in (*_HELD_STATUSES, RunStatus.CANCELLING):
        return Rejection(RejectionCode.INVALID_TRANSITION, f"run {state.run_id} is {state.status.value}")
    if command.outcome == "cancelled" and not stopping:
        return Rejection(RejectionCode.INVALID_COMMAND, "only a run asked to stop can report cancelled")
    if command.outcome == "preparation_failed" and state.status is not RunStatus.PREPARING:
        return Rejection(RejectionCode.INVALID_COMMAND, "preparation_failed is reported while preparing")
    outcome, error_code, detail = command.outcome, command.error_code, command.detail
    if outcome == "succeeded" and not stopping and not command.manifest_verified:
        # EXE-1: exit code 0 alone never makes a success; only a verified ResultManifest does.
        outcome, error_code = "failed", "MANIFEST_INVALID"
        detail = command.manifest_problem or "the success report carried no verified ResultManifest"
    reported = AttemptReported(
        **command_event_header(state, command, "AttemptReported", now_ms),
        attempt_id=lease.attempt_id,
        lease_id=lease.lease_id,
        epoch=lease.epoch,
        sequence=command.sequence,
        outcome=outcome,
        error_code=error_code,
        detail=detail,
        manifest=command.manifest,
    )
    if command.outcome != "preparation_failed":
        return (reported,)
    # EXE-11: no external effect happened yet, so another attempt is safe while attempts remain.
    meta = event_header(
        state,
        command.command_id,
        "AfterPreparation",
        command.correlation_id,
        COORDINATOR_ACTOR,
        now_ms,
        offset=2,
    )
    if state.attempts_used < state.max_attempts and state.cancel_accepted_at is None:
        return (
            reported,
            RunRequeued(
                **meta,
                reason="PREPARATION_FAILED",
                attempts_used=state.attempts_used,
                attempts_remaining=state.max_attempts - state.attempts_used,
            ),
        )
    return (
        reported,
        RunFailed(
            **meta,
            code="PREPARATION_FAILED",
            detail=command.detail or command.error_code,
            attempt_id=lease.attempt_id,
            epoch=lease.epoch,
        ),
    )


# --- takeover ---------------------------------------------------------------------------------


def decide_takeover(state: RunState, command: TakeOverLease, now_ms: int, policy: LeasePolicy) -> Decision:
    """LEASE-6/LEASE-7: revoke the current lease and grant a new one, epoch + 1, with the why."""
    if not command.reason.strip():
        return Rejection(RejectionCode.INVALID_COMMAND, "a takeover needs a reason")
    if command.holder_kind not in HOLDER_KINDS or not command.new_holder.strip():
        return Rejection(
            RejectionCode.INVALID_COMMAND, "newHolder is required; holderKind is runner or human"
        )
    lease = state.lease
    if lease is None or state.status not in _HELD_STATUSES:
        return Rejection(
            RejectionCode.TAKEOVER_NOT_POSSIBLE,
            f"run {state.run_id} is {state.status.value}; only a preparing or running run can be taken over",
        )
    terms = _terms(policy, command.lease_seconds, 0)
    if isinstance(terms, Rejection):
        return terms
    lease_ms, heartbeat_ms, at_risk_ms = terms
    epoch = state.epoch + 1
    return (
        LeaseTakenOver(
            **command_event_header(state, command, "LeaseTakenOver", now_ms),
            previous_attempt_id=lease.attempt_id,
            previous_lease_id=lease.lease_id,
            previous_epoch=lease.epoch,
            previous_holder=lease.holder,
            attempt_id=attempt_id_for(state.run_id, epoch),
            lease_id=lease_id_for(state.run_id, epoch),
            epoch=epoch,
            holder=command.new_holder,
            holder_kind=command.holder_kind,
            reason=command.reason,
            last_renewal_at=lease.last_renewal_at,
            last_sequence=lease.last_sequence,
            effects_attempted=tuple(e.effect_id for e in state.effects if e.epoch == lease.epoch),
            lease_seconds=lease_ms // 1000,
            heartbeat_seconds=heartbeat_ms // 1000,
            at_risk_after_ms=at_risk_ms,
            expires_at=now_ms + lease_ms,
        ),
    )


# --- effects ----------------------------------------------------------------------------------


def decide_effect_intent(state: RunState, command: RecordEffectIntent, now_ms: int) -> Decision:
    """Intent before action: an effect is recorded under the current lease before it happens."""
    lease = fence(state, command.attempt_id, command.lease_epoch, now_ms)
    if isinstance(lease, Rejection):
        return lease
    known = state.effect(command.effect_id)
    if known is not None:
        return Rejection(
            RejectionCode.DUPLICATE_EFFECT,
            f"effect {command.effect_id} is already recorded ({known.outcome}, epoch {known.epoch})",
        )
    return (
        EffectIntentRecorded(
            **event_header(
                state,
                command.command_id,
                "EffectIntentRecorded",
                command.correlation_id,
                command.actor,
                now_ms,
            ),
            attempt_id=lease.attempt_id,
            lease_id=lease.lease_id,
            epoch=lease.epoch,
            effect_id=command.effect_id,
            idempotency_key=command.idempotency_key,
            tool=command.tool,
            operation=command.operation,
        ),
    )


def decide_effect_outcome(state: RunState, command: RecordEffectOutcome, now_ms: int) -> Decision:
    """An outcome is a fact about an intent already recorded, whoever holds the run now."""
    known = state.effect(command.effect_id)
    if known is None or known.epoch != command.lease_epoch:
        return Rejection(
            RejectionCode.UNKNOWN_EFFECT, f"no intent {command.effect_id} under epoch {command.lease_epoch}"
        )
    if command.outcome not in EFFECT_OUTCOMES:
        return Rejection(RejectionCode.INVALID_COMMAND, f"outcome must be one of {EFFECT_OUTCOMES}")
    if known.outcome == command.outcome:
        return ()
    if known.outcome in ("committed", "failed"):
        return Rejection(
            RejectionCode.DUPLICATE_EFFECT, f"effect {command.effect_id} already ended {known.outcome}"
        )
    lease = state.lease
    return (
        EffectOutcomeRecorded(
            **event_header(
                state,
                command.command_id,
                "EffectOutcomeRecorded",
                command.correlation_id,
                command.actor,
                now_ms,
            ),
            attempt_id=command.attempt_id,
            lease_id=lease.lease_id
            if lease is not None and lease.epoch == known.epoch
            else lease_id_for(state.run_id, known.epoch),
            epoch=known.epoch,
            effect_id=command.effect_id,
            outcome=command.outcome,
            detail=command.detail,
        ),
    )


# --- timers -----------------------------------------------------------------------------------


def next_timer_at(state: RunState | None) -> int | None:
    """When the coordinator's timer must next look at this run, if ever."""
    if state is None:
        return None
    due = [t for t in (_next_lease_timer_at(state), next_stop_timer_at(state)) if t is not None]
    return min(due) if due else None


def _next_lease_timer_at(state: RunState) -> int | None:
    if state.lease is None or not state.lease.held:
        return None
    lease = state.lease
    if lease.certainty is LeaseCertainty.ACTIVE:
        return min(lease.last_renewal_at + lease.at_risk_after_ms, lease.expires_at)
    return lease.expires_at


def decide_timers(state: RunState, now_ms: int, policy: LeasePolicy) -> tuple[RunEvent, ...]:
    """Everything due for this run, decided on the coordinator's clock and recorded with `now`.

    One kind of event per call: whatever else is due stays in the timer index for the next tick.
    """
    stopped = decide_stop_timers(state, now_ms, policy)
    if stopped:
        return stopped
    return _decide_lease_timers(state, now_ms, policy)


def _decide_lease_timers(state: RunState, now_ms: int, policy: LeasePolicy) -> tuple[RunEvent, ...]:
    lease = state.lease
    if lease is None or not lease.held:
        return ()
    cause = f"timer/{lease.lease_id}"
    if now_ms >= lease.expires_at:
        expired = LeaseExpired(
            **event_header(state, cause, "LeaseExpired", state.run_id, COORDINATOR_ACTOR, now_ms),
            attempt_id=lease.attempt_id,
            lease_id=lease.lease_id,
            epoch=lease.epoch,
            expires_at=lease.expires_at,
            last_renewal_at=lease.last_renewal_at,
            last_sequence=lease.last_sequence,
        )
        # EXE-5: automatic retry only for retry-safe runs with attempts left, if the organisation
        # allows it, and never after an accepted cancel (EXE-7).
        retry = (
            policy.auto_retry
            and state.retry_safe
            and state.attempts_used < state.max_attempts
            and state.cancel_accepted_at is None
            and state.status is not RunStatus.CANCELLING
        )
        if not retry:
            return (expired,)
        requeued = RunRequeued(
            **event_header(state, cause, "RunRequeued", state.run_id, COORDINATOR_ACTOR, now_ms, offset=2),
            reason="LEASE_EXPIRED",
            attempts_used=state.attempts_used,
            attempts_remaining=state.max_attempts - state.attempts_used,
        )
        return (expired, requeued)
    if lease.certainty is LeaseCertainty.ACTIVE and now_ms >= lease.last_renewal_at + lease.at_risk_after_ms:
        return (
            LeaseAtRisk(
                **event_header(
                    state,
                    f"{cause}/{lease.last_sequence}",
                    "LeaseAtRisk",
                    state.run_id,
                    COORDINATOR_ACTOR,
                    now_ms,
                ),
                attempt_id=lease.attempt_id,
                lease_id=lease.lease_id,
                epoch=lease.epoch,
                last_renewal_at=lease.last_renewal_at,
                expires_at=lease.expires_at,
            ),
        )
    return ()


# --- evolve -----------------------------------------------------------------------------------


def _granted(event: AttemptClaimed | LeaseTakenOver) -> LeaseState:
    return LeaseState(
        attempt_id=event.attempt_id,
        lease_id=event.lease_id,
        epoch=event.epoch,
        holder=event.holder,
        holder_kind=event.holder_kind,
        lease_ms=event.lease_seconds * 1000,
        heartbeat_ms=event.heartbeat_seconds * 1000,
        at_risk_after_ms=event.at_risk_after_ms,
        issued_at=event.occurred_at,
        expires_at=event.expires_at,
        last_renewal_at=event.occurred_at,
        last_sequence=0,
        certainty=LeaseCertainty.ACTIVE,
        capabilities=tuple(event.capabilities) if isinstance(event, AttemptClaimed) else (),
    )


def _with_certainty(lease: LeaseState | None, certainty: LeaseCertainty, **changes: Any) -> LeaseState:
    if lease is None:
        raise ValueError("no lease to change")
    return replace_fields(lease, certainty=check_lease_transition(lease.certainty, certainty), **changes)


def superseded_lease(lease: LeaseState) -> LeaseState:
    """`lease` as it ends when a newer epoch is granted (LEASE-3, LEASE-6): a grant made while it
    is still held (a takeover) revokes it; a lease that had already ended stays as it ended.

    `evolve` keeps only the newest lease; readers that keep the older ones (the Run view) take
    their final certainty from here rather than deciding it themselves."""
    return _with_certainty(lease, LeaseCertainty.REVOKED) if lease.held else lease


def _reported_status(state: RunState, outcome: str) -> RunStatus:
    if state.status is RunStatus.CANCELLING:
        # EXE-7: whatever the runner reports after an accepted stop, the stop stands; a late
        # success is recorded (in the event) but not applied.
        stop = state.stop
        return (
            RunStatus.FAILED if stop is not None and stop.kind is StopKind.DEADLINE else RunStatus.CANCELLED
        )
    if outcome == "succeeded":
        return RunStatus.SUCCEEDED
    return RunStatus.FAILED


def evolve_lease(state: RunState, event: RunEvent) -> RunState | None:
    """The state after a lease or effect event, or None if `event` is not one of those."""
    replace = replace_fields
    if isinstance(event, AttemptClaimed):
        return replace(
            state,
            status=check_transition(state.status, RunStatus.PREPARING),
            epoch=event.epoch,
            # A continuation after an answer (EXE-8) is a new Attempt but not a retry.
            attempts_used=state.attempts_used + (0 if state.continuation_of else 1),
            attempts_started=state.attempts_started + 1,
            continuation_of=None,
            lease=_granted(event),
            deadline_at=state.deadline_at or event.deadline_at,
        )
    if isinstance(event, LeaseRenewed):
        lease = _with_certainty(
            state.lease,
            LeaseCertainty.ACTIVE,
            last_sequence=event.sequence,
            last_renewal_at=event.occurred_at,
            expires_at=event.expires_at,
        )
        status = check_transition(state.status, RunStatus.RUNNING) if event.run_started else state.status
        return replace(state, lease=lease, status=status)
    if isinstance(event, LeaseAtRisk):
        return replace(state, lease=_with_certainty(state.lease, LeaseCertainty.AT_RISK))
    if isinstance(event, LeaseExpired):
        return replace(
            state,
            lease=_with_certainty(state.lease, LeaseCertainty.EXPIRED),
            status=check_transition(state.status, RunStatus.INTERRUPTED),
        )
    if isinstance(event, RunRequeued):
        return replace(state, status=check_transition(state.status, RunStatus.QUEUED))
    if isinstance(event, LeaseTakenOver):
        _with_certainty(state.lease, LeaseCertainty.REVOKED)  # the old lease must have been revocable
        return replace(state, epoch=event.epoch, lease=_granted(event))
    if isinstance(event, AttemptReported):
        released = _with_certainty(state.lease, LeaseCertainty.RELEASED, last_sequence=event.sequence)
        if event.outcome == "preparation_failed":
            return replace(state, lease=released)  # the event after it requeues or fails the run
        target = _reported_status(state, event.outcome)
        current = state.status
        if current is RunStatus.PREPARING and target is RunStatus.SUCCEEDED:
            # A runner may finish before its first heartbeat: it ran, then it succeeded.
            current = check_transition(current, RunStatus.RUNNING)
        return replace(state, status=check_transition(current, target), lease=released, stop=None)
    if isinstance(event, EffectIntentRecorded):
        return replace(
            state, effects=(*state.effects, EffectRecord(event.effect_id, event.epoch, "intended"))
        )
    if isinstance(event, EffectOutcomeRecorded):
        effects = tuple(
            EffectRecord(e.effect_id, e.epoch, event.outcome) if e.effect_id == event.effect_id else e
            for e in state.effects
        )
        return replace(state, effects=effects)
    return None
