"""One trace from an HTTP request to a tool call (issue 17, Observability: tracing).

Real processes on a real broker (tests/support/saga_system.py), each exporting its finished spans
as JSON lines to one file (TENURE_OTEL_EXPORTER=file:<path>). A runner proposes a trajectory step
with a `traceparent` of its own; that one trace then holds the API's request, the saga
orchestrator's decision of the step and its dispatch to the effect gateway, the gateway's request,
the lease coordinator's decision of the effect's intent, the gateway's call to the tool and the
tool's own request, each the child of the one before it (W3C Trace Context through HTTP headers
and Kafka record headers).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.runner_sdk import TenureClient, TrajectoryClient
from tests.support.saga_system import RUNNER_KEY, SagaSystem
from tests.support.tenure import submit

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TRACE_ID = uuid.uuid4().hex
CALLER_SPAN = uuid.uuid4().hex[:16]


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SagaSystem, Path]]:
    tmp = tmp_path_factory.mktemp("tracing")
    spans = tmp / "spans.jsonl"
    s = SagaSystem(tenure_topics, tmp)
    for service in s.services:
        service.env["TENURE_OTEL_EXPORTER"] = f"file:{spans}"
    s.start()
    try:
        yield s, spans
    finally:
        s.stop()


def all_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def spans_of(path: Path, trace_id: str) -> list[dict[str, Any]]:
    return [s for s in all_spans(path) if s["traceId"] == trace_id]


def one(spans: list[dict[str, Any]], service: str, name: str, parent: dict[str, Any] | str) -> dict[str, Any]:
    """The span of `service` named `name` whose parent is `parent` (a span or a span id)."""
    parent_id = parent if isinstance(parent, str) else parent["spanId"]
    found = [
        s for s in spans if s["service"] == service and s["name"] == name and s["parentSpanId"] == parent_id
    ]
    assert found, f"no {service} span {name!r} under {parent_id}; the trace has: " + "; ".join(
        f"{s['service']} {s['name']} {s['spanId']}<-{s['parentSpanId']}" for s in spans
    )
    return found[0]


def test_a_trace_spans_api_saga_gateway_coordinator_and_tool(system: tuple[SagaSystem, Path]) -> None:
    saga, path = system
    with (
        saga.client(RUNNER_KEY) as http,
        TenureClient(saga.base, saga.gateway_url, api_key=RUNNER_KEY) as runs,
    ):
        run = submit(http, f"trace-{uuid.uuid4()}")
        lease = runs.claim(run["runId"], "runner-1", [], lease_seconds=120, heartbeat_seconds=60)
        with TrajectoryClient(saga.base, api_key=RUNNER_KEY) as trajectories:
            trajectories.start_trajectory(lease)
            proposed = http.post(
                f"/runs/{lease.run_id}/trajectory/steps",
                headers={
                    "Idempotency-Key": uuid.uuid4().hex,
                    "traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01",
                },
                json={
                    "attemptId": lease.attempt_id,
                    "leaseEpoch": lease.epoch,
                    "tool": "cache.warm",
                    "params": {"name": "traced"},
                },
            )
            assert proposed.status_code in (200, 201, 202), proposed.text
            step = trajectories.wait_for_step(lease.run_id, proposed.json()["stepIndex"], timeout_s=60)
            assert step.committed, step

    # The step's outcome is reported last (a span ends when its work is done): wait for it.
    deadline = time.monotonic() + 20
    spans: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        spans = spans_of(path, TRACE_ID)
        if any(s["name"] == "decide RecordStepOutcome" for s in spans):
            break
        time.sleep(0.2)

    api = one(spans, "tenure-command-api", "POST /runs/{run_id}/trajectory/steps", CALLER_SPAN)
    assert api["kind"] == "SERVER" and api["attributes"]["tenure.run.id"] == lease.run_id
    assert api["attributes"]["http.response.status_code"] == proposed.status_code

    # Through trajectories.commands: the orchestrator decides the step as the request's child.
    decided = one(spans, "tenure-saga-orchestrator", "decide ProposeStep", api)
    assert decided["kind"] == "CONSUMER"
    assert decided["attributes"]["tenure.run.id"] == lease.run_id
    assert decided["attributes"]["tenure.epoch"] == lease.epoch
    assert decided["attributes"]["messaging.destination.name"].endswith("trajectories.commands")
    assert "messaging.kafka.offset" in decided["attributes"]

    # The work the decision calls for, and its request to the gateway.
    work = one(spans, "tenure-saga-orchestrator", "saga DispatchStep", decided)
    assert work["attributes"]["tenure.attempt.id"] == lease.attempt_id
    call = one(spans, "tenure-saga-orchestrator", "POST gateway", work)
    gateway = one(spans, "tenure-effect-gateway", "POST /effects", call)
    assert gateway["attributes"]["tenure.run.id"] == lease.run_id
    assert gateway["attributes"]["tenure.epoch"] == lease.epoch
    assert gateway["attributes"]["tenure.tool"] == "env"

    # Through runs.commands: the coordinator records the intent inside the gateway's request.
    intent = one(spans, "tenure-lease-coordinator", "decide RecordEffectIntent", gateway)
    assert intent["attributes"]["tenure.attempt.id"] == lease.attempt_id
    # Its Kafka transaction is a span of the batch, linked to the decisions it committed.
    link = {"traceId": TRACE_ID, "spanId": intent["spanId"]}
    commits = [
        s for s in all_spans(path) if s["service"] == "tenure-lease-coordinator" and link in s["links"]
    ]
    assert [s["name"] for s in commits] == ["commit run"], commits

    # The tool call, and the tool's own request.
    tool_call = one(spans, "tenure-effect-gateway", "tool env", gateway)
    tool = one(spans, "tenure-sim-environment", "POST /effects", tool_call)
    assert tool["attributes"]["tenure.epoch"] == str(lease.epoch)

    # The report of the outcome goes back through trajectories.commands in the same trace.
    one(spans, "tenure-saga-orchestrator", "decide RecordStepOutcome", work)

    # Every span of the trace hangs off the caller's: no orphan within it.
    ids = {s["spanId"] for s in spans} | {CALLER_SPAN}
    assert all(s["parentSpanId"] in ids for s in spans), spans


def test_requests_without_traceparent_start_traces_of_their_own(system: tuple[SagaSystem, Path]) -> None:
    saga, path = system
    response = httpx.get(f"{saga.base}/healthz", timeout=10)
    assert response.status_code == 200
    deadline = time.monotonic() + 10
    health: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not health:
        health = [
            s for s in all_spans(path) if s["service"] == "tenure-command-api" and s["name"] == "GET /healthz"
        ]
        time.sleep(0.1)
    assert health and all(s["parentSpanId"] is None and s["traceId"] != TRACE_ID for s in health)


def test_a_submitted_run_is_decided_by_the_coordinator_in_the_callers_trace(
    system: tuple[SagaSystem, Path],
) -> None:
    saga, path = system
    trace_id, caller = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    key = f"trace-submit-{uuid.uuid4()}"
    with saga.client(RUNNER_KEY) as http:
        response = http.post(
            "/runs",
            headers={"Idempotency-Key": key, "traceparent": f"00-{trace_id}-{caller}-01"},
            json={"tenant": "acme", "executionSpec": {"agent": "demo", "key": key}, "timeoutSeconds": 600},
        )
    assert response.status_code == 201, response.text
    run_id = response.json()["runId"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(spans_of(path, trace_id)) < 2:
        time.sleep(0.1)
    spans = spans_of(path, trace_id)
    api = one(spans, "tenure-command-api", "POST /runs", caller)
    assert (
        api["attributes"]["tenure.command.type"] == "SubmitRun"
        and api["attributes"]["tenure.run.id"] == run_id
    )
    decided = one(spans, "tenure-lease-coordinator", "decide SubmitRun", api)
    assert decided["attributes"]["tenure.run.id"] == run_id
    assert decided["attributes"]["messaging.destination.name"].endswith("runs.commands")
