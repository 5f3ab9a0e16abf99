"""Routes of a run's trajectory (the saga of SAGA-1..7) and of operator incidents (REC-7).

The lease holder opens the trajectory, proposes steps one at a time (the orchestrator validates
them, records the intent and dispatches through the effect gateway asynchronously: poll
GET /runs/{runId}/trajectory), and finishes or aborts it. Operators approve pivots and resolve
the incidents of frozen trajectories.

Command ids (idempotency), the convention of the claim, cancel and takeover routes: every POST
takes an optional `Idempotency-Key` header. With it the command id is derived from the run, the
command type, the key and the whole canonical request (services/command_api/idempotency.py), so
a retried request is the same command, decided once; a repeat that the view names among the
step's dispatches or the trajectory's recent commands is answered again rather than re-sent,
and the same key with a different request is 409 idempotency-key-conflict naming the fields
that differ. Without it every request is a new command. The orchestrator remembers refused
command ids: the same refused request again is not decided again (its answer, if this API saw
it, is); a corrected request is a different request and is decided afresh.

Every runner command is checked here against the run's lease as the Run view shows it (the
attempt must be the current lease, still active, held by the calling principal), because the
orchestrator fences by the trajectory's own epoch, which learns of a takeover only later.
Rejections become problem+json with the orchestrator's `code` and `detail`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from services.command_api.context import ApiContext, Outcome, pending_response
from services.command_api.holder_commands import command_header, current_lease, rejection_response
from services.command_api.idempotency import PRINCIPAL_FIELD, KeyedRequest
from services.command_api.models import (
    AVRO_LONG_MAX,
    ApiBody,
    Identifier,
    Money,
    NonNegativeLong,
    PendingCommand,
    PositiveLong,
    Quantity,
    RunIdField,
    StepIndexPath,
    Text,
)
from services.command_api.problems import TRAJECTORY_REJECTION_PROBLEMS, ApiProblem
from services.command_api.watchdog_delivery import WATCHDOG_REFUSALS, pending_for_runner, refusal_intervention
from services.common.auth import Role, require_role
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
from services.common.ids import canonical_json

__all__ = ["trajectories_router"]

# Step statuses in which the orchestrator still owes the step an outcome.
_IN_FLIGHT = ("pending", "dispatched", "preparing", "awaiting-gate")
# A version is an Avro long in the events; a long-poll waits at most half a minute (and never
# past the request's deadline, TENURE_DECISION_TIMEOUT_S).
MAX_VERSION = AVRO_LONG_MAX
MAX_WAIT_MS = 30_000
DEFAULT_WAIT_MS = 10_000


# --- bodies -------------------------------------------------------------------------------------


_Body = ApiBody  # strict, no unknown members (models.py)


class LeaseFields(_Body):
    attemptId: Identifier = Field(
        min_length=1, max_length=200, description="The attempt that holds the lease."
    )
    leaseEpoch: PositiveLong = Field(description="The lease's fencing epoch.")


class PlanStepBody(_Body):
    stepId: Identifier = Field(min_length=1, max_length=200)
    tool: Identifier = Field(min_length=1, max_length=200)
    params: dict[str, Any] = Field(default_factory=dict)
    after: list[Annotated[Identifier, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=200
    )


class BudgetBody(_Body):
    tokens: Quantity = 200_000
    steps: int = Field(default=50, ge=0, le=10_000)
    money: Money = 10.0


class RerunCostBody(_Body):
    durationMs: Quantity = 0
    money: Money = 0.0


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
    tool: Identifier = Field(min_length=1, max_length=200)
    params: dict[str, Any] = Field(default_factory=dict)
    planStepId: Identifier = Field(default="", max_length=200)
    repairOf: NonNegativeLong | None = Field(
        default=None, description="The failed step this proposal repairs."
    )
    tokensUsed: Quantity = Field(default=0, description="Tokens the model spent since the last step (REC-3).")
    moneyUsed: Money = 0.0


class EndTrajectoryBody(LeaseFields):
    reason: Text = Field(
        default="", max_length=2000, description="Recorded for an abort; finish has no field for it."
    )


class ApprovalBody(_Body):
    decision: Literal["approve", "refuse"]
    note: Text = Field(default="", max_length=2000)


class ResolveIncidentBody(_Body):
    runId: RunIdField
    resolution: Literal["resume", "compensated-manually", "abandon"]
    note: Text = Field(default="", max_length=2000)
    attemptId: Identifier = Field(
        default="", max_length=200, description="resume: the lease taken over after the freeze."
    )
    leaseEpoch: NonNegativeLong = 0


# --- helpers ------------------------------------------------------------------------------------


def _first_command(keyed: KeyedRequest, view: dict[str, Any] | None) -> Mapping[str, Any] | None:
    """The trajectory's record of the command a request under this key caused, if any."""
    return keyed.find((view or {}).get("recentCommands", []), "commandId")


