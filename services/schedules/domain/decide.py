"""decide(state, command, now) -> events or a Rejection; the timer; the run a firing submits.

Firing (the timer, at `next_run_at` on the coordinator's clock): every scheduled time in
(evaluated_until, now] is due. A due time older than MISFIRE_GRACE_MS was missed (the processor
was down, or the schedule paused): misfirePolicy "coalesce" folds ALL due times into one firing
(the latest, counting the others), "skip" records each missed time as skipped. Each remaining
firing meets the overlap policy: with a run of the schedule still active, "skip" records it as
skipped (reason and run named), "queue" holds it as the one pending firing, or merges it into
the pending one. Otherwise it is decided: FiringDecided, whose SubmitRun (`submission`) commits
in the same transaction, under the idempotency key schedule:<id>:<scheduledAt, RFC 3339 UTC>;
the run id is derived from it, so deciding the same firing again (a crash before the commit,
a redelivery) can only ever name the same run. When the active run ends, the pending firing is
decided at once. A manual trigger is a firing of its own key (the trigger's command id).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from services.common.contracts import SubmitRun
from services.common.contracts.schedules import (
    FIRING_KEY_PREFIX,
    SCHEDULE_ID_PATTERN,
    CreateSchedule,
    FiringDecided,
    FiringQueued,
    FiringRefused,
    FiringSkipped,
    FiringSubmitted,
    PauseSchedule,
    RecordScheduledRun,
    ResumeSchedule,
    ScheduleCommand,
    ScheduleCreated,
    ScheduledRunEnded,
    ScheduleEvent,
    SchedulePaused,
    ScheduleRejectionCode,
    ScheduleResumed,
    ScheduleUpdated,
    TriggerSchedule,
    UpdateSchedule,
)
from services.common.contracts.status import MAX_ATTEMPTS_LIMIT, MAX_TIMEOUT_SECONDS
from services.common.ids import command_id_for, derived_id, run_id_for
from services.common.times import rfc3339
from services.schedules.domain.calendar import (
    CalendarError,
    NonexistentPolicy,
    RepeatedPolicy,
    next_firing,
    validate_cron,
    validate_zone,
)
from services.schedules.domain.evolve import evolve
from services.schedules.domain.lifecycle import FiringStatus, ScheduleStatus
from services.schedules.domain.state import Definition, ScheduleState

__all__ = [
    "ACTOR",
    "MAX_FIRINGS_PER_TICK",
    "MISFIRE_GRACE_MS",
    "MISFIRE_POLICIES",
    "OVERLAP_POLICIES",
    "Decision",
    "Rejection",
    "decide",
    "decide_timers",
    "due_firings",
    "firing_key",
    "idempotency_key",
    "next_after",
    "next_timer_at",
    "submission",
]

ACTOR = "tenure-schedules"
# A due time later than this is a misfire (the scheduler was down or the schedule paused).
MISFIRE_GRACE_MS = 60_000
# Due times one tick handles; a longer backlog (misfirePolicy skip) goes on at the next tick.
MAX_FIRINGS_PER_TICK = 100
OVERLAP_POLICIES = ("skip", "queue")
MISFIRE_POLICIES = ("skip", "coalesce")
C = ScheduleRejectionCode
_SCHEDULE_ID = re.compile(SCHEDULE_ID_PATTERN)


@dataclass(frozen=True)
class Rejection:
    code: ScheduleRejectionCode
    detail: str
    state: ScheduleState | None = None


Decision = tuple[ScheduleEvent, ...] | Rejection


def firing_key(schedule_id: str, scheduled_at: int) -> str:
    return f"{schedule_id}/{rfc3339(scheduled_at, timespec='seconds')}"


def idempotency_key(schedule_id: str, scheduled_at: int, manual_command_id: str = "") -> str:
    if manual_command_id:
        return f"{FIRING_KEY_PREFIX}{schedule_id}:manual:{manual_command_id}"
    return f"{FIRING_KEY_PREFIX}{schedule_id}:{rfc3339(scheduled_at, timespec='seconds')}"


def _policies(d: Definition) -> tuple[NonexistentPolicy, RepeatedPolicy]:
    return NonexistentPolicy(d.nonexistent_policy), RepeatedPolicy(d.repeated_policy)


def next_after(d: Definition, after_ms: int) -> int:
    """The first scheduled time after `after_ms` (0: none within the look-ahead)."""
    return next_firing(d.cron, d.time_zone, after_ms, *_policies(d)) or 0


def due_firings(d: Definition, after_ms: int, now_ms: int, limit: int = MAX_FIRINGS_PER_TICK) -> list[int]:
    """Scheduled times in (after_ms, now_ms], oldest first, at most `limit`."""
    found: list[int] = []
    at = after_ms
    while len(found) < limit:
        following = next_after(d, at)
        if not following or following > now_ms:
            break
        found.append(following)
        at = following
    return found


class _Emitter:
    """Builds a decision's events one by one, folding each at once into `state`."""

    def __init__(
        self,
        state: ScheduleState | None,
        schedule_id: str,
        cause: str,
        correlation: str,
        actor: str,
        now_ms: int,
    ) -> None:
        self.state_or_none = state
        self._header = (schedule_id, cause, correlation, actor)
        self.now_ms = now_ms
        self.events: list[ScheduleEvent] = []

    @property
    def state(self) -> ScheduleState:
        assert self.state_or_none is not None
        return self.state_or_none

    def emit(self, kind: type[Any], **fields: Any) -> None:
        version = (self.state_or_none.version if self.state_or_none is not None else 0) + 1
        schedule_id, cause, correlation, actor = self._header
        event = kind(
            event_id=derived_id("sch", cause, kind.__name__, str(version)),
            run_id=schedule_id,
            version=version,
            occurred_at=self.now_ms,
            causation_id=cause,
            correlation_id=correlation,
            actor=actor,
            **fields,
        )
        self.state_or_none = evolve(self.state_or_none, event)
        self.events.append(event)

    def fire(
        self,
        scheduled_at: int,
        *,
        next_run_at: int,
        manual_command_id: str = "",
        coalesced: int = 0,
        merged: int = 0,
        key: str = "",
    ) -> None:
        state = self.state
        idem = idempotency_key(state.schedule_id, scheduled_at, manual_command_id)
        default_key = (
            f"{state.schedule_id}/manual/{manual_command_id}"
            if manual_command_id
            else firing_key(state.schedule_id, scheduled_at)
        )
        self.emit(
            FiringDecided,
            firing_key=key or default_key,
            scheduled_at=scheduled_at,
            manual=bool(manual_command_id),
            target_run_id=run_id_for(state.tenant, idem),
            idempotency_key=idem,
            coalesced=coalesced,
            merged=merged,
            next_run_at=next_run_at,
        )


