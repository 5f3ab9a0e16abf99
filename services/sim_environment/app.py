"""HTTP face of the simulated environment (FastAPI). The decisions live in ``world``; this module
parses requests, holds the lock around the world and sleeps the answers' delays outside it.

Contract (errors are RFC 9457 ``application/problem+json`` with ``type`` ``/problems/<kind>``):

- ``POST /effects`` with headers ``Idempotency-Key``, ``X-Fencing-Epoch``, ``X-Work-Id`` and body
  ``{"operation": str, "payload": {...}}``: 200 ``{"operation", "output"}`` (a repeat of an applied
  request gets the same body and ``Idempotent-Replay: true``); 409 ``stale-epoch`` /
  ``idempotency-key-conflict`` / ``conflict``; 422 ``schema-invalid`` / ``missing-parameter`` /
  ``compile-error``; 404 ``not-found``; armed faults answer what they were armed with. A missing
  or malformed header is a 400, a body of the wrong shape a 422 ``invalid-request``.
- ``GET /effects/{key}``: the probe (REC-6): 200 with exactly the stored success body, or 404.
- ``POST /faults`` (201, the armed fault; ``workId`` limits it to one work's requests; kind
  ``corrupt-answer`` applies the effect and answers 200 with a malformed JSON body), ``GET
  /faults``, ``DELETE /faults``.
- ``GET /audit[?workId=...]`` (the world's state, or one work's, see ``World.audit``; with its
  semantic duplicates), ``POST /reset`` (a fresh world),
  ``POST /verifiers/{name}`` ({payload, workId?} -> {ok, detail}), ``GET /problems/{kind}``,
  ``GET /healthz``.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import Body, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.common.http_metrics import install_http_metrics
from services.common.tracing import TracingMiddleware
from services.sim_environment.verifiers import UnknownVerifier, verify
from services.sim_environment.world import OPERATIONS, PROBLEM_KINDS, Answer, Fault, World, canonical_json

__all__ = ["APP_PROBLEMS", "FaultSpec", "SimProblem", "VerifyRequest", "create_app"]

PROBLEM_JSON = "application/problem+json"
REPLAY_HEADER = "Idempotent-Replay"
MAX_ID_LENGTH = 255
MAX_EPOCH = 2**63 - 1
_EPOCH_PATTERN = re.compile(r"[0-9]{1,19}")

# Problems of the HTTP layer itself; the world's own kinds are in world.PROBLEM_KINDS.
APP_PROBLEMS: dict[str, tuple[int, str]] = {
    "idempotency-key-required": (400, "Idempotency-Key header is missing or malformed"),
    "work-id-required": (400, "X-Work-Id header is missing or malformed"),
    "fencing-epoch-required": (400, "X-Fencing-Epoch header is missing"),
    "fencing-epoch-invalid": (400, "X-Fencing-Epoch is not a valid epoch"),
    "invalid-request": (422, "The request body has the wrong shape"),
    "invalid-fault": (422, "The fault is not valid"),
    "effect-not-found": (404, "No effect answered success under this idempotency key"),
    "verifier-not-found": (404, "No such verifier"),
    "problem-type-not-found": (404, "No such problem type"),
    "not-found": (404, "No such resource"),
    "method-not-allowed": (405, "Method not allowed"),
    "http-error": (400, "HTTP error"),
}


class SimProblem(Exception):
    """Raised by handlers; rendered as problem+json with ``extensions`` merged into the body."""

    def __init__(self, kind: str, detail: str, **extensions: Any) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.extensions = extensions


def _problem_response(
    kind: str, detail: str, instance: str, *, status: int | None = None, **extensions: Any
) -> JSONResponse:
    default_status, title = APP_PROBLEMS[kind]
    body = {
        **extensions,
        "type": f"/problems/{kind}",
        "title": title,
        "status": status or default_status,
        "detail": detail,
        "instance": instance,
    }
    return JSONResponse(body, status_code=body["status"], media_type=PROBLEM_JSON)


class FaultSpec(BaseModel):
    """The body of ``POST /faults`` (see ``world.Fault`` for what each kind does)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    operation: str
    kind: Literal["error", "timeout-after-commit", "timeout-before-commit", "corrupt-answer"]
    times: int = Field(1, ge=1, le=1000)
    status: int | None = Field(None, ge=400, le=599)
    problem: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")
    detail: str | None = Field(None, max_length=2000)
    partial_output: bool = Field(False, alias="partialOutput")
    delay_s: float = Field(10.0, ge=0.0, le=600.0, alias="delayS")
    match: dict[str, Any] = Field(default_factory=dict)
    extensions: dict[str, Any] = Field(default_factory=dict)
    work_id: str | None = Field(None, alias="workId", min_length=1, max_length=MAX_ID_LENGTH)

    @model_validator(mode="after")
    def _consistent(self) -> FaultSpec:
        if self.operation not in OPERATIONS:
            raise ValueError(f"unknown operation {self.operation!r}; known: {', '.join(OPERATIONS)}")
        error_only = self.status is not None or self.problem is not None or self.partial_output
        if self.kind != "error" and error_only:
            raise ValueError("status, problem and partialOutput apply only to kind 'error'")
        unknown_kind = self.problem is not None and self.problem not in PROBLEM_KINDS
        if self.kind == "error" and unknown_kind and self.status is None:
            raise ValueError(f"problem {self.problem!r} is not a known kind: give its status")
        return self

    def to_fault(self) -> Fault:
        return Fault(
            operation=self.operation,
            kind=self.kind,
            times=self.times,
            status=self.status,
            problem=self.problem or "unavailable",
            detail=self.detail,
            partial_output=self.partial_output,
            delay_s=self.delay_s,
            match=self.match,
            extensions=self.extensions,
            work_id=self.work_id,
        )


