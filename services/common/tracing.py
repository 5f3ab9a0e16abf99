"""OpenTelemetry tracing, in one adapter: the only module that imports `opentelemetry`.

A trace follows one request through the system (W3C Trace Context, the `traceparent` header):
the HTTP request that reaches the API or the effect gateway (`TracingMiddleware`: a caller's
`traceparent` is continued, else a root span starts) -> the command record's Kafka headers
(`traced_record`, applied by services.common.routing to every command it builds) -> the
processor that decides the command (`start_span_from_headers`, one span per command, whose
output records carry the same context) -> the saga executor's call to the gateway
(`remember`/`recall` carry a trajectory's context from its decision to the work it causes;
`inject_into_http` puts it on the request) -> the gateway's intent and outcome commands and
its call to the tool (`inject_into_http` on the tool request).

The exporter is optional and off by default (TENURE_OTEL_EXPORTER=none): no SDK provider is
installed, spans are the API's non-recording ones, and a caller's `traceparent` still passes
through unchanged, so nothing is exported, nothing is slower to speak of, and nothing needs a
collector. `otlp` sends batches over OTLP/HTTP (TENURE_OTEL_ENDPOINT; the exporter package is
imported only then, and a collector that is away only loses spans), `console` prints them, and
`file:<path>` appends each finished span as one JSON line (`JsonLinesSpanExporter`, what the
tests read). The configuration is read once per process, on first use, from TenureSettings;
`service.name` is TENURE_OTEL_SERVICE_NAME or the process's module (`python -m
services.lease_coordinator` is tenure-lease-coordinator).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import Token
from dataclasses import replace
from pathlib import Path
from typing import Any, Awaitable, Callable, MutableMapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.common.kafka import InboundRecord, OutboundRecord
from services.common.settings import TenureSettings

__all__ = [
    "TRACE_HEADERS",
    "Context",
    "JsonLinesSpanExporter",
    "SpanKind",
    "TracingMiddleware",
    "annotate",
    "commit_span",
    "configure_tracing",
    "current_traceparent",
    "decide_span",
    "extract",
    "inject_into_headers",
    "inject_into_http",
    "recall",
    "remember",
    "reset_tracing",
    "span",
    "start_span_from_headers",
    "traced_as",
    "traced_record",
    "traced_records",
]

log = logging.getLogger("tenure.tracing")

# W3C Trace Context only (no baggage): what crosses a process boundary is the trace's position.
_PROPAGATOR = TraceContextTextMapPropagator()
Headers = tuple[tuple[str, bytes], ...]
TRACE_HEADERS = ("traceparent", "tracestate")
_TRACER_NAME = "tenure"
# How many aggregates' last decided context a process keeps for the work they cause (remember).
_REMEMBERED = 10_000

_lock = threading.Lock()
_tracer: trace.Tracer | None = None
_provider: TracerProvider | None = None
_remembered: OrderedDict[str, Context] = OrderedDict()
# The decisions a processor thread made since its last commit (decide_span -> commit_span).
_batch = threading.local()


# --- configuration ------------------------------------------------------------------------------


def _default_service_name() -> str:
    """`python -m services.lease_coordinator` -> tenure-lease-coordinator (the processes' app ids)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    module = getattr(spec, "name", "") or ""
    parts = [p for p in module.split(".") if p not in ("services", "__main__")]
    return "tenure-" + parts[0].replace("_", "-") if parts else "tenure"


def _exporter_for(choice: str, endpoint: str, timeout_s: float) -> tuple[SpanExporter, bool] | None:
    """(exporter, export synchronously) for a TENURE_OTEL_EXPORTER value; None: off."""
    if choice == "none":
        return None
    if choice == "console":
        return ConsoleSpanExporter(), True
    if choice.startswith("file:"):
        # Synchronous: each span is on disk when it ends, so a test (or an operator's tail -f)
        # sees it without waiting for a batch or for the process to exit.
        return JsonLinesSpanExporter(Path(choice.removeprefix("file:"))), True
    if choice == "otlp":
        # Imported only when chosen: a deployment without the package, or without a collector,
        # starts the same (a collector that is away costs only the spans it would have had).
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint or None, timeout=timeout_s)
        return exporter, False
    raise ValueError(f"TENURE_OTEL_EXPORTER={choice!r}: expected none, otlp, console or file:<path>")


