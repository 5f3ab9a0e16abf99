"""Routes for submitting, cancelling, retrying and reading runs (and liveness/readiness).

Idempotency (services/command_api/idempotency.py): a repeat of a request under its key is the
first answer again; the same key with a different request is 409 idempotency-key-conflict
naming the fields that differ. A repeated submission answers 200 (documented in the README),
every other repeat the status of the first answer.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.command_api.as_of import BadAsOf, fold_as_of, parse_as_of
from services.command_api.context import ApiContext, pending_response, rejection_problem
from services.command_api.health import health_router
from services.command_api.idempotency import PRINCIPAL_FIELD, KeyedRequest, conflict_problem, differing_fields
from services.command_api.models import (
    STATUS_VALUES,
    CancelRequest,
    PendingCommand,
    RetryRequest,
    RunPage,
    SubmitRunRequest,
)
from services.command_api.problems import ApiProblem
from services.common.auth import Principal, Role, require_role
from services.common.contracts import CancelRun, RetryRun, SubmitRun
from services.common.decisions import Rejected
from services.common.ids import canonical_json, command_id_for, run_id_for
from services.projections.store import BadCursor

__all__ = ["caused_by", "may_act_on_run", "runs_router"]

TERMINAL_VALUES = ("succeeded", "failed", "cancelled")
_IDEMPOTENCY_KEY = Header(default=None, alias="Idempotency-Key", max_length=200)


def caused_by(view: dict[str, Any], command_id: str) -> bool:
    return any(entry.get("causationId") == command_id for entry in view["history"])


def may_act_on_run(who: Principal, view: dict[str, Any], action: str) -> None:
    """A run is cancelled, retried or answered by its submitter or by an operator."""
    if who.role != Role.OPERATOR and who.name != view.get("submittedBy"):
        raise ApiProblem(
            "forbidden",
            f"{who.name} did not submit run {view['runId']}; {action} it needs its submitter or "
            "the operator role",
            runId=view["runId"],
        )


def _submission(view: dict[str, Any]) -> dict[str, Any]:
    """The submission as the Run view records it, in the request's field names."""
    return {
        PRINCIPAL_FIELD: view.get("submittedBy"),
        "tenant": view["tenant"],
        "executionSpec": view["executionSpec"],
        "retrySafe": view["retrySafe"],
        "timeoutSeconds": view["timeoutSeconds"],
        "maxAttempts": view["maxAttempts"],
        # Views folded before runs carried it have no member: the same as none named.
        "agentRevisionId": view.get("agentRevisionId"),
    }


def _cancel_fields(entry: dict[str, Any]) -> dict[str, Any]:
    reason = entry["reason"] if "reason" in entry else entry.get("details", {}).get("reason")
    return {PRINCIPAL_FIELD: entry.get("actor"), "reason": reason}


def _retry_fields(entry: dict[str, Any]) -> dict[str, Any]:
    details = entry.get("details", {})
    return {
        PRINCIPAL_FIELD: entry.get("actor"),
        "acknowledgeRepeatedEffects": details.get("acknowledgedRepeatedEffects"),
        "reason": details.get("reason"),
    }


