"""The watchdog view: what an operator, a runner or a dashboard sees of a run's semantic watchdog (pure).

The watchdog's own state is folded by its own `evolve` (services/watchdog/domain), so the view
can never disagree with the ladder the watchdog climbs. Around that state the fold keeps what the
state forgets but a reader needs (WD-5: "an operator sees the whole ladder in the run's view"):
the recent observations, the recent detections with their evidence (the window, the repeated
hashes, the period, the metric history), every rung of the ladder with the detection that caused
it and its acknowledgement, and the thresholds each configuration put in force.

Times in the view are RFC 3339 (UTC, milliseconds); the fold keeps epoch ms.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Iterable

from services.common.contracts import (
    InterventionIssued,
    LoopDetected,
    RollbackAcknowledged,
    StepObserved,
    WatchdogConfigured,
    WatchdogEvent,
)
from services.common.sequencing import Sequencing, sequence
from services.common.times import rfc3339
from services.watchdog.domain import WatchdogState, WatchdogStatus, evolve
from services.watchdog.state_codec import decode_state, encode_state

__all__ = [
    "MAX_DETECTIONS",
    "MAX_INTERVENTIONS",
    "MAX_OBSERVATIONS",
    "WatchdogFold",
    "apply_watchdog_event",
    "decode_fold",
    "encode_fold",
    "fold_watchdog",
    "pending_intervention",
    "render_brief",
    "render_watchdog",
    "rfc3339",
]

# A reader wants the recent steps and verdicts, not a log that grows with a long run; the ladder
# itself is short (a few rungs per violation streak) and is kept longer.
MAX_OBSERVATIONS = 32
MAX_DETECTIONS = 20
MAX_INTERVENTIONS = 50
MAX_CONFIGURATIONS = 16
# Fields of a fold entry that hold epoch ms and are shown as RFC 3339.
_TIME_FIELDS = ("at", "issuedAt", "acknowledgedAt")


@dataclass(frozen=True)
class WatchdogFold:
    """The watchdog's state of one run plus what the view keeps beside it (JSON-able entries,
    never mutated once built; times in epoch ms)."""

    state: WatchdogState
    started_at: int
    updated_at: int
    observations: tuple[dict[str, Any], ...] = ()  # the last MAX_OBSERVATIONS, oldest first
    detections: tuple[dict[str, Any], ...] = ()  # the last MAX_DETECTIONS, oldest first
    interventions: tuple[dict[str, Any], ...] = ()  # the ladder, oldest first
    configurations: tuple[dict[str, Any], ...] = ()  # thresholds put in force, oldest first


def apply_watchdog_event(fold: WatchdogFold | None, event: WatchdogEvent) -> WatchdogFold | None:
    """The fold after `event`, or None when `event` is a duplicate (version already applied).

    A version gap raises services.common.sequencing.VersionGap, like the other views."""
    current = fold.state.version if fold is not None else 0
    if sequence(event.run_id, current, event.version) is Sequencing.DUPLICATE:
        return None
    if fold is None:
        # evolve refuses anything but a WatchdogConfigured as a watchdog's first event.
        fold = WatchdogFold(
            state=evolve(None, event), started_at=event.occurred_at, updated_at=event.occurred_at
        )
    else:
        fold = replace(fold, state=evolve(fold.state, event), updated_at=event.occurred_at)
    if isinstance(event, WatchdogConfigured):
        entry = {
            "commandId": event.causation_id,
            "origin": event.origin,
            "actor": event.actor,
            "at": event.occurred_at,
        }
        configured = (*fold.configurations, {**entry, "thresholds": _thresholds(event)})
        return replace(fold, configurations=configured[-MAX_CONFIGURATIONS:])
    if isinstance(event, StepObserved):
        return replace(fold, observations=(*fold.observations, _observation(event))[-MAX_OBSERVATIONS:])
    if isinstance(event, LoopDetected):
        return replace(fold, detections=(*fold.detections, _detection(event))[-MAX_DETECTIONS:])
    if isinstance(event, InterventionIssued):
        evidence = next((d for d in fold.detections if d["detectionId"] == event.detection_id), None)
        ladder = (*fold.interventions, _intervention(event, evidence))
        return replace(fold, interventions=ladder[-MAX_INTERVENTIONS:])
    if isinstance(event, RollbackAcknowledged):
        ladder = tuple(
            {
                **rung,
                "acknowledgedAt": event.occurred_at,
                "acknowledgedBy": event.actor,
                "restoredStateHash": event.restored_state_hash or None,
                "restoredCheckpointStep": event.checkpoint_step,
            }
            if rung["interventionId"] == event.intervention_id
            else rung
            for rung in fold.interventions
        )
        return replace(fold, interventions=ladder)
    return fold


def fold_watchdog(events: Iterable[WatchdogEvent]) -> WatchdogFold | None:
    fold: WatchdogFold | None = None
    for event in events:
        fold = apply_watchdog_event(fold, event) or fold
    return fold


def _thresholds(event: WatchdogConfigured) -> dict[str, int]:
    return {
        "maxPeriod": event.max_period,
        "window": event.window,
        "epochSteps": event.epoch_steps,
        "repeatCount": event.repeat_count,
        "rollbackBudget": event.rollback_budget,
        "ladderEpoch": event.ladder_epoch,
        "pollPatience": event.poll_patience,
    }


def _observation(event: StepObserved) -> dict[str, Any]:
    return {
        "turn": event.turn,
        "source": event.source,
        "stepSeq": event.step_seq,
        "tool": event.tool,
        "actionHash": event.action_hash,
        "stateHash": event.state_hash or None,
        "summary": event.summary,
        "metrics": list(event.metrics),
        "errorKind": event.error_kind,
        "polling": event.polling,
        "mutating": event.mutating,
        "commandId": event.causation_id,
        "actor": event.actor,
        "version": event.version,
        "at": event.occurred_at,
    }


def _parsed(text: str) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _detection(event: LoopDetected) -> dict[str, Any]:
    return {
        "detectionId": event.detection_id,
        "turn": event.turn,
        "stepSeq": event.step_seq,
        "detector": event.detector,
        "period": event.period,
        "returnedToStep": event.returned_to_step if event.returned_to_step >= 0 else None,
        "actionHash": event.action_hash,
        "repeatedHashes": list(event.repeated_hashes),
        "window": [
            {"stepSeq": step, "stateHash": digest or None}
            for step, digest in zip(event.window_steps, event.window_hashes, strict=False)
        ],
        "metricHistory": _parsed(event.metric_history) or [],
        "detail": event.detail,
        "version": event.version,
        "at": event.occurred_at,
    }


def _intervention(event: InterventionIssued, evidence: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "interventionId": event.intervention_id,
        "detectionId": event.detection_id,
        "turn": event.turn,
        "level": event.level,
        "code": event.code,
        "detector": event.detector,
        "actionHash": event.action_hash or None,
        "period": event.period,
        "returnedToStep": event.returned_to_step if event.returned_to_step >= 0 else None,
        # -1 / "" = the run's start (the runner's first checkpoint).
        "checkpointStep": event.checkpoint_step,
        "checkpointTurn": event.checkpoint_turn,
        "checkpointStateHash": event.checkpoint_state_hash or None,
        "truncatedSteps": list(event.truncated_steps),
        "rollbacksUsed": event.rollbacks_used,
        "rollbackBudget": event.rollback_budget,
        "message": event.message,
        "version": event.version,
        "issuedAt": event.occurred_at,
        "acknowledgedAt": None,
        "acknowledgedBy": None,
        "restoredStateHash": None,
        "restoredCheckpointStep": None,
        "evidence": evidence,
    }


# --- rendering ----------------------------------------------------------------------------------


def _shown(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """A fold entry as served: its times as RFC 3339 (nested evidence too)."""
    if entry is None:
        return None
    shown = dict(entry)
    for name in _TIME_FIELDS:
        if isinstance(shown.get(name), int):
            shown[name] = rfc3339(shown[name])
    if isinstance(shown.get("evidence"), dict):
        shown["evidence"] = _shown(shown["evidence"])
    return shown


def pending_intervention(fold: WatchdogFold) -> dict[str, Any] | None:
    """The rung the runner must act on now, or None: a level-1 interrupt until the ladder epoch
    passes quietly, a level-2 rollback until it is acknowledged, a level-3 deadlock for good."""
    if not fold.interventions:
        return None
    status = fold.state.status
    latest = fold.interventions[-1]
    if status is WatchdogStatus.ROLLBACK_REQUESTED:
        pending = fold.state.pending_rollback
        return next((i for i in fold.interventions if i["interventionId"] == pending), latest)
    if status in (WatchdogStatus.INTERRUPTED, WatchdogStatus.DEADLOCKED):
        return latest
    return None


def _for_runner(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """An intervention as a runner's answer carries it: without the (large) evidence."""
    shown = _shown(entry)
    if shown is not None:
        shown.pop("evidence", None)
    return shown


