"""HTTP face of the fenced ledger (FastAPI). The decisions live in ``ledger``, the state in ``store``.

Contract (every error is RFC 9457 ``application/problem+json`` whose ``type`` is
``/problems/<slug>``, served by ``GET /problems/<slug>``):

- ``POST /effects`` with headers ``Idempotency-Key``, ``X-Work-Id``, ``X-Fencing-Epoch`` and body
  ``{"operation": "credit"|"debit"|"note", "payload": {...}}``: 201 applied (``Location:
  /effects/<key>``); 200 with ``Idempotent-Replay: true`` for a repeat of an applied request;
  409 ``stale-epoch`` / ``insufficient-funds`` / ``balance-overflow``; 422
  ``idempotency-key-conflict`` / ``invalid-effect``; 400 for a missing or malformed header.
- ``GET /effects/<key>``: 200 stored effect or 404 ``effect-not-found`` (reconcile before retry).
- ``GET /works/<workId>``, ``GET /accounts/<account>``, ``GET /healthz``.
- ``POST|GET|DELETE /faults`` exist only when fault injection is enabled (else 404).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Body, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.common.http_metrics import install_http_metrics
from services.common.tracing import TracingMiddleware
from services.fenced_ledger.ledger import (
    Apply,
    BalanceOverflow,
    EffectRequest,
    InsufficientFunds,
    InvalidEffectRequest,
    KeyConflict,
    Replay,
    StaleEpoch,
    build_effect_request,
)
from services.fenced_ledger.store import LedgerStore, StorageUnavailable

__all__ = ["PROBLEM_TYPES", "FaultPlan", "LedgerProblem", "create_app"]

PROBLEM_JSON = "application/problem+json"
REPLAY_HEADER = "Idempotent-Replay"
MAX_FAULT_DELAY_MS = 60_000
MAX_FAULT_TIMES = 1_000


@dataclass(frozen=True)
class ProblemType:
    title: str
    status: int
    meaning: str


PROBLEM_TYPES: dict[str, ProblemType] = {
    "idempotency-key-required": ProblemType(
        "Idempotency-Key header is missing or malformed",
        400,
        "Every effect needs a non-empty Idempotency-Key (at most 255 characters) so a retry is never "
        "applied twice.",
    ),
    "work-id-required": ProblemType(
        "X-Work-Id header is missing or malformed",
        400,
        "Every effect names the work (a Tenure run id) whose fencing epoch it carries.",
    ),
    "fencing-epoch-required": ProblemType(
        "X-Fencing-Epoch header is missing", 400, "Every effect carries the sender's fencing epoch."
    ),
    "fencing-epoch-invalid": ProblemType(
        "X-Fencing-Epoch is not a valid epoch", 400, "The epoch is a non-negative decimal integer below 2^63."
    ),
    "invalid-effect": ProblemType(
        "The effect request is not valid",
        422,
        "The body is {operation, payload}; credit/debit take {account: string, amount: 1..10^12}.",
    ),
    "idempotency-key-conflict": ProblemType(
        "Idempotency-Key reused for a different request",
        422,
        "The key already names an applied effect with another work id, operation or payload; "
        "`differences` lists which.",
    ),
    "stale-epoch": ProblemType(
        "Fencing epoch is stale",
        409,
        "A newer holder of this work already presented `highestEpoch`; the request came from a "
        "previous holder and nothing was changed.",
    ),
    "insufficient-funds": ProblemType(
        "Insufficient funds",
        409,
        "The debit would take the account below zero; nothing was applied.",
    ),
    "balance-overflow": ProblemType(
        "Balance would overflow", 409, "The credit would take the balance past 2^63-1; nothing was applied."
    ),
    "effect-not-found": ProblemType(
        "No effect under this idempotency key",
        404,
        "The effect never happened here: a caller reconciling before retry may send it again.",
    ),
    "work-not-found": ProblemType("Unknown work id", 404, "No effect for this work id was ever accepted."),
    "account-not-found": ProblemType("Unknown account", 404, "No effect ever touched this account."),
    "problem-type-not-found": ProblemType("Unknown problem type", 404, "The ledger defines no such problem."),
    "invalid-fault": ProblemType(
        "The fault plan is not valid",
        422,
        'Send {delayAfterCommitMs: 0..60000, times: 1..1000} or {failBeforeCommit: "503", times: 1..1000}.',
    ),
    "injected-fault": ProblemType(
        "Injected failure (test fault)", 503, "A test armed failBeforeCommit; the effect was NOT applied."
    ),
    "storage-unavailable": ProblemType(
        "Ledger storage unavailable", 503, "SQLite could not run the transaction; nothing was applied."
    ),
    "invalid-request": ProblemType(
        "The request is not valid", 422, "The body is not JSON or has the wrong shape."
    ),
    "not-found": ProblemType("No such resource", 404, "The path does not name a resource."),
    "method-not-allowed": ProblemType("Method not allowed", 405, "The path exists; the method does not."),
    "http-error": ProblemType("HTTP error", 400, "A generic HTTP error."),
}


class LedgerProblem(Exception):
    """Raised by handlers; rendered as problem+json with ``extensions`` merged into the body."""

    def __init__(self, slug: str, detail: str, **extensions: Any) -> None:
        super().__init__(detail)
        self.slug = slug
        self.detail = detail
        self.extensions = extensions


def problem_response(
    slug: str, detail: str, instance: str, *, status: int | None = None, **extensions: Any
) -> JSONResponse:
    problem = PROBLEM_TYPES[slug]
    body: dict[str, Any] = {
        "type": f"/problems/{slug}",
        "title": problem.title,
        "status": status or problem.status,
        "detail": detail,
        "instance": instance,
        **extensions,
    }
    return JSONResponse(body, status_code=body["status"], media_type=PROBLEM_JSON)


@dataclass(frozen=True)
class Fault:
    delay_after_commit_ms: int | None = None
    fail_before_commit: bool = False

    def to_json(self) -> dict[str, Any]:
        if self.fail_before_commit:
            return {"failBeforeCommit": "503"}
        return {"delayAfterCommitMs": self.delay_after_commit_ms}


class FaultPlan:
    """The faults armed for the next effect requests, consumed one per request, in order.

    A lock, because the effect handler runs on several worker threads at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fault: Fault | None = None
        self._remaining = 0

    def arm(self, fault: Fault, times: int) -> None:
        with self._lock:
            self._fault, self._remaining = fault, times

    def clear(self) -> None:
        with self._lock:
            self._fault, self._remaining = None, 0

    def take(self) -> Fault | None:
        with self._lock:
            if self._fault is None or self._remaining <= 0:
                return None
            fault = self._fault
            self._remaining -= 1
            if self._remaining == 0:
                self._fault = None
            return fault

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            armed = self._fault.to_json() if self._fault is not None else {}
            return {**armed, "remaining": self._remaining}