def configure_tracing(
    service_name: str | None = None,
    *,
    settings: TenureSettings | None = None,
    exporter: SpanExporter | None = None,
) -> bool:
    """Set this process's tracer from the settings (or around `exporter`, for tests); whether
    spans are recorded. A misconfigured or unloadable exporter is logged and tracing stays off:
    tracing never stops a process from starting."""
    global _tracer, _provider
    name = service_name or "tenure"
    try:
        settings = settings or TenureSettings()
        name = service_name or settings.otel_service_name or _default_service_name()
        chosen = (
            (exporter, True)
            if exporter is not None
            else _exporter_for(settings.otel_exporter, settings.otel_endpoint, settings.otel_export_timeout_s)
        )
    except Exception as exc:  # ImportError of the OTLP package, a bad value: never a poison command
        log.warning("tracing is off: %s", exc)
        chosen = None
    with _lock:
        old, _provider, _tracer = _provider, None, trace.NoOpTracer()
        if chosen is not None:
            span_exporter, synchronous = chosen
            provider = TracerProvider(resource=Resource.create({"service.name": name}), shutdown_on_exit=True)
            processor = (
                SimpleSpanProcessor(span_exporter) if synchronous else BatchSpanProcessor(span_exporter)
            )
            provider.add_span_processor(processor)
            _provider, _tracer = provider, provider.get_tracer(_TRACER_NAME)
    if old is not None:
        old.shutdown()
    return chosen is not None


def reset_tracing() -> None:
    """Forget the configuration (flushing what was recorded): the next use reads it again."""
    global _tracer, _provider
    with _lock:
        old, _provider, _tracer = _provider, None, None
        _remembered.clear()
    if old is not None:
        old.shutdown()


def _get_tracer() -> trace.Tracer:
    tracer = _tracer
    if tracer is None:
        configure_tracing()
        tracer = _tracer
    assert tracer is not None
    return tracer


# --- spans ------------------------------------------------------------------------------------


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, str | int | float | bool]:
    """Attributes OpenTelemetry accepts; empty and None values left out."""
    out: dict[str, str | int | float | bool] = {}
    for key, value in (attributes or {}).items():
        if value is None or value == "":
            continue
        out[key] = value if isinstance(value, (str, int, float, bool)) else str(value)
    return out


def _recording() -> bool:
    if _tracer is None:
        configure_tracing()
    return _provider is not None


class _PassThrough(AbstractContextManager[Span]):
    """Tracing off: no span, only `parent` made current while the block runs (so what the block
    sends carries the caller's context on unchanged). Cheap: every command goes through it."""

    __slots__ = ("_parent", "_token")

    def __init__(self, parent: Context | None) -> None:
        self._parent = parent
        self._token: Token[Context] | None = None

    def __enter__(self) -> Span:
        if self._parent is None:
            return trace.get_current_span()
        self._token = otel_context.attach(self._parent)
        return trace.get_current_span(self._parent)

    def __exit__(self, *_: object) -> None:
        if self._token is not None:
            otel_context.detach(self._token)
            self._token = None


@contextmanager
def _recorded_span(
    name: str, attributes: Mapping[str, Any] | None, kind: SpanKind, parent: Context | None
) -> Iterator[Span]:
    with _get_tracer().start_as_current_span(
        name, context=parent, kind=kind, attributes=_clean(attributes)
    ) as current:
        yield current


def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    parent: Context | None = None,
) -> AbstractContextManager[Span]:
    """A span, current while the block runs: a child of `parent`, else of the current span."""
    if not _recording():
        return _PassThrough(parent)
    return _recorded_span(name, attributes, kind, parent)


