"""decide(state, command, now, defaults) -> events or a Rejection: every rule of the watchdog (pure).

An observation is validated, deduplicated by its reporter's step number, recorded (StepObserved),
judged by the detectors against the state before it, and a violation climbs the ladder (WD-5):

  level 1  a first violation (or one after a quiet ladder epoch): STATE_OSCILLATION_DETECTED, a
           synthetic observation for the runner; its next proposal of the action is refused.
  level 2  a violation within `ladder_epoch` steps of the last intervention, or any violation
           while a rollback is unacknowledged, with rollback budget left: ROLLBACK_REQUESTED to
           the checkpoint before the loop began, the looping turns truncated, the action
           tombstoned for the run.
  level 3  the same with the budget spent: ERR_SEMANTIC_DEADLOCK.

Each event's id is derived from its cause, so deciding a command again gives the same records.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from services.common.contracts import (
    MAX_METRICS,
    MAX_SUMMARY_CHARS,
    AcknowledgeRollback,
    ConfigureWatchdog,
    InterventionIssued,
    LoopDetected,
    ObserveStep,
    RollbackAcknowledged,
    StepObserved,
    WatchdogCommand,
    WatchdogConfigured,
    WatchdogEvent,
    WatchdogRejectionCode,
)
from services.common.ids import ACTION_HASH_PATTERN, STATE_HASH_PATTERN, canonical_json, derived_id
from services.watchdog.domain.detectors import APPLICATION, TRANSIENT, Detection, Detector, detect
from services.watchdog.domain.evolve import evolve
from services.watchdog.domain.lifecycle import WatchdogStatus
from services.watchdog.domain.state import MAX_CONFIGURATIONS, Mark, WatchdogState
from services.watchdog.domain.thresholds import KEEP, Thresholds, out_of_bounds, with_overrides

__all__ = [
    "DEADLOCK",
    "INTERRUPT",
    "ROLLBACK",
    "SOURCES",
    "Decision",
    "Rejection",
    "decide",
    "validate_observation",
]

C = WatchdogRejectionCode
W = WatchdogStatus
INTERRUPT, ROLLBACK, DEADLOCK = "STATE_OSCILLATION_DETECTED", "ROLLBACK_REQUESTED", "ERR_SEMANTIC_DEADLOCK"
SOURCES = ("saga", "runner")
ERROR_KINDS = ("none", APPLICATION, TRANSIENT)
_ACTION = re.compile(ACTION_HASH_PATTERN)
_STATE = re.compile(STATE_HASH_PATTERN)
_MAX_TOOL_CHARS = 200


@dataclass(frozen=True)
class Rejection:
    code: WatchdogRejectionCode
    detail: str
    state: WatchdogState | None = None


Decision = tuple[WatchdogEvent, ...] | Rejection


class _Emitter:
    """Builds a decision's events one by one, folding each at once into `state`."""

    def __init__(self, state: WatchdogState | None, command: WatchdogCommand, now_ms: int) -> None:
        self._state = state
        self.command = command
        self.now_ms = now_ms
        self.events: list[WatchdogEvent] = []

    @property
    def state(self) -> WatchdogState:
        assert self._state is not None, "no watchdog yet"
        return self._state

    def emit(self, kind: type[Any], **fields: Any) -> None:
        version = (self._state.version if self._state is not None else 0) + 1
        cause = self.command.command_id
        event = kind(
            event_id=derived_id("wde", cause, kind.__name__, str(version)),
            run_id=self.command.run_id,
            version=version,
            occurred_at=self.now_ms,
            causation_id=cause,
            correlation_id=self.command.correlation_id,
            actor=self.command.actor,
            **fields,
        )
        self._state = evolve(self._state, event)
        self.events.append(event)


def decide(
    state: WatchdogState | None, command: WatchdogCommand, now_ms: int, defaults: Thresholds
) -> Decision:
    if isinstance(command, ObserveStep):
        return _observe(state, command, now_ms, defaults)
    if isinstance(command, AcknowledgeRollback):
        return _acknowledge(state, command, now_ms)
    if isinstance(command, ConfigureWatchdog):
        return _configure(state, command, now_ms, defaults)
    return Rejection(C.INVALID_COMMAND, f"{type(command).__name__} is not a watchdog command", state)


# --- observations (WD-1) -------------------------------------------------------------------------