def runs_router(ctx: ApiContext) -> APIRouter:
    router = APIRouter()
    api = ctx.guarded()

    def replayed_submission(view: dict[str, Any], who: Principal, body: SubmitRunRequest, key: str) -> Any:
        request_fields = {PRINCIPAL_FIELD: who.name, **body.model_dump(mode="json")}
        fields = differing_fields(request_fields, _submission(view))
        if fields:
            raise conflict_problem(
                f"Idempotency-Key {key!r}", view["runId"], f"run {view['runId']}", fields, idempotencyKey=key
            )
        return JSONResponse(view, status_code=200, headers={"Location": f"/runs/{view['runId']}"})

    @api.post("/runs", status_code=201, summary="Submit a run (idempotent by Idempotency-Key)")
    async def submit_run(
        body: SubmitRunRequest,
        request: Request,
        response: Response,
        idempotency_key: str | None = _IDEMPOTENCY_KEY,
    ) -> Any:
        who = ctx.principal(request)
        require_role(who, "submitting a run", Role.SUBMITTER, Role.OPERATOR)
        if not idempotency_key:
            raise ApiProblem("idempotency-key-required", "send an Idempotency-Key header (e.g. a UUID)")
        run_id = run_id_for(body.tenant, idempotency_key)
        existing = await ctx.view(run_id)
        if existing is not None:
            return replayed_submission(existing, who, body, idempotency_key)
        command = SubmitRun(
            # Unique per request: a refused submission (e.g. over the tenant's queue limit) leaves
            # nothing behind and must be decided afresh when the caller retries with its key;
            # repeats of an accepted one are recognised by the run already existing.
            command_id=command_id_for(run_id, "SubmitRun", f"{idempotency_key}/{uuid.uuid4().hex}"),
            run_id=run_id,
            issued_at=ctx.deps.clock.now_ms(),
            correlation_id=request.headers.get("x-correlation-id") or run_id,
            actor=who.name,
            tenant=body.tenant,
            idempotency_key=idempotency_key,
            execution_spec=canonical_json(body.executionSpec),
            retry_safe=body.retrySafe,
            timeout_seconds=body.timeoutSeconds,
            max_attempts=body.maxAttempts,
            agent_revision_id=body.agentRevisionId,
        )
        outcome = await ctx.publish_and_wait(command)
        if isinstance(outcome, (Rejected, PendingCommand)):
            # A concurrent request under the same key may have created the run meanwhile: then
            # this one is its repeat (or its conflict), whatever the coordinator answered.
            raced = await ctx.view(run_id)
            if raced is not None and not caused_by(raced, command.command_id):
                return replayed_submission(raced, who, body, idempotency_key)
        if isinstance(outcome, Rejected):
            return rejection_problem(outcome, request.url.path)
        if isinstance(outcome, PendingCommand):
            return pending_response(outcome)
        response.headers["Location"] = f"/runs/{run_id}"
        return outcome.view

    @api.post("/runs/{run_id}/cancel", summary="Cancel a run (its submitter or an operator)")
    async def cancel_run(
        run_id: str,
        request: Request,
        body: CancelRequest | None = None,
        idempotency_key: str | None = _IDEMPOTENCY_KEY,
    ) -> Any:
        who = ctx.principal(request)
        current = await ctx.view(run_id)
        if current is None:
            raise ApiProblem("run-not-found", f"run {run_id} does not exist", runId=run_id)
        may_act_on_run(who, current, "cancelling")
        body = body or CancelRequest(reason="")
        keyed = KeyedRequest.of(run_id, "CancelRun", idempotency_key, who.name, body.model_dump(mode="json"))
        first = keyed.find(current["history"], "causationId")
        if first is not None:
            keyed.check(first["causationId"], _cancel_fields(dict(first)), f"a cancel of run {run_id}")
            return current  # this very cancel was already applied: answer it again
        command = CancelRun(
            command_id=keyed.command_id,
            run_id=run_id,
            issued_at=ctx.deps.clock.now_ms(),
            correlation_id=request.headers.get("x-correlation-id") or run_id,
            actor=who.name,
            reason=body.reason,
        )
        outcome = await ctx.publish_and_wait(command)
        if isinstance(outcome, Rejected):
            return rejection_problem(outcome, request.url.path)
        if isinstance(outcome, PendingCommand):
            return pending_response(outcome)
        return outcome.view

    @api.post("/runs/{run_id}/retry", summary="Retry a run: same run if interrupted, a new run if it ended")
    async def retry_run(
        run_id: str,
        body: RetryRequest,
        request: Request,
        idempotency_key: str | None = _IDEMPOTENCY_KEY,
    ) -> Any:
        who = ctx.principal(request)  # a fresh permission check, by whoever retries now
        current = await ctx.view(run_id)
        if current is None:
            raise ApiProblem("run-not-found", f"run {run_id} does not exist", runId=run_id)
        may_act_on_run(who, current, "retrying")
        key = idempotency_key or uuid.uuid4().hex
        fields = body.model_dump(mode="json")
        # A repeat answers what the first request did, even if the run has moved on since
        # (an interrupted run retried in place may have ended by now).
        in_place = KeyedRequest.of(run_id, "RetryRun", key, who.name, fields)
        first = in_place.find(current["history"], "causationId")
        if first is not None:
            in_place.check(first["causationId"], _retry_fields(dict(first)), f"a retry of run {run_id}")
            return current
        child_key = f"retry:{run_id}:{key}"
        child_id = run_id_for(current["tenant"], child_key)
        as_new = KeyedRequest.of(child_id, "SubmitRun", child_key, who.name, fields)
        child = await ctx.view(child_id)
        if child is not None:
            submitted = child["history"][0]
            # The retry's reason is not recorded in the new run; only its caller is.
            as_new.check(
                submitted["causationId"],
                {PRINCIPAL_FIELD: child.get("submittedBy")},
                f"a retry of run {run_id} (as run {child_id})",
            )
            return JSONResponse(child, status_code=201, headers={"Location": f"/runs/{child_id}"})
        if not body.acknowledgeRepeatedEffects:
            raise ApiProblem(
                "retry-needs-acknowledgement",
                "external actions of the earlier attempt may repeat; send acknowledgeRepeatedEffects=true",
                runId=run_id,
            )
        command: SubmitRun | RetryRun
        if current["status"] in TERMINAL_VALUES:
            # EXE-5: a terminal run is never reopened; its retry is a new run that points back.
            command = SubmitRun(
                command_id=as_new.command_id,
                run_id=child_id,
                issued_at=ctx.deps.clock.now_ms(),
                correlation_id=request.headers.get("x-correlation-id") or run_id,
                actor=who.name,
                tenant=current["tenant"],
                idempotency_key=child_key,
                execution_spec=canonical_json(current["executionSpec"]),
                retry_safe=current["retrySafe"],
                timeout_seconds=current["timeoutSeconds"],
                max_attempts=current["maxAttempts"],
                parent_run_id=run_id,
                # The retry runs what its parent ran (EXE-14).
                agent_revision_id=current.get("agentRevisionId"),
            )
        else:
            command = RetryRun(
                command_id=in_place.command_id,
                run_id=run_id,
                issued_at=ctx.deps.clock.now_ms(),
                correlation_id=request.headers.get("x-correlation-id") or run_id,
                actor=who.name,
                acknowledge_repeated_effects=True,
                reason=body.reason,
            )
        outcome = await ctx.publish_and_wait(command)
        if isinstance(outcome, Rejected):
            return rejection_problem(outcome, request.url.path)
        if isinstance(outcome, PendingCommand):
            return pending_response(outcome)
        if isinstance(command, SubmitRun):
            location = {"Location": f"/runs/{command.run_id}"}
            return JSONResponse(outcome.view, status_code=201, headers=location)
        return outcome.view

    @api.get("/runs/{run_id}", summary="The Run view, with its semantic watchdog's ladder if it has one")
    async def get_run(
        run_id: str,
        asOf: str | None = Query(
            default=None,
            max_length=64,
            description="The run as it was at this time (RFC 3339 or epoch ms) or version (v12), "
            "folded from the log; the answer's `asOf` says which version that was.",
        ),
    ) -> Any:
        view = await ctx.view(run_id)
        if view is None:
            raise ApiProblem("run-not-found", f"run {run_id} does not exist", runId=run_id)
        if asOf is not None:
            return await _as_of(run_id, view, asOf)
        view = await ctx.with_every_renewal(run_id, view)
        ladder = await _watchdog_ladder(run_id)
        return view if ladder is None else {**view, "watchdog": ladder}

    async def _as_of(run_id: str, current: dict[str, Any], text: str) -> Any:
        try:
            as_of = parse_as_of(text)
        except BadAsOf as exc:
            raise ApiProblem("validation-failed", str(exc), runId=run_id) from exc
        history = ctx.deps.run_history
        if history is None:
            raise ctx.unavailable("the run's history is not readable by this API")
        read = history

        def fold() -> dict[str, Any] | None:
            return fold_as_of(read(run_id, int(current["submittedAt"]), as_of.time_ms), as_of)

        view = await ctx.in_thread("the run's history on runs.events", fold)
        if view is None:
            raise ApiProblem(
                "run-not-found", f"run {run_id} did not exist yet at {text}", runId=run_id, asOf=text
            )
        return view

    async def _watchdog_ladder(run_id: str) -> dict[str, Any] | None:
        """The watchdog's interventions (WD-5) beside the run, so an operator sees the whole
        ladder where it looks first; GET /runs/{runId}/watchdog has the evidence in full. A
        watchdog view that cannot be read leaves the run's answer as it is."""
        try:
            watchdog = await ctx.in_thread("the watchdog views", ctx.deps.views.watchdog, run_id)
        except Exception:  # an unreadable watchdog view must not hide the run
            return None
        if watchdog is None:
            return None
        return {
            "status": watchdog["status"],
            "turn": watchdog["turn"],
            "rollbacks": watchdog["rollbacks"],
            "tombstones": watchdog["tombstones"],
            "interventions": watchdog["interventions"],
            "pendingIntervention": watchdog["pendingIntervention"],
            "href": f"/runs/{run_id}/watchdog",
        }

    @api.get("/runs", response_model=RunPage, summary="List runs, oldest submissions first")
    async def list_runs(
        status: str | None = Query(default=None, description=f"One of {', '.join(STATUS_VALUES)}"),
        limit: int = Query(default=50, ge=1, le=500),
        cursor: str | None = Query(default=None),
    ) -> Any:
        if status is not None and status not in STATUS_VALUES:
            raise ApiProblem(
                "validation-failed", f"status must be one of {', '.join(STATUS_VALUES)}, not {status!r}"
            )
        try:
            page = await ctx.in_thread("the run views", ctx.deps.views.list, status, limit, cursor)
        except BadCursor as exc:
            raise ApiProblem("invalid-cursor", str(exc)) from exc
        return RunPage(items=page.items, nextCursor=page.next_cursor)

    @router.get("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> Response:
        return PlainTextResponse(generate_latest(ctx.metrics), media_type=CONTENT_TYPE_LATEST)

    router.include_router(api)
    router.include_router(health_router(ctx))
    return router
