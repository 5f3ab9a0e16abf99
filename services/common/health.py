"""Liveness, readiness and Prometheus metrics for the processes that serve no API of their own.

The lease coordinator, the projector and the saga orchestrator each serve, on their health port
(TENURE_COORDINATOR_HEALTH_PORT, TENURE_PROJECTIONS_HEALTH_PORT, TENURE_SAGA_HEALTH_PORT; 0 = off):

  GET /healthz   200 {"status": "ok", "service": ...}: the process is alive and answering.
  GET /readyz    200 {"status": "ready", "service": ..., "checks": {name: {"ok", "detail"}}} once
                 every check passes (partitions assigned and restored, the log caught up, Kafka
                 answering); else 503 application/problem+json (type /problems/not-ready) with
                 Retry-After, the same "checks" and the names of the failed ones in "failed".
  GET /metrics   Prometheus text: the process and platform collectors plus the process's own.

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

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

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


def metrics_registry() -> CollectorRegistry:
    """A registry with the process (CPU, memory, file descriptors) and platform collectors."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


# Batches commit in milliseconds; a broker hiccup stretches one to seconds.
_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)



def _deadletter_counter(registry: CollectorRegistry) -> Counter:
    """One name and meaning for dead letters, whichever process sets them aside."""
    return Counter(
        "tenure_deadletters",
        "Records set aside on tenure.deadletter, by reason code.",
        ["reason"],
        registry=registry,
    )

class ProcessorMetrics:
    """What a command processor counts; `aggregate` ("run", "trajectory") labels every series."""

    def __init__(self, aggregate: str, registry: CollectorRegistry | None = None) -> None:
        self.aggregate = aggregate
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = ["aggregate"]
        self._batches = Counter(
            "tenure_processor_batches", "Command batches committed.", labels, registry=self.registry
        )
        self._commands = Counter(
            "tenure_processor_commands",
            "Commands handled, by outcome: accepted, rejected, duplicate, deadlettered (undecodable "
            "or misaddressed) or failed (its handling raised: dead-lettered and refused).",
            [*labels, "outcome"],
            registry=self.registry,
        )
        self._events = Counter("tenure_processor_events", "Events committed.", labels, registry=self.registry)
        self._transaction = Histogram(
            "tenure_processor_transaction_seconds",
            "Time of one Kafka transaction of a batch or timer tick (produce, flush, commit).",
            labels,
            buckets=_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self._restores = Counter(
            "tenure_processor_restores", "Partitions restored from the log.", labels, registry=self.registry
        )
        self._restored_events = Counter(
            "tenure_processor_restored_events",
            "Events folded while restoring partitions.",
            labels,
            registry=self.registry,
        )
        self._restore_seconds = Histogram(
            "tenure_processor_restore_seconds",
            "Time to restore one partition from the log.",
            labels,
            buckets=_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self._deadletters = _deadletter_counter(self.registry)

    def batch(self, outcomes: dict[str, int], events: int) -> None:
        self._batches.labels(self.aggregate).inc()
        for outcome, count in outcomes.items():
            if count:
                self._commands.labels(self.aggregate, outcome).inc(count)
        if events:
            self._events.labels(self.aggregate).inc(events)

    def transaction(self, seconds: float) -> None:
        self._transaction.labels(self.aggregate).observe(seconds)

    def restored(self, events: int, seconds: float) -> None:
        self._restores.labels(self.aggregate).inc()
        if events:
            self._restored_events.labels(self.aggregate).inc(events)
        self._restore_seconds.labels(self.aggregate).observe(seconds)

    def deadlettered(self, reason: str) -> None:
        self._deadletters.labels(reason).inc()


class StreamMetrics:
    """What the stream runtime counts: retried transient failures and rebalances, per `app`."""

    def __init__(self, app: str, registry: CollectorRegistry | None = None) -> None:
        self.app = app
        self.registry = registry if registry is not None else CollectorRegistry()
        self._retries = Counter(
            "tenure_stream_retries",
            "Transient failures retried with backoff, by the work that failed (batch, tick, assign).",
            ["app", "work"],
            registry=self.registry,
        )
        self._assignments = Counter(
            "tenure_stream_assignments", "Partition assignments received.", ["app"], registry=self.registry
        )
        self._partitions = Gauge(
            "tenure_stream_partitions_assigned",
            "Partitions of the command topic this process owns.",
            ["app"],
            registry=self.registry,
        )

    def retried(self, work: str) -> None:
        self._retries.labels(self.app, work).inc()

    def assigned(self, partitions: int) -> None:
        self._assignments.labels(self.app).inc()
        self._partitions.labels(self.app).set(partitions)

    def revoked(self) -> None:
        self._partitions.labels(self.app).set(0)


class ProjectionMetrics:
    """What the projector counts: records folded into views and dead letters, per topic."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._records = Counter(
            "tenure_projection_records",
            "Records of an event topic folded into the views.",
            ["topic"],
            registry=self.registry,
        )
        self._caught_up = Gauge(
            "tenure_projection_caught_up",
            "1 once the views have folded their topic up to its end as of start-up.",
            ["topic"],
            registry=self.registry,
        )
        self._deadletters = _deadletter_counter(self.registry)

    def folded(self, topic: str, records: int) -> None:
        self._records.labels(topic).inc(records)

    def caught_up(self, topic: str) -> None:
        self._caught_up.labels(topic).set(1)

    def deadlettered(self, reason: str) -> None:
        self._deadletters.labels(reason).inc()


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
