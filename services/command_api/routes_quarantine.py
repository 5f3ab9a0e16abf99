"""A run's quarantine over HTTP (QUA-1): triggers, the stages a runner host reports, clearing.

The contract the managed runner host (services/runner_host) codes against:
* POST /runs/{runId}/quarantine (operator) `{"reason", "evidence", "taintFrom"}` -> 202 view;
* POST /runs/{runId}/suspicions (verifier) `{"reason", "evidence"}` -> 202 view;
* GET /runs/{runId}/quarantine?afterVersion=&waitMs= -> 200 view (long-poll: answered the moment
  the version passes afterVersion, else after waitMs with the view as it is);
* POST /runs/{runId}/quarantine/stages `{"stage", "mechanism", "completedAt", "hostId"}` -> 202
  (the principal that held the lease when the run was quarantined, or the service role;
  idempotent on run and stage);
* POST /runs/{runId}/quarantine/clear (operator or verifier, never the run's own principal: 403)
  `{"reason", "evidence", "artifacts"}` -> 202 view.
Triggers honour Idempotency-Key like the other write routes (idempotency.py). Every answer is the
fold's view (services.quarantine.view.render_quarantine) with what only the run and trajectory
views know: the effects left uncompensated (the frozen trajectory's incident) and in flight.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from services.command_api.context import ApiContext
from services.command_api.idempotency import KeyedRequest, conflict_problem
from services.command_api.models import ApiBody, Identifier, Text
from services.command_api.problems import QUARANTINE_REJECTION_PROBLEMS, ApiProblem, problem_response
from services.command_api.quarantine_deps import publish, quarantine_deps, wait_for_version
from services.common.auth import Principal, Role
from services.common.contracts.quarantine import (
    IN_FLIGHT_NOTE,
    MAX_REASON_CHARS,
    ClearQuarantine,
    QuarantineRejectionCode,
    RecordQuarantineStage,
    StartQuarantine,
    graph_id,
)
from services.common.decisions import Rejected
from services.common.ids import canonical_json, derived_id
from services.quarantine.view import render_quarantine

__all__ = ["ClearBody", "QuarantineBody", "StageBody", "SuspicionBody", "quarantine_router"]

MAX_WAIT_MS = 30_000
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)]


class TaintFromStep(ApiBody):
    step: int = Field(ge=0, le=2**31 - 1)


class TaintFromAt(ApiBody):
    at: dt.datetime


class QuarantineBody(ApiBody):
    reason: Text = Field(min_length=1, max_length=MAX_REASON_CHARS)
    evidence: dict[str, Any] | None = None
    taintFrom: TaintFromStep | TaintFromAt | None = None


class SuspicionBody(ApiBody):
    reason: Text = Field(min_length=1, max_length=MAX_REASON_CHARS)
    evidence: dict[str, Any] | None = None


class StageBody(ApiBody):
    stage: Literal["suspended", "severed"]
    mechanism: Literal["cgroup-v2-freeze", "cgroup-v1-freezer", "sigstop", "netns-link-down", "unavailable"]
    # strict=False: an RFC 3339 string in JSON (a strict datetime refuses every string).
    completedAt: Annotated[dt.datetime, Field(strict=False)]
    hostId: Identifier = Field(min_length=1, max_length=200)


class ClearBody(ApiBody):
    reason: Text = Field(min_length=1, max_length=MAX_REASON_CHARS)
    evidence: dict[str, Any] | None = None
    artifacts: list[Identifier] | None = Field(default=None, max_length=10_000)


def _ms(value: dt.datetime) -> int:
    if value.tzinfo is None:
        raise ApiProblem("validation-failed", "a time must carry its offset (RFC 3339), e.g. ...Z")
    return int(value.timestamp() * 1000)


def _evidence(value: dict[str, Any] | None) -> str:
    return canonical_json(value) if value is not None else ""


def _default_taint_step(trajectory: dict[str, Any] | None) -> int:
    """QUA-2's default t_taint: the run's first step after its last verified checkpoint (a
    committed step whose pre-pivot gate passed); with none, -1: the whole run."""
    verified = [
        int(s["index"])
        for s in (trajectory or {}).get("steps", [])
        if s.get("gateVerdict") == "passed" and s.get("status") == "committed"
    ]
    return max(verified) + 1 if verified else -1


def _holder(run: dict[str, Any]) -> tuple[str, int, str]:
    """(holder principal, epoch, attempt) of the run's latest lease ("" / 0 / "" without one)."""
    lease = run.get("lease")
    if not lease:
        return "", 0, ""
    return str(lease.get("holderPrincipal") or ""), int(lease.get("epoch") or 0), str(lease.get("attemptId"))


