"""The processors' health server: /healthz, /readyz and /metrics (issue 10).

Liveness answers 200 while the process answers at all; readiness answers 200 with every check,
or 503 application/problem+json with Retry-After naming the failed checks (never a 500, even
when a check raises); /metrics is Prometheus text with the process collector and the
processors' own series. Anything else is a problem+json 404/405.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from services.common.health import (
    Check,
    DeferredReadiness,
    HealthServer,
    ProcessorMetrics,
    StreamMetrics,
    metrics_registry,
    serve_health,
)

CHECKS: list[Check] = []


@pytest.fixture()
def server() -> Iterator[tuple[HealthServer, ProcessorMetrics]]:
    registry = metrics_registry()
    metrics = ProcessorMetrics("run", registry)
    StreamMetrics("tenure-test", registry).assigned(4)
    CHECKS[:] = [Check("assignment", True, "runs.commands partitions [0, 1, 2, 3]")]
    health = HealthServer("tenure-test", lambda: CHECKS, registry, poll_interval_s=0.02).start()
    yield health, metrics
    health.close()


def url(server: HealthServer, path: str) -> str:
    return f"http://127.0.0.1:{server.port}{path}"


def test_healthz_is_liveness(server: tuple[HealthServer, ProcessorMetrics]) -> None:
    response = httpx.get(url(server[0], "/healthz"))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"status": "ok", "service": "tenure-test"}


def test_readyz_is_200_with_every_check_when_all_pass(server: tuple[HealthServer, ProcessorMetrics]) -> None:
    CHECKS.append(Check("restore", True, "partitions [0, 1, 2, 3] restored"))
    response = httpx.get(url(server[0], "/readyz"))
    assert response.status_code == 200
    assert response.json() == {
        "status": "ready",
        "service": "tenure-test",
        "checks": {
            "assignment": {"ok": True, "detail": "runs.commands partitions [0, 1, 2, 3]"},
            "restore": {"ok": True, "detail": "partitions [0, 1, 2, 3] restored"},
        },
    }


def test_readyz_is_a_503_problem_naming_the_failed_checks(
    server: tuple[HealthServer, ProcessorMetrics],
) -> None:
    CHECKS.append(Check("restore", False, "partitions [2] not restored yet"))
    response = httpx.get(url(server[0], "/readyz"))
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["retry-after"] == "1"
    body = response.json()
    assert body["type"] == "/problems/not-ready" and body["status"] == 503
    assert body["failed"] == ["restore"]
    assert body["detail"] == "restore: partitions [2] not restored yet"
    assert body["checks"]["assignment"]["ok"] is True and body["service"] == "tenure-test"
    described = httpx.get(url(server[0], body["type"]))
    assert described.status_code == 200 and described.json()["status"] == 503


def test_a_readiness_check_that_raises_is_a_503_not_a_500(
    server: tuple[HealthServer, ProcessorMetrics],
) -> None:
    registry = metrics_registry()

    def broken() -> list[Check]:
        raise RuntimeError("the check has a bug")

    health = HealthServer("tenure-test", broken, registry, poll_interval_s=0.02).start()
    try:
        response = httpx.get(url(health, "/readyz"))
    finally:
        health.close()
    assert response.status_code == 503
    assert response.json()["failed"] == ["readiness"]


def test_metrics_are_prometheus_text_with_process_and_processor_series(
    server: tuple[HealthServer, ProcessorMetrics],
) -> None:
    health, metrics = server
    metrics.batch({"accepted": 3, "failed": 1, "rejected": 0}, events=4)
    metrics.deadlettered("COMMAND_FAILED")
    metrics.transaction(0.004)
    metrics.restored(12, 0.05)
    response = httpx.get(url(health, "/metrics"))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    for line in (
        'tenure_processor_commands_total{aggregate="run",outcome="accepted"} 3.0',
        'tenure_processor_commands_total{aggregate="run",outcome="failed"} 1.0',
        'tenure_processor_batches_total{aggregate="run"} 1.0',
        'tenure_processor_events_total{aggregate="run"} 4.0',
        'tenure_deadletters_total{reason="COMMAND_FAILED"} 1.0',
        'tenure_processor_transaction_seconds_count{aggregate="run"} 1.0',
        'tenure_processor_restores_total{aggregate="run"} 1.0',
        'tenure_processor_restored_events_total{aggregate="run"} 12.0',
        'tenure_stream_assigned_partitions{app="tenure-test"} 4.0',
    ):
        assert line in text, line
    assert 'outcome="rejected"' not in text, "zero counts are not invented"
    assert "process_resident_memory_bytes" in text and "python_info" in text


def test_other_paths_and_methods_are_problems(server: tuple[HealthServer, ProcessorMetrics]) -> None:
    health = server[0]
    missing = httpx.get(url(health, "/nope"))
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"
    assert missing.json()["type"] == "/problems/not-found"
    with httpx.Client() as client:  # one keep-alive connection: a refused POST leaves it usable
        refused = client.post(url(health, "/readyz"), content=b'{"x": 1}')
        assert refused.status_code == 405 and refused.headers["allow"] == "GET, HEAD"
        assert refused.json()["type"] == "/problems/method-not-allowed"
        assert client.get(url(health, "/healthz")).status_code == 200
    head = httpx.head(url(health, "/healthz"))
    assert head.status_code == 200 and head.content == b""


def test_serve_health_is_off_on_port_0_and_survives_a_taken_port() -> None:
    registry = metrics_registry()
    assert serve_health("tenure-test", 0, lambda: [], registry) is None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert serve_health("tenure-test", port, lambda: [], registry) is None, "logged, not raised"
    health = serve_health("tenure-test", _free_port(), lambda: [], registry)
    assert health is not None
    try:
        assert json.loads(httpx.get(url(health, "/readyz")).text)["status"] == "ready"
    finally:
        health.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_starting_process_answers_503_startup_until_its_checks_are_handed_over() -> None:
    readiness = DeferredReadiness("connecting to Kafka")
    health = HealthServer("tenure-test", readiness, metrics_registry(), poll_interval_s=0.02).start()
    try:
        starting = httpx.get(url(health, "/readyz"))
        assert starting.status_code == 503
        assert starting.json()["failed"] == ["startup"]
        assert starting.json()["detail"] == "startup: connecting to Kafka"
        readiness.become(lambda: [Check("assignment", True, "partitions [0]")])
        assert httpx.get(url(health, "/readyz")).status_code == 200
    finally:
        health.close()
