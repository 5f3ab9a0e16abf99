"""The one way Tenure's HTTP processes serve: uvicorn with uvloop and httptools (the fastest loop
and parser it has; issue 11, per-request CPU), its logs as JSON through the process's own
formatter, and its access log only when TENURE_ACCESS_LOG asks for it."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn

from services.common.heap import freeze_startup_heap
from services.common.logs import uvicorn_log_config
from services.common.problem_json import ProblemCatalog
from services.common.settings import TenureSettings

__all__ = ["KEEP_ALIVE_S", "CutAtShutdown", "serve_http"]

# How long a Tenure server keeps an idle client connection open. uvicorn's default (5 s) equals
# httpx's client-side default, so a client reusing a connection just as the server closed it got
# a ReadError: a retry for the saga executor, an "outcome unknown" for an effect (the gateway's
# own tool client drops idle connections at 2 s for servers Tenure does not run,
# services/effect_gateway/tools.py). Longer than every client Tenure ships keeps one idle
# (httpx 5 s, aiohttp 15 s), the client always closes first.
KEEP_ALIVE_S = 30

_COMMON = ProblemCatalog()


class CutAtShutdown:
    """The app, answering a request that shutdown cuts with a 503 problem and `Retry-After`.

    Past TENURE_HTTP_SHUTDOWN_GRACE_S uvicorn cancels the requests still running, and answers
    each one that had not started its response with a text/plain 500. The request was cut, not
    failed: 503 `unavailable` says retry (every write carries an idempotency key, so a retry
    elsewhere is safe), and `Connection: close` that this process is going.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched_send(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except asyncio.CancelledError:
            if started:
                raise  # half an answer: only closing the connection tells the client
            cut = _COMMON.response(
                "unavailable",
                "this process is shutting down and cut the request; retry it",
                str(scope.get("path", "")),
                headers={"Retry-After": "1", "Connection": "close"},
            )
            await cut(scope, receive, send)


def serve_http(app: Any, host: str, port: int, settings: TenureSettings) -> None:
    """Serve `app` until the process is told to stop (uvicorn handles SIGTERM and SIGINT)."""
    freeze_startup_heap(settings.collector_schedule())
    uvicorn.run(
        CutAtShutdown(app),
        host=host,
        port=port,
        # The levels are the log config's (uvicorn at WARNING, its access log at INFO when on):
        # uvicorn's own log_level would set the access logger to it too and silence it.
        log_config=uvicorn_log_config(),
        log_level=None,
        access_log=settings.access_log,
        loop="uvloop",
        http="httptools",
        # Bounded: uvicorn's default waits for every open request, so one held by a peer that
        # died mid-request kept a SIGTERMed process alive until it was SIGKILLed.
        timeout_graceful_shutdown=settings.http_shutdown_grace_s,
        timeout_keep_alive=KEEP_ALIVE_S,
    )
