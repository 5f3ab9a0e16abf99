"""evolve(state, event) -> state: the only way a watchdog changes, and how a restore rebuilds it.

Pure and total over the watchdog's events; the thresholds it trims its rings by come from the
WatchdogConfigured events on the log, never from the deployment of the day. A status change
outside the transition table (lifecycle.py) raises IllegalTransition.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from services.common.contracts import (
    InterventionIssued,
    LoopDetected,
    RollbackAcknowledged,
    StepObserved,
    WatchdogConfigured,
    WatchdogEvent,
)
from services.watchdog.domain.detectors import APPLICATION, TRANSIENT, summary_digest
from services.watchdog.domain.lifecycle import WatchdogStatus, check_transition
from services.watchdog.domain.state import (
    MAX_FAILURES,
    MAX_RECENT,
    Failure,
    Mark,
    MetricPoint,
    Poll,
    WatchdogState,
)
from services.watchdog.domain.thresholds import Thresholds

__all__ = ["evolve", "fold"]

W = WatchdogStatus


def fold(events: Sequence[WatchdogEvent]) -> WatchdogState | None:
    state: WatchdogState | None = None
    for event in events:
        state = evolve(state, event)
    return state


def evolve(state: WatchdogState | None, event: WatchdogEvent) -> WatchdogState:
    if state is None:
        if not isinstance(event, WatchdogConfigured):
            raise ValueError(
                f"{type(event).__name__} for watchdog {event.run_id}, which was never configured"
            )
        state = WatchdogState(
            run_id=event.run_id, version=0, status=W.WATCHING, thresholds=_thresholds(event)
        )
    if isinstance(event, StepObserved):
        return _observed(state, event)  # the hot path: it sets the version itself
    state = replace(state, version=event.version)
    if isinstance(event, WatchdogConfigured):
        return _configured(state, event)
    if isinstance(event, LoopDetected):
        return state  # the evidence is for readers; the ladder acts on InterventionIssued
    if isinstance(event, InterventionIssued):
        return _intervened(state, event)
    if isinstance(event, RollbackAcknowledged):
        return replace(
            state,
            status=check_transition(state.status, W.ROLLED_BACK),
            pending_rollback="",
            acknowledged=(*state.acknowledged, event.intervention_id),
            probation_from=state.turn,
        )
    raise TypeError(f"not a watchdog event: {type(event).__name__}")


def _thresholds(event: WatchdogConfigured) -> Thresholds:
    return Thresholds(
        max_period=event.max_period,
        window=event.window,
        epoch_steps=event.epoch_steps,
        repeat_count=event.repeat_count,
        rollback_budget=event.rollback_budget,
        ladder_epoch=event.ladder_epoch,
        poll_patience=event.poll_patience,
    )


def _configured(state: WatchdogState, event: WatchdogConfigured) -> WatchdogState:
    thresholds = _thresholds(event)
    configured_by = state.configured_by
    if event.origin == "run":
        configured_by = (*configured_by, event.causation_id)
    return replace(
        state,
        thresholds=thresholds,
        configured_by=configured_by,
        marks=state.marks[-thresholds.window :],
        trail=state.trail[-_trail_length(thresholds) :],
    )


def _trail_length(th: Thresholds) -> int:
    # Enough metric points to show the epoch and to find an oscillation of period up to K.
    return th.epoch_steps + th.max_period + 1


def _observed(state: WatchdogState, event: StepObserved) -> WatchdogState:
    # One replace for the whole observation: this runs for every step of every run.
    changes: dict[str, Any] = {"version": event.version}
    changes["last_saga_seq" if event.source == "saga" else "last_runner_seq"] = event.step_seq
    if event.error_kind == TRANSIENT:
        return replace(state, **changes)  # recorded, never counted: 429s and 5xxs are the breakers'
    mark = Mark(event.turn, event.step_seq, event.state_hash, event.action_hash)
    changes["turn"] = event.turn
    changes["recent"] = (*state.recent, mark)[-MAX_RECENT:]
    if event.polling:
        changes["poll"] = _polled(state.poll, event)
    else:
        _stepped(state, event, mark, changes)
    epoch_over = event.turn - state.probation_from > state.thresholds.ladder_epoch
    if state.status in (W.INTERRUPTED, W.ROLLED_BACK) and epoch_over:
        # The ladder epoch passed without a violation: the next one starts at level 1 again.
        changes["status"] = check_transition(state.status, W.WATCHING)
        changes["checkpoint"] = None
    return replace(state, **changes)


def _polled(poll: Poll | None, event: StepObserved) -> Poll:
    digest = summary_digest(event.summary)
    if poll is not None and poll.action_hash == event.action_hash and poll.summary_digest == digest:
        return replace(poll, idle=poll.idle + 1)
    return Poll(event.action_hash, digest, event.turn, event.step_seq)


def _stepped(state: WatchdogState, event: StepObserved, mark: Mark, changes: dict[str, Any]) -> None:
    th = state.thresholds
    failures = _failures(state, event)  # judged in the state the step was taken in
    if failures is not state.failures:
        changes["failures"] = failures
    if event.state_hash:
        changes["last_state_hash"] = event.state_hash
    since_gain = state.since_gain
    if event.mutating:
        changes["poll"] = None
        changes["last_mutation"] = event.action_hash
        if event.error_kind != APPLICATION:
            # A failed mutation changed nothing: it is WD-4's evidence, not a step of an orbit.
            changes["mutations"] = state.mutations + 1
            if event.state_hash:
                changes["marks"] = (*state.marks, mark)[-th.window :]
        if state.best:
            since_gain += 1
    changes["since_gain"] = since_gain
    values = tuple(event.metrics)
    if not values:
        return
    point = MetricPoint(event.turn, event.step_seq, values)
    best = state.best
    if len(values) != len(best):
        # The first vector, or a new metric set: a new epoch starts here.
        changes.update(best=values, gain_turn=event.turn, since_gain=0, trail=(point,))
        return
    changes["trail"] = (*state.trail, point)[-_trail_length(th) :]
    if any(v > b for v, b in zip(values, best, strict=True)):
        improved = tuple(max(v, b) for v, b in zip(values, best, strict=True))
        changes.update(best=improved, gain_turn=event.turn, since_gain=0)


def _failures(state: WatchdogState, event: StepObserved) -> tuple[Failure, ...]:
    failed = state.failure(event.action_hash)
    if event.error_kind == APPLICATION:
        where = event.state_hash or state.last_state_hash
        if failed is not None and failed.same_state(where, state.mutations):
            updated = replace(failed, repeats=failed.repeats + 1)
            return tuple(updated if f is failed else f for f in state.failures)
        # A first failure, or one in a changed environment: its count starts again here.
        entry = Failure(event.action_hash, event.turn, event.step_seq, where, state.mutations)
        others = tuple(f for f in state.failures if f is not failed)
        return (*others, entry)[-MAX_FAILURES:]
    if failed is not None:
        # It worked this time (the environment changed): no longer a known-bad request.
        return tuple(f for f in state.failures if f is not failed)
    return state.failures


def _intervened(state: WatchdogState, event: InterventionIssued) -> WatchdogState:
    checkpoint = Mark(event.checkpoint_turn, event.checkpoint_step, event.checkpoint_state_hash, "")
    state = replace(
        state,
        probation_from=event.turn,
        interventions=state.interventions + 1,
        checkpoint=checkpoint,
    )
    if event.level == 1:
        return replace(state, status=check_transition(state.status, W.INTERRUPTED))
    tombstones = state.tombstones
    if event.action_hash and event.action_hash not in tombstones:
        tombstones = (*tombstones, event.action_hash)
    if event.level == 3:
        return replace(state, status=check_transition(state.status, W.DEADLOCKED), tombstones=tombstones)
    # Level 2: the run goes back to the checkpoint, so what came after it is no evidence any more
    # (the restored state would otherwise look like a return to an earlier state).
    kept = event.checkpoint_turn
    trail = tuple(p for p in state.trail if p.turn <= kept)
    return replace(
        state,
        status=check_transition(state.status, W.ROLLBACK_REQUESTED),
        rollbacks=event.rollbacks_used,
        pending_rollback=event.intervention_id,
        tombstones=tombstones,
        marks=tuple(m for m in state.marks if m.turn <= kept),
        recent=tuple(m for m in state.recent if m.turn <= kept),
        trail=trail,
        best=trail[-1].values if trail else (),
        gain_turn=trail[-1].turn if trail else kept,
        since_gain=0,
        poll=None,
    )