def _bounded_int(body: dict[str, Any], name: str, low: int, high: int) -> int:
    value = body.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise LedgerProblem("invalid-fault", f"{name} must be an integer from {low} to {high}, got {value!r}")
    return value


def parse_fault(body: Any) -> tuple[Fault, int]:
    if not isinstance(body, dict):
        raise LedgerProblem("invalid-fault", "the body must be a JSON object")
    kinds = {"delayAfterCommitMs", "failBeforeCommit"} & set(body)
    unknown = sorted(set(body) - {"delayAfterCommitMs", "failBeforeCommit", "times"})
    if unknown:
        raise LedgerProblem("invalid-fault", f"unknown fields: {', '.join(unknown)}")
    if len(kinds) != 1:
        raise LedgerProblem("invalid-fault", "give exactly one of delayAfterCommitMs or failBeforeCommit")
    times = _bounded_int(body, "times", 1, MAX_FAULT_TIMES)
    if "delayAfterCommitMs" in kinds:
        delay_ms = _bounded_int(body, "delayAfterCommitMs", 0, MAX_FAULT_DELAY_MS)
        return Fault(delay_after_commit_ms=delay_ms), times
    status = body["failBeforeCommit"]
    if status not in ("503", 503):
        raise LedgerProblem("invalid-fault", f'failBeforeCommit supports only "503", got {status!r}')
    return Fault(fail_before_commit=True), times


def _register_problem_handlers(app: FastAPI) -> None:
    @app.exception_handler(LedgerProblem)
    async def on_problem(request: Request, exc: LedgerProblem) -> JSONResponse:
        return problem_response(exc.slug, exc.detail, request.url.path, **exc.extensions)

    @app.exception_handler(StorageUnavailable)
    async def on_storage(request: Request, exc: StorageUnavailable) -> JSONResponse:
        return problem_response("storage-unavailable", str(exc), request.url.path)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"location": [str(p) for p in e.get("loc", ())], "message": str(e.get("msg", ""))}
            for e in exc.errors()
        ]
        detail = "; ".join(f"{'.'.join(e['location'])}: {e['message']}" for e in errors) or "invalid request"
        return problem_response("invalid-request", detail, request.url.path, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        slug = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "http-error")
        return problem_response(slug, str(exc.detail), request.url.path, status=exc.status_code)


