"""Routes for submitting, cancelling and reading runs."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.command_api.context import ApiContext, pending_response, rejection_problem
from services.command_api.models import (
    STATUS_VALUES,
    CancelRequest,
    PendingCommand,
    RetryRequest,
    RunPage,
    SubmitRunRequest,
)
from services.command_api.problems import ApiProblem
from services.common.contracts import CancelRun, RetryRun, SubmitRun
from services.common.decisions import Rejected
from services.common.ids import canonical_json, command_id_for, run_id_for, sha256_digest
from services.projections.store import BadCursor

__all__ = ["caused_by", "runs_router"]

TERMINAL_VALUES = ("succeeded", "failed", "cancelled")


def caused_by(view: dict[str, Any], command_id: str) -> bool:
    return any(entry.get("causationId") == command_id for entry in view["history"])


def runs_router(ctx: ApiContext) -> APIRouter:
    router = APIRouter()

    @router.post("/runs", status_code=201, summary="Submit a run (idempotent by Idempotency-Key)")
    async def submit_run(
        body: SubmitRunRequest,
        request: Request,
        response: Response,
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        who = ctx.principal(request)
        if not idempotency_key:
            raise ApiProblem("idempotency-key-required", "send an Idempotency-Key header (e.g. a UUID)")
        run_id = run_id_for(body.tenant, idempotency_key)
        existing = await ctx.view(run_id)
        if existing is not None:
            digest = sha256_digest(canonical_json(body.executionSpec))
            if existing["specDigest"] != digest:
                raise ApiProblem(
                    "idempotency-key-conflict",
                    f"Idempotency-Key {idempotency_key!r} already submitted run {run_id} with "
                    f"spec {existing['specDigest']}; this request has spec {digest}",
                    runId=run_id,
                )
            response.status_code = 200
            response.headers["Location"] = f"/runs/{run_id}"
            return existing
        command = SubmitRun(
            # Unique per request: a refused submission (e.g. over the tenant's queue limit) leaves
            # nothing behind and must be decided afresh when the caller retries with its key;
            # duplicates of an accepted one are recognised by the run already existing.
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
        )
        outcome = await ctx.publish_and_wait(command)
        if isinstance(outcome, Rejected):
            return rejection_problem(outcome, request.url.path)
        if isinstance(outcome, PendingCommand):
            return pending_response(outcome)
        response.headers["Location"] = f"/runs/{run_id}"
        return outcome.view

    @router.post("/runs/{run_id}/cancel", summary="Cancel a run")
    async def cancel_run(
        run_id: str,
        request: Request,
        body: CancelRequest | None = None,
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        who = ctx.principal(request)
        current = await ctx.view(run_id)
        if current is None:
            raise ApiProblem("run-not-found", f"run {run_id} does not exist", runId=run_id)
        command_id = command_id_for(run_id, "CancelRun", idempotency_key or uuid.uuid4().hex)
        if caused_by(current, command_id):
            return current  # this very cancel was already applied: answer it again
        command = CancelRun(
            command_id=command_id,
            run_id=run_id,
            issued_at=ctx.deps.clock.now_ms(),
            correlation_id=request.headers.get("x-correlation-id") or run_id,
            actor=who.name,
            reason=(body.reason if body else ""),
        )
        outcome = await ctx.publish_and_wait(command)
        if isinstance(outcome, Rejected):
            return rejection_problem(outcome, request.url.path)
        if isinstance(outcome, PendingCommand):
            return pending_response(outcome)
        return outcome.view

    @router.post(
        "/runs/{run_id}/retry", summary="Retry a run: same run if interrupted, a new run if it ended"
    )
    async def retry_run(
        run_id: str,
        body: RetryRequest,
        request: Request,
        response: Response,
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        who = ctx.principal(request)  # a fresh permission check, by whoever retries now
        current = await ctx.view(run_id)
        if current is None:
            raise ApiProblem("run-not-found", f"run {run_id} does not exist", runId=run_id)
        if not body.acknowledgeRepeatedEffects:
            raise ApiProblem(
                "retry-needs-acknowledgement",
                "external actions of the earlier attempt may repeat; send acknowledgeRepeatedEffects=true",
                runId=run_id,
            )
        key = idempotency_key or uuid.uuid4().hex
        command: SubmitRun | RetryRun
        if current["status"] in TERMINAL_VALUES:
            # EXE-5: a terminal run is never reopened; its retry is a new run that points back.
            child_key = f"retry:{run_id}:{key}"
            child_id = run_id_for(current["tenant"], child_key)
            command = SubmitRun(
                command_id=command_id_for(child_id, "SubmitRun", child_key),
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
            )
            existing = await ctx.view(child_id)
            if existing is not None:
                return existing
        else:
            command = RetryRun(
                command_id=command_id_for(run_id, "RetryRun", key),
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
            response.status_code = 201
            response.headers["Location"] = f"/runs/{command.run_id}"
        return outcome.view

    @router.get("/runs/{run_id}", summary="The Run view")
    async def get_run(run_id: str, request: Request) -> Any:
        ctx.principal(request)
        view = await ctx.view(run_id)
        if view is None:
            raise ApiProblem("run-not-found", f"run {run_id} does not exist", runId=run_id)
        return view

    @router.get("/runs", response_model=RunPage, summary="List runs, oldest submissions first")
    async def list_runs(
        request: Request,
        status: str | None = Query(default=None, description=f"One of {', '.join(STATUS_VALUES)}"),
        limit: int = Query(default=50, ge=1, le=500),
        cursor: str | None = Query(default=None),
    ) -> Any:
        ctx.principal(request)
        if status is not None and status not in STATUS_VALUES:
            raise ApiProblem(
                "validation-failed", f"status must be one of {', '.join(STATUS_VALUES)}, not {status!r}"
            )
        try:
            page = await asyncio.to_thread(ctx.deps.views.list, status, limit, cursor)
        except BadCursor as exc:
            raise ApiProblem("invalid-cursor", str(exc)) from exc
        return RunPage(items=page.items, nextCursor=page.next_cursor)

    @router.get("/healthz", summary="Liveness and readiness")
    async def healthz() -> Any:
        return {"status": "ok"}

    @router.get("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> Response:
        return PlainTextResponse(generate_latest(ctx.metrics), media_type=CONTENT_TYPE_LATEST)

    return router
