"""evolve(state, event) -> state: the only way a trajectory changes, and how replay rebuilds it.

Pure and total over the trajectory's events; it never reads a clock or the tool catalog. A status
change outside the transition tables (lifecycle.py) raises IllegalTransition.
"""

from __future__ import annotations

import json
from dataclasses import replace

from services.common.contracts import (
    CompensationCompleted,
    CompensationFailed,
    CompensationStackRetired,
    IncidentResolved,
    LeaseAdopted,
    LeaseRevocationRecorded,
    PivotApproved,
    PivotGateEvaluated,
    RecoveryDecided,
    StepCommitted,
    StepFailed,
    StepIntentRecorded,
    StepOutcomeUnknown,
    TrajectoryCompleted,
    TrajectoryEvent,
    TrajectoryFrozen,
    TrajectoryRolledBack,
    TrajectoryStarted,
    WatchdogInterventionRecorded,
)
from services.common.ids import action_hash, canonical_json
from services.saga_orchestrator.domain.lifecycle import (
    StepStatus,
    TrajectoryStatus,
    check_step,
    check_trajectory,
)
from services.saga_orchestrator.domain.policy import is_deferral
from services.saga_orchestrator.domain.state import Incident, StepState, TrajectoryState

__all__ = ["evolve", "fold"]

S = StepStatus
T = TrajectoryStatus


def fold(events: list[TrajectoryEvent] | tuple[TrajectoryEvent, ...]) -> TrajectoryState | None:
    state: TrajectoryState | None = None
    for event in events:
        state = evolve(state, event)
    return state


def evolve(state: TrajectoryState | None, event: TrajectoryEvent) -> TrajectoryState:
    if isinstance(event, TrajectoryStarted):
        if state is not None:
            raise ValueError(f"trajectory {event.run_id} already started")
        return TrajectoryState(
            run_id=event.run_id,
            version=event.version,
            status=T.FORWARD,
            attempt_id=event.attempt_id,
            epoch=event.epoch,
            pivot_approval=event.pivot_approval,
            budget_tokens=event.budget_tokens,
            budget_steps=event.budget_steps,
            budget_money=event.budget_money,
            rerun_cost_ms=event.rerun_cost_ms,
            rerun_cost_money=event.rerun_cost_money,
            plan=event.plan,
            causes=frozenset({event.causation_id}),
            tenant=event.tenant or "",
        )
    if state is None:
        raise ValueError(f"{type(event).__name__} for trajectory {event.run_id}, which never started")
    state = replace(state, version=event.version, causes=state.causes | {event.causation_id})
    return _apply(state, event)


def _status(state: TrajectoryState, status: TrajectoryStatus) -> TrajectoryState:
    return replace(state, status=check_trajectory(state.status, status))


def _step(state: TrajectoryState, index: int, status: StepStatus, **changes: object) -> TrajectoryState:
    step = state.steps[index]
    moved = check_step(step.status, status, index) if step.status is not status else status
    return state.with_step(replace(step, status=moved, **changes))  # type: ignore[arg-type]


