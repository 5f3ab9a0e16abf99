"""FastAPI application: translates HTTP into Run commands and serves Run views.

A command is published to runs.commands and the request waits (bounded by
TENURE_DECISION_TIMEOUT_S) for its decision: the event it caused (and, for most routes, the Run
view showing it) or a rejection (409 and friends). If neither arrives in time the answer is 202
with the command id and a Location to poll; the command is durable on Kafka and will still be
decided.

Hostile input never reaches a route's logic: the HTTP guard (services.common.http_guard)
refuses bodies that are too large or not acceptable JSON, the body models (models.py) refuse
loose types and out-of-range values, and `well_formed_path_ids` refuses path ids that Tenure
cannot have issued, before authentication and before anything is read or published.
"""

from __future__ import annotations

import asyncio
import re
from contextlib import asynccontextmanager
from importlib.metadata import version
from typing import AsyncIterator, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from services.command_api.console import console_router
from services.command_api.context import RETRY_AFTER_S, ApiContext, ApiDependencies, open_dependencies
from services.command_api.openapi_doc import install_openapi, operation_id
from services.command_api.problems import CATALOG, ApiProblem, register_problem_handlers
from services.command_api.routes_admin import admin_router
from services.command_api.routes_artifacts import artifacts_router
from services.command_api.routes_breakers import breakers_router
from services.command_api.routes_leases import leases_router
from services.command_api.routes_lock import lock_router
from services.command_api.routes_quarantine import quarantine_router
from services.command_api.routes_queues import queues_router
from services.command_api.routes_runs import runs_router
from services.command_api.routes_schedules import schedules_router
from services.command_api.routes_trajectories import trajectories_router
from services.command_api.routes_watchdog import watchdog_router
from services.command_api.routes_work import work_router
from services.command_api.view_times import Rfc3339Siblings
from services.common.avro import SchemaRegistryError
from services.common.contracts.breakers import ENDPOINT_ID_PATTERN
from services.common.http_guard import MAX_JSON_DEPTH, HttpGuard
from services.common.http_metrics import install_http_metrics
from services.common.ids import is_attempt_id, is_grant_id, is_incident_id, is_run_id
from services.common.objectstore import ObjectStoreUnavailable
from services.common.routing import RecordTooLarge
from services.common.settings import TenureSettings
from services.common.tracing import TracingMiddleware

__all__ = [
    "API_VERSION",
    "PUBLIC_PATHS",
    "REFUSALS",
    "ApiDependencies",
    "create_app",
    "open_dependencies",
    "well_formed_path_ids",
]

# One version: the package's own (pyproject.toml), never a second literal here.
API_VERSION = version("tenure")
# Upload bodies are artifact bytes, streamed and bounded by their grant (routes_work.upload).
RAW_BODY_PREFIXES = ("/uploads/",)
MAX_PATH_PARAM = 200
_ENDPOINT = re.compile(ENDPOINT_ID_PATTERN)
# What anyone may read without a key: liveness, readiness, metrics and what a problem type means.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/problems/{slug}"})

REFUSALS = f"""

**What the API refuses** (nothing is recorded for any of these):

* a body larger than TENURE_MAX_BODY_BYTES (default 1 MiB), by Content-Length or counted:
  413 `payload-too-large`;
* a body that is not one UTF-8 JSON document, has a duplicate key in any object, a lone
  surrogate escape (\\ud800-\\udfff), NaN or Infinity, or nests deeper than {MAX_JSON_DEPTH}
  levels: 400 `malformed-request`;
* an `Idempotency-Key` or `X-Correlation-Id` longer than 200 characters or with characters other
  than printable ASCII: 422 `validation-failed`;
* a value of the wrong JSON type (`"5"` or `true` for an integer, `1` for a boolean), an
  integer outside what its Avro field carries (epochs and sequences: 1..2^63-1), an unknown
  member, or a control character (U+0000-U+001F, U+007F) in an identifier or name (free text
  may hold tab, line feed and carriage return): 422 `validation-failed`;
* a path id that Tenure cannot have issued: 404 `run-not-found` / `grant-not-found` /
  `breaker-not-found` / `not-found`, or 409 `unknown-attempt` for an attempt id.
"""


