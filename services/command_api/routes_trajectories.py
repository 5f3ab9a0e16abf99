"""Routes of a run's trajectory (the saga of SAGA-1..7) and of operator incidents (REC-7).

The lease holder opens the trajectory, proposes steps one at a time (the orchestrator validates
them, records the intent and dispatches through the effect gateway asynchronously: poll
GET /runs/{runId}/trajectory), and finishes or aborts it. Operators approve pivots and resolve
the incidents of frozen trajectories.

Command ids (idempotency), the convention of the claim, cancel and takeover routes: every POST
takes an optional `Idempotency-Key` header. With it the command id is
`command_id_for(runId, <command type>, key)`, so a retried request is the same command, decided
once; a repeat whose decision this API has seen (or that the view names among the step's
dispatches or the trajectory's recent commands) is answered again rather than re-sent. Without
it every request is a new command. The orchestrator also remembers refused command ids: after
fixing a refused request, send it with a new key.

Every runner command is checked here against the run's lease as the Run view shows it (the
attempt must be the current lease, still active, held by the calling principal), because the
orchestrator fences by the trajectory's own epoch, which learns of a takeover only later.
Rejections become problem+json with the orchestrator's `code` and `detail`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from services.command_api.auth import Principal
from services.command_api.context import ApiContext, Outcome, pending_response
from services.command_api.models import PendingCommand
from services.command_api.problems import ApiProblem, problem_response
from services.common.contracts import (
    AbortTrajectory,
    AdoptLease,
    ApprovePivot,
    FinishTrajectory,
    ProposeStep,
    ResolveIncident,
    StartTrajectory,
    StepIntentRecorded,
)
from services.common.decisions import Rejected
from services.common.ids import canonical_json, command_id_for
from services.lease_coordinator.domain import run_id_of_attempt

__all__ = ["trajectories_router"]

OPERATOR_ROLE = "operator"
# Step statuses in which the orchestrator still owes the step an outcome.
_IN_FLIGHT = ("pending", "dispatched", "preparing", "awaiting-gate")

# Rejection codes of the orchestrator -> the problem type the API answers with.
_CODE_PROBLEMS = {
    "TRAJECTORY_NOT_FOUND": "trajectory-not-found",
    "TRAJECTORY_EXISTS": "trajectory-exists",
    "TRAJECTORY_ENDED": "trajectory-ended",
    "UNKNOWN_TOOL": "unknown-tool",
    "INVALID_PARAMETERS": "invalid-parameters",
    "PLAN_REJECTED": "plan-rejected",
    "TWO_PIVOTS": "two-pivots",
    "STALE_EPOCH": "stale-epoch",
    "INCIDENT_NOT_OPEN": "incident-not-open",
    "INVALID_COMMAND": "validation-failed",
}


# --- bodies -------------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LeaseFields(_Body):
    attemptId: str = Field(min_length=1, max_length=200, description="The attempt that holds the lease.")
    leaseEpoch: int = Field(ge=1, description="The lease's fencing epoch.")


class PlanStepBody(_Body):
    stepId: str = Field(min_length=1, max_length=200)
    tool: str = Field(min_length=1, max_length=200)
    params: dict[str, Any] = Field(default_factory=dict)
    after: list[str] = Field(default_factory=list, max_length=200)


class BudgetBody(_Body):
    tokens: int = Field(default=200_000, ge=0)
    steps: int = Field(default=50, ge=0, le=10_000)
    money: float = Field(default=10.0, ge=0)


class RerunCostBody(_Body):
    durationMs: int = Field(default=0, ge=0)
    money: float = Field(default=0.0, ge=0)


class StartTrajectoryBody(LeaseFields):
    plan: list[PlanStepBody] | None = Field(
        default=None, max_length=500, description="A DAG of steps compiled up front (SAGA-6/7)."
    )
    pivotApproval: Literal["none", "human"] = "none"
    budget: BudgetBody | None = None
    rerunCost: RerunCostBody | None = Field(
        default=None, description="R of REC-4: what re-running the run from scratch costs."
    )


class ProposeStepBody(LeaseFields):
    tool: str = Field(min_length=1, max_length=200)
    params: dict[str, Any] = Field(default_factory=dict)
    planStepId: str = Field(default="", max_length=200)
    repairOf: int | None = Field(default=None, ge=0, description="The failed step this proposal repairs.")
    tokensUsed: int = Field(
        default=0, ge=0, description="Tokens the model spent since the last step (REC-3)."
    )
    moneyUsed: float = Field(default=0.0, ge=0)


class EndTrajectoryBody(LeaseFields):
    reason: str = Field(
        default="", max_length=2000, description="Recorded for an abort; finish has no field for it."
    )


class ApprovalBody(_Body):
    decision: Literal["approve", "refuse"]
    note: str = Field(default="", max_length=2000)


class ResolveIncidentBody(_Body):
    runId: str = Field(min_length=1, max_length=200)
    resolution: Literal["resume", "compensated-manually", "abandon"]
    note: str = Field(default="", max_length=2000)
    attemptId: str = Field(
        default="", max_length=200, description="resume: the lease taken over after the freeze."
    )
    leaseEpoch: int = Field(default=0, ge=0)


# --- helpers ------------------------------------------------------------------------------------


def _command_id(run_id: str, command_type: str, idempotency_key: str | None) -> str:
    return command_id_for(run_id, command_type, idempotency_key or uuid.uuid4().hex)


def _header(
    ctx: ApiContext, request: Request, who: Principal, run_id: str, command_id: str
) -> dict[str, Any]:
    return {
        "command_id": command_id,
        "run_id": run_id,
        "issued_at": ctx.deps.clock.now_ms(),
        "correlation_id": request.headers.get("x-correlation-id") or run_id,
        "actor": who.name,
    }


def _rejection(rejected: Rejected, path: str) -> JSONResponse:
    r = rejected.rejection
    return problem_response(
        _CODE_PROBLEMS.get(r.code, "trajectory-conflict"),
        r.detail,
        path,
        code=r.code,
        runId=r.run_id,
        currentStatus=r.current_status,
        commandId=r.causation_id,
    )


def _pending(pending: PendingCommand) -> JSONResponse:
    response = pending_response(pending)
    response.headers["Location"] = f"/runs/{pending.runId}/trajectory"
    return response


def _require_operator(who: Principal, run_id: str, what: str) -> None:
    if who.role != OPERATOR_ROLE:
        raise ApiProblem(
            "forbidden", f"{who.name} has role {who.role!r}; {what} needs the operator role", runId=run_id
        )


def _decided_before(view: dict[str, Any] | None, command_id: str) -> bool:
    return view is not None and any(c["commandId"] == command_id for c in view.get("recentCommands", []))


def _ticket(run_id: str, step: dict[str, Any], dispatch: dict[str, Any], replayed: bool) -> dict[str, Any]:
    return {
        "runId": run_id,
        "stepIndex": step["index"],
        "dispatch": dispatch["dispatch"],
        "idempotencyKey": dispatch["idempotencyKey"],
        "tool": step["tool"],
        "status": step["status"] if step["dispatch"] == dispatch["dispatch"] else "superseded",
        "commandId": dispatch["commandId"],
        "replayed": replayed,
    }


def _step_accepted(body: dict[str, Any], run_id: str) -> JSONResponse:
    return JSONResponse(body, status_code=202, headers={"Location": f"/runs/{run_id}/trajectory"})


async def _current_lease(
    ctx: ApiContext, run_id: str, attempt_id: str, epoch: int, who: Principal | None
) -> dict[str, Any]:
    """The run's lease when (attempt, epoch) is it, still active, held by `who`; else a problem.

    A grant is answered before the projection shows it, so a lease newer than the view is
    waited for (bounded by the decision timeout) rather than refused."""
    if run_id_of_attempt(attempt_id) != run_id or not attempt_id.endswith(f"_{epoch}"):
        raise ApiProblem(
            "unknown-attempt",
            f"{attempt_id!r} at epoch {epoch} was never issued for run {run_id}",
            runId=run_id,
        )
    deadline = time.monotonic() + ctx.deps.decision_timeout_s
    while True:
        view = await ctx.view(run_id)
        if view is None:
            raise ApiProblem("run-not-found", f"run {run_id} does not exist", runId=run_id)
        lease = view.get("lease") or {}
        if int(lease.get("epoch", 0)) >= epoch or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.02)
    current = int(lease.get("epoch", 0))
    if current < epoch:
        raise ApiProblem("unknown-attempt", f"epoch {epoch} was never issued for run {run_id}", runId=run_id)
    if current > epoch or lease.get("attemptId") != attempt_id:
        raise ApiProblem(
            "stale-epoch",
            f"attempt {attempt_id} at epoch {epoch} no longer holds run {run_id}: lease "
            f"{lease.get('leaseId')} at epoch {current} does",
            runId=run_id,
            code="STALE_EPOCH",
        )
    certainty = lease.get("certainty")
    if certainty not in ("active", "at_risk"):
        slug = {"expired": "lease-expired", "released": "lease-released"}.get(str(certainty), "lease-revoked")
        raise ApiProblem(slug, f"lease {lease.get('leaseId')} is {certainty}", runId=run_id)
    if who is not None and lease.get("holderPrincipal") not in (None, who.name):
        raise ApiProblem(
            "not-lease-holder", f"{who.name} does not hold lease {lease.get('leaseId')}", runId=run_id
        )
    return dict(lease)


# --- routes -------------------------------------------------------------------------------------


def trajectories_router(ctx: ApiContext) -> APIRouter:
    router = APIRouter()

    async def trajectory_view(run_id: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(ctx.deps.views.trajectory, run_id)

    async def decide(command: Any, path: str, *, status: int = 200) -> Any:
        outcome = await ctx.publish_trajectory_and_wait(command)
        if isinstance(outcome, Rejected):
            return _rejection(outcome, path)
        if isinstance(outcome, PendingCommand):
            return _pending(outcome)
        assert isinstance(outcome, Outcome)
        return JSONResponse(
            outcome.view, status_code=status, headers={"Location": f"/runs/{command.run_id}/trajectory"}
        )

    @router.post(
        "/runs/{run_id}/trajectory",
        status_code=201,
        summary="Open the run's trajectory (the lease holder), optionally with a plan (SAGA-6/7)",
    )
    async def start_trajectory(
        run_id: str,
        body: StartTrajectoryBody,
        request: Request,
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        who = ctx.principal(request)
        await _current_lease(ctx, run_id, body.attemptId, body.leaseEpoch, who)
        command_id = _command_id(run_id, "StartTrajectory", idempotency_key)
        existing = await trajectory_view(run_id)
        if _decided_before(existing, command_id):
            return existing
        budget = body.budget or BudgetBody()
        rerun = body.rerunCost or RerunCostBody()
        command = StartTrajectory(
            **_header(ctx, request, who, run_id, command_id),
            attempt_id=body.attemptId,
            lease_epoch=body.leaseEpoch,
            plan=canonical_json([step.model_dump() for step in body.plan]) if body.plan else "",
            pivot_approval=body.pivotApproval,
            budget_tokens=budget.tokens,
            budget_steps=budget.steps,
            budget_money=budget.money,
            rerun_cost_ms=rerun.durationMs,
            rerun_cost_money=rerun.money,
        )
        return await decide(command, request.url.path, status=201)

    @router.get("/runs/{run_id}/trajectory", summary="The trajectory view: steps, stack, decisions, incident")
    async def get_trajectory(run_id: str, request: Request) -> Any:
        ctx.principal(request)
        view = await trajectory_view(run_id)
        if view is None:
            raise ApiProblem("trajectory-not-found", f"run {run_id} has no trajectory", runId=run_id)
        return view

    @router.post(
        "/runs/{run_id}/trajectory/steps",
        status_code=202,
        summary="Propose the next step (or a repair); dispatched asynchronously, poll the trajectory",
    )
    async def propose_step(
        run_id: str,
        body: ProposeStepBody,
        request: Request,
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        """202 with {stepIndex, dispatch, idempotencyKey, status} once the intent is recorded.

        The orchestrator validated the parameters and recorded the intent durably; the gateway
        dispatches it next. Poll GET /runs/{runId}/trajectory until the step's status is no
        longer pending, dispatched, preparing or awaiting-gate. A 202 without stepIndex means no
        decision arrived in time: repeat the request with the same Idempotency-Key.
        """
        who = ctx.principal(request)
        await _current_lease(ctx, run_id, body.attemptId, body.leaseEpoch, who)
        command_id = _command_id(run_id, "ProposeStep", idempotency_key)
        existing = await trajectory_view(run_id)
        for step in (existing or {}).get("steps", []):
            for dispatch in step["dispatches"]:
                if dispatch["commandId"] == command_id:
                    return _step_accepted(_ticket(run_id, step, dispatch, replayed=True), run_id)
        command = ProposeStep(
            **_header(ctx, request, who, run_id, command_id),
            attempt_id=body.attemptId,
            lease_epoch=body.leaseEpoch,
            tool=body.tool,
            params=canonical_json(body.params),
            plan_step_id=body.planStepId,
            repair_of=body.repairOf if body.repairOf is not None else -1,
            tokens_used=body.tokensUsed,
            money_used=body.moneyUsed,
        )
        outcome = await ctx.publish_trajectory_and_wait(command, wait_for_view=False)
        if isinstance(outcome, Rejected):
            return _rejection(outcome, request.url.path)
        if isinstance(outcome, PendingCommand):
            return _pending(outcome)
        event = outcome.decided.event
        if not isinstance(event, StepIntentRecorded):
            # A repeat decided before this API started: the view names the step once caught up.
            return _pending(
                PendingCommand(runId=run_id, commandId=command_id, detail="decided; poll the trajectory")
            )
        return _step_accepted(
            {
                "runId": run_id,
                "stepIndex": event.step_index,
                "dispatch": event.dispatch,
                "idempotencyKey": event.idempotency_key,
                "tool": event.tool,
                "status": event.status,
                "commandId": command_id,
                "version": event.version,
                "replayed": False,
            },
            run_id,
        )

    @router.post(
        "/runs/{run_id}/trajectory/steps/{index}/approval",
        summary="A human approves or refuses the pending pivot (operator role, SAGA-6)",
    )
    async def approve_pivot(
        run_id: str,
        index: int,
        body: ApprovalBody,
        request: Request,
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        who = ctx.principal(request)
        _require_operator(who, run_id, "approving a pivot")
        command_id = _command_id(run_id, "ApprovePivot", idempotency_key)
        existing = await trajectory_view(run_id)
        if existing is None:
            raise ApiProblem("trajectory-not-found", f"run {run_id} has no trajectory", runId=run_id)
        if _decided_before(existing, command_id):
            return existing
        command = ApprovePivot(
            **_header(ctx, request, who, run_id, command_id),
            step_index=index,
            decision=body.decision,
            note=body.note,
        )
        return await decide(command, request.url.path)

    async def holder_command(
        kind: type[Any],
        run_id: str,
        lease: LeaseFields,
        request: Request,
        idempotency_key: str | None,
        **fields: Any,
    ) -> Any:
        """A command only the run's lease holder may send: checked, deduplicated, decided."""
        who = ctx.principal(request)
        await _current_lease(ctx, run_id, lease.attemptId, lease.leaseEpoch, who)
        command_id = _command_id(run_id, kind.__name__, idempotency_key)
        existing = await trajectory_view(run_id)
        if _decided_before(existing, command_id):
            return existing
        if kind is AdoptLease and isinstance(existing, dict) and existing.get("epoch") == lease.leaseEpoch:
            return existing  # already the trajectory's lease: nothing to decide
        command = kind(
            **_header(ctx, request, who, run_id, command_id),
            attempt_id=lease.attemptId,
            lease_epoch=lease.leaseEpoch,
            **fields,
        )
        return await decide(command, request.url.path)

    @router.post("/runs/{run_id}/trajectory/finish", summary="Complete the trajectory (the lease holder)")
    async def finish_trajectory(
        run_id: str,
        body: EndTrajectoryBody,
        request: Request,
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        return await holder_command(FinishTrajectory, run_id, body, request, idempotency_key)

    @router.post(
        "/runs/{run_id}/trajectory/lease",
        summary="The run's new lease holder (after a takeover) adopts the trajectory (LEASE-6)",
    )
    async def adopt_lease(
        run_id: str,
        body: LeaseFields,
        request: Request,
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        """200 with the view once work still owed (even a step in flight) moved to this lease."""
        return await holder_command(AdoptLease, run_id, body, request, idempotency_key)

    @router.post(
        "/runs/{run_id}/trajectory/abort",
        summary="Give up before the pivot: every committed step is compensated (SAGA-3)",
    )
    async def abort_trajectory(
        run_id: str,
        body: EndTrajectoryBody,
        request: Request,
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        """200 with the view; the unwind runs asynchronously (status unwinding -> rolled-back)."""
        return await holder_command(
            AbortTrajectory, run_id, body, request, idempotency_key, reason=body.reason
        )

    @router.get("/incidents", summary="Open incidents of frozen trajectories, oldest first (REC-7)")
    async def list_incidents(request: Request) -> Any:
        ctx.principal(request)
        items = await asyncio.to_thread(ctx.deps.views.open_incidents)
        return {"items": items}

    @router.post(
        "/incidents/{incident_id}/resolve",
        summary="Resolve an incident: resume, compensated-manually or abandon (operator role)",
    )
    async def resolve_incident(
        incident_id: str,
        body: ResolveIncidentBody,
        request: Request,
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        """`resume` continues under a lease taken over after the freeze (POST
        /runs/{runId}/lease/takeover): pass its attemptId and leaseEpoch."""
        who = ctx.principal(request)
        run_id = body.runId
        _require_operator(who, run_id, "resolving an incident")
        if body.resolution == "resume":
            if not body.attemptId or body.leaseEpoch < 1:
                raise ApiProblem(
                    "validation-failed",
                    "resume needs the attemptId and leaseEpoch of a lease taken over after the freeze",
                    runId=run_id,
                )
            await _current_lease(ctx, run_id, body.attemptId, body.leaseEpoch, None)
        command_id = _command_id(run_id, "ResolveIncident", idempotency_key)
        existing = await trajectory_view(run_id)
        if existing is None:
            raise ApiProblem("trajectory-not-found", f"run {run_id} has no trajectory", runId=run_id)
        if _decided_before(existing, command_id):
            return existing
        command = ResolveIncident(
            **_header(ctx, request, who, run_id, command_id),
            incident_id=incident_id,
            resolution=body.resolution,
            note=body.note,
            attempt_id=body.attemptId,
            lease_epoch=body.leaseEpoch,
        )
        return await decide(command, request.url.path)

    return router