def _answer(store: LedgerStore, effect_request: EffectRequest, path: str) -> JSONResponse:
    outcome = store.submit(effect_request)
    decision = outcome.decision
    match decision:
        case Apply():
            assert outcome.effect is not None  # the store always returns the effect it applied
            return JSONResponse(
                outcome.effect.result,
                status_code=201,
                headers={"Location": f"/effects/{outcome.effect.idempotency_key}"},
            )
        case Replay():
            return JSONResponse(decision.effect.result, status_code=200, headers={REPLAY_HEADER: "true"})
        case KeyConflict():
            return problem_response(
                "idempotency-key-conflict",
                f"Idempotency-Key {decision.existing.idempotency_key!r} already names a different request "
                f"(differs in {', '.join(decision.differences)})",
                path,
                differences=list(decision.differences),
                effectId=decision.existing.effect_id,
            )
        case StaleEpoch():
            return problem_response(
                "stale-epoch",
                f"epoch {decision.presented_epoch} is below the highest epoch {decision.highest_epoch} "
                f"seen for work {decision.work_id!r}",
                path,
                workId=decision.work_id,
                presentedEpoch=decision.presented_epoch,
                highestEpoch=decision.highest_epoch,
            )
        case InsufficientFunds():
            return problem_response(
                "insufficient-funds",
                f"account {decision.account!r} holds {decision.balance}, cannot debit {decision.amount}",
                path,
                account=decision.account,
                balance=decision.balance,
                amount=decision.amount,
            )
        case BalanceOverflow():
            return problem_response(
                "balance-overflow",
                f"account {decision.account!r} holds {decision.balance}, cannot credit {decision.amount}",
                path,
                account=decision.account,
                balance=decision.balance,
                amount=decision.amount,
            )


def create_app(store: LedgerStore, *, faults_enabled: bool = False) -> FastAPI:
    """The ledger app over an initialized ``store``. Fault routes exist only if ``faults_enabled``."""
    app = FastAPI(title="Tenure fenced ledger", version="1")
    app.state.store = store
    faults = FaultPlan()
    app.state.faults = faults
    _register_problem_handlers(app)
    install_http_metrics(app)  # GET /metrics: requests by route and status, the process collector

    # Plain `def` handlers: FastAPI runs them on worker threads, so the blocking SQLite calls
    # (and the injected sleep) never stall the event loop, and requests really run concurrently.
    @app.post("/effects", status_code=201)
    def post_effect(
        request: Request,
        body: Annotated[Any, Body()] = None,
        idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
        work_id: Annotated[str | None, Header(alias="X-Work-Id")] = None,
        fencing_epoch: Annotated[str | None, Header(alias="X-Fencing-Epoch")] = None,
    ) -> JSONResponse:
        try:
            effect_request = build_effect_request(idempotency_key, work_id, fencing_epoch, body)
        except InvalidEffectRequest as exc:
            raise LedgerProblem(exc.problem, exc.detail) from exc
        fault = faults.take()
        if fault is not None and fault.fail_before_commit:
            raise LedgerProblem("injected-fault", "failBeforeCommit fault: the effect was not applied")
        response = _answer(store, effect_request, request.url.path)
        if fault is not None and fault.delay_after_commit_ms:
            # The transaction is already committed: a caller that times out now has lost only
            # the acknowledgement, which is exactly the case reconcile-before-retry exists for.
            time.sleep(fault.delay_after_commit_ms / 1000)
        return response

    @app.get("/effects/{idempotency_key:path}")
    def get_effect(idempotency_key: str) -> dict[str, Any]:
        effect = store.find_effect(idempotency_key)
        if effect is None:
            raise LedgerProblem(
                "effect-not-found",
                f"no effect was applied under Idempotency-Key {idempotency_key!r}",
                idempotencyKey=idempotency_key,
            )
        return effect.to_json()

    @app.get("/works/{work_id}")
    def get_work(work_id: str) -> dict[str, Any]:
        work = store.work(work_id)
        if work is None:
            raise LedgerProblem(
                "work-not-found", f"no effect for work {work_id!r} was ever accepted", workId=work_id
            )
        return {
            "workId": work.work_id,
            "highestEpoch": work.highest_epoch,
            "effects": [effect.to_json() for effect in work.effects],
        }

    @app.get("/accounts/{account}")
    def get_account(account: str) -> dict[str, Any]:
        balance = store.balance(account)
        if balance is None:
            raise LedgerProblem(
                "account-not-found", f"no effect ever touched account {account!r}", account=account
            )
        return {"account": account, "balance": balance}

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        store.check()
        return {"status": "ok", "faultsEnabled": faults_enabled}

    @app.get("/problems/{slug}")
    def describe_problem(slug: str) -> dict[str, Any]:
        problem = PROBLEM_TYPES.get(slug)
        if problem is None:
            raise LedgerProblem("problem-type-not-found", f"the ledger defines no problem type {slug!r}")
        return {
            "type": f"/problems/{slug}",
            "title": problem.title,
            "status": problem.status,
            "meaning": problem.meaning,
        }

    if faults_enabled:

        @app.post("/faults")
        def arm_fault(body: Annotated[Any, Body()] = None) -> dict[str, Any]:
            fault, times = parse_fault(body)
            faults.arm(fault, times)
            return faults.snapshot()

        @app.get("/faults")
        def show_faults() -> dict[str, Any]:
            return faults.snapshot()

        @app.delete("/faults")
        def clear_faults() -> dict[str, Any]:
            faults.clear()
            return faults.snapshot()

    app.add_middleware(TracingMiddleware)  # a tool call continues the effect's trace (issue 17)
    return app
