"""The tool endpoints' circuit breakers (BRK-1, BRK-2) and the gateway's bulkheads (BRK-4).

* GET /breakers: every endpoint's breaker: status, whether calls fail fast, the window's counts
  and error rate, the cooldown and what is left of it, the canary and its holder (RFC 3339
  times); `status` filters.
* GET /breakers/{endpoint}: the same, plus the window's outcomes and the breaker's recent
  transitions with their evidence (the window that opened it, the canary's outcome, the
  operator and reason), oldest first.
* POST /breakers/{endpoint}/force-open | /disable | /reset (operators, with a `reason` that is
  recorded in the event): fail every call fast until a reset (resilience4j FORCED_OPEN); let
  every call through and count nothing until a reset (DISABLED); back to Closed with an empty
  window and the base cooldown. 200 with the breaker once the API's board shows the change,
  202 (Location) when the decision did not arrive in time, 409 breaker-conflict when the
  breaker is in that state already.
* GET /bulkheads: the gateway's pools per tool domain as this deployment configures them (their
  live occupancy is each gateway instance's own: the gateway's GET /bulkheads).

Everything is answered from the API's BreakerBoard: breakers.events folded with the breaker's own
`evolve` (breaker_board.py), no fold written here. An endpoint with no breaker is 404
breaker-not-found: a breaker begins with the first call the gateway reports to it. Idempotency
as on the other write routes (idempotency.py): with an `Idempotency-Key` the command id is
derived from the key and the canonical request (principal, endpoint, reason), and a repeat
the breaker's recent transitions show is answered again without a second command.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import fields
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from pydantic import Field, field_validator

from services.breakers.client import BreakerClient
from services.breakers.domain import BreakerState, BreakerStatus
from services.command_api.breaker_board import BreakerHistoryFold
from services.command_api.context import ApiContext
from services.command_api.idempotency import PRINCIPAL_FIELD, KeyedRequest
from services.command_api.models import ApiBody, Text
from services.command_api.problems import BREAKER_REJECTION_PROBLEMS, ApiProblem, problem_response
from services.common.auth import Role, require_role
from services.common.contracts import (
    BreakerClosed,
    BreakerDisabled,
    BreakerEvent,
    BreakerForcedOpen,
    BreakerHalfOpened,
    BreakerOpened,
    BreakerReopened,
    BreakerReset,
    CanaryExpired,
    CanaryGranted,
)
from services.common.contracts._headers import EventHeader
from services.common.contracts.breakers import MAX_REASON_CHARS
from services.common.decisions import Decided, NotDurable, Rejected
from services.common.times import rfc3339_or_none

__all__ = ["BreakerOverrideBody", "breakers_router", "describe_breaker", "describe_transition"]

StatusName = Literal["closed", "open", "half-open", "forced-open", "disabled"]
# What the breaker is in after each of its events (an outcome changes no status).
_STATUS_AFTER: dict[type[Any], BreakerStatus] = {
    BreakerOpened: BreakerStatus.OPEN,
    BreakerHalfOpened: BreakerStatus.HALF_OPEN,
    CanaryGranted: BreakerStatus.HALF_OPEN,
    CanaryExpired: BreakerStatus.HALF_OPEN,
    BreakerClosed: BreakerStatus.CLOSED,
    BreakerReopened: BreakerStatus.OPEN,
    BreakerForcedOpen: BreakerStatus.FORCED_OPEN,
    BreakerDisabled: BreakerStatus.DISABLED,
    BreakerReset: BreakerStatus.CLOSED,
}
# Event fields that hold epoch ms, shown as RFC 3339.
_TIME_FIELDS = frozenset({"half_open_at", "expires_at", "opened_at"})
_HEADER_FIELDS = frozenset(f.name for f in fields(EventHeader))
_POLL_S = 0.005
_LAST_READ_S = 0.2


class BreakerOverrideBody(ApiBody):
    reason: Text = Field(
        min_length=1, max_length=MAX_REASON_CHARS, description="Why: recorded in the breaker's event."
    )

    @field_validator("reason")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a reason is more than white space")
        return value


# --- rendering ------------------------------------------------------------------------------------


def _rfc3339(ms: int) -> str | None:
    """Epoch ms as RFC 3339 UTC with a Z (None for 0: not set)."""
    return rfc3339_or_none(ms) if ms > 0 else None


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def describe_transition(event: BreakerEvent) -> dict[str, Any]:
    """One recorded event of a breaker with its evidence, in the API's field names."""
    entry: dict[str, Any] = {
        "type": type(event).__name__,
        "status": _STATUS_AFTER[type(event)].value,
        "version": event.version,
        "at": _rfc3339(event.occurred_at),
        "by": event.actor,
        "commandId": event.causation_id,
    }
    for field in fields(event):
        if field.name in _HEADER_FIELDS:
            continue
        value = getattr(event, field.name)
        if field.name in _TIME_FIELDS:
            value = _rfc3339(value)
        elif isinstance(value, tuple):
            value = list(value)  # the window that opened it: oldest first, true = failure
        entry[_camel(field.name)] = value
    return entry