class _HeaderGetter(Getter[Any]):
    """Reads Kafka headers (pairs of str and bytes) and HTTP headers (a mapping of str)."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        if isinstance(carrier, Mapping):
            value = carrier.get(key)
            return [value] if isinstance(value, str) else None
        found = [
            v.decode("latin-1") if isinstance(v, bytes) else str(v)
            for k, v in carrier
            if (k.decode("latin-1") if isinstance(k, bytes) else k).lower() == key
        ]
        return found or None

    def keys(self, carrier: Any) -> list[str]:
        if isinstance(carrier, Mapping):
            return list(carrier)
        return [k.decode("latin-1") if isinstance(k, bytes) else k for k, _ in carrier]


_GETTER = _HeaderGetter()


def extract(headers: Headers | Sequence[tuple[Any, Any]] | Mapping[str, str]) -> Context:
    """The trace context a carrier names (an empty context when it names none, or garbage)."""
    return _PROPAGATOR.extract(headers, getter=_GETTER)


def _carried(headers: Headers | Sequence[tuple[Any, Any]] | Mapping[str, str]) -> Context | None:
    """The context the headers carry, None when they carry no traceparent (the common case when
    tracing is off: no parsing at all)."""
    return extract(headers) if _GETTER.get(headers, "traceparent") else None


def start_span_from_headers(
    name: str,
    headers: Headers | Sequence[tuple[Any, Any]] | Mapping[str, str],
    attributes: Mapping[str, Any] | None = None,
    *,
    kind: SpanKind = SpanKind.CONSUMER,
) -> AbstractContextManager[Span]:
    """A span continuing the trace the headers carry (a root span when they carry none)."""
    if not _recording():
        return _PassThrough(_carried(headers))
    return _recorded_span(name, attributes, kind, extract(headers))


def _attributes_of(command: object) -> dict[str, Any]:
    """What a span says about a command or event: its run, attempt, epoch and type."""
    epoch = getattr(command, "lease_epoch", None)
    return {
        "tenure.command.type": type(command).__name__,
        "tenure.command.id": getattr(command, "command_id", None),
        "tenure.run.id": getattr(command, "run_id", None),
        "tenure.attempt.id": getattr(command, "attempt_id", None) or None,
        "tenure.epoch": epoch if epoch is not None else getattr(command, "epoch", None),
    }


def _decided() -> list[SpanContext]:
    pending: list[SpanContext] | None = getattr(_batch, "decided", None)
    if pending is None:
        pending = _batch.decided = []
    return pending


def decide_span(record: InboundRecord, command: object) -> AbstractContextManager[Span]:
    """The span of one command's decision by a processor, continuing the trace its record's
    headers carry, with the command's run, attempt, epoch and type and the record's position.
    The batch's `commit_span` links to it."""
    if not _recording():
        return _PassThrough(_carried(record.headers))
    return _decide_span(record, command)


@contextmanager
def _decide_span(record: InboundRecord, command: object) -> Iterator[Span]:
    with start_span_from_headers(
        f"decide {type(command).__name__}",
        record.headers,
        {
            **_attributes_of(command),
            "messaging.system": "kafka",
            "messaging.destination.name": record.topic,
            "messaging.destination.partition.id": str(record.partition),
            "messaging.kafka.offset": record.offset,
        },
    ) as current:
        if current.is_recording():
            _decided().append(current.get_span_context())
        yield current


def commit_span(aggregate: str, records: int) -> AbstractContextManager[None]:
    """The span of a batch's Kafka transaction, linked to the decisions it commits (those this
    thread recorded since its last commit): a batch holds commands of many traces, so it is a
    root of its own, as OpenTelemetry's messaging conventions have it. Nothing when tracing is
    off or the batch decided nothing traced (a timer tick)."""
    decided: list[SpanContext] | None = getattr(_batch, "decided", None)
    if not decided:
        return nullcontext()
    links, decided[:] = [Link(c) for c in decided], []
    return _commit_span(aggregate, records, links)


@contextmanager
def _commit_span(aggregate: str, records: int, links: list[Link]) -> Iterator[None]:
    with _get_tracer().start_as_current_span(
        f"commit {aggregate}",
        context=Context(),
        kind=SpanKind.PRODUCER,
        links=links,
        attributes={"messaging.system": "kafka", "messaging.batch.message_count": records},
    ):
        yield


def annotate(attributes: Mapping[str, Any] | None = None, *, command: object | None = None) -> None:
    """Add attributes (and those of `command`: run, attempt, epoch, type) to the current span;
    nothing when it does not record."""
    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes(
            _clean({**(_attributes_of(command) if command is not None else {}), **(attributes or {})})
        )


def _carrier() -> dict[str, str]:
    carrier: dict[str, str] = {}
    if trace.get_current_span().get_span_context().is_valid:  # outside a trace: nothing to carry
        _PROPAGATOR.inject(carrier)
    return carrier


def current_traceparent() -> str | None:
    """The current context as a `traceparent` value, None outside any trace."""
    return _carrier().get("traceparent")


def inject_into_headers(headers: Headers) -> Headers:
    """Kafka headers with the current trace context in place of any they had (unchanged outside
    a trace, so an untraced record costs no bytes)."""
    carrier = _carrier()
    if not carrier:
        return headers
    kept = tuple((k, v) for k, v in headers if k not in TRACE_HEADERS)
    return kept + tuple((k, v.encode("ascii")) for k, v in carrier.items())


def inject_into_http(headers: MutableMapping[str, str] | None = None) -> MutableMapping[str, str]:
    """HTTP request headers with the current trace context added."""
    out: MutableMapping[str, str] = {} if headers is None else headers
    out.update(_carrier())
    return out