async def well_formed_path_ids(request: Request) -> None:
    """Refuse a path id of the wrong shape as "no such resource", before anything else runs.

    Every route's ids are checked here, by parameter name, so a new route cannot forget it and
    a malformed id never reaches routing (services.common.routing) or a codec. A coroutine
    though it awaits nothing: FastAPI runs a plain `def` dependency in its thread pool, a hop
    that cost ~130 µs of CPU on every request (tests/unit/test_no_thread_hop_per_request.py)."""
    params = request.path_params
    run_id = params.get("run_id")
    if run_id is not None and not is_run_id(run_id):
        raise ApiProblem("run-not-found", f"{str(run_id)[:80]!r} is not a run id")
    attempt_id = params.get("attempt_id")
    if attempt_id is not None and not is_attempt_id(attempt_id):
        raise ApiProblem(
            "unknown-attempt", f"{str(attempt_id)[:80]!r} is not an attempt id this coordinator issued"
        )
    grant_id = params.get("grant_id")
    if grant_id is not None and not is_grant_id(grant_id):
        raise ApiProblem("grant-not-found", f"{str(grant_id)[:80]!r} is not an upload grant")
    endpoint = params.get("endpoint")
    if endpoint is not None and not _ENDPOINT.fullmatch(endpoint):
        raise ApiProblem("breaker-not-found", f"{str(endpoint)[:80]!r} is not a tool endpoint id")
    incident_id = params.get("incident_id")
    if incident_id is not None and not is_incident_id(incident_id):
        raise ApiProblem("not-found", f"{str(incident_id)[:80]!r} is not an incident id")
    for name, value in params.items():  # the rest (block subjects, problem slugs): names
        if isinstance(value, str) and (
            len(value) > MAX_PATH_PARAM or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)
        ):
            raise ApiProblem(
                "not-found",
                f"path parameter {name}: at most {MAX_PATH_PARAM} characters, no control character",
            )


def create_app(open_deps: Callable[[], ApiDependencies], *, max_body_bytes: int | None = None) -> FastAPI:
    ctx = ApiContext()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        ctx.open(await asyncio.to_thread(open_deps))
        try:
            yield
        finally:
            await asyncio.to_thread(ctx.close)

    app = FastAPI(
        title="Tenure command API",
        version=API_VERSION,
        description="Submit, claim, renew, report, take over and inspect agent runs; drive a "
        "run's trajectory (saga) step by step and resolve its incidents; report a runner's own steps "
        "to the semantic watchdog and see its interventions; see the tool endpoints' circuit breakers "
        "and bulkheads, and override a breaker (operators). "
        "Errors are RFC 9457 problem+json; an unexpected failure is a 500 problem, never a page." + REFUSALS,
        lifespan=lifespan,
        dependencies=[Depends(well_formed_path_ids)],
        generate_unique_id_function=operation_id,
    )
    register_problem_handlers(app)

    @app.exception_handler(RecordTooLarge)
    async def on_record_too_large(request: Request, exc: RecordTooLarge) -> JSONResponse:
        # A body under the HTTP limit can still make a command Kafka refuses (routing checks
        # before publishing): the client's to shrink, not an outage to retry.
        return CATALOG.response("payload-too-large", f"{exc}; nothing was recorded", request.url.path)

    # The artifact store (S3) down or refusing, or, with TENURE_WIRE_FORMAT=confluent, the schema
    # registry unable to give a schema's id (nothing was published: it never falls back to another
    # format): an outage to retry, never a 500.
    async def on_outage(request: Request, exc: Exception) -> JSONResponse:
        return CATALOG.response(
            "unavailable",
            f"{exc}; nothing was recorded, retry after Retry-After seconds",
            request.url.path,
            headers={"Retry-After": str(RETRY_AFTER_S)},
            retryAfterSeconds=RETRY_AFTER_S,
        )

    app.add_exception_handler(ObjectStoreUnavailable, on_outage)
    app.add_exception_handler(SchemaRegistryError, on_outage)

    app.include_router(runs_router(ctx))
    app.include_router(leases_router(ctx))
    app.include_router(work_router(ctx))
    app.include_router(trajectories_router(ctx))
    app.include_router(watchdog_router(ctx))
    app.include_router(admin_router(ctx))
    app.include_router(breakers_router(ctx))
    app.include_router(schedules_router(ctx))
    app.include_router(quarantine_router(ctx))
    app.include_router(artifacts_router(ctx))
    app.include_router(queues_router(ctx))  # claim-next, POST /queues/{queue}/claim (issue 17)
    app.include_router(console_router(ctx))  # the web console at /ui (issue 17)
    app.include_router(lock_router(ctx))  # a run's lock for local mode (EXE-16)
    install_openapi(app, CATALOG, PUBLIC_PATHS)
    # Innermost: every JSON view leaves with `<x>AtRfc3339` beside its epoch-ms `<x>At` (issue 17).
    app.add_middleware(Rfc3339Siblings)
    app.add_middleware(
        HttpGuard,
        catalog=CATALOG,
        max_body_bytes=max_body_bytes if max_body_bytes is not None else TenureSettings().max_body_bytes,
        raw_body_prefixes=RAW_BODY_PREFIXES,
    )
    install_http_metrics(app, ctx.metrics, serve=False)  # outside the guard; /metrics is routes_runs'
    # Outermost: every request is a span continuing its caller's traceparent, current while the
    # route publishes its command (whose record carries it on; issue 17).
    app.add_middleware(TracingMiddleware)
    return app
