"""HTTP front of the effect gateway (POST /effects), problem+json errors like the command API."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from services.effect_gateway.service import EffectRefused, EffectRequest, Gateway

__all__ = ["EffectBody", "VerifyBody", "create_app"]

_STATUS = {
    "stale-epoch": 409,
    "fenced-by-recipient": 409,
    "run-not-found": 404,
    "unknown-tool": 422,
    "tool-failed": 502,
    "outcome-unknown": 504,
    "unavailable": 503,
}


class EffectBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    runId: str = Field(min_length=1)
    attemptId: str = Field(min_length=1)
    epoch: int = Field(ge=1)
    idempotencyKey: str = Field(min_length=1, max_length=200)
    tool: str = Field(min_length=1)
    operation: str = Field(min_length=1)
    payload: dict[str, Any] = Field(default_factory=dict)


class VerifyBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    runId: str = Field(min_length=1)
    tool: str = Field(min_length=1)
    verifier: str = Field(min_length=1)
    payload: dict[str, Any] = Field(default_factory=dict)


def _problem(slug: str, detail: str, status: int, path: str, **extensions: Any) -> JSONResponse:
    body = {
        "type": f"/problems/{slug}",
        "title": slug.replace("-", " "),
        "status": status,
        "detail": detail,
        "instance": path,
        **extensions,
    }
    return JSONResponse(body, status_code=status, media_type="application/problem+json")


def create_app(open_gateway: Callable[[], Gateway]) -> FastAPI:
    holder: dict[str, Gateway] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        holder["gw"] = await asyncio.to_thread(open_gateway)
        try:
            yield
        finally:
            await holder["gw"].close()

    app = FastAPI(
        title="Tenure effect gateway",
        version="0.1.0",
        lifespan=lifespan,
        description="Fenced, journaled, reconciled external effects.",
    )

    @app.exception_handler(EffectRefused)
    async def refused(request: Request, exc: EffectRefused) -> JSONResponse:
        status = exc.status or _STATUS.get(exc.slug, 409)
        return _problem(exc.slug, exc.detail, status, request.url.path, **exc.extensions)

    @app.post("/effects", summary="Perform an external effect under a lease")
    async def perform(body: EffectBody) -> Any:
        result = await holder["gw"].perform(
            EffectRequest(
                body.runId,
                body.attemptId,
                body.epoch,
                body.idempotencyKey,
                body.tool,
                body.operation,
                body.payload,
            )
        )
        return {
            "effectId": result.effect_id,
            "outcome": result.outcome,
            "toolStatus": result.tool_status,
            "toolResponse": result.tool_response,
            "reconciled": result.reconciled,
            "replayed": result.replayed,
        }

    @app.get("/runs/{run_id}/fencing", summary="The run's lease epoch as the gateway folds it")
    async def fencing(run_id: str, request: Request) -> Any:
        view = holder["gw"].view(run_id)
        if view is None:
            return _problem("run-not-found", f"run {run_id} does not exist", 404, request.url.path)
        return {
            "runId": run_id,
            "epoch": view.epoch,
            "attemptId": view.attempt_id,
            "leaseHeld": view.lease_held,
            "version": view.version,
        }

    @app.post("/verify", summary="Run a tool's deterministic verifier (pre-pivot gate, SAGA-6)")
    async def verify(body: VerifyBody) -> Any:
        answer = await holder["gw"].verify(body.tool, body.verifier, body.runId, body.payload)
        return {"status": answer.status, "result": answer.body}

    @app.get("/healthz")
    async def healthz() -> Any:
        if not holder["gw"].ready:
            return JSONResponse({"status": "catching-up"}, status_code=503)
        return {"status": "ok"}

    return app
