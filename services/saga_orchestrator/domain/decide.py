"""decide(state, command, now, context) -> events or a Rejection: every rule of the saga (pure).

Each command's events are built one at a time and folded at once (`_Emitter`), so a later rule
of the same decision sees the state the earlier events made. Failures go through recovery.py.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from services.common.contracts import (
    AbortTrajectory,
    AdoptLease,
    ApprovePivot,
    CompensationCompleted,
    CompensationFailed,
    FinishTrajectory,
    IncidentResolved,
    LeaseAdopted,
    LeaseRevocationRecorded,
    PivotApproved,
    PivotGateEvaluated,
    ProposeStep,
    RecordCompensationOutcome,
    RecordLeaseRevocation,
    RecordPivotGate,
    RecordStepOutcome,
    RecordWatchdogIntervention,
    ResolveIncident,
    StartTrajectory,
    StepIntentRecorded,
    StepOutcomeUnknown,
    TrajectoryCommand,
    TrajectoryCompleted,
    TrajectoryEvent,
    TrajectoryRolledBack,
    TrajectoryStarted,
)
from services.common.ids import canonical_json
from services.saga_orchestrator.domain.codes import TrajectoryRejectionCode, code_for_status
from services.saga_orchestrator.domain.emitter import Emitter, Rejection, SagaContext
from services.saga_orchestrator.domain.interventions import (
    enforce_deadlock,
    record_intervention,
    refused_by_watchdog,
)
from services.saga_orchestrator.domain.lifecycle import StepStatus, TrajectoryStatus
from services.saga_orchestrator.domain.plan import PlanRejected, PlanStep, compile_plan
from services.saga_orchestrator.domain.policy import is_deferral
from services.saga_orchestrator.domain.recovery import (
    abort,
    backoff_until,
    fail_step,
    freeze,
    handle_failure,
    record_commit,
)
from services.saga_orchestrator.domain.state import TrajectoryState, compensation_key, step_key
from services.saga_orchestrator.domain.tools import validate_parameters

__all__ = ["Decision", "decide"]

Decision = tuple[TrajectoryEvent, ...] | Rejection
C = TrajectoryRejectionCode
S = StepStatus
T = TrajectoryStatus
_ACTIVE = (T.FORWARD, T.POST_PIVOT, T.AWAITING_REPAIR, T.AWAITING_APPROVAL)


def decide(
    state: TrajectoryState | None, command: TrajectoryCommand, now_ms: int, context: SagaContext
) -> Decision:
    if state is None:
        if isinstance(command, StartTrajectory):
            return _start(command, now_ms, context)
        return Rejection(C.TRAJECTORY_NOT_FOUND, f"run {command.run_id} has no trajectory; start one first")
    if command.command_id in state.causes:
        return ()  # a redelivered command: already decided, nothing new
    if isinstance(command, StartTrajectory):
        return Rejection(C.TRAJECTORY_EXISTS, f"run {command.run_id} already has a trajectory")
    if state.status.is_terminal and not _deadlock_revocation(state, command):
        return Rejection(
            C.TRAJECTORY_ENDED, f"the trajectory of run {state.run_id} ended {state.status.value}", state
        )
    handler = _HANDLERS.get(type(command))
    if handler is None:
        return Rejection(C.INVALID_COMMAND, f"{type(command).__name__} is not a trajectory command")
    emitter = Emitter(state, command, now_ms, context)
    refusal = handler(emitter, command)
    return refusal if refusal is not None else tuple(emitter.events)


# --- start ------------------------------------------------------------------------------------


def _start(command: StartTrajectory, now_ms: int, context: SagaContext) -> Decision:
    if command.pivot_approval not in ("none", "human"):
        return Rejection(C.INVALID_COMMAND, 'pivotApproval must be "none" or "human"')
    if min(command.budget_tokens, command.budget_steps) < 0 or command.budget_money < 0:
        return Rejection(C.INVALID_COMMAND, "budgets must not be negative")
    compiled = ""
    if command.plan:
        try:
            compiled = _compile(command.plan, context)
        except PlanRejected as exc:
            return Rejection(C.PLAN_REJECTED, f"{exc.code}: {exc}")
        except ValueError as exc:
            return Rejection(C.PLAN_REJECTED, f"INVALID_PLAN: {exc}")
    emitter = Emitter(None, command, now_ms, context)
    emitter.emit(
        TrajectoryStarted,
        attempt_id=command.attempt_id,
        epoch=command.lease_epoch,
        plan=compiled,
        pivot_approval=command.pivot_approval,
        budget_tokens=command.budget_tokens,
        budget_steps=command.budget_steps,
        budget_money=command.budget_money,
        rerun_cost_ms=command.rerun_cost_ms,
        rerun_cost_money=command.rerun_cost_money,
        tenant=command.tenant,
    )
    return tuple(emitter.events)


def _compile(plan_text: str, context: SagaContext) -> str:
    raw = json.loads(plan_text)
    if not isinstance(raw, list) or not all(isinstance(item, dict) for item in raw):
        raise ValueError("a plan is a JSON list of {stepId, tool, params, after}")
    steps = [
        PlanStep(
            step_id=str(item.get("stepId", "")),
            tool=str(item.get("tool", "")),
            params=dict(item.get("params") or {}),
            after=tuple(str(x) for x in item.get("after") or ()),
        )
        for item in raw
    ]
    compiled = compile_plan(steps, context.catalog)

    def entry(step: PlanStep) -> dict[str, Any]:
        return {
            "stepId": step.step_id,
            "tool": step.tool,
            "params": dict(step.params),
            "after": list(step.after),
        }

    return canonical_json(
        {
            "order": [entry(s) for s in compiled.order],
            "pivot": compiled.pivot,
            "outbox": [entry(s) for s in compiled.outbox],
            "reordered": compiled.reordered,
        }
    )


# --- the runner's commands --------------------------------------------------------------------


def _fenced(em: Emitter, attempt_id: str, epoch: int) -> Rejection | None:
    state = em.state
    if epoch < state.epoch or (epoch == state.epoch and attempt_id != state.attempt_id):
        return Rejection(
            C.STALE_EPOCH,
            f"attempt {attempt_id} at epoch {epoch} no longer holds run {state.run_id} (epoch {state.epoch})",
            state,
        )
    return None


def _propose(em: Emitter, command: ProposeStep) -> Rejection | None:
    state = em.state
    if (stale := _fenced(em, command.attempt_id, command.lease_epoch)) is not None:
        return stale
    if state.status not in (T.FORWARD, T.POST_PIVOT, T.AWAITING_REPAIR):
        return Rejection(
            code_for_status(state.status),
            f"the trajectory is {state.status.value}; no step may be proposed now",
            state,
        )
    if state.semantic_deadlock:
        return Rejection(
            C.ERR_SEMANTIC_DEADLOCK,
            "the semantic watchdog found the run looping past its rollback budget (WD-5 level 3); "
            "no step may be proposed",
            state,
        )
    if (open_step := state.open_step) is not None:
        return Rejection(C.STEP_IN_FLIGHT, f"step {open_step.index} is still {open_step.status.value}", state)
    try:
        spec = em.context.catalog.get(command.tool)
    except KeyError as exc:
        return Rejection(C.UNKNOWN_TOOL, str(exc), state)
    try:
        params = json.loads(command.params)
    except ValueError as exc:
        return Rejection(C.INVALID_PARAMETERS, f"params is not JSON: {exc}", state)
    if not isinstance(params, dict):
        return Rejection(C.INVALID_PARAMETERS, "params must be a JSON object", state)
    problems = validate_parameters(spec, params)
    if problems:
        return Rejection(C.INVALID_PARAMETERS, f"{command.tool}: " + "; ".join(problems), state)
    if (watched := refused_by_watchdog(state, command.tool, params)) is not None:
        return watched
    if state.budget_steps < 1:
        return Rejection(C.BUDGET_EXHAUSTED, "the trajectory has no steps left in its budget (REC-3)", state)
    if command.repair_of >= 0:
        failed = state.step(command.repair_of)
        if state.status is not T.AWAITING_REPAIR or failed is None or failed.status is not S.FAILED:
            return Rejection(
                C.NOT_AWAITING_REPAIR, f"step {command.repair_of} is not awaiting a repair", state
            )
        if failed.index in state.stack:
            return Rejection(
                C.PARTIAL_EFFECTS,
                f"step {failed.index} left effects that must be compensated first; it cannot be repaired "
                "in place (SAGA-3)",
                state,
            )
        if failed.tool != command.tool:
            return Rejection(
                C.REPAIR_TOOL_MISMATCH, f"a repair of step {failed.index} must use {failed.tool}", state
            )
        index, dispatch, plan_step_id = failed.index, failed.dispatch + 1, failed.plan_step_id
    else:
        if state.status is T.AWAITING_REPAIR:
            failed_index = next(s.index for s in reversed(state.steps) if s.status is S.FAILED)
            return Rejection(
                C.REPAIR_EXPECTED,
                f"step {failed_index} failed and awaits a repair (repairOf={failed_index}) or an abort",
                state,
            )
        if spec.is_pivot and state.pivot_step >= 0:
            pivot = state.steps[state.pivot_step]
            return Rejection(
                C.TWO_PIVOTS,
                f"at most one pivot per trajectory (SAGA-6): step {pivot.index} ({pivot.tool}) is the pivot; "
                f"{command.tool} is irreversible too. Declare both in a plan so an outbound message can be "
                "staged in the outbox and released with the pivot",
                state,
            )
        if state.pivot_committed and not spec.idempotent:
            return Rejection(
                C.NOT_RETRYABLE_AFTER_PIVOT,
                f"after the pivot every step must be idempotent (SAGA-6); {command.tool} is not",
                state,
            )
        plan_step_id = command.plan_step_id
        if state.plan:
            expected = state.next_plan_step()
            if (
                expected is None
                or expected["tool"] != command.tool
                or (plan_step_id and plan_step_id != expected["stepId"])
            ):
                want = (
                    f"{expected['stepId']} ({expected['tool']})" if expected else "nothing (the plan is done)"
                )
                return Rejection(C.PLAN_MISMATCH, f"the compiled plan expects {want} next", state)
            plan_step_id = str(expected["stepId"])
        index, dispatch = len(state.steps), 1
    em.emit(
        StepIntentRecorded,
        step_index=index,
        dispatch=dispatch,
        tool=spec.name,
        gateway_tool=spec.gateway_tool,
        operation=spec.operation,
        params=canonical_json(params),
        idempotency_key=step_key(state.run_id, index, dispatch),
        reversibility=spec.reversibility.value,
        attempt_id=command.attempt_id,
        epoch=command.lease_epoch,
        plan_step_id=plan_step_id,
        repair_of=command.repair_of,
        not_before=0,
        status=(S.AWAITING_GATE if spec.is_pivot else S.PENDING).value,
        tokens_used=command.tokens_used,
        money_used=command.money_used,
    )
    return None


def _adopt(em: Emitter, command: AdoptLease) -> Rejection | None:
    """A new holder took the run's lease over (its runner crashed, LEASE-6): the work still owed,
    even a step already in flight, is redone under the new epoch with the same idempotency key."""
    state = em.state
    if state.status is T.FROZEN:
        return Rejection(
            C.TRAJECTORY_FROZEN, "a frozen trajectory resumes through ResolveIncident (REC-7)", state
        )
    if command.lease_epoch < state.epoch:
        return _fenced(em, command.attempt_id, command.lease_epoch)
    if command.lease_epoch == state.epoch:
        if command.attempt_id != state.attempt_id:
            return _fenced(em, command.attempt_id, command.lease_epoch)
        return None  # already the trajectory's lease
    em.emit(
        LeaseAdopted,
        attempt_id=command.attempt_id,
        epoch=command.lease_epoch,
        previous_attempt_id=state.attempt_id,
        previous_epoch=state.epoch,
    )
    return None


def _finish(em: Emitter, command: FinishTrajectory) -> Rejection | None:
    state = em.state
    if (stale := _fenced(em, command.attempt_id, command.lease_epoch)) is not None:
        return stale
    if state.status not in (T.FORWARD, T.POST_PIVOT) or state.open_step is not None:
        return Rejection(C.TRAJECTORY_BUSY, f"the trajectory is {state.status.value} with work open", state)
    if state.plan and (remaining := state.next_plan_step()) is not None:
        return Rejection(C.PLAN_INCOMPLETE, f"plan step {remaining['stepId']} has not run", state)
    em.emit(TrajectoryCompleted, steps=len(state.steps))
    return None


def _abort(em: Emitter, command: AbortTrajectory) -> Rejection | None:
    state = em.state
    if (stale := _fenced(em, command.attempt_id, command.lease_epoch)) is not None:
        return stale
    if state.pivot_committed:
        return Rejection(
            C.PIVOT_COMMITTED, "the pivot committed: nothing is rolled back after it (SAGA-6)", state
        )
    if state.status not in _ACTIVE:
        return Rejection(code_for_status(state.status), f"the trajectory is {state.status.value}", state)
    open_step = state.open_step
    if open_step is not None and open_step.status is not S.AWAITING_GATE:
        return Rejection(C.STEP_IN_FLIGHT, f"step {open_step.index} is {open_step.status.value}", state)
    abort(em, command.reason)
    return None


# --- the executor's reports -------------------------------------------------------------------


def _outcome(em: Emitter, command: RecordStepOutcome) -> Rejection | None:
    state = em.state
    step = state.step(command.step_index)
    if step is None:
        return Rejection(C.UNKNOWN_STEP, f"no step {command.step_index}", state)
    if step.dispatch != command.dispatch or step.status not in (S.PENDING, S.PREPARING, S.DISPATCHED):
        return None  # a late or repeated report of a dispatch already settled
    if 0 < command.lease_epoch < state.epoch:
        return None  # done under a lease since replaced: the work is redone under the current one
    if state.status is T.FROZEN and command.outcome != "committed":
        return None
    if command.outcome == "committed":
        record_commit(em, step, command.output, command.reconciled)
    elif command.outcome == "unknown":
        em.emit(
            StepOutcomeUnknown, step_index=step.index, dispatch=step.dispatch, detail=command.error_message
        )
        if em.state.steps[step.index].unknown_outcomes >= em.context.max_unknown_outcomes:
            freeze(
                em,
                "OUTCOME_UNKNOWN",
                step.index,
                {"kind": "outcome-unknown", "message": command.error_message},
            )
    elif command.outcome == "failed":
        if step.unknown_outcomes and is_deferral(command.error_kind):
            # This dispatch's effect may have happened (its answers were lost): a deferral must
            # not retire its key for a new one. The executor tries the same key again later.
            return None
        handle_failure(em, step, command)
    else:
        return Rejection(C.INVALID_COMMAND, "outcome must be committed, failed or unknown", state)
    if em.state.semantic_deadlock:
        enforce_deadlock(em)  # the step the deadlock waited for has settled
    return None


def _gate(em: Emitter, command: RecordPivotGate) -> Rejection | None:
    state = em.state
    step = state.step(command.step_index)
    if step is None or step.status is not S.AWAITING_GATE or step.gate_verdict:
        return None
    if state.status not in (T.FORWARD, T.AWAITING_APPROVAL):
        return None  # the trajectory moved on (aborted, frozen) while the gate was evaluated
    try:
        checks = json.loads(command.checks)
    except ValueError:
        return Rejection(C.INVALID_COMMAND, "checks must be a JSON list", state)
    failed = [c for c in checks if not c.get("passed")]
    if failed:
        detail = "; ".join(f"{c.get('name')}: {c.get('detail', '')}" for c in failed)
        em.emit(
            PivotGateEvaluated, step_index=step.index, checks=command.checks, verdict="failed", detail=detail
        )
        fail_step(em, step, "gate-failed", detail)
        return None
    waiting = state.pivot_approval == "human" and step.approval != "approve"
    em.emit(
        PivotGateEvaluated,
        step_index=step.index,
        checks=command.checks,
        verdict="waiting-approval" if waiting else "passed",
        detail="waiting for a human approval (policy)" if waiting else "every check passed",
    )
    return None


def _approve(em: Emitter, command: ApprovePivot) -> Rejection | None:
    state = em.state
    step = state.step(command.step_index)
    pending = step is not None and step.index == state.pivot_step and step.status is S.AWAITING_GATE
    if not pending or state.status not in (T.FORWARD, T.AWAITING_APPROVAL):
        return Rejection(
            C.NO_PIVOT_PENDING,
            f"step {command.step_index} is not a pivot awaiting its gate (trajectory {state.status.value})",
            state,
        )
    assert step is not None
    if command.decision not in ("approve", "refuse"):
        return Rejection(C.INVALID_COMMAND, "decision must be approve or refuse", state)
    em.emit(
        PivotApproved,
        step_index=step.index,
        approver=command.actor,
        decision=command.decision,
        note=command.note,
    )
    if command.decision == "refuse":
        fail_step(em, step, "approval-refused", command.note or f"{command.actor} refused the pivot")
    elif step.gate_verdict == "waiting-approval":
        em.emit(
            PivotGateEvaluated,
            step_index=step.index,
            checks=step.gate_checks,
            verdict="passed",
            detail=f"approved by {command.actor}",
        )
    return None


def _compensated(em: Emitter, command: RecordCompensationOutcome) -> Rejection | None:
    state = em.state
    step = state.step(command.step_index)
    if state.status is not T.UNWINDING or not state.stack or state.stack[-1] != command.step_index:
        return None
    assert step is not None
    if command.attempt != step.compensation_attempt or 0 < command.lease_epoch < state.epoch:
        return None
    if command.outcome == "compensated":
        em.emit(
            CompensationCompleted,
            step_index=step.index,
            attempt=command.attempt,
            idempotency_key=compensation_key(state.run_id, step.index, command.attempt),
        )
        if not em.state.stack:
            em.emit(
                TrajectoryRolledBack,
                compensated_steps=em.state.compensated,
                reason="every committed effect was compensated",
            )
        return None
    fatal = command.outcome == "fatal" or command.attempt >= em.context.max_compensation_attempts
    em.emit(
        CompensationFailed,
        step_index=step.index,
        attempt=command.attempt,
        severity="fatal" if fatal else "retriable",
        error_kind=command.error_kind,
        error_message=command.error_message,
        not_before=0 if fatal else backoff_until(em, step.index, command.attempt),
    )
    if fatal:
        freeze(
            em,
            "COMPENSATION_CORRUPTED",
            step.index,
            {
                "kind": command.error_kind,
                "message": command.error_message,
                "compensator": step.compensation_spec(),
            },
        )
    return None


# --- operators --------------------------------------------------------------------------------


def _deadlock_revocation(state: TrajectoryState, command: TrajectoryCommand) -> bool:
    """The one command an ended trajectory takes: the lease revocation a semantic deadlock
    unwound before the pivot owes once ROLLED_BACK (WD-5 level 3), or its repeat."""
    return (
        isinstance(command, RecordLeaseRevocation)
        and state.status is T.ROLLED_BACK
        and state.semantic_deadlock
        and bool(state.deadlock_intervention)
        and command.incident_id == state.deadlock_intervention
    )


def _revoked(em: Emitter, command: RecordLeaseRevocation) -> Rejection | None:
    """REC-7: an incident's lease revocation; WD-5: a deadlock's, named by its intervention."""
    state = em.state
    incident = state.incident
    if incident is not None and incident.incident_id == command.incident_id:
        owed = not incident.revoked_epoch
    else:
        owed = state.owes_deadlock_revocation and command.incident_id == state.deadlock_intervention
    if owed:  # otherwise a repeat, or a revocation no one owes: nothing to record
        em.emit(LeaseRevocationRecorded, incident_id=command.incident_id, revoked_epoch=command.revoked_epoch)
    return None


def _resolve(em: Emitter, command: ResolveIncident) -> Rejection | None:
    state = em.state
    incident = state.incident
    if state.status is not T.FROZEN or incident is None or incident.incident_id != command.incident_id:
        return Rejection(
            C.INCIDENT_NOT_OPEN, f"incident {command.incident_id} is not open on {state.run_id}", state
        )
    if command.resolution not in ("resume", "compensated-manually", "abandon"):
        return Rejection(
            C.INVALID_COMMAND, "resolution must be resume, compensated-manually or abandon", state
        )
    if command.resolution == "resume" and command.lease_epoch <= incident.epoch:
        return Rejection(
            C.LEASE_REQUIRED,
            f"resume under a lease taken over after the freeze (epoch > {incident.epoch}); "
            f"got epoch {command.lease_epoch}",
            state,
        )
    em.emit(
        IncidentResolved,
        incident_id=incident.incident_id,
        resolution=command.resolution,
        note=command.note,
        attempt_id=command.attempt_id or state.attempt_id,
        epoch=command.lease_epoch or state.epoch,
    )
    return None


_HANDLERS: dict[type[Any], Callable[[Emitter, Any], Rejection | None]] = {
    ProposeStep: _propose,
    AdoptLease: _adopt,
    FinishTrajectory: _finish,
    AbortTrajectory: _abort,
    RecordStepOutcome: _outcome,
    RecordPivotGate: _gate,
    ApprovePivot: _approve,
    RecordCompensationOutcome: _compensated,
    RecordLeaseRevocation: _revoked,
    ResolveIncident: _resolve,
    RecordWatchdogIntervention: record_intervention,
}
