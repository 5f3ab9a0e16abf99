"""OpenTelemetry trace context across Tenure's boundaries (issue 17, services/common/tracing.py).

The W3C `traceparent` round trip through Kafka headers and HTTP headers, the HTTP middleware,
a processor's decision span and its output records, the gateway's call to a tool, and the
exporter being optional: off, nothing is recorded or exported and nothing fails; a collector
that is away or an exporter package that is missing never stops a process.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common import tracing
from services.common.clock import ManualClock
from services.common.eventlog import MemoryEventLog
from services.common.kafka import InboundRecord, OutboundRecord
from services.common.messages import MessageCodec
from services.common.routing import command_record
from services.common.settings import TenureSettings
from services.common.store import MemoryStore
from services.common.topics import RUNS_EVENTS
from services.effect_gateway.tools import ToolRegistry
from services.lease_coordinator.processor import RunCommandProcessor

from .strategies import submit_command

pytestmark = pytest.mark.timeout(60)


def header_value(headers: tuple[tuple[str, bytes], ...], name: str) -> bytes | None:
    return dict(headers).get(name)


CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    assert tracing.configure_tracing("tenure-test", exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.reset_tracing()


@pytest.fixture
def tracing_off() -> Iterator[None]:
    assert not tracing.configure_tracing("tenure-test", settings=TenureSettings(otel_exporter="none"))
    try:
        yield
    finally:
        tracing.reset_tracing()


def _ids(traceparent: str) -> tuple[str, str]:
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00" and int(flags, 16) & 1  # sampled (bit 1: a random trace id)
    return trace_id, span_id


def test_kafka_headers_round_trip_the_trace_context(spans: InMemorySpanExporter) -> None:
    with tracing.span("publish") as parent:
        headers = tracing.inject_into_headers((("contract", b"x"),))
    assert headers[0] == ("contract", b"x")  # the record's own headers are kept
    traceparent = dict(headers)["traceparent"].decode()
    with tracing.start_span_from_headers("decide", headers) as child:
        assert child.get_span_context().trace_id == parent.get_span_context().trace_id
    finished = {s.name: s for s in spans.get_finished_spans()}
    assert finished["decide"].parent is not None
    assert finished["decide"].parent.span_id == parent.get_span_context().span_id
    assert _ids(traceparent) == (
        format(parent.get_span_context().trace_id, "032x"),
        format(parent.get_span_context().span_id, "016x"),
    )


def test_http_headers_round_trip_and_a_record_keeps_one_traceparent(spans: InMemorySpanExporter) -> None:
    with tracing.start_span_from_headers("server", {"traceparent": TRACEPARENT}):
        sent = tracing.inject_into_http({"Idempotency-Key": "k"})
        record = tracing.traced_record(OutboundRecord("t", b"k", b"v", (("traceparent", b"stale"),)))
    assert sent["Idempotency-Key"] == "k" and _ids(sent["traceparent"])[0] == CALLER_TRACE
    assert [k for k, _ in record.headers].count("traceparent") == 1
    assert header_value(record.headers, "traceparent") == sent["traceparent"].encode()
    (server,) = spans.get_finished_spans()
    assert server.parent is not None and format(server.parent.span_id, "016x") == CALLER_SPAN


def test_outside_a_trace_records_are_unchanged_and_garbage_starts_a_root(spans: InMemorySpanExporter) -> None:
    record = OutboundRecord("t", b"k", b"v", (("contract", b"x"),))
    assert tracing.traced_record(record) is record
    assert tracing.current_traceparent() is None
    with tracing.start_span_from_headers("root", (("traceparent", b"not-a-traceparent"),)) as root:
        assert root.get_span_context().is_valid
    (finished,) = spans.get_finished_spans()
    assert finished.parent is None


def test_with_the_exporter_off_nothing_is_recorded_and_context_passes_through(
    tracing_off: None, tmp_path: Path
) -> None:
    with tracing.start_span_from_headers("decide", (("traceparent", TRACEPARENT.encode()),)) as current:
        assert not current.is_recording()
        tracing.annotate({"tenure.run.id": "run_x"})  # a no-op, not an error
        # The caller's context passes through unchanged: a downstream collector still sees one trace.
        assert tracing.current_traceparent() == TRACEPARENT
    with tracing.span("root") as root:
        assert not root.is_recording() and not root.get_span_context().is_valid
        assert tracing.inject_into_headers(()) == ()  # nothing to carry: no bytes added
    assert not list(tmp_path.iterdir())


def test_the_file_exporter_writes_json_lines_and_none_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    try:
        assert tracing.configure_tracing("tenure-a", settings=TenureSettings(otel_exporter=f"file:{path}"))
        with tracing.start_span_from_headers("decide", {"traceparent": TRACEPARENT}, {"tenure.epoch": 3}):
            pass
        (line,) = path.read_text().splitlines()
        span = json.loads(line)
        assert (span["name"], span["service"], span["traceId"], span["parentSpanId"]) == (
            "decide",
            "tenure-a",
            CALLER_TRACE,
            CALLER_SPAN,
        )
        assert span["attributes"] == {"tenure.epoch": 3} and span["kind"] == "CONSUMER"
        tracing.configure_tracing("tenure-a", settings=TenureSettings(otel_exporter="none"))
        with tracing.start_span_from_headers("decide", {"traceparent": TRACEPARENT}):
            pass
        assert len(path.read_text().splitlines()) == 1  # off: nothing more exported
    finally:
        tracing.reset_tracing()


def test_no_collector_or_no_exporter_package_never_breaks_start_up(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    try:
        # A collector that is not there: spans are batched and lost, nothing raises.
        settings = TenureSettings(
            otel_exporter="otlp", otel_endpoint="http://127.0.0.1:9/v1/traces", otel_export_timeout_s=0.5
        )
        assert tracing.configure_tracing("tenure-a", settings=settings)
        with tracing.span("lost"):
            pass
        tracing.reset_tracing()
        # The exporter package missing: tracing is off, said once, and the process goes on.
        monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
        with caplog.at_level("WARNING", logger="tenure.tracing"):
            assert not tracing.configure_tracing("tenure-a", settings=settings)
        assert "tracing is off" in caplog.text
        with tracing.span("nothing") as current:
            assert not current.is_recording()
    finally:
        tracing.reset_tracing()


def test_a_bad_exporter_setting_is_refused_by_the_settings() -> None:
    with pytest.raises(ValueError):
        TenureSettings(otel_exporter="jaeger")


def test_the_http_middleware_continues_the_callers_trace(spans: InMemorySpanExporter) -> None:
    app = FastAPI()

    @app.get("/things/{thing}")
    async def thing(thing: str) -> dict[str, str]:
        return dict(tracing.inject_into_http())

    app.add_middleware(tracing.TracingMiddleware)
    with TestClient(app) as client:
        seen = client.get("/things/t1", headers={"traceparent": TRACEPARENT}).json()
        client.get("/things/t2")  # no traceparent: a root span of its own
    (first, second) = spans.get_finished_spans()
    assert first.name == "GET /things/{thing}" and first.kind is tracing.SpanKind.SERVER
    assert first.attributes is not None and first.attributes["http.response.status_code"] == 200
    assert first.parent is not None and format(first.parent.span_id, "016x") == CALLER_SPAN
    # What the route passes on is the server span: a child of the caller, in its trace.
    assert _ids(seen["traceparent"]) == (CALLER_TRACE, format(first.context.span_id, "016x"))
    assert second.parent is None and second.context.trace_id != first.context.trace_id


def test_a_decision_continues_the_commands_trace_and_its_events_carry_it(
    spans: InMemorySpanExporter,
) -> None:
    codec = MessageCodec()
    command = submit_command("acme", "trace-1")
    with tracing.span("api request") as api:
        record = command_record(codec, command)  # routing injects the request's context
    log = MemoryEventLog()
    processor = RunCommandProcessor(log, MemoryStore(), codec, ManualClock())
    inbound = InboundRecord(record.topic, record.partition or 0, 7, record.key, record.value, record.headers)
    assert processor.handle([inbound]).accepted == 1
    decide = next(s for s in spans.get_finished_spans() if s.name == "decide SubmitRun")
    assert decide.parent is not None and decide.parent.span_id == api.get_span_context().span_id
    assert decide.context.trace_id == api.get_span_context().trace_id
    attributes = dict(decide.attributes or {})
    assert attributes["tenure.run.id"] == command.run_id
    assert attributes["tenure.command.type"] == "SubmitRun"
    assert attributes["messaging.kafka.offset"] == 7
    assert attributes["messaging.destination.partition.id"] == str(inbound.partition)
    # The batch's transaction is a span of its own, linked to the decisions it commits.
    (commit,) = [s for s in spans.get_finished_spans() if s.name.startswith("commit ")]
    assert commit.parent is None and [link.context.span_id for link in commit.links] == [
        decide.context.span_id
    ]
    (event,) = [r for (topic, _), rs in log.topics.items() if topic == RUNS_EVENTS.name for r in rs]
    carried = header_value(event.headers, "traceparent")
    assert carried is not None
    assert _ids(carried.decode()) == (
        format(decide.context.trace_id, "032x"),
        format(decide.context.span_id, "016x"),
    )


def test_the_gateway_passes_the_trace_to_the_tool(spans: InMemorySpanExporter) -> None:
    received: list[httpx.Request] = []

    def tool(request: httpx.Request) -> httpx.Response:
        received.append(request)
        return httpx.Response(200, json={"ok": True})

    async def call() -> None:
        tools = ToolRegistry({"env": "http://tool.test"}, transport=httpx.MockTransport(tool))
        with tracing.start_span_from_headers("POST /effects", {"traceparent": TRACEPARENT}):
            answer = await tools.dispatch("env", "run_x", 4, "run_x/s0/d1", "vm.provision", {})
        assert answer.status == 200
        await tools.close()

    asyncio.run(call())
    (request,) = received
    assert request.headers["Idempotency-Key"] == "run_x/s0/d1"
    client = next(s for s in spans.get_finished_spans() if s.name == "tool env")
    assert client.kind is tracing.SpanKind.CLIENT
    assert dict(client.attributes or {})["tenure.epoch"] == 4
    assert _ids(request.headers["traceparent"]) == (CALLER_TRACE, format(client.context.span_id, "016x"))


def test_what_a_processor_publishes_after_its_commit_continues_the_deciding_trace(
    spans: InMemorySpanExporter,
) -> None:
    """An incident published after the commit (`traced_as`) carries the context remembered for
    its aggregate by the decision; with none remembered (a timer's work) it is unchanged."""
    with tracing.start_span_from_headers("decide", {"traceparent": TRACEPARENT}) as decided:
        tracing.remember("run-traced")
    incident = OutboundRecord("tenure.incidents", b"run-traced", b"{}", (("contract", b"x"),))
    (published,) = tracing.traced_as("run-traced", [incident])
    traceparent = header_value(published.headers, "traceparent")
    assert traceparent is not None
    assert _ids(traceparent.decode()) == (CALLER_TRACE, format(decided.get_span_context().span_id, "016x"))
    assert header_value(published.headers, "contract") == b"x"
    assert tracing.traced_as("run-never-decided", [incident]) == [incident]
