"""What follows an outcome: the commit with its compensator, or a failure through policy D.

REC-1: every failure is classified and run through decide_recovery; its decision is recorded as
a RecoveryDecided event with the deciding gate and all its inputs, then carried out here. A
deferral by the gateway's tool protection (circuit open, bulkhead full) is retried no earlier
than the wait its error message names, plus a full-jitter spread (`deferral_until`), so that
the trajectories an open breaker refused do not all come back the moment it half-opens.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

from services.common.contracts import (
    CompensationStackRetired,
    RecordStepOutcome,
    RecoveryDecided,
    StepCommitted,
    StepFailed,
    StepIntentRecorded,
    TrajectoryFrozen,
    TrajectoryRolledBack,
)
from services.common.ids import canonical_json, derived_id
from services.saga_orchestrator.domain.emitter import Emitter
from services.saga_orchestrator.domain.lifecycle import StepStatus, TrajectoryStatus
from services.saga_orchestrator.domain.policy import (
    Budget,
    FailureContext,
    Gate,
    RecoveryAction,
    StepError,
    classify,
    decide_recovery,
    error_signature,
    full_jitter_backoff_ms,
    is_deferral,
    retry_after_ms,
)
from services.saga_orchestrator.domain.state import StepState, TrajectoryState, step_key
from services.saga_orchestrator.domain.tools import (
    BindingFailed,
    Cost,
    ToolSpec,
    bind_compensation,
    check_postcondition,
)

__all__ = [
    "abort",
    "backoff_until",
    "compensation_cost",
    "deferral_until",
    "fail_step",
    "freeze",
    "handle_failure",
    "record_commit",
]

S = StepStatus
T = TrajectoryStatus


def _bound(spec: ToolSpec, params: str, output: str) -> str:
    """The compensator bound from the forward action's output, as recorded JSON ("" = none)."""
    if spec.compensator is None or not output:
        return ""
    bound = bind_compensation(spec, json.loads(params or "{}"), json.loads(output))
    return canonical_json(
        {
            "gatewayTool": bound.gateway_tool,
            "operation": bound.operation,
            "params": bound.params,
            "costMs": spec.compensator.cost.duration_ms,
            "costMoney": spec.compensator.cost.money,
        }
    )


def record_commit(em: Emitter, step: StepState, output: str, reconciled: bool) -> None:
    """COMMITTED and the compensator pushed in one record, before the next step may start (SAGA-2).

    The output must meet the tool's post-condition first (SAGA-1). One that does not is a step
    that failed with effects: its compensator is bound from that output and runs first on unwind,
    and policy D decides what follows (it is a semantic error: a repair candidate)."""
    spec = em.context.catalog.get(step.tool)
    frozen = em.state.status is TrajectoryStatus.FROZEN
    try:
        problems = check_postcondition(spec, json.loads(output or "{}"))
    except ValueError:
        problems = ("the output is not JSON",)
    if problems and not frozen:
        not_json = problems[0].startswith("the output is not JSON")
        fail_step(em, step, "postcondition-failed", "; ".join(problems), 422, "" if not_json else output)
        return
    try:
        compensation = _bound(spec, step.params, output or "{}")
    except (BindingFailed, ValueError) as exc:
        em.emit(
            StepCommitted,
            step_index=step.index,
            dispatch=step.dispatch,
            output=output,
            compensation="",
            reconciled=reconciled,
            stack_depth=len(em.state.stack) + 1,
        )
        if not frozen:
            freeze(em, "COMPENSATOR_UNBOUND", step.index, {"kind": "binding-failed", "message": str(exc)})
        return
    is_the_pivot = step.index == em.state.pivot_step
    depth = len(em.state.stack) + (0 if is_the_pivot or em.state.pivot_committed else 1)
    em.emit(
        StepCommitted,
        step_index=step.index,
        dispatch=step.dispatch,
        output=output,
        compensation=compensation,
        reconciled=reconciled,
        stack_depth=depth,
    )
    if is_the_pivot:
        em.emit(CompensationStackRetired, pivot_step=step.index, retired_steps=em.state.stack)
        _release_outbox(em)  # recorded now; dispatched once an operator resumes a frozen trajectory


def _release_outbox(em: Emitter) -> None:
    """Outbound messages staged by the plan are recorded with the pivot's commit (SAGA-7).

    Their intents land in the same transaction as the pivot's COMMITTED record, so they are
    released exactly when the pivot is, and dispatched after it with retries only."""
    for item in em.state.plan_value().get("outbox", []):
        spec = em.context.catalog.get(str(item["tool"]))
        index = len(em.state.steps)
        em.emit(
            StepIntentRecorded,
            step_index=index,
            dispatch=1,
            tool=spec.name,
            gateway_tool=spec.gateway_tool,
            operation=spec.operation,
            params=canonical_json(item.get("params") or {}),
            idempotency_key=step_key(em.state.run_id, index, 1),
            reversibility=spec.reversibility.value,
            attempt_id=em.state.attempt_id,
            epoch=em.state.epoch,
            plan_step_id=str(item["stepId"]),
            repair_of=-1,
            not_before=0,
            status=S.PENDING.value,
            tokens_used=0,
            money_used=0.0,
        )


