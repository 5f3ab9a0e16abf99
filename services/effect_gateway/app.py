"""HTTP front of the effect gateway: POST /effects and /verify, authenticated like the command API.

Every write authenticates the caller (`Authorization: Bearer <key>`, keys from TENURE_API_KEYS)
and the gateway checks that the caller holds the lease it acts under, or has the `service` role
(the saga orchestrator acting for a trajectory): knowing a run id, an attempt id and an epoch is
not enough (LEASE-1, LEASE-3). A refused request records nothing. Errors are RFC 9457
problem+json from the gateway's catalog (`/problems/{slug}` says what each means). Before an
effect is recorded, its tool's circuit breaker and bulkhead may refuse it (`circuit-open`,
`bulkhead-full`: services/effect_gateway/protection.py); GET /breakers and GET /bulkheads show
them as this instance sees them.

Input is bounded to what the log can carry: integers fit an Avro `long`, ids are short visible
ASCII (the idempotency key also travels in an HTTP header), and the body passes the shared
HttpGuard (bounded, one UTF-8 JSON document, no duplicate keys, lone surrogates or NaN).
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Annotated, Any, AsyncIterator, Callable

from fastapi import Depends, FastAPI, Path, Request
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from services.common.auth import Principal, authenticate, parse_api_keys, warn_if_development_mode
from services.common.http_guard import HttpGuard
from services.common.http_metrics import install_http_metrics
from services.common.ids import ACTION_HASH_PATTERN, is_attempt_id, is_run_id
from services.common.problem_json import Problem, ProblemCatalog, ProblemType, install_problem_handlers
from services.common.settings import TenureSettings
from services.common.tracing import TracingMiddleware
from services.effect_gateway.service import EffectRefused, EffectRequest, Gateway

__all__ = ["CATALOG", "GATEWAY_PROBLEMS", "MAX_EPOCH", "EffectBody", "VerifyBody", "create_app"]

MAX_EPOCH = 2**63 - 1  # Avro `long`
MAX_ID_LENGTH = 200

GATEWAY_PROBLEMS: tuple[ProblemType, ...] = (
    ProblemType(
        "stale-epoch",
        "The epoch is stale",
        409,
        "A newer lease rules the run (`currentEpoch`); the caller was fenced out and nothing was "
        "sent. Stop producing effects under this lease.",
    ),
    ProblemType(
        "fenced-by-recipient",
        "The recipient refused the epoch",
        409,
        "The tool itself has seen a newer epoch for this work and refused the effect (LEASE-3); "
        "the outcome is recorded as failed.",
    ),
    ProblemType("run-not-found", "No such run", 404, "The gateway's log has no run with this id."),
    ProblemType(
        "unknown-attempt",
        "No such attempt",
        409,
        "The attempt and epoch were never issued for this run; nothing was recorded.",
    ),
    ProblemType(
        "not-lease-holder",
        "You do not hold this lease",
        403,
        "Only the principal that claimed the lease (or the holder a takeover named), or a "
        "principal with the service role, may act under it (LEASE-1); nothing was recorded.",
    ),
    ProblemType(
        "lease-expired", "The lease expired", 409, "The coordinator refused the intent: the lease expired."
    ),
    ProblemType(
        "lease-revoked",
        "The lease was revoked",
        409,
        "The coordinator refused the intent: a takeover revoked it.",
    ),
    ProblemType(
        "lease-released",
        "The lease was released",
        409,
        "The coordinator refused the intent: the holder reported and released the lease.",
    ),
    ProblemType(
        "intent-refused",
        "The coordinator refused the intent",
        409,
        "The lease coordinator did not record the intent; `code` says why. Nothing was sent.",
    ),
    ProblemType(
        "action-tombstoned",
        "The action is tombstoned for this run",
        409,
        "The semantic watchdog tombstoned this action for the run (WD-5 level 2, ACTION_TOMBSTONED): "
        "the run kept looping through it. The gateway refuses any effect named by it (`actionHash`: "
        "the hash given, or that of operation or tool/operation with the payload); nothing was "
        "recorded or sent.",
    ),
    ProblemType(
        "run-quarantined",
        "The run is quarantined",
        409,
        "The run was quarantined (QUA-1: an operator, a verifier, or an egress violation): every "
        "effect of it is refused with RUN_QUARANTINED, whatever the epoch; nothing was recorded or "
        "sent. Only an operator or an independent verifier can clear it.",
    ),
    ProblemType(
        "egress-not-allowed",
        "Egress to this host is not allowed",
        403,
        "The effect is aimed at a host (`host`) outside the tool's (TENURE_TOOL_EGRESS) or the run's "
        "(executionSpec.egressAllowlist) allowlist (`declaredBy`). It was refused before anything was "
        "recorded or dispatched, and the run's quarantine started from the same decision "
        "(`quarantineTriggered`).",
    ),
    ProblemType("unknown-tool", "No such tool", 422, "The gateway has no tool of this name (TENURE_TOOLS)."),
    ProblemType(
        "circuit-open",
        "The tool's circuit breaker is open",
        424,
        "The fleet-wide circuit breaker of the tool (`dependency`; one per tool of TENURE_TOOLS) "
        "fails calls fast: it opened on the tool's transport failures, is forced open by an "
        "operator, or is half-open with its one canary in flight elsewhere (BRK-2). This is the "
        "synthetic observation ERR_CIRCUIT_OPEN (`code`, `observation`): nothing was recorded or "
        "sent. Retry after `retryAfterMs` (the cooldown remaining; `Retry-After` in seconds) with "
        "full jitter on top; keep the idempotency key when `pendingIntent` is true (an earlier "
        "try under it is recorded and unsettled). 424 (Failed Dependency), not 503: the gateway "
        "works, the tool it depends on does not.",
    ),
    ProblemType(
        "bulkhead-full",
        "External tool queue saturated; defer execution",
        429,
        "The tool's bulkhead (its domain's pool, or its own: `pool`, `domain`) runs as many calls "
        "as it may and its bounded queue is full, or the call waited longer than the pool's "
        "timeout for a slot (BRK-4, ERR_BULKHEAD_FULL). Nothing was recorded or sent; defer and "
        "retry with full-jitter backoff. Other domains' pools are not affected.",
    ),
    ProblemType(
        "tool-failed",
        "The tool refused the effect",
        502,
        "The tool answered with an error and the probe shows nothing happened: a definite failure "
        "(`toolStatus`, `toolResponse`).",
    ),
    ProblemType(
        "outcome-unknown",
        "The outcome is unknown",
        504,
        "No usable answer from the tool and the probe found nothing (or the tool's circuit "
        "breaker opened, so it was not probed): retry with the same idempotency key; the gateway "
        "reconciles before any re-dispatch (REC-6).",
    ),
    ProblemType(
        "not-ready",
        "The gateway is not ready",
        503,
        "GET /readyz: it has not read runs.events to the end yet, or Kafka, its publisher or its "
        "decision listener is not working (`notReady` names the checks, `checks` says why); poll "
        "again after `Retry-After` seconds. /healthz (liveness) answers 200 meanwhile.",
    ),
    ProblemType(
        "unavailable",
        "The gateway cannot record effects right now",
        503,
        "It is still reading the lease log, or Kafka did not confirm the intent; nothing was sent. "
        "Retry after `Retry-After` seconds.",
    ),
)
CATALOG = ProblemCatalog(GATEWAY_PROBLEMS)


# --- input bounds ---------------------------------------------------------------------------------
# The bytes are checked before any of this by HttpGuard (services/common/http_guard.py): bounded
# body (413), one UTF-8 JSON document with no duplicate keys, lone surrogates, NaN or excessive
# nesting (400). The fields below are bounded to what the log and the tool requests can carry.


def _run_id(value: str) -> str:
    if not is_run_id(value):
        raise ValueError("is not a run id (run_ followed by 32 hex digits)")
    return value


def _attempt_id(value: str) -> str:
    if not is_attempt_id(value):
        raise ValueError("is not an attempt id (att_<32 hex digits>_<epoch>)")
    return value


def _visible_ascii(value: str) -> str:
    """Names: visible ASCII only, so no NUL, control character, space or lone surrogate."""
    if not all("!" <= c <= "~" for c in value):
        raise ValueError("must be visible ASCII (no spaces, control characters or non-ASCII text)")
    return value


def _header_text(value: str) -> str:
    """The idempotency key travels in an HTTP header and a URL: printable ASCII, not padded."""
    if not all(" " <= c <= "~" for c in value) or value != value.strip():
        raise ValueError("must be printable ASCII without leading or trailing spaces")
    return value


def _clean(value: str) -> str:
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or 0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise ValueError("must not contain control characters or lone surrogates")
    return value


RunId = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH), AfterValidator(_run_id)]
AttemptId = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH), AfterValidator(_attempt_id)]
Name = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH), AfterValidator(_visible_ascii)]
Key = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH), AfterValidator(_header_text)]
Text = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH), AfterValidator(_clean)]


class EffectBody(BaseModel):
    # strict: "5" and true are not integers
    model_config = ConfigDict(extra="forbid", strict=True)

    runId: RunId
    attemptId: AttemptId
    epoch: int = Field(ge=1, le=MAX_EPOCH, description="The lease's fencing epoch (an Avro long).")
    idempotencyKey: Key = Field(description="Printable ASCII: it is sent as the Idempotency-Key header.")
    tool: Name
    operation: Text
    payload: dict[str, Any] = Field(default_factory=dict)
    actionHash: str | None = Field(
        default=None,
        pattern=ACTION_HASH_PATTERN,
        description="The action this effect is (services.common.ids.action_hash, WD-4), if the caller "
        "names it; a tombstoned one is refused (ACTION_TOMBSTONED).",
    )


class VerifyBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    runId: RunId
    tool: Name
    verifier: Text
    payload: dict[str, Any] = Field(default_factory=dict)


# --- the application ----------------------------------------------------------------------------


async def _caller(request: Request) -> Principal | None:
    """The authenticated caller, None in development mode; AuthError (401) otherwise.

    A dependency, so it runs before the body is validated: a caller without a key learns
    nothing, not even which of its fields are wrong. A coroutine, so that it runs on the event
    loop and not in FastAPI's thread pool (tests/unit/test_no_thread_hop_per_request.py)."""
    keys: dict[str, Principal] = request.app.state.api_keys
    if not keys:
        return None
    return authenticate(request.headers.get("authorization"), keys)


