"""What the executor must do next for a trajectory, derived from its state alone (pure).

After a crash nothing is remembered but the state: the executor asks `pending_work` again and
re-does the same work with the same idempotency key, which the gateway and the recipient turn
into "already done" (SAGA-3: a crash during unwind resumes at the same compensator).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from services.common.ids import action_hash
from services.saga_orchestrator.domain.lifecycle import StepStatus, TrajectoryStatus
from services.saga_orchestrator.domain.state import TrajectoryState, compensation_key

__all__ = ["DispatchStep", "EvaluateGate", "RevokeLease", "RunCompensator", "Work", "pending_work"]

S = StepStatus
T = TrajectoryStatus


@dataclass(frozen=True)
class DispatchStep:
    run_id: str
    step_index: int
    dispatch: int
    attempt_id: str
    epoch: int
    idempotency_key: str
    gateway_tool: str
    operation: str
    params: dict[str, Any]
    not_before: int
    unknown_outcomes: int = 0  # how many answers of this dispatch were lost so far
    # The step's action (tool + canonical params, WD-4): the gateway refuses it when the
    # watchdog tombstoned it, whatever gateway tool and operation the catalog maps it to.
    action_hash: str = ""

    @property
    def key(self) -> str:
        # not_before tells a deferred retry (same dispatch, same idempotency key, later) from the
        # try it follows, so its report is a command of its own.
        return f"dispatch/{self.idempotency_key}/{self.unknown_outcomes}/e{self.epoch}/t{self.not_before}"


@dataclass(frozen=True)
class EvaluateGate:
    run_id: str
    step_index: int
    dispatch: int
    tool: str
    epoch: int
    params: dict[str, Any]

    @property
    def key(self) -> str:
        return f"gate/{self.run_id}/{self.step_index}/{self.dispatch}/e{self.epoch}"


@dataclass(frozen=True)
class RunCompensator:
    run_id: str
    step_index: int
    attempt: int
    attempt_id: str
    epoch: int
    idempotency_key: str
    gateway_tool: str
    operation: str
    params: dict[str, Any]
    not_before: int

    @property
    def key(self) -> str:
        return f"compensate/{self.idempotency_key}/e{self.epoch}"


@dataclass(frozen=True)
class RevokeLease:
    """Revoke the run's lease (an epoch bump): for a frozen trajectory's incident (REC-7), or for
    a semantic deadlock unwound before the pivot (WD-5), whose `incident_id` is the id of the
    level-3 intervention. `reason` is what the takeover says."""

    run_id: str
    incident_id: str
    epoch: int
    reason: str

    @property
    def key(self) -> str:
        return f"revoke/{self.incident_id}"


Work = DispatchStep | EvaluateGate | RunCompensator | RevokeLease


def pending_work(state: TrajectoryState) -> Work | None:
    """At most one piece of work per trajectory: a saga runs one sub-transaction at a time."""
    if state.status is T.FROZEN:
        incident = state.incident
        if incident is not None and not incident.revoked_epoch:
            reason = f"REC-7 incident {incident.incident_id}: {incident.failure_mode}"
            return RevokeLease(state.run_id, incident.incident_id, incident.epoch, reason)
        return None
    if state.owes_deadlock_revocation:
        # WD-5 level 3 before the pivot, after the unwind: the revocation is keyed, and recorded,
        # by the intervention's id (RecordLeaseRevocation.incident_id carries it).
        intervention = state.deadlock_intervention
        reason = f"WD-5 ERR_SEMANTIC_DEADLOCK: intervention {intervention}; the saga was unwound"
        return RevokeLease(state.run_id, intervention, state.epoch, reason)
    if state.status is T.UNWINDING and state.stack:
        step = state.steps[state.stack[-1]]
        spec = step.compensation_spec()
        attempt = step.compensation_attempt
        return RunCompensator(
            run_id=state.run_id,
            step_index=step.index,
            attempt=attempt,
            attempt_id=state.attempt_id,
            epoch=state.epoch,
            idempotency_key=compensation_key(state.run_id, step.index, attempt),
            gateway_tool=str(spec.get("gatewayTool", step.gateway_tool)),
            operation=str(spec.get("operation", "")),
            params=dict(spec.get("params") or {}),
            not_before=step.compensation_not_before,
        )
    open_step = state.open_step
    if open_step is None or state.status.is_terminal:
        return None
    step = open_step
    if step.status is S.AWAITING_GATE:
        if step.gate_verdict:
            return None  # waiting for a human (or the failure is being handled)
        return EvaluateGate(
            state.run_id, step.index, step.dispatch, step.tool, state.epoch, json.loads(step.params)
        )
    return DispatchStep(
        run_id=state.run_id,
        step_index=step.index,
        dispatch=step.dispatch,
        attempt_id=state.attempt_id,
        epoch=state.epoch,
        idempotency_key=step.idempotency_key,
        gateway_tool=step.gateway_tool,
        operation=step.operation,
        params=json.loads(step.params),
        not_before=step.not_before,
        unknown_outcomes=step.unknown_outcomes,
        action_hash=action_hash(step.tool, json.loads(step.params)),
    )
