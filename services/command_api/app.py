"""FastAPI application: translates HTTP into Run commands and serves Run views.

A command is published to runs.commands and the request waits (bounded by
TENURE_DECISION_TIMEOUT_S) for its decision: the Run view showing the command's event (201/200)
or a rejection (409 and friends). If neither arrives in time the answer is 202 with the command
id and a Location to poll; the command is durable on Kafka and will still be decided.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Header, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from services.command_api.auth import Principal, load_api_keys, principal_of
from services.command_api.decisions import Decided, DecisionListener, Rejected
from services.command_api.models import (
    STATUS_VALUES,
    CancelRequest,
    PendingCommand,
    RunPage,
    SubmitRunRequest,
)
from services.command_api.problems import (
    PROBLEM_TYPES,
    REJECTION_PROBLEMS,
    ApiProblem,
    problem_response,
    register_problem_handlers,
)
from services.common.clock import Clock, SystemClock
from services.common.contracts import CancelRun, SubmitRun
from services.common.ids import canonical_json, command_id_for, run_id_for, sha256_digest
from services.common.kafka import CommandPublisher
from services.common.messages import MessageCodec
from services.common.store import RocksStore
from services.common.topics import RUNS_COMMANDS
from services.projections.store import BadCursor, RunViewStore

__all__ = ["ApiDependencies", "create_app", "open_dependencies"]


class _ViewReader:
    """Opens the projector's RocksDB as a read-only secondary, once it exists."""

    # Catching up with the primary costs a few file reads; many waiting requests share one.
    _REFRESH_EVERY_S = 0.002

    def __init__(self, path: Path, codec: MessageCodec) -> None:
        self._path = path
        self._codec = codec
        self._views: RunViewStore | None = None
        self._lock = threading.Lock()
        self._refreshed_at = 0.0

    def _store(self) -> RunViewStore:
        if self._views is None:
            if not (self._path / "CURRENT").exists():
                raise ApiProblem("unavailable", "the run views are not built yet; is projections running?")
            self._views = RunViewStore(RocksStore(self._path, secondary=True), self._codec)
        return self._views

    def _fresh_store(self) -> RunViewStore:
        store = self._store()
        with self._lock:
            now = time.monotonic()
            if now - self._refreshed_at >= self._REFRESH_EVERY_S:
                store.refresh()
                self._refreshed_at = now
        return store

    def get(self, run_id: str) -> dict[str, Any] | None:
        return self._fresh_store().get(run_id)

    def list(self, status: str | None, limit: int, cursor: str | None) -> Any:
        return self._fresh_store().list(status, limit, cursor)

    async def wait_for_version(self, run_id: str, version: int, timeout_s: float) -> dict[str, Any] | None:
        """The run's view once the projection has applied `version`, or None on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            view = await asyncio.to_thread(self.get, run_id)
            if view is not None and int(view["version"]) >= version:
                return view
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(self._REFRESH_EVERY_S)


@dataclass
class ApiDependencies:
    publisher: CommandPublisher
    decisions: DecisionListener
    views: _ViewReader
    codec: MessageCodec
    clock: Clock
    api_keys: dict[str, Principal]
    decision_timeout_s: float

    def close(self) -> None:
        self.decisions.close()
        self.publisher.close()


def open_dependencies(bootstrap_servers: str, views_path: Path, decision_timeout_s: float) -> ApiDependencies:
    codec = MessageCodec()
    return ApiDependencies(
        publisher=CommandPublisher(bootstrap_servers, client_id="tenure-command-api"),
        decisions=DecisionListener(bootstrap_servers, codec),
        views=_ViewReader(views_path, codec),
        codec=codec,
        clock=SystemClock(),
        api_keys=load_api_keys(),
        decision_timeout_s=decision_timeout_s,
    )


def create_app(open_deps: Callable[[], ApiDependencies]) -> FastAPI:
    metrics = CollectorRegistry()
    commands_total = Counter(
        "tenure_api_commands_total",
        "Commands published, by type and outcome.",
        ["command", "outcome"],
        registry=metrics,
    )
    decision_seconds = Histogram(
        "tenure_api_decision_seconds",
        "Time from publishing a command to its decision.",
        ["command"],
        registry=metrics,
        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    )
    state: dict[str, ApiDependencies] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state["deps"] = await asyncio.to_thread(open_deps)
        try:
            yield
        finally:
            await asyncio.to_thread(state["deps"].close)

    app = FastAPI(
        title="Tenure command API",
        version="0.1.0",
        description="Submit, cancel and inspect agent runs. Errors are RFC 9457 problem+json.",
        lifespan=lifespan,
    )
    register_problem_handlers(app)

    def deps() -> ApiDependencies:
        return state["deps"]

    async def publish_and_wait(command: SubmitRun | CancelRun) -> dict[str, Any] | Rejected | PendingCommand:
        """Publish, then wait (bounded) for the decision and for the view that shows it."""
        d = deps()
        record = d.codec.outbound(RUNS_COMMANDS.name, command.run_id, command)
        kind = type(command).__name__
        loop = asyncio.get_running_loop()
        started = loop.time()
        decision = d.decisions.register(command.command_id)
        try:
            await asyncio.wrap_future(d.publisher.publish(record))
        except Exception as exc:
            d.decisions.forget(command.command_id, decision)
            raise ApiProblem("unavailable", f"could not publish the command to Kafka: {exc}") from exc
        try:
            outcome = await asyncio.wait_for(decision, d.decision_timeout_s)
        except TimeoutError:
            d.decisions.forget(command.command_id, decision)
            outcome = None
        view = None
        if isinstance(outcome, Decided):
            remaining = max(0.0, d.decision_timeout_s - (loop.time() - started))
            view = await d.views.wait_for_version(command.run_id, outcome.event.version, remaining)
        decision_seconds.labels(kind).observe(loop.time() - started)
        if isinstance(outcome, Rejected):
            commands_total.labels(kind, "rejected").inc()
            return outcome
        if view is not None:
            commands_total.labels(kind, "accepted").inc()
            return view
        commands_total.labels(kind, "pending").inc()
        return PendingCommand(
            runId=command.run_id,
            commandId=command.command_id,
            detail=f"no decision within {d.decision_timeout_s}s; the command is durable, poll the run",
        )

    def rejection_problem(rejected: Rejected, path: str) -> JSONResponse:
        r = rejected.rejection
        slug = REJECTION_PROBLEMS.get(r.code, "command-rejected")
        return problem_response(
            slug,
            r.detail,
            path,
            code=r.code,
            runId=r.run_id,
            currentStatus=r.current_status,
            commandId=r.causation_id,
        )

    def pending_response(pending: PendingCommand) -> JSONResponse:
        return JSONResponse(
            pending.model_dump(), status_code=202, headers={"Location": f"/runs/{pending.runId}"}
        )

    @app.post("/runs", status_code=201, summary="Submit a run (idempotent by Idempotency-Key)")
    async def submit_run(
        body: SubmitRunRequest,
        request: Request,
        response: Response,
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        who = principal_of(request, deps().api_keys)
        if not idempotency_key:
            raise ApiProblem("idempotency-key-required", "send an Idempotency-Key header (e.g. a UUID)")
        run_id = run_id_for(body.tenant, idempotency_key)
        existing = await asyncio.to_thread(deps().views.get, run_id)
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
            command_id=command_id_for(run_id, "SubmitRun", idempotency_key),
            run_id=run_id,
            issued_at=deps().clock.now_ms(),
            correlation_id=request.headers.get("x-correlation-id") or run_id,
            actor=who.name,
            tenant=body.tenant,
            idempotency_key=idempotency_key,
            execution_spec=canonical_json(body.executionSpec),
            retry_safe=body.retrySafe,
            timeout_seconds=body.timeoutSeconds,
            max_attempts=body.maxAttempts,
        )
        outcome = await publish_and_wait(command)
        if isinstance(outcome, Rejected):
            return rejection_problem(outcome, request.url.path)
        if isinstance(outcome, PendingCommand):
            return pending_response(outcome)
        response.headers["Location"] = f"/runs/{run_id}"
        return outcome

    @app.post("/runs/{run_id}/cancel", summary="Cancel a run")
    async def cancel_run(
        run_id: str,
        request: Request,
        body: CancelRequest | None = None,
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        who = principal_of(request, deps().api_keys)
        current = await asyncio.to_thread(deps().views.get, run_id)
        if current is None:
            raise ApiProblem("run-not-found", f"run {run_id} does not exist", runId=run_id)
        command_id = command_id_for(run_id, "CancelRun", idempotency_key or uuid.uuid4().hex)
        if any(entry.get("causationId") == command_id for entry in current["history"]):
            return current  # this very cancel was already applied: answer it again
        command = CancelRun(
            command_id=command_id,
            run_id=run_id,
            issued_at=deps().clock.now_ms(),
            correlation_id=request.headers.get("x-correlation-id") or run_id,
            actor=who.name,
            reason=(body.reason if body else ""),
        )
        outcome = await publish_and_wait(command)
        if isinstance(outcome, Rejected):
            return rejection_problem(outcome, request.url.path)
        if isinstance(outcome, PendingCommand):
            return pending_response(outcome)
        return outcome

    @app.get("/runs/{run_id}", summary="The Run view")
    async def get_run(run_id: str, request: Request) -> Any:
        principal_of(request, deps().api_keys)
        view = await asyncio.to_thread(deps().views.get, run_id)
        if view is None:
            raise ApiProblem("run-not-found", f"run {run_id} does not exist", runId=run_id)
        return view

    @app.get("/runs", response_model=RunPage, summary="List runs, newest submissions last")
    async def list_runs(
        request: Request,
        status: str | None = Query(default=None, description=f"One of {', '.join(STATUS_VALUES)}"),
        limit: int = Query(default=50, ge=1, le=500),
        cursor: str | None = Query(default=None),
    ) -> Any:
        principal_of(request, deps().api_keys)
        if status is not None and status not in STATUS_VALUES:
            raise ApiProblem(
                "validation-failed", f"status must be one of {', '.join(STATUS_VALUES)}, not {status!r}"
            )
        try:
            page = await asyncio.to_thread(deps().views.list, status, limit, cursor)
        except BadCursor as exc:
            raise ApiProblem("invalid-cursor", str(exc)) from exc
        return RunPage(items=page.items, nextCursor=page.next_cursor)

    @app.get("/healthz", summary="Liveness and readiness")
    async def healthz() -> Any:
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> Response:
        return PlainTextResponse(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    @app.get("/problems/{slug}", summary="What a problem type means")
    async def describe_problem(slug: str) -> Any:
        problem = PROBLEM_TYPES.get(slug)
        if problem is None:
            raise ApiProblem("not-found", f"no problem type {slug!r}")
        return {
            "type": f"/problems/{slug}",
            "title": problem.title,
            "status": problem.status,
            "meaning": problem.meaning,
        }

    return app
