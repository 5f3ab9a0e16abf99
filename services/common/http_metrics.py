"""HTTP request metrics and /metrics for every Tenure HTTP process (API, gateway, ledger, sim).

`install_http_metrics(app, registry)` adds `HttpMetrics`, a pure ASGI middleware (like
services/common/http_guard.py: a streamed or long-polled answer is passed through, never
buffered), and, unless the app serves its own, `GET /metrics` with `registry`'s text.

  tenure_http_requests_total{route,method,status}          every answered request
  tenure_http_request_duration_seconds{route,method}       from the request to the answer's end

`route` is the route's template (`/runs/{run_id}`), never the raw path, so the label set stays
bounded whatever clients send: a path no route matches is `unmatched`, a method outside the
standard ones is `OTHER`. A request whose application raised before answering is counted with
status 500, which is what the server then sends.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI, Response
from fastapi.routing import iter_route_contexts
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.routing import compile_path

from services.common.metrics import counter, histogram, metrics_registry

__all__ = ["UNMATCHED", "HttpMetrics", "install_http_metrics", "route_template"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UNMATCHED = "unmatched"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Most answers take milliseconds; long polls hold a request for up to 30 s.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def route_template(scope: Scope) -> str:
    """The template of the route that handled the request (the router leaves it in the scope),
    else `unmatched`. A request answered before routing (an oversized body refused by the
    guard) has none: `HttpMetrics` matches its path against the app's templates instead."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) and path else UNMATCHED


def _templates(app: Any) -> list[tuple[re.Pattern[str], str]]:
    """Every route template of `app` (included routers flattened), as path regexes."""
    routes = getattr(getattr(app, "router", None), "routes", [])
    templates = []
    for route in iter_route_contexts(routes):
        path = route.path
        if isinstance(path, str) and path:
            templates.append((compile_path(path)[0], path))
    return templates


class HttpMetrics:
    """Counts and times every HTTP request by route template, method and status."""

    def __init__(self, app: ASGIApp, registry: CollectorRegistry) -> None:
        self.app = app
        self._requests = counter(
            registry,
            "tenure_http_requests",
            "HTTP requests answered, by route template, method and status code.",
            ["route", "method", "status"],
        )
        self._duration = histogram(
            registry,
            "tenure_http_request_duration_seconds",
            "Time from an HTTP request to the end of its answer, by route template and method.",
            ["route", "method"],
            buckets=_BUCKETS,
        )
        self._templates: list[tuple[re.Pattern[str], str]] | None = None

    def _match(self, scope: Scope) -> str:
        if self._templates is None:
            self._templates = _templates(scope.get("app"))  # the routes are fixed once serving
        path = scope.get("path", "")
        return next((template for regex, template in self._templates if regex.match(path)), UNMATCHED)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the server answers when the application raises before answering

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            method = scope.get("method", "GET")
            method = method if method in _METHODS else "OTHER"
            route = route_template(scope)
            if route == UNMATCHED:
                route = self._match(scope)
            self._requests.labels(route, method, str(status)).inc()
            self._duration.labels(route, method).observe(time.perf_counter() - started)


def install_http_metrics(
    app: FastAPI, registry: CollectorRegistry | None = None, *, serve: bool = True
) -> CollectorRegistry:
    """Count `app`'s requests into `registry` (default: a new one with the process collector)
    and, with `serve`, answer `GET /metrics` with it (outside the OpenAPI, unauthenticated like
    /healthz). Returns the registry, for the process's own metrics."""
    registry = registry if registry is not None else metrics_registry()
    app.add_middleware(HttpMetrics, registry=registry)
    if serve:

        @app.get("/metrics", include_in_schema=False)
        async def prometheus_metrics() -> Response:
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return registry