def traced_record(record: OutboundRecord) -> OutboundRecord:
    """`record` carrying the current trace context in its headers."""
    headers = inject_into_headers(record.headers)
    return record if headers is record.headers else replace(record, headers=headers)


def traced_records(records: Sequence[OutboundRecord]) -> list[OutboundRecord]:
    return [traced_record(r) for r in records]


# --- from a decision to the work it causes (the saga executor) ----------------------------------


def remember(key: str) -> None:
    """Keep the current context as the last one that changed aggregate `key` (bounded, in
    memory: after a restart the work a state calls for starts a trace of its own)."""
    current = otel_context.get_current()
    if not trace.get_current_span(current).get_span_context().is_valid:
        return
    with _lock:
        _remembered[key] = current
        _remembered.move_to_end(key)
        while len(_remembered) > _REMEMBERED:
            _remembered.popitem(last=False)


def recall(key: str) -> Context | None:
    with _lock:
        return _remembered.get(key)


def traced_as(key: str, records: Iterable[OutboundRecord]) -> list[OutboundRecord]:
    """`records` carrying the context last remembered for aggregate `key`: what a processor
    publishes after its commit (an incident of a frozen trajectory) continues the trace of the
    decision that called for it. Unchanged when none is remembered (tracing off, a timer)."""
    remembered = recall(key)
    if remembered is None:
        return list(records)
    token = otel_context.attach(remembered)
    try:
        return [traced_record(r) for r in records]
    finally:
        otel_context.detach(token)


# --- HTTP servers -------------------------------------------------------------------------------

_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


# What a tool request's headers say about the effect (services/effect_gateway/tools.py).
_HTTP_ATTRIBUTES = (
    ("idempotency-key", "tenure.idempotency_key"),
    ("x-fencing-epoch", "tenure.epoch"),
    ("x-work-id", "tenure.run.id"),
)


class TracingMiddleware:
    """A SERVER span per HTTP request, continuing the caller's `traceparent` (pure ASGI, so the
    span is current in the route and everything it awaits: the records it publishes, the
    requests it makes)."""

    def __init__(self, app: Callable[[_Scope, _Receive, _Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        method = str(scope.get("method", "GET"))
        path = str(scope.get("path", ""))
        status: dict[str, int] = {}

        async def sending(message: MutableMapping[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                status["code"] = int(message.get("status", 0))
            await send(message)

        headers = scope.get("headers") or ()
        attributes: dict[str, Any] = {"http.request.method": method, "url.path": path}
        for name, attribute in _HTTP_ATTRIBUTES:
            found = _GETTER.get(headers, name)
            if found:
                attributes[attribute] = found[0][:200]
        with start_span_from_headers(
            f"{method} {path}", headers, attributes, kind=SpanKind.SERVER
        ) as current:
            try:
                await self.app(scope, receive, sending)
            finally:
                if current.is_recording():
                    route = getattr(scope.get("route"), "path", None)
                    if isinstance(route, str):
                        # The route template, not the path: one span name per endpoint.
                        current.update_name(f"{method} {route}")
                        current.set_attribute("http.route", route)
                    if "code" in status:
                        current.set_attribute("http.response.status_code", status["code"])
                        if status["code"] >= 500:
                            current.set_status(Status(StatusCode.ERROR))


# --- the file exporter ------------------------------------------------------------------------


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


class JsonLinesSpanExporter(SpanExporter):
    """Appends each finished span to `path` as one JSON line (one write per batch on an O_APPEND
    descriptor, so several processes can share the file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(self.as_json(s), separators=(",", ":")) + "\n" for s in spans)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, lines.encode("utf-8"))
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("spans not written to %s: %s", self.path, exc)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    @staticmethod
    def as_json(s: ReadableSpan) -> dict[str, Any]:
        ctx = s.get_span_context()
        assert ctx is not None
        return {
            "name": s.name,
            "service": s.resource.attributes.get("service.name"),
            "traceId": _hex(ctx.trace_id, 32),
            "spanId": _hex(ctx.span_id, 16),
            "parentSpanId": _hex(s.parent.span_id, 16) if s.parent is not None else None,
            "kind": s.kind.name,
            "startNs": s.start_time,
            "endNs": s.end_time,
            "status": s.status.status_code.name,
            "attributes": dict(s.attributes or {}),
            "links": [
                {"traceId": _hex(link.context.trace_id, 32), "spanId": _hex(link.context.span_id, 16)}
                for link in s.links
            ],
        }

    def shutdown(self) -> None:
        return None