def _effects(run: dict[str, Any] | None, epoch: int) -> list[dict[str, Any]]:
    """Effects in flight at the quarantine: intended under the quarantined lease and never settled,
    or settled with the gateway's note that they were in flight."""
    if run is None:
        return []
    leases = [*run.get("leaseHistory", []), *([run["lease"]] if run.get("lease") else [])]
    found = []
    for lease in leases:
        if lease.get("epoch") != epoch:
            continue
        for effect in lease.get("effects", []):
            if effect.get("status") == "intended" or IN_FLIGHT_NOTE in str(effect.get("detail") or ""):
                found.append(effect)
    return found


def quarantine_router(ctx: ApiContext) -> APIRouter:
    router = ctx.guarded(tags=["quarantine"])

    async def run_of(run_id: str) -> dict[str, Any]:
        view = await ctx.view(run_id)
        if view is None:
            raise ApiProblem("run-not-found", f"run {run_id} does not exist", runId=run_id)
        return view

    async def render(run_id: str, run: dict[str, Any] | None = None) -> dict[str, Any]:
        board = quarantine_deps(ctx).board
        state = board.quarantine(run_id)
        graph = board.graph(state.tenant) if state is not None else None
        view = render_quarantine(run_id, state, graph)
        trajectory = await ctx.trajectory_view(run_id) if state is not None else None
        incidents = (trajectory or {}).get("incidents", [])
        incident = next((i for i in reversed(incidents) if i.get("failureMode") == "QUARANTINED"), None)
        view["uncompensatedEffects"] = incident["uncompensated"] if incident else []
        view["incidentId"] = incident["incidentId"] if incident else None
        if state is not None and run is None:
            run = await ctx.view(run_id)
        view["inFlightEffects"] = _effects(run, state.lease_epoch) if state is not None else []
        return view

    def refused(outcome: Rejected, request: Request) -> JSONResponse:
        r = outcome.rejection
        return problem_response(
            QUARANTINE_REJECTION_PROBLEMS.get(r.code, "quarantine-conflict"),
            r.detail,
            request.url.path,
            code=r.code,
            runId=r.run_id,
            currentStatus=r.current_status,
            commandId=r.causation_id,
        )

    async def answer(run_id: str, outcome: Any, request: Request, run: dict[str, Any] | None) -> Any:
        if isinstance(outcome, Rejected) and outcome.rejection.code == QuarantineRejectionCode.NOTHING_TO_DO:
            return JSONResponse(await render(run_id, run), status_code=202)  # an idempotent repeat
        if isinstance(outcome, Rejected):
            return refused(outcome, request)
        if outcome is not None:
            await wait_for_version(ctx, run_id, int(outcome.event.version), ctx.remaining())
        return JSONResponse(await render(run_id, run), status_code=202)

    async def trigger(
        run_id: str,
        kind: str,
        body: QuarantineBody | SuspicionBody,
        who: Principal,
        key: str | None,
        request: Request,
    ) -> Any:
        run = await run_of(run_id)
        fields = body.model_dump(mode="json")
        keyed = KeyedRequest.of(run_id, f"StartQuarantine/{kind}", key, who.name, fields)
        state = quarantine_deps(ctx).board.quarantine(run_id)
        if state is not None and keyed.command_id in state.recent:
            return JSONResponse(await render(run_id, run), status_code=202)  # the same request again
        if state is not None and any(keyed.under_key(c) for c in state.recent):
            # The key named another request (another body or caller): never a second trigger.
            raise conflict_problem(
                f"Idempotency-Key {key!r}",
                run_id,
                "a quarantine trigger",
                sorted(fields),
                candidates=True,
                idempotencyKey=key,
            )
        step, at = -1, 0
        taint_from = getattr(body, "taintFrom", None)
        if isinstance(taint_from, TaintFromStep):
            step = taint_from.step
        elif isinstance(taint_from, TaintFromAt):
            at = _ms(taint_from.at)
        else:
            step = _default_taint_step(await ctx.trajectory_view(run_id))
        holder, epoch, attempt = _holder(run)
        command = StartQuarantine(
            command_id=keyed.command_id,
            run_id=run_id,
            issued_at=ctx.deps.clock.now_ms(),
            correlation_id=request.headers.get("x-correlation-id") or run_id,
            actor=who.name,
            trigger=kind,
            reason=body.reason,
            evidence=_evidence(body.evidence),
            tenant=str(run["tenant"]),
            holder=holder,
            lease_epoch=epoch,
            attempt_id=attempt,
            taint_from_step=step,
            taint_from_at=at,
        )
        return await answer(run_id, await publish(ctx, command), request, run)

    @router.post("/runs/{run_id}/quarantine", status_code=202, summary="Quarantine a run (QUA-1, operators)")
    async def quarantine(
        run_id: str, body: QuarantineBody, request: Request, key: IdempotencyKey = None
    ) -> Any:
        who = ctx.principal(request)
        if who.role != Role.OPERATOR:
            raise ApiProblem("forbidden", "quarantining a run needs the operator role", runId=run_id)
        return await trigger(run_id, "operator", body, who, key, request)

    @router.post("/runs/{run_id}/suspicions", status_code=202, summary="A verifier suspects a run (QUA-1)")
    async def suspicion(
        run_id: str, body: SuspicionBody, request: Request, key: IdempotencyKey = None
    ) -> Any:
        who = ctx.principal(request)
        if who.role != Role.VERIFIER:
            raise ApiProblem("forbidden", "reporting a suspicion needs the verifier role", runId=run_id)
        return await trigger(run_id, "verifier", body, who, key, request)

    @router.get(
        "/runs/{run_id}/quarantine",
        summary="A run's quarantine: trigger, stages, taint (long-poll)",
        name="read_quarantine",
    )
    async def read(
        run_id: str,
        request: Request,
        afterVersion: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
        waitMs: Annotated[int, Query(ge=0, le=MAX_WAIT_MS)] = 0,
    ) -> Any:
        who = ctx.principal(request)
        run = await run_of(run_id)
        state = quarantine_deps(ctx).board.quarantine(run_id)
        holders = _holders(run)
        may_read = (
            who.role in (Role.OPERATOR, Role.SERVICE, Role.VERIFIER)
            or who.name == run.get("submittedBy")
            or who.name in holders
            or (state is not None and who.name == state.holder)
            or ctx.development_mode
        )
        if not may_read:
            detail = f"{who.name} may not read the quarantine of run {run_id}"
            raise ApiProblem("forbidden", detail, runId=run_id)
        version = state.version if state is not None else 0
        if version <= afterVersion and waitMs > 0:
            wait_s = min(waitMs / 1000, max(0.0, ctx.remaining() - 0.2))
            newer = await quarantine_deps(ctx).decisions.wait_past(run_id, afterVersion, wait_s)
            if newer is not None:
                await wait_for_version(ctx, run_id, min(newer, afterVersion + 1), 1.0)
        return await render(run_id, run)

    @router.post("/runs/{run_id}/quarantine/stages", status_code=202, summary="A runner host's stage done")
    async def stage(run_id: str, body: StageBody, request: Request) -> Any:
        who = ctx.principal(request)
        state = quarantine_deps(ctx).board.quarantine(run_id)
        if state is None:
            await run_of(run_id)
            raise ApiProblem("quarantine-conflict", f"run {run_id} was never quarantined", runId=run_id)
        if who.role != Role.SERVICE and who.name != state.holder and not ctx.development_mode:
            raise ApiProblem(
                "forbidden",
                f"only the principal that held run {run_id}'s lease when it was quarantined "
                f"({state.holder or 'none'}) or the service role may report its stages",
                runId=run_id,
            )
        command = RecordQuarantineStage(
            command_id=derived_id("cmd", state.quarantine_event_id, "stage", body.stage),
            run_id=run_id,
            issued_at=ctx.deps.clock.now_ms(),
            correlation_id=run_id,
            actor=who.name,
            stage=body.stage,
            mechanism=body.mechanism,
            completed_at=_ms(body.completedAt),
            host_id=body.hostId,
            detail="",
        )
        if state.stage(body.stage) is not None:
            return JSONResponse(await render(run_id), status_code=202)  # idempotent on (run, stage)
        return await answer(run_id, await publish(ctx, command), request, None)

    @router.post(
        "/runs/{run_id}/quarantine/clear",
        status_code=202,
        summary="Clear a quarantine (QUA-2)",
        name="clear_quarantine",
    )
    async def clear(run_id: str, body: ClearBody, request: Request, key: IdempotencyKey = None) -> Any:
        who = ctx.principal(request)
        run = await run_of(run_id)
        state = quarantine_deps(ctx).board.quarantine(run_id)
        _may_clear(who, run, state.holder if state is not None else "", run_id)
        keyed = KeyedRequest.of(run_id, "ClearQuarantine", key, who.name, body.model_dump(mode="json"))
        command = ClearQuarantine(
            command_id=keyed.command_id,
            run_id=run_id,
            issued_at=ctx.deps.clock.now_ms(),
            correlation_id=request.headers.get("x-correlation-id") or run_id,
            actor=who.name,
            reason=body.reason,
            evidence=_evidence(body.evidence),
            role=str(who.role),
            artifact_ids=tuple(body.artifacts or ()),
        )
        outcome = await publish(ctx, command)
        if not isinstance(outcome, Rejected) and outcome is not None and state is not None:
            await wait_for_version(ctx, run_id, int(outcome.event.version), ctx.remaining())
            await _lifted(ctx, state.tenant, run_id, body.artifacts)
        return await answer(run_id, outcome, request, run)

    return router