def validate_observation(obs: ObserveStep) -> list[str]:
    """What makes `obs` unusable, for humans; empty when it may be taken in."""
    problems = []
    if obs.source not in SOURCES:
        problems.append(f"source must be one of {', '.join(SOURCES)}")
    if obs.step_seq < 0:
        problems.append("stepSeq must not be negative")
    if not obs.tool or len(obs.tool) > _MAX_TOOL_CHARS:
        problems.append(f"tool must be 1 to {_MAX_TOOL_CHARS} characters")
    if not _ACTION.fullmatch(obs.action_hash):
        problems.append("actionHash must be 16 lowercase hex digits (xxHash64, WD-4)")
    if obs.state_hash and not _STATE.fullmatch(obs.state_hash):
        problems.append("stateHash must be empty or 64 lowercase hex digits (SHA-256, WD-1)")
    if len(obs.summary) > MAX_SUMMARY_CHARS:
        problems.append(f"summary must be at most {MAX_SUMMARY_CHARS} characters")
    if len(obs.metrics) > MAX_METRICS or not all(math.isfinite(v) for v in obs.metrics):
        problems.append(f"metrics must be at most {MAX_METRICS} finite numbers")
    if obs.error_kind not in ERROR_KINDS:
        problems.append(f"errorKind must be one of {', '.join(ERROR_KINDS)}")
    return problems


def _observe(state: WatchdogState | None, obs: ObserveStep, now_ms: int, defaults: Thresholds) -> Decision:
    problems = validate_observation(obs)
    if problems:
        return Rejection(C.INVALID_OBSERVATION, "; ".join(problems), state)
    if state is not None and obs.step_seq <= state.last_seq(obs.source):
        # Seen already (a redelivery), or older than a step already judged: nothing new.
        return ()
    if state is not None and state.status.is_terminal:
        return Rejection(C.WATCHDOG_DEADLOCKED, "the run is in semantic deadlock (WD-5 level 3)", state)
    em = _Emitter(state, obs, now_ms)
    if state is None:
        em.emit(WatchdogConfigured, **asdict(defaults), origin="deployment")
    before = em.state
    counted = obs.error_kind != TRANSIENT
    turn = before.turn + (1 if counted else 0)
    detection = detect(before, obs, turn) if counted else None
    em.emit(
        StepObserved,
        turn=turn,
        source=obs.source,
        step_seq=obs.step_seq,
        tool=obs.tool,
        action_hash=obs.action_hash,
        state_hash=obs.state_hash,
        summary=obs.summary,
        metrics=tuple(obs.metrics),
        error_kind=obs.error_kind,
        polling=obs.polling,
        mutating=obs.mutating,
    )
    if detection is not None:
        _detected(em, obs, turn, detection, before)
    return tuple(em.events)


def _detected(em: _Emitter, obs: ObserveStep, turn: int, found: Detection, before: WatchdogState) -> None:
    detection_id = derived_id("det", obs.run_id, str(turn))
    em.emit(
        LoopDetected,
        detection_id=detection_id,
        turn=turn,
        step_seq=obs.step_seq,
        detector=found.detector.value,
        period=found.period,
        returned_to_step=found.returned_to_step,
        action_hash=obs.action_hash,
        repeated_hashes=found.repeated_hashes,
        window_steps=tuple(m.step_seq for m in found.window),
        window_hashes=tuple(m.state_hash for m in found.window),
        metric_history=canonical_json([list(v) for v in found.metric_history]),
        detail=found.detail,
    )
    _intervene(em, obs, turn, found, detection_id, before)


# --- the ladder (WD-5) ---------------------------------------------------------------------------


def _intervene(
    em: _Emitter, obs: ObserveStep, turn: int, found: Detection, detection_id: str, before: WatchdogState
) -> None:
    state = em.state
    th = state.thresholds
    within_epoch = turn - state.probation_from <= th.ladder_epoch
    escalate = state.status is W.ROLLBACK_REQUESTED or (state.status.on_probation and within_epoch)
    if not escalate:
        level, code = 1, INTERRUPT
    elif state.rollbacks < th.rollback_budget:
        level, code = 2, ROLLBACK
    else:
        level, code = 3, DEADLOCK
    checkpoint = before.checkpoint_before(found.since_turn)
    if escalate and state.checkpoint is not None and state.checkpoint.turn < checkpoint.turn:
        checkpoint = state.checkpoint  # back to before the streak's first loop, not this one's
    truncated = tuple(m.step_seq for m in state.recent if m.turn > checkpoint.turn) if level == 2 else ()
    action = _blamed_action(obs, found, before)
    rollbacks = state.rollbacks + (1 if level == 2 else 0)
    em.emit(
        InterventionIssued,
        intervention_id=derived_id("itv", detection_id),
        detection_id=detection_id,
        turn=turn,
        level=level,
        code=code,
        detector=found.detector.value,
        action_hash=action,
        period=found.period,
        returned_to_step=found.returned_to_step,
        checkpoint_step=checkpoint.step_seq,
        checkpoint_turn=checkpoint.turn,
        checkpoint_state_hash=checkpoint.state_hash,
        truncated_steps=truncated,
        rollbacks_used=rollbacks,
        rollback_budget=th.rollback_budget,
        message=_message(level, found, obs, checkpoint, truncated, action, th),
    )