Caller = Annotated[Principal | None, Depends(_caller)]


def create_app(
    open_gateway: Callable[[], Gateway],
    *,
    api_keys: dict[str, Principal] | None = None,
    max_body_bytes: int | None = None,
) -> FastAPI:
    """`api_keys` None: TENURE_API_KEYS; empty: development mode (nothing is authenticated)."""
    settings = TenureSettings()
    keys = parse_api_keys(settings.api_keys) if api_keys is None else api_keys
    development_mode = not keys
    holder: dict[str, Gateway] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        warn_if_development_mode(keys, "tenure-effect-gateway")
        holder["gw"] = await asyncio.to_thread(open_gateway)
        try:
            yield
        finally:
            await holder["gw"].close()

    app = FastAPI(
        title="Tenure effect gateway",
        version="0.1.0",
        lifespan=lifespan,
        description="Fenced, journaled, reconciled external effects. Errors are RFC 9457 problem+json.",
    )
    app.state.api_keys = keys
    install_problem_handlers(app, CATALOG)
    app.add_middleware(HttpGuard, catalog=CATALOG, max_body_bytes=max_body_bytes or settings.max_body_bytes)
    install_http_metrics(app)  # outside the guard, so its refusals are counted too; GET /metrics
    # Outermost: every request is a span continuing its caller's traceparent (issue 17).
    app.add_middleware(TracingMiddleware)

    def gateway() -> Gateway:
        gw = holder.get("gw")
        if gw is None:
            raise EffectRefused("unavailable", "the gateway is starting")
        return gw

    @app.post("/effects", summary="Perform an external effect under a lease")
    async def perform(body: EffectBody, who: Caller) -> Any:
        result = await gateway().perform(
            EffectRequest(
                body.runId,
                body.attemptId,
                body.epoch,
                body.idempotencyKey,
                body.tool,
                body.operation,
                body.payload,
                body.actionHash or "",
            ),
            who,
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
    async def fencing(run_id: Annotated[str, Path(max_length=MAX_ID_LENGTH)], who: Caller) -> Any:
        # Reads are authenticated too when keys are set (any role may read a run's epoch).
        view = gateway().view(run_id)
        if view is None:
            raise EffectRefused("run-not-found", f"run {run_id} does not exist", runId=run_id)
        return {
            "runId": run_id,
            "epoch": view.epoch,
            "attemptId": view.attempt_id,
            "leaseHeld": view.lease_held,
            "version": view.version,
        }

    @app.post("/verify", summary="Run a tool's deterministic verifier (pre-pivot gate, SAGA-6)")
    async def verify(body: VerifyBody, who: Caller) -> Any:
        answer = await gateway().verify(body.tool, body.verifier, body.runId, body.payload, who)
        return {"status": answer.status, "result": answer.body}

    @app.get("/breakers", summary="The tools' circuit breakers as this gateway instance follows them")
    async def breakers(who: Caller) -> Any:
        gw = gateway()
        return gw.protection.snapshot(gw.tool_names())

    @app.get("/bulkheads", summary="This gateway instance's bulkhead pools (BRK-4)")
    async def bulkheads(who: Caller) -> Any:
        gw = gateway()
        protection = gw.protection
        return {
            "pools": protection.bulkheads.snapshot(),
            "tools": {tool: protection.bulkheads.pool_for(tool).name for tool in gw.tool_names()},
            "connectionLimit": protection.bulkheads.connection_limit(),
        }

    @app.get("/healthz", summary="Liveness: the process answers")
    async def healthz() -> Any:
        gw = holder.get("gw")
        return {
            "status": "ok",
            "developmentMode": development_mode,
            "caughtUp": gw is not None and gw.ready,
        }

    @app.get("/readyz", summary="Readiness: caught up with runs.events, Kafka publisher and listener up")
    async def readyz() -> Any:
        gw = holder.get("gw")
        if gw is None:
            checks = {"started": {"ok": False, "detail": "the gateway is starting"}}
        else:
            checks = await asyncio.to_thread(gw.readiness)
        failing = sorted(name for name, check in checks.items() if not check["ok"])
        if failing:
            detail = "; ".join(f"{name}: {checks[name]['detail']}" for name in failing)
            raise Problem("not-ready", detail, checks=checks, notReady=failing)
        return {"status": "ready", "checks": checks, "developmentMode": development_mode}

    return app