def _apply(state: TrajectoryState, event: TrajectoryEvent) -> TrajectoryState:
    if isinstance(event, StepIntentRecorded):
        return _intent(state, event)
    if isinstance(event, PivotGateEvaluated):
        step = state.steps[event.step_index]
        if event.verdict == "passed":
            state = _step(
                state, event.step_index, S.PREPARING, gate_checks=event.checks, gate_verdict="passed"
            )
            return _status(state, T.FORWARD)
        if event.verdict == "waiting-approval":
            state = state.with_step(replace(step, gate_checks=event.checks, gate_verdict=event.verdict))
            return _status(state, T.AWAITING_APPROVAL)
        return state.with_step(replace(step, gate_checks=event.checks, gate_verdict=event.verdict))
    if isinstance(event, PivotApproved):
        step = state.steps[event.step_index]
        return state.with_step(replace(step, approval=event.decision))
    if isinstance(event, StepCommitted):
        step = state.steps[event.step_index]
        changes: dict[str, object] = {"output": event.output, "compensation": event.compensation}
        state = _step(state, event.step_index, S.COMMITTED, **changes)
        is_the_pivot = event.step_index == state.pivot_step
        if not is_the_pivot and not state.pivot_committed and event.step_index not in state.stack:
            # On the stack even when no compensator could be bound from the output: the effect is
            # there, and an unwind that reaches it must stop for a human, not skip it.
            state = replace(state, stack=(*state.stack, event.step_index))
        if state.status is T.FROZEN:
            # A late report of work done before the freeze: recorded, but only an operator thaws
            # the trajectory; it resumes past the pivot if the pivot is what committed (REC-7).
            if is_the_pivot and state.incident is not None:
                state = replace(state, incident=replace(state.incident, resume_to=T.POST_PIVOT))
            return state
        if is_the_pivot:
            state = _status(state, T.POST_PIVOT)
        elif state.status is T.AWAITING_REPAIR:
            state = _status(state, T.POST_PIVOT if state.pivot_committed else T.FORWARD)
        return state
    if isinstance(event, StepOutcomeUnknown):
        step = state.steps[event.step_index]
        return _step(state, event.step_index, S.DISPATCHED, unknown_outcomes=step.unknown_outcomes + 1)
    if isinstance(event, StepFailed):
        step = state.steps[event.step_index]
        state = _step(
            state,
            event.step_index,
            S.FAILED,
            error_kind=event.error_kind,
            error_message=event.error_message,
            error_status=event.error_status,
            error_class=event.error_class,
            signatures=(*step.signatures, event.signature),
            compensation=event.compensation,
            output=event.partial_output,
        )
        if event.compensation and not state.pivot_committed and event.step_index not in state.stack:
            # Partial effects: this step's own compensator runs first on unwind (SAGA-3). After
            # the pivot the stack is retired: the incident lists them instead.
            state = replace(state, stack=(*state.stack, event.step_index))
        return state
    if isinstance(event, RecoveryDecided):
        return _recovery(state, event)
    if isinstance(event, CompensationStackRetired):
        return replace(state, stack=())
    if isinstance(event, CompensationCompleted):
        state = _step(state, event.step_index, S.COMPENSATED)
        stack = tuple(i for i in state.stack if i != event.step_index)
        return replace(state, stack=stack, compensated=(*state.compensated, event.step_index))
    if isinstance(event, CompensationFailed):
        status = S.COMPENSATING if event.severity == "retriable" else S.PANIC
        return _step(
            state,
            event.step_index,
            status,
            compensation_attempt=event.attempt + 1 if status is S.COMPENSATING else event.attempt,
            compensation_not_before=event.not_before,
            error_kind=event.error_kind,
            error_message=event.error_message,
        )
    if isinstance(event, TrajectoryCompleted):
        return _status(state, T.COMPLETED)
    if isinstance(event, TrajectoryRolledBack):
        return _status(state, T.ROLLED_BACK)
    if isinstance(event, TrajectoryFrozen):
        resume_to = (
            state.status
            if state.status is not T.AWAITING_REPAIR
            else (T.POST_PIVOT if state.pivot_committed else T.FORWARD)
        )
        if resume_to is T.AWAITING_APPROVAL:
            resume_to = T.FORWARD
        incident = Incident(event.incident_id, event.failure_mode, event.failed_step, resume_to, event.epoch)
        return replace(_status(state, T.FROZEN), incident=incident)
    if isinstance(event, LeaseAdopted):
        return replace(state, attempt_id=event.attempt_id, epoch=event.epoch)
    if isinstance(event, LeaseRevocationRecorded):
        revoked = state.incident
        if revoked is not None and revoked.incident_id == event.incident_id:
            return replace(state, incident=replace(revoked, revoked_epoch=event.revoked_epoch))
        # WD-5: the revocation a semantic deadlock owes once unwound names its intervention.
        assert event.incident_id == state.deadlock_intervention, event.incident_id
        return replace(state, deadlock_revoked_epoch=event.revoked_epoch)
    if isinstance(event, IncidentResolved):
        return _resolved(state, event)
    if isinstance(event, WatchdogInterventionRecorded):
        return _watchdog(state, event)
    raise TypeError(f"not a trajectory event: {type(event).__name__}")


def _watchdog(state: TrajectoryState, event: WatchdogInterventionRecorded) -> TrajectoryState:
    """WD-5: level 1 refuses the action once, level 2 tombstones it, level 3 is the deadlock."""
    shown = canonical_json(
        {
            "interventionId": event.intervention_id,
            "level": event.level,
            "code": event.code,
            "actionHash": event.action_hash,
            "period": event.period,
            "checkpointStep": event.checkpoint_step,
            "detector": event.detector,
            "detail": event.detail,
            "message": event.message,
        }
    )
    state = replace(state, watchdog_intervention=shown)
    if event.level == 1:
        return replace(state, interrupt_action=event.action_hash)
    tombstones = state.tombstones
    if event.action_hash and event.action_hash not in tombstones:
        tombstones = (*tombstones, event.action_hash)
    deadlock = state.semantic_deadlock or event.level >= 3
    # The first level 3 names the deadlock (and keys the lease revocation it owes, work.py).
    named = state.deadlock_intervention or (event.intervention_id if event.level >= 3 else "")
    return replace(
        state,
        interrupt_action="",
        tombstones=tombstones,
        semantic_deadlock=deadlock,
        deadlock_intervention=named,
    )