def _invalid_definition(command: CreateSchedule | UpdateSchedule) -> Rejection | None:
    try:
        validate_zone(command.time_zone)
    except CalendarError as exc:
        return Rejection(C.UNKNOWN_TIME_ZONE, f"timeZone: {exc.detail}")
    try:
        validate_cron(command.cron)
    except CalendarError as exc:
        return Rejection(C.INVALID_CRON, f"cron: {exc.detail}")
    problems = {
        "overlapPolicy": command.overlap_policy in OVERLAP_POLICIES,
        "misfirePolicy": command.misfire_policy in MISFIRE_POLICIES,
        "nonexistentPolicy": command.nonexistent_policy in tuple(NonexistentPolicy),
        "repeatedPolicy": command.repeated_policy in tuple(RepeatedPolicy),
        "agentRevisionId": 0 < len(command.agent_revision_id.strip()) <= 200,
        "timeoutSeconds": 1 <= command.timeout_seconds <= MAX_TIMEOUT_SECONDS,
        "maxAttempts": 1 <= command.max_attempts <= MAX_ATTEMPTS_LIMIT,
    }
    bad = [name for name, ok in problems.items() if not ok]
    if bad:
        return Rejection(C.INVALID_COMMAND, f"invalid: {', '.join(bad)}")
    try:
        spec = json.loads(command.execution_spec)
    except ValueError:
        spec = None
    if not isinstance(spec, dict):
        return Rejection(C.INVALID_COMMAND, "executionSpec must be a JSON object")
    return None