def render_watchdog(fold: WatchdogFold) -> dict[str, Any]:
    """The JSON-able view of one run's watchdog (GET /runs/{runId}/watchdog)."""
    state = fold.state
    th = state.thresholds
    return {
        "runId": state.run_id,
        "version": state.version,
        "status": state.status.value,
        "terminal": state.status.is_terminal,
        "thresholds": {
            "maxPeriod": th.max_period,
            "window": th.window,
            "epochSteps": th.epoch_steps,
            "repeatCount": th.repeat_count,
            "rollbackBudget": th.rollback_budget,
            "ladderEpoch": th.ladder_epoch,
            "pollPatience": th.poll_patience,
        },
        "configurations": [_shown(c) for c in fold.configurations],
        "turn": state.turn,
        "rollbacks": {"used": state.rollbacks, "budget": th.rollback_budget},
        "pendingRollback": state.pending_rollback or None,
        "tombstones": list(state.tombstones),
        "pendingIntervention": _for_runner(pending_intervention(fold)),
        "observations": [_shown(o) for o in fold.observations],
        "detections": [_shown(d) for d in fold.detections],
        "interventions": [_shown(i) for i in fold.interventions],
        "startedAt": rfc3339(fold.started_at),
        "updatedAt": rfc3339(fold.updated_at),
    }