def compensation_cost(state: TrajectoryState) -> Cost:
    """U: the cost of running every compensator on the stack (REC-4)."""
    total = Cost()
    for index in state.stack:
        spec = state.steps[index].compensation_spec()
        total = total + Cost(int(spec.get("costMs", 0)), float(spec.get("costMoney", 0.0)))
    return total


def _rerun_cost(em: Emitter) -> Cost:
    """R: the declared re-run cost, or else the forward cost of every committed step."""
    state = em.state
    if state.rerun_cost_ms or state.rerun_cost_money:
        return Cost(state.rerun_cost_ms, state.rerun_cost_money)
    total = Cost()
    for step in state.steps:
        if step.status is S.COMMITTED and step.tool in em.context.catalog:
            total = total + em.context.catalog.get(step.tool).cost
    return total


def _unit_random(*parts: Any) -> float:
    """Jitter drawn from the cause, so re-deciding gives the same backoff (replay never re-draws)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def backoff_until(em: Emitter, step_index: int, attempt: int) -> int:
    policy = em.context.policy
    jitter = _unit_random(em.state.run_id, step_index, attempt, em.command.command_id)
    return em.now_ms + full_jitter_backoff_ms(attempt, policy.backoff_base_ms, policy.backoff_cap_ms, jitter)


# The deferrals of one step spread over at most 2^k * base (capped by the policy's cap) on top of
# their wait; k grows with the step's dispatches and stops here (it is only an exponent).
_MAX_DEFERRAL_EXPONENT = 16


def deferral_until(em: Emitter, step: StepState) -> int:
    """When a deferred step may be dispatched again: the wait it was told (the breaker's
    cooldown remaining), then a full-jitter draw from its cause (BRK-3; replay never re-draws)."""
    policy = em.context.policy
    jitter = _unit_random(em.state.run_id, step.index, "deferral", step.dispatch, em.command.command_id)
    exponent = min(max(step.dispatch - 1, 0), _MAX_DEFERRAL_EXPONENT)
    spread = full_jitter_backoff_ms(exponent, policy.backoff_base_ms, policy.backoff_cap_ms, jitter)
    return em.now_ms + retry_after_ms(step.error_message) + spread


def handle_failure(em: Emitter, step: StepState, outcome: RecordStepOutcome) -> None:
    spec = em.context.catalog.get(step.tool)
    error = StepError(
        outcome.error_kind or "unknown-error", step.tool, outcome.error_message, outcome.error_status or None
    )
    error_class = classify(error)
    signature = error_signature(error)
    try:
        partial = _bound(spec, step.params, outcome.partial_output) if outcome.partial_output else ""
    except (BindingFailed, ValueError):
        partial = ""
    em.emit(
        StepFailed,
        step_index=step.index,
        dispatch=step.dispatch,
        error_kind=error.kind,
        error_message=error.message,
        error_status=outcome.error_status,
        error_class=error_class.value,
        signature=signature,
        partial_output=outcome.partial_output,
        compensation=partial,
    )
    failed = em.state.steps[step.index]
    state = em.state
    context = FailureContext(
        step_index=step.index,
        tool=spec,
        error=error,
        after_pivot=state.pivot_committed,
        budget=Budget(state.budget_tokens, state.budget_steps, state.budget_money),
        consecutive_repairs=failed.consecutive_repairs,
        transient_retries=failed.transient_retries,
        earlier_signatures=failed.signatures[:-1],
        compensation_cost=compensation_cost(state),
        rerun_cost=_rerun_cost(em),
    )
    p, source, samples = em.context.stats.p_success(error.kind, em.context.policy)
    decision = decide_recovery(context, p, source, em.context.policy)
    if partial and decision.action in (RecoveryAction.TRANSIENT_RETRY, RecoveryAction.FORWARD_REPAIR):
        # SAGA-3: the failed dispatch left effects whose compensator is on the stack. A retry in
        # place would commit a second effect over them, so they are undone first: roll back before
        # the pivot (a re-run starts clean), escalate after it.
        action = RecoveryAction.OPERATOR_ESCALATE if context.after_pivot else RecoveryAction.BACKWARD_ROLLBACK
        decision = replace(
            decision,
            action=action,
            gate=Gate.TAXONOMY,
            reason=f"the failed dispatch left effects (partial output); {decision.action.name} in place "
            f"would lose them, so {action.name} (SAGA-3)",
        )
    inputs = dict(decision.inputs)
    inputs.setdefault("pSuccess", f"{p:.4f}")
    inputs.setdefault("pSource", f"{source} ({samples} samples)")
    em.emit(
        RecoveryDecided,
        step_index=step.index,
        action=decision.action.name,
        gate=decision.gate.value,
        reason=decision.reason,
        error_class=decision.error_class.value,
        signature=decision.signature,
        inputs=canonical_json(inputs),
    )
    if decision.action is RecoveryAction.TRANSIENT_RETRY:
        _retry(em, failed)
    elif decision.action is RecoveryAction.BACKWARD_ROLLBACK:
        _unwind_or_finish(em, decision.reason)
    elif decision.action is RecoveryAction.OPERATOR_ESCALATE:
        mode = "POST_PIVOT_STALLED" if state.pivot_committed else "PRE_PIVOT_STALLED"
        freeze(
            em,
            mode,
            step.index,
            {
                "kind": error.kind,
                "message": error.message,
                "status": error.status,
                "class": error_class.value,
                "signature": signature,
                "decision": decision.reason,
            },
        )
    # FORWARD_REPAIR: RecoveryDecided moved the trajectory to AWAITING_REPAIR; the runner proposes.


def fail_step(
    em: Emitter, step: StepState, kind: str, message: str, status: int = 0, partial_output: str = ""
) -> None:
    """A failure the orchestrator itself found (a gate, a refusal, a post-condition), decided by D
    exactly like one the executor reported."""
    command = em.command
    handle_failure(
        em,
        step,
        RecordStepOutcome(
            command_id=command.command_id,
            run_id=em.state.run_id,
            issued_at=em.now_ms,
            correlation_id=command.correlation_id,
            actor=command.actor,
            step_index=step.index,
            dispatch=step.dispatch,
            outcome="failed",
            error_kind=kind,
            error_message=message,
            error_status=status,
            partial_output=partial_output,
        ),
    )


def _retry(em: Emitter, step: StepState) -> None:
    if is_deferral(step.error_kind):
        # The refused request sent nothing, but an earlier request under the same key may still
        # be on its way (queued at a gateway, or sent by an executor that was killed): a new key
        # could apply the effect twice. A deferral therefore keeps its dispatch and its key, and
        # only waits; the recipient turns any repeat into "already done".
        dispatch, key = step.dispatch, step.idempotency_key
        not_before = deferral_until(em, step)
    else:
        dispatch = step.dispatch + 1
        key = step_key(em.state.run_id, step.index, dispatch)
        not_before = backoff_until(em, step.index, step.transient_retries)
    em.emit(
        StepIntentRecorded,
        step_index=step.index,
        dispatch=dispatch,
        tool=step.tool,
        gateway_tool=step.gateway_tool,
        operation=step.operation,
        params=step.params,
        idempotency_key=key,
        reversibility=step.reversibility,
        attempt_id=em.state.attempt_id,
        epoch=em.state.epoch,
        plan_step_id=step.plan_step_id,
        repair_of=-1,
        not_before=not_before,
        status=(S.AWAITING_GATE if step.index == em.state.pivot_step else S.PENDING).value,
        tokens_used=0,
        money_used=0.0,
    )


def _unwind_or_finish(em: Emitter, reason: str) -> None:
    if not em.state.stack:
        em.emit(TrajectoryRolledBack, compensated_steps=em.state.compensated, reason=reason)


def abort(em: Emitter, reason: str) -> None:
    """The runner gave up before the pivot: roll back whatever committed (SAGA-3)."""
    em.emit(
        RecoveryDecided,
        step_index=-1,
        action=RecoveryAction.BACKWARD_ROLLBACK.name,
        gate="runner-abort",
        reason=reason or "the runner aborted the trajectory",
        error_class="",
        signature="",
        inputs=canonical_json({"stackDepth": str(len(em.state.stack))}),
    )
    _unwind_or_finish(em, reason or "aborted by the runner")


def freeze(em: Emitter, failure_mode: str, failed_step: int, error: dict[str, Any]) -> None:
    """REC-7: stop dispatch, list what stays uncompensated, open an incident."""
    state = em.state
    if state.pivot_committed:
        remainder = [s for s in state.steps if s.status is S.COMMITTED]
    else:
        remainder = [state.steps[i] for i in reversed(state.stack)]
    uncompensated = [
        {
            "stepIndex": s.index,
            "tool": s.tool,
            "status": s.status.value,
            "output": s.output,
            "compensation": s.compensation_spec(),
        }
        for s in remainder
    ]
    step = state.step(failed_step)
    summary = canonical_json([[s.index, s.tool, s.status.value, s.output] for s in state.steps])
    digest = hashlib.sha256(summary.encode()).hexdigest()
    em.emit(
        TrajectoryFrozen,
        incident_id=derived_id("inc", state.run_id, str(state.version + 1)),
        failure_mode=failure_mode,
        failed_step=failed_step,
        failed_tool=step.tool if step is not None else "",
        error_context=canonical_json(error),
        uncompensated=canonical_json(uncompensated),
        snapshot_ref=f"tenure://trajectories/{state.run_id}?version={state.version}&sha256={digest}",
        epoch=state.epoch,
    )
