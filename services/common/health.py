"""Liveness, readiness and Prometheus metrics for the processes that serve no API of their own.

The lease coordinator, the projector and the saga orchestrator each serve, on their health port
(TENURE_COORDINATOR_HEALTH_PORT, TENURE_PROJECTIONS_HEALTH_PORT, TENURE_SAGA_HEALTH_PORT; 0 = off):

  GET /healthz   200 {"status": "ok", "service": ...}: the process is alive and answering.
  GET /readyz    200 {"status": "ready", "service": ..., "checks": {name: {"ok", "detail"}}} once
                 every check passes (partitions assigned and restored, the log caught up, Kafka
                 answering); else 503 application/problem+json (type /problems/not-ready) with
                 Retry-After, the same "checks" and the names of the failed ones in "failed".
  GET /metrics   Prometheus text: the process and platform collectors plus the process's own
                 (services/common/metrics.py lists them; docs/architecture.md "Metrics").

A stdlib ThreadingHTTPServer on a daemon thread: a probe never waits for a batch, and no web
framework is started in a Kafka worker. The probe only reads snapshots the workers publish.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

# The metrics themselves are defined in services/common/metrics.py; re-exported for the
# processes that import them from here.
from services.common.metrics import ProcessorMetrics, ProjectionMetrics, StreamMetrics, metrics_registry
from services.common.problem_json import PROBLEM_JSON, ProblemCatalog, ProblemType

__all__ = [
    "NOT_READY",
    "Check",
    "DeferredReadiness",
    "HealthServer",
    "ProcessorMetrics",
    "ProjectionMetrics",
    "StreamMetrics",
    "metrics_registry",
    "serve_health",
]

log = logging.getLogger("tenure.health")

NOT_READY = ProblemType(
    "not-ready",
    "The process is not ready",
    503,
    "The process is alive but not yet (or no longer) doing its work: `failed` names the checks "
    "that did not pass (e.g. partitions not yet assigned or restored, Kafka not answering); "
    "retry after `Retry-After` seconds.",
)
_CATALOG = ProblemCatalog([NOT_READY])
_JSON = "application/json"


@dataclass(frozen=True)
class Check:
    """One readiness condition, as the probe reports it."""

    name: str
    ok: bool
    detail: str


Readiness = Callable[[], Sequence[Check]]


class DeferredReadiness:
    """Readiness for a process still starting: "startup" fails until `become` hands over the
    real checks. Lets the port open first, so a slow start answers 503, not "connection refused"
    (which a supervisor may take for an old build with no endpoint)."""

    def __init__(self, starting: str = "connecting to Kafka and opening the state store") -> None:
        self._starting = starting
        self._checks: Readiness | None = None

    def become(self, checks: Readiness) -> None:
        self._checks = checks

    def __call__(self) -> Sequence[Check]:
        checks = self._checks
        return [Check("startup", False, self._starting)] if checks is None else checks()


class HealthServer:
    """Serves /healthz, /readyz and /metrics on `host:port` (port 0: any free port)."""

    def __init__(
        self,
        service: str,
        readiness: Readiness,
        registry: CollectorRegistry,
        host: str = "127.0.0.1",
        port: int = 0,
        retry_after_s: int = 1,
        poll_interval_s: float = 0.5,
    ) -> None:
        self.service = service
        self._readiness = readiness
        self._registry = registry
        self._retry_after_s = retry_after_s
        self._server = ThreadingHTTPServer((host, port), self._handler_class())
        self._server.daemon_threads = True
        # How often the serving thread looks for shutdown(): only close() waits for it.
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(poll_interval_s,), name=f"{service}-health", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> HealthServer:
        self._thread.start()
        log.info("serving /healthz, /readyz and /metrics on port %d", self.port)
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    # --- answers ------------------------------------------------------------------------------

    def answer(self, path: str) -> tuple[int, str, bytes, dict[str, str]]:
        """(status, content type, body, extra headers) for a GET of `path`."""
        if path == "/healthz":
            return self._json(200, {"status": "ok", "service": self.service})
        if path == "/readyz":
            return self._ready()
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self._registry), {}
        if path.startswith("/problems/"):
            described = _CATALOG.describe(path.removeprefix("/problems/"))
            if described is not None:
                return self._json(200, described)
        return self._problem("not-found", f"{path} is not served here; try /healthz, /readyz or /metrics")

    def _ready(self) -> tuple[int, str, bytes, dict[str, str]]:
        try:
            checks = list(self._readiness())
        except Exception as exc:  # a probe answers; it never fails with the process's bug
            log.warning("a readiness check raised", exc_info=True)
            checks = [Check("readiness", False, f"the check raised {type(exc).__name__}: {exc}")]
        report = {c.name: {"ok": c.ok, "detail": c.detail} for c in checks}
        failed = [c for c in checks if not c.ok]
        if not failed:
            return self._json(200, {"status": "ready", "service": self.service, "checks": report})
        detail = "; ".join(f"{c.name}: {c.detail}" for c in failed)
        return self._problem(
            "not-ready",
            detail,
            headers={"Retry-After": str(self._retry_after_s)},
            instance="/readyz",
            service=self.service,
            failed=[c.name for c in failed],
            checks=report,
        )

    @staticmethod
    def _json(status: int, body: dict[str, Any]) -> tuple[int, str, bytes, dict[str, str]]:
        return status, _JSON, json.dumps(body).encode("utf-8"), {}

    @staticmethod
    def _problem(
        slug: str,
        detail: str,
        *,
        status: int | None = None,
        headers: dict[str, str] | None = None,
        instance: str | None = None,
        **ext: Any,
    ) -> tuple[int, str, bytes, dict[str, str]]:
        body = _CATALOG.body(slug, detail, instance, status, **ext)
        return int(body["status"]), PROBLEM_JSON, json.dumps(body).encode("utf-8"), dict(headers or {})

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = "tenure-health"

            def do_GET(self) -> None:
                self._send(*server.answer(self.path.split("?", 1)[0]))

            def do_HEAD(self) -> None:
                self._send(*server.answer(self.path.split("?", 1)[0]), head=True)

            def _refuse(self) -> None:
                # Drain a body so a keep-alive connection stays in step, then say what is allowed.
                length = int(self.headers.get("Content-Length") or 0)
                if 0 < length <= 65_536:
                    self.rfile.read(length)
                else:
                    self.close_connection = True
                status, ctype, body, headers = server._problem(
                    "method-not-allowed", f"{self.command} is not allowed; only GET and HEAD"
                )
                self._send(status, ctype, body, {**headers, "Allow": "GET, HEAD"})

            do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse

            def _send(
                self, status: int, ctype: str, body: bytes, headers: dict[str, str], head: bool = False
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                # Probes come every few seconds: not worth a log line each.
                log.debug("%s %s", self.address_string(), format % args)

        return Handler


def serve_health(
    service: str, port: int, readiness: Readiness, registry: CollectorRegistry, host: str = "127.0.0.1"
) -> HealthServer | None:
    """Start a HealthServer on `port` (0 = off). A port already taken is logged, not fatal: the
    process's work matters more than its probe, and a supervisor sees the missing probe."""
    if port == 0:
        log.info("health port 0: /healthz, /readyz and /metrics are off")
        return None
    try:
        return HealthServer(service, readiness, registry, host, port).start()
    except OSError as exc:
        log.error("cannot serve health on %s:%d (%s); carrying on without it", host, port, exc)
        return None