def _repeat(keyed: KeyedRequest, view: dict[str, Any] | None, what: str) -> bool:
    """True when this request was decided before; a different request under its key is 409.

    The trajectory view records who sent each command but not its other fields, so a different
    body is recognised by the command id's fingerprint and named as a candidate."""
    first = _first_command(keyed, view)
    if first is None:
        return False
    keyed.check(first["commandId"], {PRINCIPAL_FIELD: first.get("actor")}, what)
    return True


def _refused(rejected: Rejected, path: str, **extensions: Any) -> JSONResponse:
    problems = TRAJECTORY_REJECTION_PROBLEMS
    return rejection_response(rejected, path, problems, "trajectory-conflict", **extensions)


def _pending(pending: PendingCommand) -> JSONResponse:
    response = pending_response(pending)
    response.headers["Location"] = f"/runs/{pending.runId}/trajectory"
    return response


def _dispatch_of(
    keyed: KeyedRequest, view: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The step and dispatch a ProposeStep under this key recorded."""
    for step in (view or {}).get("steps", []):
        for dispatch in step["dispatches"]:
            if keyed.under_key(dispatch["commandId"]):
                return step, dispatch
    return None


def _proposal_fields(step: dict[str, Any], dispatch: dict[str, Any]) -> dict[str, Any]:
    """A recorded proposal in the request's field names (the step's parameters are those of its
    latest dispatch, so only then are they the proposal's)."""
    recorded: dict[str, Any] = {
        PRINCIPAL_FIELD: dispatch.get("by"),
        "attemptId": dispatch.get("attemptId"),
        "leaseEpoch": dispatch.get("epoch"),
        "repairOf": dispatch.get("repairOf"),
        "tool": step.get("tool"),
    }
    if step.get("dispatch") == dispatch.get("dispatch"):
        recorded["params"] = step.get("params") or {}
    return recorded


def _resolution_fields(view: dict[str, Any], first: Mapping[str, Any]) -> dict[str, Any]:
    """The resolution a recorded ResolveIncident made, found by who resolved it and when."""
    recorded: dict[str, Any] = {PRINCIPAL_FIELD: first.get("actor")}
    for incident in view.get("incidents", []):
        if incident.get("resolvedAt") == first.get("at") and incident.get("resolvedBy") == first.get("actor"):
            recorded.update(
                incidentId=incident["incidentId"],
                resolution=incident["resolution"],
                note=incident.get("resolutionNote") or "",
                attemptId=incident.get("resumedAttemptId") or "",
                leaseEpoch=incident.get("resumedEpoch") or 0,
            )
    return recorded


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


# --- routes -------------------------------------------------------------------------------------


def trajectories_router(ctx: ApiContext) -> APIRouter:
    router = ctx.guarded()
    trajectory_view = ctx.trajectory_view

    async def decide(command: Any, path: str, *, status: int = 200) -> Any:
        outcome = await ctx.publish_trajectory_and_wait(command)
        if isinstance(outcome, Rejected):
            return _refused(outcome, path)
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
        run = await current_lease(ctx, run_id, body.attemptId, body.leaseEpoch, who)
        budget = body.budget or BudgetBody()
        rerun = body.rerunCost or RerunCostBody()
        fields = body.model_dump(mode="json") | {
            "budget": budget.model_dump(mode="json"),
            "rerunCost": rerun.model_dump(mode="json"),
        }
        keyed = KeyedRequest.of(run_id, "StartTrajectory", idempotency_key, who.name, fields)
        existing = await trajectory_view(run_id)
        first = _first_command(keyed, existing)
        if first is not None and existing is not None:
            recorded = {
                PRINCIPAL_FIELD: first.get("actor"),
                "pivotApproval": existing.get("pivotApproval"),
                "rerunCost": existing.get("rerunCost"),
            }
            keyed.check(first["commandId"], recorded, f"the trajectory of run {run_id}")
            return JSONResponse(existing, status_code=201, headers={"Location": f"/runs/{run_id}/trajectory"})
        command_id = keyed.command_id
        # The record current_lease read names the tenant, whose graph the run joins (QUA-2).
        command = StartTrajectory(
            **command_header(ctx, request, who, run_id, command_id),
            attempt_id=body.attemptId,
            lease_epoch=body.leaseEpoch,
            plan=canonical_json([step.model_dump() for step in body.plan]) if body.plan else "",
            pivot_approval=body.pivotApproval,
            budget_tokens=budget.tokens,
            budget_steps=budget.steps,
            budget_money=budget.money,
            rerun_cost_ms=rerun.durationMs,
            rerun_cost_money=rerun.money,
            tenant=str(run.get("tenant") or "") or None,
        )
        return await decide(command, request.url.path, status=201)

    @router.get("/runs/{run_id}/trajectory", summary="The trajectory view: steps, stack, decisions, incident")
    async def get_trajectory(
        run_id: str,
        after_version: Annotated[
            int | None,
            Query(
                alias="afterVersion",
                ge=0,
                le=MAX_VERSION,
                description="Long-poll: answer once the view's version is above this one",
            ),
        ] = None,
        wait_ms: Annotated[
            int,
            Query(
                alias="waitMs",
                ge=0,
                le=MAX_WAIT_MS,
                description="How long a long-poll may wait (bounded by the request's deadline); "
                "the current view is the answer when nothing changed by then",
            ),
        ] = DEFAULT_WAIT_MS,
    ) -> Any:
        if after_version is None:
            view = await trajectory_view(run_id)
        else:
            view = await ctx.trajectory_after(run_id, after_version, wait_ms / 1000)
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
        await current_lease(ctx, run_id, body.attemptId, body.leaseEpoch, who)
        fields = body.model_dump(mode="json")
        keyed = KeyedRequest.of(run_id, "ProposeStep", idempotency_key, who.name, fields)
        command_id = keyed.command_id
        existing = await trajectory_view(run_id)
        recorded_step = _dispatch_of(keyed, existing)
        if recorded_step is not None:
            step, dispatch = recorded_step
            keyed.check(dispatch["commandId"], _proposal_fields(step, dispatch), f"a step of run {run_id}")
            ticket = _ticket(run_id, step, dispatch, replayed=True)
            return _step_accepted({**ticket, "watchdog": await pending_for_runner(ctx, run_id)}, run_id)
        if _repeat(keyed, existing, f"a step of run {run_id}"):
            # Decided, but not (yet) as a dispatch of a step: the view names it once caught up.
            return _pending(
                PendingCommand(runId=run_id, commandId=command_id, detail="decided; poll the trajectory")
            )
        command = ProposeStep(
            **command_header(ctx, request, who, run_id, command_id),
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
        if isinstance(outcome, Rejected) and outcome.rejection.code in WATCHDOG_REFUSALS:
            # WD-5: the refusal carries the intervention, so the runner sees why before acting.
            watchdog = await refusal_intervention(ctx, outcome)
            return _refused(outcome, request.url.path, watchdog=watchdog)
        if isinstance(outcome, Rejected):
            return _refused(outcome, request.url.path)
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
                # WD-5: the intervention in force (a level-1 interrupt, a pending rollback), if any.
                "watchdog": await pending_for_runner(ctx, run_id),
            },
            run_id,
        )

    @router.post(
        "/runs/{run_id}/trajectory/steps/{index}/approval",
        summary="A human approves or refuses the pending pivot (operator role, SAGA-6)",
    )
    async def approve_pivot(
        run_id: str,
        index: StepIndexPath,
        body: ApprovalBody,
        request: Request,
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        who = ctx.principal(request)
        require_role(who, "approving a pivot", Role.OPERATOR)
        fields = {"stepIndex": index, **body.model_dump(mode="json")}
        keyed = KeyedRequest.of(run_id, "ApprovePivot", idempotency_key, who.name, fields)
        command_id = keyed.command_id
        existing = await trajectory_view(run_id)
        if existing is None:
            raise ApiProblem("trajectory-not-found", f"run {run_id} has no trajectory", runId=run_id)
        if _repeat(keyed, existing, f"an approval of run {run_id}"):
            return existing
        command = ApprovePivot(
            **command_header(ctx, request, who, run_id, command_id),
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
        await current_lease(ctx, run_id, lease.attemptId, lease.leaseEpoch, who)
        keyed = KeyedRequest.of(
            run_id, kind.__name__, idempotency_key, who.name, lease.model_dump(mode="json")
        )
        command_id = keyed.command_id
        existing = await trajectory_view(run_id)
        if _repeat(keyed, existing, f"a {kind.__name__} of run {run_id}"):
            return existing
        if kind is AdoptLease and isinstance(existing, dict) and existing.get("epoch") == lease.leaseEpoch:
            return existing  # already the trajectory's lease: nothing to decide
        command = kind(
            **command_header(ctx, request, who, run_id, command_id),
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
    async def list_incidents() -> Any:
        items = await ctx.in_thread("the incident views", ctx.deps.views.open_incidents)
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
        require_role(who, "resolving an incident", Role.OPERATOR)
        if body.resolution == "resume":
            if not body.attemptId or body.leaseEpoch < 1:
                raise ApiProblem(
                    "validation-failed",
                    "resume needs the attemptId and leaseEpoch of a lease taken over after the freeze",
                    runId=run_id,
                )
            await current_lease(ctx, run_id, body.attemptId, body.leaseEpoch, None)
        fields = {"incidentId": incident_id, **body.model_dump(mode="json")}
        keyed = KeyedRequest.of(run_id, "ResolveIncident", idempotency_key, who.name, fields)
        command_id = keyed.command_id
        existing = await trajectory_view(run_id)
        if existing is None:
            raise ApiProblem("trajectory-not-found", f"run {run_id} has no trajectory", runId=run_id)
        first = _first_command(keyed, existing)
        if first is not None:
            keyed.check(first["commandId"], _resolution_fields(existing, first), f"incident {incident_id}")
            return existing
        command = ResolveIncident(
            **command_header(ctx, request, who, run_id, command_id),
            incident_id=incident_id,
            resolution=body.resolution,
            note=body.note,
            attempt_id=body.attemptId,
            lease_epoch=body.leaseEpoch,
        )
        return await decide(command, request.url.path)

    return router