def _definition_fields(command: CreateSchedule | UpdateSchedule) -> dict[str, Any]:
    return {
        "agent_revision_id": command.agent_revision_id,
        "execution_spec": command.execution_spec,
        "retry_safe": command.retry_safe,
        "timeout_seconds": command.timeout_seconds,
        "max_attempts": command.max_attempts,
        "labels": command.labels,
        "time_zone": command.time_zone,
        "cron": command.cron,
        "overlap_policy": command.overlap_policy,
        "misfire_policy": command.misfire_policy,
        "nonexistent_policy": command.nonexistent_policy,
        "repeated_policy": command.repeated_policy,
    }


def decide(state: ScheduleState | None, command: ScheduleCommand, now_ms: int) -> Decision:
    if not _SCHEDULE_ID.fullmatch(command.run_id):
        return Rejection(C.INVALID_COMMAND, f"runId must be a schedule id ({SCHEDULE_ID_PATTERN})", state)
    if state is not None and command.command_id in state.recent:
        return ()  # accepted before: a redelivery
    em = _Emitter(state, command.run_id, command.command_id, command.correlation_id, command.actor, now_ms)
    if isinstance(command, CreateSchedule):
        if state is not None:
            return Rejection(C.SCHEDULE_EXISTS, f"schedule {command.run_id} exists already", state)
        problem = _invalid_definition(command)
        if problem is not None or not command.tenant.strip():
            return problem or Rejection(C.INVALID_COMMAND, "tenant must not be empty")
        fields = _definition_fields(command)
        em.emit(ScheduleCreated, tenant=command.tenant, next_run_at=_next_of(fields, now_ms), **fields)
        return tuple(em.events)
    if state is None:
        return Rejection(C.SCHEDULE_NOT_FOUND, f"schedule {command.run_id} does not exist")
    if isinstance(command, UpdateSchedule):
        problem = _invalid_definition(command)
        if problem is not None:
            return Rejection(problem.code, problem.detail, state)
        fields = _definition_fields(command)
        next_run = _next_of(fields, max(now_ms, state.evaluated_until))
        em.emit(ScheduleUpdated, next_run_at=next_run, **fields)
        return tuple(em.events)
    if isinstance(command, PauseSchedule):
        if state.status is ScheduleStatus.PAUSED:
            return Rejection(C.SCHEDULE_PAUSED, f"schedule {state.schedule_id} is paused already", state)
        em.emit(SchedulePaused, reason=command.reason)
        return tuple(em.events)
    if isinstance(command, ResumeSchedule):
        if state.status is ScheduleStatus.ACTIVE:
            return Rejection(C.SCHEDULE_ACTIVE, f"schedule {state.schedule_id} is not paused", state)
        # From where it stopped: what fell due while paused is a misfire at the next tick.
        em.emit(
            ScheduleResumed,
            reason=command.reason,
            next_run_at=next_after(state.definition, state.evaluated_until),
        )
        return tuple(em.events)
    if isinstance(command, TriggerSchedule):
        em.fire(now_ms, next_run_at=state.next_run_at, manual_command_id=command.command_id)
        return tuple(em.events)
    if isinstance(command, RecordScheduledRun):
        return _run_outcome(em, state, command)
    return Rejection(C.INVALID_COMMAND, f"{type(command).__name__} is not a schedule command", state)


def _next_of(fields: dict[str, Any], after_ms: int) -> int:
    return (
        next_firing(
            fields["cron"],
            fields["time_zone"],
            after_ms,
            NonexistentPolicy(fields["nonexistent_policy"]),
            RepeatedPolicy(fields["repeated_policy"]),
        )
        or 0
    )


