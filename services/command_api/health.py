"""Liveness and readiness of the command API.

`GET /healthz` (liveness) answers 200 while the process serves HTTP, whatever its dependencies
do, and says whether it runs in development mode (no API keys):

    {"status": "ok", "service": "tenure-command-api", "developmentMode": false}

`GET /readyz` (readiness) checks what a request needs: Kafka answers a metadata request (cached
for a second, so a busy poller costs the broker nothing), this instance's own views have folded
runs.events, trajectories.events and watchdog.events up to where they ended when it started
(services/command_api/projection.py: not ready while it catches up), and the decision
followers (run, trajectory, watchdog and breaker decisions), the block policy follower and the
circuit breakers' board (breakers.events folded up to where the log ended at start-up) are
following. Ready:

    200 {"status": "ready", "service": "tenure-command-api", "developmentMode": false,
         "checks": {"kafka": {"ready": true, "detail": "..."}, "views": {...},
                    "runDecisions": {"ready": true, "detail": "...", "lag": 0},
                    "trajectoryDecisions": {...}, "watchdogDecisions": {...},
                    "blockPolicy": {...}, "breakers": {...}, "breakerDecisions": {...}}}

Not ready: 503 application/problem+json with Retry-After, type /problems/not-ready,
`notReady` (the names of the failing checks, in the order above) and the same `checks`.
Neither needs credentials: a supervisor or load balancer polls them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from services.command_api.context import RETRY_AFTER_S, ApiContext
from services.command_api.problems import problem_response
from services.common.decisions import FollowerHealth

__all__ = ["SERVICE_NAME", "health_router"]

SERVICE_NAME = "tenure-command-api"
# Kafka's answer is reused this long: a readiness poller must not become a metadata storm.
_KAFKA_CACHE_S = 1.0
_KAFKA_TIMEOUT_S = 0.5
# Each check gets this long; a check that does not answer in time is not ready.
_CHECK_TIMEOUT_S = 2.0


def health_router(ctx: ApiContext) -> APIRouter:
    router = APIRouter(tags=["health"])
    kafka_cache: dict[str, tuple[float, FollowerHealth]] = {}
    kafka_lock = asyncio.Lock()

    async def kafka() -> FollowerHealth:
        async with kafka_lock:  # concurrent probes share one metadata request
            cached = kafka_cache.get("kafka")
            if cached is not None and time.monotonic() - cached[0] < _KAFKA_CACHE_S:
                return cached[1]
            problem = await asyncio.to_thread(ctx.deps.publisher.reachable, _KAFKA_TIMEOUT_S)
            health = (
                FollowerHealth(True, "a broker answered a metadata request")
                if problem is None
                else FollowerHealth(False, f"no broker answered within {_KAFKA_TIMEOUT_S}s: {problem}")
            )
            kafka_cache["kafka"] = (time.monotonic(), health)
            return health

    async def block_policy() -> FollowerHealth:
        current = await asyncio.to_thread(ctx.deps.blocks.wait_until_current, 0.0)
        if current:
            return FollowerHealth(True, "the block policy is read up to its end")
        return FollowerHealth(False, "the block policy is still being read")

    async def check(name: str, probe: Any) -> tuple[str, dict[str, Any]]:
        try:
            health: FollowerHealth = await asyncio.wait_for(probe(), _CHECK_TIMEOUT_S)
        except TimeoutError:
            health = FollowerHealth(False, f"no answer within {_CHECK_TIMEOUT_S}s")
        except Exception as exc:  # a failing probe is a failing dependency, not a 500
            health = FollowerHealth(False, f"{type(exc).__name__}: {exc}")
        body: dict[str, Any] = {"ready": health.ready, "detail": health.detail}
        if health.lag is not None:
            body["lag"] = health.lag
        return name, body

    @router.get("/healthz", summary="Liveness: the process serves HTTP (and its development mode)")
    async def healthz() -> Any:
        return {"status": "ok", "service": SERVICE_NAME, "developmentMode": ctx.development_mode}

    @router.get(
        "/readyz",
        summary="Readiness: Kafka, this instance's own views (caught up) and the decision followers",
        responses={503: {"description": "Not ready: a problem+json naming what is not ready"}},
    )
    async def readyz() -> Any:
        d = ctx.deps

        async def views() -> FollowerHealth:
            return await asyncio.to_thread(d.views.health)

        async def run_decisions() -> FollowerHealth:
            return await asyncio.to_thread(d.decisions.health)

        async def trajectory_decisions() -> FollowerHealth:
            return await asyncio.to_thread(d.trajectory_decisions.health)

        async def watchdog_decisions() -> FollowerHealth:
            listener = d.watchdog_decisions
            if listener is None:  # a harness without the watchdog's follower
                return FollowerHealth(True, "no watchdog follower configured")
            return await asyncio.to_thread(listener.health)

        async def breakers() -> FollowerHealth:
            board = d.breakers
            if board is None:  # a harness without the breakers' follower
                return FollowerHealth(True, "no breaker follower configured")
            return await asyncio.to_thread(board.health)

        async def breaker_decisions() -> FollowerHealth:
            listener = d.breaker_decisions
            if listener is None:
                return FollowerHealth(True, "no breaker decision follower configured")
            return await asyncio.to_thread(listener.health)

        results = await asyncio.gather(
            check("kafka", kafka),
            check("views", views),
            check("runDecisions", run_decisions),
            check("trajectoryDecisions", trajectory_decisions),
            check("watchdogDecisions", watchdog_decisions),
            check("blockPolicy", block_policy),
            check("breakers", breakers),
            check("breakerDecisions", breaker_decisions),
        )
        checks = dict(results)
        not_ready = [name for name, body in results if not body["ready"]]
        if not_ready:
            response: JSONResponse = problem_response(
                "not-ready",
                "not ready: " + "; ".join(f"{n} ({checks[n]['detail']})" for n in not_ready),
                "/readyz",
                notReady=not_ready,
                checks=checks,
                service=SERVICE_NAME,
                developmentMode=ctx.development_mode,
            )
            response.headers["Retry-After"] = str(RETRY_AFTER_S)
            return response
        return {
            "status": "ready",
            "service": SERVICE_NAME,
            "developmentMode": ctx.development_mode,
            "checks": checks,
        }

    return router
