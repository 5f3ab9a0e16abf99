"""The Trajectory's side of the semantic watchdog (WD-5): interrupts, tombstones, the deadlock.

The watchdog (services/watchdog) sends RecordWatchdogIntervention in the transaction that records
its InterventionIssued. Level 1 makes the runner's next proposal of the named action a refusal
(STATE_OSCILLATION_DETECTED) until it proposes something else; level 2 tombstones the action for
the run (ACTION_TOMBSTONED); level 3 (ERR_SEMANTIC_DEADLOCK) refuses every proposal and ends the
trajectory through the existing paths: the unwind of the compensation stack before the pivot
(as an abort does), the REC-7 freeze with an incident and a lease revocation after it. An unwound
deadlock's lease is revoked too, once ROLLED_BACK (work.py, `owes_deadlock_revocation`): not
before, since the compensators run under the current epoch.
"""

from __future__ import annotations

import json
import re
from typing import Any

from services.common.contracts import (
    RecordWatchdogIntervention,
    RecoveryDecided,
    TrajectoryRolledBack,
    WatchdogInterventionRecorded,
)
from services.common.ids import ACTION_HASH_PATTERN, action_hash, canonical_json
from services.saga_orchestrator.domain.codes import TrajectoryRejectionCode
from services.saga_orchestrator.domain.emitter import Emitter, Rejection
from services.saga_orchestrator.domain.lifecycle import StepStatus, TrajectoryStatus
from services.saga_orchestrator.domain.recovery import freeze
from services.saga_orchestrator.domain.state import TrajectoryState

__all__ = [
    "QUARANTINE_CODE",
    "enforce_deadlock",
    "freeze_quarantined",
    "record_intervention",
    "refused_by_watchdog",
]

C = TrajectoryRejectionCode
S = StepStatus
T = TrajectoryStatus
_ACTIVE = (T.FORWARD, T.POST_PIVOT, T.AWAITING_REPAIR, T.AWAITING_APPROVAL)
_ACTION_HASH = re.compile(ACTION_HASH_PATTERN)
QUARANTINE_CODE = "RUN_QUARANTINED"


def refused_by_watchdog(state: TrajectoryState, tool: str, params: dict[str, Any]) -> Rejection | None:
    """WD-5: a proposal of a tombstoned action, or of the action a level-1 interrupt named."""
    if not state.tombstones and not state.interrupt_action:
        return None
    proposed = action_hash(tool, params)
    if proposed in state.tombstones:
        return Rejection(
            C.ACTION_TOMBSTONED,
            f"{tool} with these parameters (action {proposed}) was tombstoned for this run by the "
            "semantic watchdog (WD-5 level 2): it kept the run in a loop",
            state,
        )
    if proposed == state.interrupt_action:
        return Rejection(
            C.STATE_OSCILLATION_DETECTED,
            f"{tool} with these parameters (action {proposed}) is what the semantic watchdog's "
            f"interrupt named (WD-5 level 1); propose something else. {_interrupt_message(state)}",
            state,
        )
    return None


def _interrupt_message(state: TrajectoryState) -> str:
    shown = json.loads(state.watchdog_intervention) if state.watchdog_intervention else {}
    return str(shown.get("message", "")) if isinstance(shown, dict) else ""


def record_intervention(em: Emitter, command: RecordWatchdogIntervention) -> Rejection | None:
    state = em.state
    if command.level not in (1, 2, 3):
        return Rejection(C.INVALID_COMMAND, "level must be 1, 2 or 3", state)
    if command.action_hash and not _ACTION_HASH.fullmatch(command.action_hash):
        return Rejection(C.INVALID_COMMAND, "actionHash must be empty or 16 lowercase hex digits", state)
    em.emit(
        WatchdogInterventionRecorded,
        intervention_id=command.intervention_id,
        level=command.level,
        code=command.code,
        action_hash=command.action_hash,
        period=command.period,
        checkpoint_step=command.checkpoint_step,
        detector=command.detector,
        detail=command.detail,
        message=command.message,
    )
    if command.level == 3 and command.code == QUARANTINE_CODE:
        freeze_quarantined(em)
    elif command.level == 3:
        enforce_deadlock(em)
    return None


def freeze_quarantined(em: Emitter) -> None:
    """QUA-1: a quarantined run's trajectory freezes whatever its pivot state, and no
    compensator runs on the model's behalf (services/quarantine sends this as a level-3
    intervention with code RUN_QUARANTINED). The incident lists the uncompensated effects (before
    the pivot: the whole stack) for an operator, who decides; level 3 already refuses every
    proposal. The quarantine revoked the lease itself; the freeze's REC-7 revocation only bumps
    the epoch once more."""
    state = em.state
    if state.status not in _ACTIVE and state.status is not T.UNWINDING:
        return  # frozen or ended already
    shown = json.loads(state.watchdog_intervention) if state.watchdog_intervention else {}
    error = {
        "kind": QUARANTINE_CODE,
        "message": str(shown.get("detail", "")),
        "interventionId": str(shown.get("interventionId", "")),
    }
    freeze(em, "QUARANTINED", len(state.steps) - 1, error)


def enforce_deadlock(em: Emitter) -> None:
    """Level 3 (ERR_SEMANTIC_DEADLOCK): after the pivot the trajectory freezes with an incident
    and its lease is revoked (REC-7); before it, the saga unwinds its compensators LIFO, once no
    step is in flight (an in-flight step's outcome comes first, and calls this again), and the
    lease is revoked once the trajectory is ROLLED_BACK."""
    state = em.state
    if state.status not in _ACTIVE:
        return  # unwinding, frozen or ended already
    shown = json.loads(state.watchdog_intervention) if state.watchdog_intervention else {}
    error = {
        "kind": "ERR_SEMANTIC_DEADLOCK",
        "message": str(shown.get("detail", "")),
        "interventionId": str(shown.get("interventionId", "")),
        "actionHash": str(shown.get("actionHash", "")),
    }
    if state.pivot_committed:
        freeze(em, "POST_PIVOT_STALLED", len(state.steps) - 1, error)
        return
    open_step = state.open_step
    if open_step is not None and open_step.status is not S.AWAITING_GATE:
        return
    reason = f"ERR_SEMANTIC_DEADLOCK: {error['message']}"
    em.emit(
        RecoveryDecided,
        step_index=-1,
        action="BACKWARD_ROLLBACK",
        gate="semantic-watchdog",
        reason=reason,
        error_class="",
        signature="",
        inputs=canonical_json({"stackDepth": str(len(state.stack)), **error}),
    )
    if not em.state.stack:
        em.emit(TrajectoryRolledBack, compensated_steps=em.state.compensated, reason=reason)