def describe_breaker(
    board: BreakerHistoryFold, state: BreakerState, now_ms: int, *, detail: bool = False
) -> dict[str, Any]:
    """A breaker as GET /breakers shows it; with `detail`, GET /breakers/{endpoint}."""
    verdict = board.verdict(state.endpoint, now_ms)
    canary = state.canary
    held = canary is not None and now_ms < canary.expires_at
    cooling = state.status is BreakerStatus.OPEN
    history = board.transitions(state.endpoint)
    last = history[-1] if history else None
    body: dict[str, Any] = {
        "endpoint": state.endpoint,
        "status": state.status.value,
        "failsFast": verdict.open,
        "version": state.version,
        "errorRate": round(state.error_rate, 4),
        "window": {
            "size": board.window_size(state.endpoint),
            "calls": len(state.window),
            "failures": state.failures,
            "errorRate": round(state.error_rate, 4),
        },
        "cooldownMs": state.cooldown_ms,
        # Open: what is left of the cooldown before the breaker half-opens.
        "cooldownRemainingMs": max(0, state.half_open_at - now_ms) if cooling else 0,
        # What a call that fails fast is told to wait (ERR_CIRCUIT_OPEN's cooldown remaining).
        "retryAfterMs": verdict.cooldown_remaining_ms if verdict.open else 0,
        "halfOpenAt": _rfc3339(state.half_open_at) if cooling else None,
        "openSince": _rfc3339(state.open_since),
        "openedAt": _rfc3339(state.opened_at),
        "timesOpened": state.times_opened,
        "canaryHolder": canary.instance_id if canary is not None and held else None,
        "canary": None
        if canary is None
        else {
            "canaryId": canary.canary_id,
            "holder": canary.instance_id,
            "grantedAt": _rfc3339(canary.granted_at),
            "expiresAt": _rfc3339(canary.expires_at),
            "held": held,
        },
        "reason": state.reason or None,
        "reportingInstances": len(state.instances),
        "lastTransition": None
        if last is None
        else {
            "type": type(last).__name__,
            "at": _rfc3339(last.occurred_at),
            "by": last.actor,
            **({"reason": last.reason} if isinstance(last, _OPERATOR_EVENTS) else {}),
        },
        "updatedAt": _rfc3339(state.updated_at),
    }
    if detail:
        body["recentOutcomes"] = list(state.window)  # oldest first, true = failure
        body["transitions"] = [describe_transition(event) for event in history]
    return body


# --- routes ---------------------------------------------------------------------------------------

Action = Callable[[BreakerClient, str, str, str, float, str], Awaitable[Any]]


def _force_open(client: BreakerClient, endpoint: str, reason: str, actor: str, wait: float, cid: str) -> Any:
    return client.force_open(endpoint, reason, actor, wait, command_id=cid)


def _disable(client: BreakerClient, endpoint: str, reason: str, actor: str, wait: float, cid: str) -> Any:
    return client.disable(endpoint, reason, actor, wait, command_id=cid)


def _reset(client: BreakerClient, endpoint: str, reason: str, actor: str, wait: float, cid: str) -> Any:
    return client.reset(endpoint, reason, actor, wait, command_id=cid)


# path suffix -> (command type, the event it records, what it does, the client's call)
_OVERRIDES: dict[str, tuple[str, type[Any], str, Action]] = {
    "force-open": ("ForceOpenBreaker", BreakerForcedOpen, "forcing open", _force_open),
    "disable": ("DisableBreaker", BreakerDisabled, "disabling", _disable),
    "reset": ("ResetBreaker", BreakerReset, "resetting", _reset),
}
_SUMMARIES = {
    "force-open": "Force the endpoint's breaker open: every call fails fast until a reset (operator)",
    "disable": "Disable the endpoint's breaker: every call passes, nothing counts, until a reset (operator)",
    "reset": "Reset the endpoint's breaker: Closed, an empty window, the base cooldown (operator)",
}
_OPERATOR_EVENTS = (BreakerForcedOpen, BreakerDisabled, BreakerReset)


