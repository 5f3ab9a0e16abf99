"""The trajectory view: what a runner, an operator or a dashboard sees of a run's saga (pure).

The saga's own state is folded by the orchestrator's `evolve`, so the view can never disagree
with the decisions the orchestrator makes. Around that state the fold keeps what the state
forgets but a reader needs: the recent recovery decisions with their inputs (REC-1), every
incident with its context and resolution (REC-7), each step's dispatch history and which
command caused what (so the API can answer a repeated request from the view).

Parameters, outputs, compensators and decision inputs travel as JSON text on the log; the view
parses them, so a client reads objects, not strings inside strings.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable

from services.common import jsonbytes
from services.common.contracts import (
    IncidentResolved,
    LeaseRevocationRecorded,
    RecoveryDecided,
    StepIntentRecorded,
    TrajectoryEvent,
    TrajectoryFrozen,
    TrajectoryStarted,
)
from services.common.sequencing import Sequencing, sequence
from services.saga_orchestrator.domain import StepState, StepStatus, TrajectoryState, evolve
from services.saga_orchestrator.state_codec import state_from_record, state_record

__all__ = [
    "MAX_DECISIONS",
    "MAX_RECENT_COMMANDS",
    "TrajectoryFold",
    "apply_trajectory_event",
    "decode_fold",
    "encode_fold",
    "fold_trajectory",
    "open_incident",
    "render_trajectory",
]

# A reader wants the recent reasoning, not a history that grows with every retry of a long run.
MAX_DECISIONS = 20
# Enough to recognise a repeated request after an API restart; older ones are long answered.
MAX_RECENT_COMMANDS = 64
# A step's error is "current" only while the step is in one of these; otherwise it is history.
_ERROR_STATUSES = frozenset({StepStatus.FAILED, StepStatus.COMPENSATING, StepStatus.PANIC})


@dataclass(frozen=True)
class TrajectoryFold:
    """The orchestrator's state of one trajectory plus what the view keeps beside it.

    Every tuple holds JSON-able dicts that are never mutated once built (new ones replace them).
    """

    state: TrajectoryState
    started_at: int
    updated_at: int
    decisions: tuple[dict[str, Any], ...] = ()  # the last MAX_DECISIONS RecoveryDecided, oldest first
    incidents: tuple[dict[str, Any], ...] = ()  # every incident of the run, oldest first
    dispatches: tuple[dict[str, Any], ...] = ()  # every StepIntentRecorded, in log order
    recent_commands: tuple[dict[str, Any], ...] = ()  # commands that caused events, newest last


def _parsed(text: str) -> Any:
    """JSON text as a value; "" is None; text that is not JSON stays text (never an error)."""
    if not text:
        return None
    try:
        return jsonbytes.loads(text)
    except ValueError:
        return text


def apply_trajectory_event(fold: TrajectoryFold | None, event: TrajectoryEvent) -> TrajectoryFold | None:
    """The fold after `event`, or None when `event` is a duplicate (version already applied).

    A version gap raises services.common.sequencing.VersionGap, like the Run view: a view built
    over missing events would look plausible and be wrong.
    """
    current = fold.state.version if fold is not None else 0
    if sequence(event.run_id, current, event.version) is Sequencing.DUPLICATE:
        return None
    if fold is None:
        if not isinstance(event, TrajectoryStarted):
            raise ValueError(
                f"{type(event).__name__} {event.event_id} arrived before trajectory {event.run_id}"
            )
        fold = TrajectoryFold(
            state=evolve(None, event), started_at=event.occurred_at, updated_at=event.occurred_at
        )
        return replace(fold, recent_commands=_remember(fold, event))
    after = replace(
        fold,
        state=evolve(fold.state, event),
        updated_at=event.occurred_at,
        recent_commands=_remember(fold, event),
    )
    if isinstance(event, StepIntentRecorded):
        return replace(after, dispatches=(*after.dispatches, _dispatch_entry(event)))
    if isinstance(event, RecoveryDecided):
        return replace(after, decisions=(*after.decisions, _decision_entry(event))[-MAX_DECISIONS:])
    if isinstance(event, TrajectoryFrozen):
        return replace(after, incidents=(*after.incidents, _incident_entry(event)))
    if isinstance(event, LeaseRevocationRecorded):
        return _update_incident(after, event.incident_id, revokedEpoch=event.revoked_epoch)
    if isinstance(event, IncidentResolved):
        return _update_incident(
            after,
            event.incident_id,
            resolution=event.resolution,
            resolutionNote=event.note,
            resolvedAt=event.occurred_at,
            resolvedBy=event.actor,
            resumedAttemptId=event.attempt_id if event.resolution == "resume" else None,
            resumedEpoch=event.epoch if event.resolution == "resume" else None,
        )
    return after


def fold_trajectory(events: Iterable[TrajectoryEvent]) -> TrajectoryFold | None:
    fold: TrajectoryFold | None = None
    for event in events:
        fold = apply_trajectory_event(fold, event) or fold
    return fold


def _remember(fold: TrajectoryFold, event: TrajectoryEvent) -> tuple[dict[str, Any], ...]:
    """The commands that caused events, each with the version of its first event."""
    if any(entry["commandId"] == event.causation_id for entry in fold.recent_commands):
        return fold.recent_commands
    entry: dict[str, Any] = {
        "commandId": event.causation_id,
        "version": event.version,
        "firstEvent": type(event).__name__,
        "actor": event.actor,
        "at": event.occurred_at,
    }
    return (*fold.recent_commands, entry)[-MAX_RECENT_COMMANDS:]


def _dispatch_entry(event: StepIntentRecorded) -> dict[str, Any]:
    return {
        "stepIndex": event.step_index,
        "dispatch": event.dispatch,
        "idempotencyKey": event.idempotency_key,
        "commandId": event.causation_id,
        "version": event.version,
        "attemptId": event.attempt_id,
        "epoch": event.epoch,
        "repairOf": event.repair_of if event.repair_of >= 0 else None,
        "notBefore": event.not_before or None,
        "recordedAt": event.occurred_at,
        "by": event.actor,
    }


def _decision_entry(event: RecoveryDecided) -> dict[str, Any]:
    return {
        "version": event.version,
        "at": event.occurred_at,
        "stepIndex": event.step_index,
        "action": event.action,
        "gate": event.gate,
        "reason": event.reason,
        "errorClass": event.error_class or None,
        "signature": event.signature or None,
        "inputs": _parsed(event.inputs),
    }


def _incident_entry(event: TrajectoryFrozen) -> dict[str, Any]:
    return {
        "incidentId": event.incident_id,
        "runId": event.run_id,
        "failureMode": event.failure_mode,
        "failedStep": event.failed_step,
        "failedTool": event.failed_tool or None,
        "errorContext": _parsed(event.error_context),
        "uncompensated": _parsed(event.uncompensated) or [],
        "snapshotRef": event.snapshot_ref,
        "epoch": event.epoch,
        "revokedEpoch": None,
        "openedAt": event.occurred_at,
        "version": event.version,
        "resolution": None,
        "resolutionNote": None,
        "resolvedAt": None,
        "resolvedBy": None,
        "resumedAttemptId": None,
        "resumedEpoch": None,
    }


def _update_incident(fold: TrajectoryFold, incident_id: str, **changes: Any) -> TrajectoryFold:
    incidents = tuple(
        {**incident, **changes} if incident["incidentId"] == incident_id else incident
        for incident in fold.incidents
    )
    return replace(fold, incidents=incidents)


# --- rendering ----------------------------------------------------------------------------------


def _render_step(step: StepState, dispatches: list[dict[str, Any]]) -> dict[str, Any]:
    error = (
        {
            "kind": step.error_kind,
            "message": step.error_message,
            "status": step.error_status or None,
            "class": step.error_class or None,
        }
        if step.error_kind
        else None
    )
    return {
        "index": step.index,
        "tool": step.tool,
        "gatewayTool": step.gateway_tool,
        "operation": step.operation,
        "reversibility": step.reversibility,
        "pivot": step.is_pivot,
        "planStepId": step.plan_step_id or None,
        "status": step.status.value,
        "dispatch": step.dispatch,
        "idempotencyKey": step.idempotency_key,
        "notBefore": step.not_before or None,
        "params": _parsed(step.params),
        "output": _parsed(step.output),
        "compensation": _parsed(step.compensation),
        # The error of the current dispatch; an earlier dispatch's error stays as lastError.
        "error": error if step.status in _ERROR_STATUSES else None,
        "lastError": error,
        "gateVerdict": step.gate_verdict or None,
        "gateChecks": _parsed(step.gate_checks),
        "approval": step.approval or None,
        "consecutiveRepairs": step.consecutive_repairs,
        "transientRetries": step.transient_retries,
        "unknownOutcomes": step.unknown_outcomes,
        "compensationAttempt": step.compensation_attempt,
        "dispatches": dispatches,
    }


def render_trajectory(fold: TrajectoryFold) -> dict[str, Any]:
    """The JSON-able view of one trajectory (GET /runs/{runId}/trajectory)."""
    state = fold.state
    by_step: dict[int, list[dict[str, Any]]] = {}
    for entry in fold.dispatches:
        by_step.setdefault(int(entry["stepIndex"]), []).append(dict(entry))
    open_step = state.open_step
    current_incident = _unresolved(fold)
    return {
        "runId": state.run_id,
        "version": state.version,
        "status": state.status.value,
        "terminal": state.status.is_terminal,
        "attemptId": state.attempt_id,
        "epoch": state.epoch,
        "pivotApproval": state.pivot_approval,
        # What is left of the budget (REC-3): every recorded intent spent a step and its usage.
        "budget": {
            "tokens": state.budget_tokens,
            "steps": state.budget_steps,
            "money": state.budget_money,
        },
        "rerunCost": {"durationMs": state.rerun_cost_ms, "money": state.rerun_cost_money},
        "plan": _parsed(state.plan),
        "pivotStep": state.pivot_step if state.pivot_step >= 0 else None,
        "pivotCommitted": state.pivot_committed,
        "stack": list(state.stack),  # step indexes; the top of the LIFO stack is the last one
        "compensated": list(state.compensated),  # in unwind order
        "openStep": open_step.index if open_step is not None else None,
        "steps": [_render_step(step, by_step.get(step.index, [])) for step in state.steps],
        "decisions": [dict(d) for d in fold.decisions],
        "incident": current_incident,
        "incidents": [dict(i) for i in fold.incidents],
        "recentCommands": [dict(c) for c in fold.recent_commands],
        "watchdog": _watchdog(state),
        "startedAt": fold.started_at,
        "updatedAt": fold.updated_at,
    }


def _watchdog(state: TrajectoryState) -> dict[str, Any]:
    """What the semantic watchdog's interventions (WD-5) made of this trajectory: the action a
    level-1 interrupt refuses next, the tombstoned actions, the deadlock, the latest rung."""
    return {
        "interruptAction": state.interrupt_action or None,
        "tombstones": list(state.tombstones),
        "semanticDeadlock": state.semantic_deadlock,
        "intervention": _parsed(state.watchdog_intervention),
    }


def _unresolved(fold: TrajectoryFold) -> dict[str, Any] | None:
    # The state keeps an abandoned or hand-compensated incident; only the resolution closes it.
    incident = fold.state.incident
    if incident is None:
        return None
    entry = next((i for i in fold.incidents if i["incidentId"] == incident.incident_id), None)
    return dict(entry) if entry is not None and entry["resolution"] is None else None


def open_incident(fold: TrajectoryFold) -> dict[str, Any] | None:
    """The run's open incident as the incidents index lists it, or None (REC-7).

    Open from its TrajectoryFrozen until its IncidentResolved; revocation details follow it."""
    entry = _unresolved(fold)
    if entry is None:
        return None
    return {
        **{k: v for k, v in entry.items() if not k.startswith("resol") and not k.startswith("resumed")},
        "trajectoryVersion": fold.state.version,
        "attemptId": fold.state.attempt_id,
    }


# --- persistence --------------------------------------------------------------------------------


def encode_fold(fold: TrajectoryFold) -> bytes:
    return jsonbytes.dumps(
        {
            "state": state_record(fold.state),
            "startedAt": fold.started_at,
            "updatedAt": fold.updated_at,
            "decisions": list(fold.decisions),
            "incidents": list(fold.incidents),
            "dispatches": list(fold.dispatches),
            "recentCommands": list(fold.recent_commands),
        },
        sort_keys=True,
    )


def decode_fold(raw: bytes) -> TrajectoryFold:
    data = jsonbytes.loads(raw)
    return TrajectoryFold(
        state=state_from_record(data["state"]),
        started_at=int(data["startedAt"]),
        updated_at=int(data["updatedAt"]),
        decisions=tuple(data["decisions"]),
        incidents=tuple(data["incidents"]),
        dispatches=tuple(data["dispatches"]),
        recent_commands=tuple(data["recentCommands"]),
    )