def _run_outcome(em: _Emitter, state: ScheduleState, command: RecordScheduledRun) -> Decision:
    run_id = command.target_run_id
    if command.outcome == "submitted":
        decided = any(f.run_id == run_id and f.status is FiringStatus.DECIDED for f in state.history)
        if decided:
            key = next(f.firing_key for f in state.history if f.run_id == run_id)
            em.emit(FiringSubmitted, firing_key=key, target_run_id=run_id)
        return tuple(em.events)
    if command.outcome not in ("ended", "refused"):
        return Rejection(C.INVALID_COMMAND, "outcome must be submitted, ended or refused", state)
    if run_id not in state.active_runs:
        return ()  # seen before, or not this schedule's: nothing changes
    if command.outcome == "ended":
        em.emit(ScheduledRunEnded, target_run_id=run_id, status=command.status)
    else:
        em.emit(FiringRefused, target_run_id=run_id, code=command.status, detail=command.detail)
    after = em.state
    pending = after.pending
    if pending is not None and not after.active_runs:
        em.fire(
            pending.scheduled_at, next_run_at=after.next_run_at, merged=pending.merged, key=pending.firing_key
        )
    return tuple(em.events)


# --- the timer ----------------------------------------------------------------------------------


def next_timer_at(state: ScheduleState | None) -> int | None:
    if state is None or state.status is ScheduleStatus.PAUSED or not state.next_run_at:
        return None
    return state.next_run_at


def decide_timers(state: ScheduleState, now_ms: int) -> tuple[ScheduleEvent, ...]:
    due_at = next_timer_at(state)
    if due_at is None or now_ms < due_at:
        return ()
    d = state.definition
    due = due_firings(d, state.evaluated_until, now_ms)
    if not due:
        return ()
    following = next_after(d, due[-1])
    cause = f"timer/{state.schedule_id}/{due[0]}"
    em = _Emitter(state, state.schedule_id, cause, state.schedule_id, ACTOR, now_ms)
    late = [t for t in due if now_ms - t > MISFIRE_GRACE_MS]
    if late and d.misfire_policy == "coalesce":
        candidates = [(due[-1], len(due) - 1)]
    else:
        for t in late:
            em.emit(
                FiringSkipped,
                firing_key=firing_key(state.schedule_id, t),
                scheduled_at=t,
                reason="misfire",
                detail=f"missed by {(now_ms - t) // 1000} s (misfirePolicy skip)",
                next_run_at=following,
            )
        candidates = [(t, 0) for t in due if t not in late]
    for scheduled_at, coalesced in candidates:
        _overlap(em, scheduled_at, coalesced, following)
    return tuple(em.events)


def _overlap(em: _Emitter, scheduled_at: int, coalesced: int, following: int) -> None:
    state = em.state
    key = firing_key(state.schedule_id, scheduled_at)
    if not state.active_runs:
        em.fire(scheduled_at, next_run_at=following, coalesced=coalesced)
        return
    active = ", ".join(state.active_runs)
    if state.definition.overlap_policy == "skip":
        em.emit(
            FiringSkipped,
            firing_key=key,
            scheduled_at=scheduled_at,
            reason="overlap",
            detail=f"run {active} is still active (overlapPolicy skip)",
            next_run_at=following,
        )
        return
    pending = state.pending
    em.emit(
        FiringQueued,
        firing_key=pending.firing_key if pending is not None else key,
        scheduled_at=scheduled_at,
        merged=(pending.merged + 1) if pending is not None else 1,
        next_run_at=following,
    )


def submission(state: ScheduleState, event: FiringDecided) -> SubmitRun:
    """The SubmitRun a decided firing commits with it (the run's idempotency key is the firing's)."""
    d = state.definition
    labels = {**dict(d.labels), "schedule": state.schedule_id}
    return SubmitRun(
        command_id=command_id_for(event.target_run_id, "SubmitRun", event.idempotency_key),
        run_id=event.target_run_id,
        issued_at=event.occurred_at,
        correlation_id=state.schedule_id,
        actor=state.owner,
        tenant=state.tenant,
        idempotency_key=event.idempotency_key,
        execution_spec=d.execution_spec,
        retry_safe=d.retry_safe,
        timeout_seconds=d.timeout_seconds,
        max_attempts=d.max_attempts,
        agent_revision_id=d.agent_revision_id,
        labels=labels,
    )