def _blamed_action(obs: ObserveStep, found: Detection, before: WatchdogState) -> str:
    """The action the intervention refuses or tombstones. A metric verdict usually arrives with
    a read-only verifier step (run the tests): the loop is the mutation before it, never the
    verifier, which the run still needs."""
    metric = found.detector in (Detector.STAGNATION, Detector.OSCILLATION) and not obs.polling
    if metric and not obs.mutating:
        return before.last_mutation
    return obs.action_hash


def _message(
    level: int,
    found: Detection,
    obs: ObserveStep,
    checkpoint: Mark,
    truncated: tuple[int, ...],
    action: str,
    th: Thresholds,
) -> str:
    """The synthetic observation the runner puts in its model's context (the seed's wording)."""
    if found.detector is Detector.CYCLE:
        seen = (
            f"Your action returned the environment to the identical state observed at step "
            f"{found.returned_to_step} (period k={found.period})."
        )
    else:
        seen = found.detail[0].upper() + found.detail[1:] + "."
    where = "the run's start" if checkpoint.step_seq < 0 else f"step {checkpoint.step_seq}"
    if level == 1:
        return (
            f"[SYSTEM ALERT: SEMANTIC_WATCHDOG_INTERRUPT] Action refused by the host supervisor. "
            f"Invariant violation: {INTERRUPT} ({found.detector.value}, k={found.period}). {seen} "
            "You are in an unproductive loop. Do NOT repeat the previous command. Form an alternative "
            "hypothesis or verify your assumptions about the environment."
        )
    if level == 2:
        return (
            f"[SYSTEM ALERT: SEMANTIC_WATCHDOG_ROLLBACK] {ROLLBACK}: a second violation within "
            f"{th.ladder_epoch} steps. {seen} Restore the checkpoint of {where}; the looping turns "
            f"(steps {', '.join(map(str, truncated)) or 'none'}) are truncated and action {action or '-'} "
            "is tombstoned for this run."
        )
    return (
        f"[SYSTEM ALERT: SEMANTIC_WATCHDOG_DEADLOCK] {DEADLOCK}: the rollback budget "
        f"({th.rollback_budget}) is exhausted. {seen} The run's capabilities are revoked and its log "
        "is handed to an operator."
    )


# --- rollback acknowledgements and per-run thresholds -------------------------------------------


def _acknowledge(state: WatchdogState | None, command: AcknowledgeRollback, now_ms: int) -> Decision:
    if state is None:
        return Rejection(C.WATCHDOG_NOT_FOUND, f"run {command.run_id} has no watchdog")
    if command.intervention_id in state.acknowledged:
        return ()  # acknowledged already
    if state.status.is_terminal:
        return Rejection(C.WATCHDOG_DEADLOCKED, "the run is in semantic deadlock (WD-5 level 3)", state)
    if not state.pending_rollback or command.intervention_id != state.pending_rollback:
        pending = state.pending_rollback or "none"
        return Rejection(
            C.NO_ROLLBACK_PENDING,
            f"intervention {command.intervention_id} is not the rollback awaited (pending: {pending})",
            state,
        )
    if command.restored_state_hash and not _STATE.fullmatch(command.restored_state_hash):
        return Rejection(
            C.INVALID_COMMAND, "restoredStateHash must be empty or 64 lowercase hex digits", state
        )
    em = _Emitter(state, command, now_ms)
    em.emit(
        RollbackAcknowledged,
        intervention_id=command.intervention_id,
        checkpoint_step=command.checkpoint_step,
        restored_state_hash=command.restored_state_hash,
    )
    return tuple(em.events)


_OVERRIDES = (
    "max_period",
    "window",
    "epoch_steps",
    "repeat_count",
    "rollback_budget",
    "ladder_epoch",
    "poll_patience",
)


def _configure(
    state: WatchdogState | None, command: ConfigureWatchdog, now_ms: int, defaults: Thresholds
) -> Decision:
    if state is not None:
        if command.command_id in state.configured_by:
            return ()
        if state.status.is_terminal:
            return Rejection(C.WATCHDOG_DEADLOCKED, "the run is in semantic deadlock (WD-5 level 3)", state)
        if len(state.configured_by) >= MAX_CONFIGURATIONS:
            return Rejection(
                C.TOO_MANY_CONFIGURATIONS,
                f"a run may configure its watchdog {MAX_CONFIGURATIONS} times",
                state,
            )
    overrides = {name: getattr(command, name) for name in _OVERRIDES}
    if any(value < KEEP for value in overrides.values()):
        return Rejection(
            C.THRESHOLD_OUT_OF_BOUNDS, "a threshold is -1 (keep) or a value within its bounds", state
        )
    thresholds = with_overrides(state.thresholds if state is not None else defaults, overrides)
    problems = out_of_bounds(thresholds)
    if problems:
        return Rejection(C.THRESHOLD_OUT_OF_BOUNDS, "; ".join(problems), state)
    em = _Emitter(state, command, now_ms)
    em.emit(WatchdogConfigured, **asdict(thresholds), origin="run")
    return tuple(em.events)
