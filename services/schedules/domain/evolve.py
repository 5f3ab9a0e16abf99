"""evolve(state, event) -> state for the Schedule aggregate (EXE-14): pure, total, strict.

Every event carries what the fold needs (nextRunAt is computed by `decide` and recorded), so a
replay never steps a cron expression and never depends on today's tz database.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from services.common.contracts.schedules import (
    FiringDecided,
    FiringQueued,
    FiringRefused,
    FiringSkipped,
    FiringSubmitted,
    ScheduleCreated,
    ScheduledRunEnded,
    ScheduleEvent,
    SchedulePaused,
    ScheduleResumed,
    ScheduleUpdated,
)
from services.schedules.domain.lifecycle import (
    FiringStatus,
    IllegalTransition,
    ScheduleStatus,
    check_firing,
    check_transition,
)
from services.schedules.domain.state import MAX_HISTORY, MAX_RECENT, Definition, Firing, ScheduleState

__all__ = ["definition_of", "evolve", "fold"]

F, S = FiringStatus, ScheduleStatus


def definition_of(source: Any) -> Definition:
    """The definition fields of a CreateSchedule/UpdateSchedule or their events."""
    return Definition(
        agent_revision_id=source.agent_revision_id,
        execution_spec=source.execution_spec,
        retry_safe=source.retry_safe,
        timeout_seconds=source.timeout_seconds,
        max_attempts=source.max_attempts,
        labels=tuple(sorted(dict(source.labels).items())),
        time_zone=source.time_zone,
        cron=source.cron,
        overlap_policy=source.overlap_policy,
        misfire_policy=source.misfire_policy,
        nonexistent_policy=source.nonexistent_policy,
        repeated_policy=source.repeated_policy,
    )


def fold(events: Iterable[ScheduleEvent]) -> ScheduleState | None:
    state: ScheduleState | None = None
    for event in events:
        state = evolve(state, event)
    return state


def _history(state: ScheduleState, firing: Firing) -> tuple[Firing, ...]:
    return (*state.history, firing)[-MAX_HISTORY:]


def _move(state: ScheduleState, run_id: str, status: FiringStatus, detail: str = "") -> tuple[Firing, ...]:
    """The history with the firing of `run_id` moved to `status` (if it is still kept)."""
    history = list(state.history)
    for i in range(len(history) - 1, -1, -1):
        if history[i].run_id == run_id:
            current = history[i]
            if status is F.ENDED and current.status is F.ENDED:
                break
            history[i] = replace(current, status=check_firing(current.status, status), detail=detail)
            break
    return tuple(history)


def _remember(state: ScheduleState, cause: str) -> tuple[str, ...]:
    return state.recent if cause in state.recent else (*state.recent, cause)[-MAX_RECENT:]


def evolve(state: ScheduleState | None, event: ScheduleEvent) -> ScheduleState:
    if isinstance(event, ScheduleCreated):
        if state is not None:
            raise IllegalTransition(f"schedule {event.run_id} exists already")
        return ScheduleState(
            schedule_id=event.run_id,
            version=event.version,
            status=S.ACTIVE,
            tenant=event.tenant,
            owner=event.actor,
            definition=definition_of(event),
            next_run_at=event.next_run_at,
            evaluated_until=event.occurred_at,
            recent=(event.causation_id,),
            created_at=event.occurred_at,
            updated_at=event.occurred_at,
        )
    if state is None:
        raise ValueError(f"{type(event).__name__} for schedule {event.run_id}, which does not exist")
    if event.version != state.version + 1 or event.run_id != state.schedule_id:
        raise ValueError(
            f"{type(event).__name__} v{event.version} of {event.run_id} does not follow "
            f"{state.schedule_id} v{state.version}"
        )
    state = replace(state, version=event.version, updated_at=event.occurred_at)
    if isinstance(event, ScheduleUpdated):
        # A new definition starts from now: old scheduled times are not re-read under it.
        return replace(
            state,
            status=check_transition(state.status, state.status),
            definition=definition_of(event),
            next_run_at=event.next_run_at,
            evaluated_until=max(state.evaluated_until, event.occurred_at),
            recent=_remember(state, event.causation_id),
        )
    if isinstance(event, SchedulePaused):
        return replace(
            state,
            status=check_transition(state.status, S.PAUSED),
            recent=_remember(state, event.causation_id),
        )
    if isinstance(event, ScheduleResumed):
        return replace(
            state,
            status=check_transition(state.status, S.ACTIVE),
            next_run_at=event.next_run_at,
            recent=_remember(state, event.causation_id),
        )
    if isinstance(event, FiringDecided):
        return _decided(state, event)
    if isinstance(event, FiringSkipped):
        firing = Firing(
            event.firing_key, event.scheduled_at, F.SKIPPED, detail=f"{event.reason}: {event.detail}"
        )
        return replace(
            state,
            history=_history(state, firing),
            skipped=state.skipped + 1,
            next_run_at=event.next_run_at,
            evaluated_until=max(state.evaluated_until, event.scheduled_at),
        )
    if isinstance(event, FiringQueued):
        return _queued(state, event)
    if isinstance(event, FiringSubmitted):
        return replace(state, history=_move(state, event.target_run_id, F.SUBMITTED))
    if isinstance(event, ScheduledRunEnded):
        return replace(
            state,
            history=_move(state, event.target_run_id, F.ENDED, event.status),
            active_runs=tuple(r for r in state.active_runs if r != event.target_run_id),
        )
    if isinstance(event, FiringRefused):
        return replace(
            state,
            history=_move(state, event.target_run_id, F.REFUSED, f"{event.code}: {event.detail}"),
            active_runs=tuple(r for r in state.active_runs if r != event.target_run_id),
        )
    raise TypeError(f"not a schedule event: {type(event).__name__}")


def _decided(state: ScheduleState, event: FiringDecided) -> ScheduleState:
    firing = Firing(
        event.firing_key,
        event.scheduled_at,
        F.DECIDED,
        manual=event.manual,
        run_id=event.target_run_id,
        decided_at=event.occurred_at,
        coalesced=event.coalesced,
        merged=event.merged,
    )
    pending = state.pending
    history = state.history
    if pending is not None and pending.firing_key == event.firing_key:
        check_firing(pending.status, F.DECIDED)
        history = tuple(h for h in history if h.firing_key != event.firing_key)
        pending = None
    evaluated = state.evaluated_until if event.manual else max(state.evaluated_until, event.scheduled_at)
    return replace(
        state,
        history=(*history, firing)[-MAX_HISTORY:],
        pending=pending,
        active_runs=(*state.active_runs, event.target_run_id),
        fired=state.fired + 1,
        next_run_at=event.next_run_at,
        evaluated_until=evaluated,
        recent=_remember(state, event.causation_id) if event.manual else state.recent,
    )


def _queued(state: ScheduleState, event: FiringQueued) -> ScheduleState:
    evaluated = max(state.evaluated_until, event.scheduled_at)
    if state.pending is None:
        firing = Firing(event.firing_key, event.scheduled_at, F.QUEUED, merged=event.merged)
        return replace(
            state,
            pending=firing,
            history=_history(state, firing),
            next_run_at=event.next_run_at,
            evaluated_until=evaluated,
        )
    # A later firing merges into the one pending: it keeps its key, counts one more.
    merged = replace(state.pending, merged=event.merged)
    history = tuple(merged if h.firing_key == merged.firing_key else h for h in state.history)
    return replace(
        state, pending=merged, history=history, next_run_at=event.next_run_at, evaluated_until=evaluated
    )