def breakers_router(ctx: ApiContext) -> APIRouter:
    router = ctx.guarded(tags=["breakers"])

    def board() -> BreakerHistoryFold:
        found = ctx.deps.breakers
        if found is None:
            raise ctx.unavailable("the circuit breakers are not followed by this API")
        if not found.wait_until_current(0.0):
            raise ctx.unavailable("the circuit breakers are still being read from breakers.events")
        return found

    def breaker(endpoint: str) -> tuple[BreakerHistoryFold, BreakerState]:
        followed = board()
        state = followed.state(endpoint)
        if state is None:
            raise ApiProblem(
                "breaker-not-found",
                f"no breaker for endpoint {endpoint!r}: no call to it has been reported",
                endpoint=endpoint,
            )
        return followed, state

    def location(endpoint: str) -> dict[str, str]:
        return {"Location": f"/breakers/{endpoint}"}

    @router.get("/breakers", summary="Every tool endpoint's circuit breaker (BRK-1, BRK-2)")
    async def list_breakers(
        status: Annotated[StatusName | None, Query(description="Only breakers in this status")] = None,
    ) -> Any:
        followed = board()
        now = ctx.deps.clock.now_ms()
        shown = [
            describe_breaker(followed, state, now)
            for _, state in sorted(followed.states().items())
            if status is None or state.status.value == status
        ]
        return {"breakers": shown, "count": len(shown), "serverTime": _rfc3339(now)}

    @router.get(
        "/breakers/{endpoint:path}",
        summary="One endpoint's breaker with its recent transitions and their evidence",
    )
    async def get_breaker(endpoint: str) -> Any:
        followed, state = breaker(endpoint)
        return describe_breaker(followed, state, ctx.deps.clock.now_ms(), detail=True)

    async def shown_at(followed: BreakerHistoryFold, endpoint: str, version: int) -> BreakerState | None:
        """The breaker once this API's board has folded `version`, within the deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, ctx.remaining() - 0.05)
        while True:
            state = followed.state(endpoint)
            if state is not None and state.version >= version:
                return state
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(_POLL_S)

    async def override(
        action: str, endpoint: str, body: BreakerOverrideBody, request: Request, key: str | None
    ) -> Any:
        command_type, recorded_as, verb, call = _OVERRIDES[action]
        who = ctx.principal(request)
        require_role(who, f"{verb} a circuit breaker", Role.OPERATOR)
        followed, _ = breaker(endpoint)
        keyed = KeyedRequest.of(endpoint, command_type, key, who.name, {"reason": body.reason})
        if key:
            entries = [
                {"commandId": e.causation_id, PRINCIPAL_FIELD: e.actor, "reason": e.reason}
                for e in followed.transitions(endpoint)
                if isinstance(e, _OPERATOR_EVENTS) and isinstance(e, recorded_as)
            ]
            first = keyed.find(entries, "commandId")
            if first is not None:
                keyed.check(str(first["commandId"]), first, f"the breaker of {endpoint}")
                state = followed.state(endpoint)
                assert state is not None
                view = describe_breaker(followed, state, ctx.deps.clock.now_ms(), detail=True)
                return JSONResponse(
                    view | {"commandId": first["commandId"], "replayed": True}, headers=location(endpoint)
                )
        client = ctx.deps.breaker_client
        if client is None:
            raise ctx.unavailable("the circuit breakers cannot be commanded from this API")
        if ctx.remaining() < _LAST_READ_S:
            raise ctx.unavailable("the request's deadline passed before its command was sent (nothing was)")
        try:
            decision = await call(client, endpoint, body.reason, who.name, ctx.remaining(), keyed.command_id)
        except NotDurable as exc:
            fate = "may still be recorded" if exc.may_land else "was not sent"
            raise ctx.unavailable(
                f"{exc}. The command {fate}; sending the same request again under the same "
                "Idempotency-Key is recognised as the same request",
                commandId=keyed.command_id,
                endpoint=endpoint,
            ) from exc
        if isinstance(decision, Rejected):
            r = decision.rejection
            return problem_response(
                BREAKER_REJECTION_PROBLEMS.get(r.code, "breaker-conflict"),
                r.detail,
                request.url.path,
                code=r.code,
                endpoint=endpoint,
                currentStatus=r.current_status,
                commandId=r.causation_id,
            )
        shown = None
        if isinstance(decision, Decided):
            shown = await shown_at(followed, endpoint, decision.event.version)
        if shown is None:
            pending = {
                "endpoint": endpoint,
                "commandId": keyed.command_id,
                "status": "pending",
                "detail": "the command is durable but this API has not seen its decision yet; GET "
                "the breaker (or repeat the request with the same Idempotency-Key)",
            }
            return JSONResponse(pending, status_code=202, headers=location(endpoint))
        view = describe_breaker(followed, shown, ctx.deps.clock.now_ms(), detail=True)
        answer = view | {"commandId": keyed.command_id, "replayed": False}
        return JSONResponse(answer, headers=location(endpoint))

    for action in _OVERRIDES:

        def route(action: str = action) -> Any:
            async def handler(
                endpoint: str,
                body: BreakerOverrideBody,
                request: Request,
                idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
            ) -> Any:
                return await override(action, endpoint, body, request, idempotency_key)

            handler.__name__ = f"{action.replace('-', '_')}_breaker"
            return handler

        router.post(f"/breakers/{{endpoint:path}}/{action}", summary=_SUMMARIES[action])(route())

    @router.get("/bulkheads", summary="The gateway's bulkheads per tool domain, as configured (BRK-4)")
    async def bulkheads() -> Any:
        configured = ctx.deps.bulkheads
        if configured is None or isinstance(configured, str):
            why = configured or "not configured in this API"
            raise ctx.unavailable(f"the bulkheads cannot be described: {why}")
        # Occupancy (active, queued, refused) lives in each gateway instance's pools.
        return configured | {"occupancy": "live occupancy is each effect gateway's own: its GET /bulkheads"}

    return router