async def _lifted(ctx: ApiContext, tenant: str, run_id: str, named: list[str] | None) -> None:
    """Wait (briefly) until the tenant's graph shows the lift, which follows the clearing through
    the graph aggregate: the answer then shows the artifacts cleared."""
    board = quarantine_deps(ctx).board
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(1.0, ctx.remaining())
    while loop.time() < deadline:
        graph = board.graph(tenant)
        if graph is None or run_id not in graph.quarantined:
            return
        await asyncio.sleep(0.005)


def _holders(run: dict[str, Any]) -> set[str]:
    """Every principal that held one of the run's leases."""
    leases = [*run.get("leaseHistory", []), run.get("lease") or {}]
    return {str(lease["holderPrincipal"]) for lease in leases if lease.get("holderPrincipal")}


def _may_clear(who: Principal, run: dict[str, Any], holder: str, subject: str) -> None:
    """Clearing needs an operator or a verifier, and never the quarantined run's own principal
    (any principal that held one of its leases): 403 `clearing-forbidden` otherwise."""
    if who.name == holder or who.name in _holders(run):
        raise ApiProblem(
            "clearing-forbidden",
            f"{who.name} is the quarantined run's own principal: it may not clear {subject} "
            "(clearing needs an independent verifier or an operator)",
            runId=run["runId"],
        )
    if who.role not in (Role.OPERATOR, Role.VERIFIER):
        detail = "clearing needs the operator or the verifier role"
        raise ApiProblem("clearing-forbidden", detail, runId=run["runId"])


def tenant_graph(run: dict[str, Any]) -> str:
    return graph_id(str(run["tenant"]))