def _intent(state: TrajectoryState, event: StepIntentRecorded) -> TrajectoryState:
    if state.interrupt_action and action_hash(event.tool, json.loads(event.params)) != state.interrupt_action:
        # The runner moved on to another action: the level-1 interrupt has done its work.
        state = replace(state, interrupt_action="")
    status = S(event.status)
    previous = state.step(event.step_index)
    # A retry after a deferral by the gateway's tool protection (circuit open, bulkhead full):
    # nothing was sent, so it is neither a trajectory step nor a transient retry (BRK-2).
    deferred = previous is not None and event.repair_of < 0 and is_deferral(previous.error_kind)
    budget = replace(
        state,
        budget_steps=state.budget_steps - (0 if deferred else 1),
        budget_tokens=state.budget_tokens - event.tokens_used,
        budget_money=state.budget_money - event.money_used,
        attempt_id=event.attempt_id,
        epoch=event.epoch,
    )
    if previous is None:
        step = StepState(
            index=event.step_index,
            tool=event.tool,
            gateway_tool=event.gateway_tool,
            operation=event.operation,
            reversibility=event.reversibility,
            params=event.params,
            plan_step_id=event.plan_step_id,
            status=status,
            dispatch=event.dispatch,
            idempotency_key=event.idempotency_key,
            not_before=event.not_before,
        )
        state = budget.with_step(step)
        if step.is_pivot and state.pivot_step < 0:
            # Only the first class III step is the pivot; later ones are the outbox's messages.
            state = replace(state, pivot_step=step.index)
        return state
    # A retry or a repair of a failed step: same logical sub-transaction, a new dispatch and key.
    repairing = previous.error_kind if event.repair_of >= 0 else ""
    state = _step(
        budget,
        event.step_index,
        status,
        params=event.params,
        dispatch=event.dispatch,
        idempotency_key=event.idempotency_key,
        not_before=event.not_before,
        repairing_kind=repairing,
        consecutive_repairs=previous.consecutive_repairs + (1 if event.repair_of >= 0 else 0),
        transient_retries=previous.transient_retries + (0 if event.repair_of >= 0 or deferred else 1),
        gate_checks="",
        gate_verdict="",
        unknown_outcomes=0,
    )
    if state.status is T.AWAITING_REPAIR:
        state = _status(state, T.POST_PIVOT if state.pivot_committed else T.FORWARD)
    return state


def _recovery(state: TrajectoryState, event: RecoveryDecided) -> TrajectoryState:
    if event.action == "FORWARD_REPAIR":
        return _status(state, T.AWAITING_REPAIR)
    if event.action == "BACKWARD_ROLLBACK":
        return _status(state, T.UNWINDING)
    return state  # TRANSIENT_RETRY is followed by a new intent; OPERATOR_ESCALATE by a freeze


def _resolved(state: TrajectoryState, event: IncidentResolved) -> TrajectoryState:
    incident = state.incident
    assert incident is not None
    if event.resolution == "resume":
        # An operator who resumes has judged the run: a semantic deadlock (WD-5) ends with it.
        state = replace(
            state,
            attempt_id=event.attempt_id,
            epoch=event.epoch,
            incident=None,
            semantic_deadlock=False,
            deadlock_intervention="",
        )
        for index in state.stack:
            step = state.steps[index]
            if step.status is S.PANIC:
                # The panicked key failed for good at the gateway: the retry needs a new one.
                state = _step(
                    state, index, S.COMPENSATING, compensation_attempt=step.compensation_attempt + 1
                )
        resume_to = incident.resume_to
        failed = state.step(incident.failed_step)
        if failed is not None and failed.status is S.FAILED and resume_to in (T.FORWARD, T.POST_PIVOT):
            # Effects left by the failed step are undone before anything else (SAGA-3); otherwise
            # the runner retries or repairs it.
            resume_to = T.UNWINDING if failed.index in state.stack else T.AWAITING_REPAIR
        return _status(state, resume_to)
    if event.resolution == "compensated-manually":
        for index in reversed(state.stack):
            state = _step(state, index, S.COMPENSATED)
        state = replace(state, compensated=(*state.compensated, *reversed(state.stack)), stack=())
        return _status(state, T.ABANDONED if state.pivot_committed else T.ROLLED_BACK)
    return _status(replace(state, incident=incident), T.ABANDONED)