def render_brief(fold: WatchdogFold) -> dict[str, Any]:
    """The few fields a runner's answers carry (a heartbeat reads only this)."""
    latest = fold.interventions[-1] if fold.interventions else None
    return {
        "runId": fold.state.run_id,
        "version": fold.state.version,
        "status": fold.state.status.value,
        "pendingIntervention": _for_runner(pending_intervention(fold)),
        "latestIntervention": _for_runner(latest),
        "tombstones": list(fold.state.tombstones),
    }


# --- persistence --------------------------------------------------------------------------------


def encode_fold(fold: WatchdogFold) -> bytes:
    return json.dumps(
        {
            "state": json.loads(encode_state(fold.state)),
            "startedAt": fold.started_at,
            "updatedAt": fold.updated_at,
            "observations": list(fold.observations),
            "detections": list(fold.detections),
            "interventions": list(fold.interventions),
            "configurations": list(fold.configurations),
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode("utf-8")


def decode_fold(raw: bytes) -> WatchdogFold:
    data = json.loads(raw)
    return WatchdogFold(
        state=decode_state(json.dumps(data["state"]).encode("utf-8")),
        started_at=int(data["startedAt"]),
        updated_at=int(data["updatedAt"]),
        observations=tuple(data["observations"]),
        detections=tuple(data["detections"]),
        interventions=tuple(data["interventions"]),
        configurations=tuple(data["configurations"]),
    )