class VerifyRequest(BaseModel):
    """The body of ``POST /verifiers/{name}``."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    payload: dict[str, Any]
    work_id: str | None = Field(None, alias="workId")


def _identifier(value: str | None, header: str, kind: str) -> str:
    if value is None or not value.strip():
        raise SimProblem(kind, f"the {header} header is required")
    if value != value.strip():
        raise SimProblem(kind, f"the {header} header must not start or end with spaces")
    if len(value) > MAX_ID_LENGTH:
        raise SimProblem(kind, f"the {header} header is longer than {MAX_ID_LENGTH} characters")
    return value


def _epoch(value: str | None) -> int:
    if value is None or value == "":
        raise SimProblem("fencing-epoch-required", "the X-Fencing-Epoch header is required")
    if not _EPOCH_PATTERN.fullmatch(value) or int(value) > MAX_EPOCH:
        raise SimProblem(
            "fencing-epoch-invalid",
            f"X-Fencing-Epoch must be a non-negative decimal integer below 2^63, got {value!r}",
        )
    return int(value)


def _effect_body(body: Any) -> tuple[str, dict[str, Any]]:
    if not isinstance(body, dict):
        raise SimProblem("invalid-request", "the body must be a JSON object {operation, payload}")
    unknown = sorted(set(body) - {"operation", "payload"})
    if unknown:
        raise SimProblem("invalid-request", f"unknown body fields: {', '.join(unknown)}")
    operation, payload = body.get("operation"), body.get("payload")
    if not isinstance(operation, str) or not operation:
        raise SimProblem("invalid-request", "operation must be a non-empty string")
    if not isinstance(payload, dict):
        raise SimProblem("invalid-request", "payload must be a JSON object")
    try:
        canonical_json(payload)
    except ValueError as exc:  # NaN/Infinity: cannot be stored or answered as JSON
        raise SimProblem("invalid-request", f"payload is not plain JSON: {exc}") from exc
    return operation, payload


def _render(answer: Answer, instance: str) -> Response:
    if answer.raw_body is not None:  # a malformed answer, on purpose (fault "corrupt-answer")
        return Response(answer.raw_body, status_code=answer.status, media_type="application/json")
    if answer.ok:
        headers = {REPLAY_HEADER: "true"} if answer.replay else None
        return JSONResponse(answer.body, status_code=answer.status, headers=headers)
    body = {**answer.body, "instance": instance}
    return JSONResponse(body, status_code=answer.status, media_type=PROBLEM_JSON)


class _Holder:
    """The current world and the lock every access to it takes."""

    def __init__(self, factory: Callable[[], World]) -> None:
        self.factory = factory
        self.lock = threading.Lock()
        self.world = factory()


def _register_problem_handlers(app: FastAPI) -> None:
    @app.exception_handler(SimProblem)
    async def on_problem(request: Request, exc: SimProblem) -> JSONResponse:
        return _problem_response(exc.kind, exc.detail, request.url.path, **exc.extensions)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in exc.errors()
        )
        return _problem_response("invalid-request", detail or "invalid request", request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        return _problem_response(kind, str(exc.detail), request.url.path, status=exc.status_code)


def _validation_detail(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in error['loc']) or 'body'}: {error['msg']}" for error in exc.errors()
    )


def create_app(world_factory: Callable[[], World] | None = None, *, time_scale: float = 0.0) -> FastAPI:
    """The environment app. ``world_factory`` builds the world (again on ``POST /reset``); by
    default a ``World(time_scale)``, whose answers are delayed by their nominal durations times
    ``time_scale`` (0: no delay)."""
    holder = _Holder(world_factory or (lambda: World(time_scale=time_scale)))
    app = FastAPI(title="Tenure simulated environment", version="1")
    app.state.sim = holder
    _register_problem_handlers(app)
    install_http_metrics(app)  # GET /metrics: requests by route and status, the process collector

    @app.post("/effects")
    async def post_effect(
        request: Request,
        body: Annotated[Any, Body()] = None,
        idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
        work_id: Annotated[str | None, Header(alias="X-Work-Id")] = None,
        fencing_epoch: Annotated[str | None, Header(alias="X-Fencing-Epoch")] = None,
    ) -> Response:
        key = _identifier(idempotency_key, "Idempotency-Key", "idempotency-key-required")
        work = _identifier(work_id, "X-Work-Id", "work-id-required")
        epoch = _epoch(fencing_epoch)
        operation, payload = _effect_body(body)
        with holder.lock:
            answer = holder.world.perform(work, epoch, key, operation, payload)
        if answer.delay_s > 0:
            # Outside the lock: a probe arriving meanwhile already sees a committed effect, which
            # is exactly the "timeout after commit" case reconcile-before-retry exists for.
            await asyncio.sleep(answer.delay_s)
        return _render(answer, request.url.path)

    @app.get("/effects/{key:path}")
    async def probe_effect(key: str) -> JSONResponse:
        with holder.lock:
            stored = holder.world.probe(key)
        if stored is None:
            raise SimProblem(
                "effect-not-found",
                f"no effect answered success under Idempotency-Key {key!r}",
                idempotencyKey=key,
            )
        return JSONResponse(stored)

    @app.post("/faults", status_code=201)
    async def arm_fault(body: Annotated[Any, Body()] = None) -> dict[str, Any]:
        try:
            spec = FaultSpec.model_validate(body)
        except ValidationError as exc:
            raise SimProblem("invalid-fault", _validation_detail(exc)) from exc
        with holder.lock:
            return holder.world.arm(spec.to_fault()).to_json()

    @app.get("/faults")
    async def list_faults() -> dict[str, Any]:
        with holder.lock:
            return {"faults": holder.world.faults()}

    @app.delete("/faults")
    async def clear_faults() -> dict[str, Any]:
        with holder.lock:
            return {"cleared": holder.world.clear_faults()}

    @app.get("/audit")
    async def audit(work_id: Annotated[str | None, Query(alias="workId")] = None) -> dict[str, Any]:
        with holder.lock:
            return holder.world.audit(work_id)

    @app.post("/reset")
    async def reset() -> dict[str, Any]:
        fresh = holder.factory()
        with holder.lock:
            holder.world = fresh
        return {"reset": True}

    @app.post("/verifiers/{name}")
    async def run_verifier(name: str, body: Annotated[Any, Body()] = None) -> dict[str, Any]:
        try:
            verify_request = VerifyRequest.model_validate(body)
        except ValidationError as exc:
            raise SimProblem("invalid-request", _validation_detail(exc)) from exc
        try:
            with holder.lock:
                ok, detail = verify(name, holder.world, verify_request.payload, verify_request.work_id)
        except UnknownVerifier as exc:
            raise SimProblem("verifier-not-found", str(exc), verifier=name) from exc
        return {"verifier": name, "ok": ok, "detail": detail}

    @app.get("/problems/{kind}")
    async def describe_problem(kind: str) -> dict[str, Any]:
        known = PROBLEM_KINDS.get(kind) or APP_PROBLEMS.get(kind)
        if known is None:
            raise SimProblem("problem-type-not-found", f"the environment defines no problem type {kind!r}")
        return {"type": f"/problems/{kind}", "status": known[0], "title": known[1]}

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        with holder.lock:
            return {"status": "ok", "timeScale": holder.world.time_scale}

    app.add_middleware(TracingMiddleware)  # a tool call continues the effect's trace (issue 17)
    return app
