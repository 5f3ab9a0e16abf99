"""Prometheus on every process (issue 17): real processes on the real broker, scraped after a run
was submitted, claimed and renewed.

The lease coordinator and the projector serve /metrics on their health ports, the API, the
effect gateway and the fenced ledger on their HTTP apps; every one carries the process collector
(`process_cpu_seconds_total`). The coordinator's lease counters moved by what it committed
(LEASE-2: a grant and a renewal), its batches were timed and its consumer lag reported per
partition; the API and the gateway counted their requests by route template and status.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest
from confluent_kafka import KafkaException

from services.breakers.client import BreakerClient
from services.common.contracts import TRANSPORT_FAILURE
from services.common.topics import RUNS_EVENTS
from tests.support.system import ServiceProcess, service_env, wait_for_ready, wait_until
from tests.support.tenure import TenureSystem, claim, free_port, heartbeat, submit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def scrape(url: str) -> str:
    response = httpx.get(f"{url}/metrics", timeout=5)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the series `name{labels}` (labels in any order), None when absent."""
    for line in text.splitlines():
        match = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if match is None or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(3))
    return None


def test_every_process_serves_metrics_and_the_counters_move_after_a_command_lease_2(
    tenure_topics: str, tmp_path: Path
) -> None:
    coordinator_port, projections_port = free_port(), free_port()
    system = TenureSystem(
        tenure_topics,
        tmp_path,
        gateway=True,
        TENURE_COORDINATOR_HEALTH_PORT=str(coordinator_port),
        TENURE_PROJECTIONS_HEALTH_PORT=str(projections_port),
    ).start()
    coordinator = f"http://127.0.0.1:{coordinator_port}"
    try:
        with system.client() as api:
            run = submit(api, "metrics-1")
            grant = claim(api, run["runId"])
            assert grant.status_code == 201, grant.text
            assert heartbeat(api, grant.json(), 1).status_code == 200
        gateway = httpx.get(f"{system.gateway_url}/runs/{run['runId']}/fencing", timeout=5)
        assert gateway.status_code == 200, gateway.text

        def renewed() -> str | None:
            text = scrape(coordinator)
            return text if sample(text, "tenure_lease_renewals_total") else None

        text = wait_until(renewed, 30, "the coordinator's renewal counter")
        assert sample(text, "tenure_lease_grants_total", via="claim") == 1
        assert sample(text, "tenure_lease_renewals_total") == 1
        assert (sample(text, "tenure_processor_batch_seconds_count", aggregate="run") or 0) >= 3
        assert (sample(text, "tenure_processor_transaction_seconds_count", aggregate="run") or 0) >= 3
        lags = [line for line in text.splitlines() if line.startswith("tenure_consumer_lag_records{")]
        assert lags and all(line.endswith(" 0.0") for line in lags), lags
        assert "process_cpu_seconds_total" in text

        text = scrape(system.base)
        assert sample(text, "tenure_http_requests_total", route="/runs", method="POST", status="201") == 1
        route = "/runs/{run_id}/attempts"
        assert sample(text, "tenure_http_requests_total", route=route, method="POST", status="201") == 1
        assert sample(text, "tenure_http_request_duration_seconds_count", route=route, method="POST") == 1
        assert "process_cpu_seconds_total" in text

        # The API's own log followers report their lag too (measured each second by the
        # follower): its views of runs.events, every partition, caught up.
        def views_caught_up() -> list[str] | None:
            views = [
                line
                for line in scrape(system.base).splitlines()
                if line.startswith("tenure_follower_lag_records{")
                and 'follower="tenure-api-views"' in line
                and 'topic="runs.events"' in line
            ]
            current = len(views) == RUNS_EVENTS.partitions and all(v.endswith(" 0.0") for v in views)
            return views if current else None

        wait_until(views_caught_up, 15, "the API's views follower reporting no lag")

        text = scrape(system.gateway_url)
        route = "/runs/{run_id}/fencing"
        assert sample(text, "tenure_http_requests_total", route=route, method="GET", status="200") == 1
        assert "process_cpu_seconds_total" in text and run["runId"] not in text
        assert any(line.startswith("tenure_follower_lag_records{") for line in text.splitlines()), text

        for url in (system.ledger_url, f"http://127.0.0.1:{projections_port}"):
            assert "process_cpu_seconds_total" in scrape(url), url
    finally:
        system.stop()


def test_the_breakers_process_reports_each_breakers_state_from_its_store_brk_1(
    tenure_topics: str, tmp_path: Path
) -> None:
    endpoint = f"metrics-{time.time_ns()}/search"
    port = free_port()
    env = service_env(
        tenure_topics,
        tmp_path / "state",
        TENURE_BREAKERS_HEALTH_PORT=str(port),
        TENURE_BREAKER_MIN_CALLS="10",
    )
    breakers = ServiceProcess("breakers", "services.breakers", env, tmp_path).start()
    client: BreakerClient | None = None
    try:
        assert wait_for_ready(port, 90, breakers)["service"] == "tenure-breakers"
        deadline = time.monotonic() + 30
        while client is None:  # a fresh broker's partitions may not have answering leaders yet
            try:
                client = BreakerClient.connect(tenure_topics, "gw-metrics")
            except (KafkaException, RuntimeError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        for _ in range(10):
            future = client.record_outcome(endpoint, TRANSPORT_FAILURE, 5_000, "HTTP 503")
            assert future is not None
            future.result(30)
        url = f"http://127.0.0.1:{port}"

        def opened() -> str | None:
            text = scrape(url)
            return text if sample(text, "tenure_breaker_state", endpoint=endpoint, state="open") else None

        text = wait_until(opened, 30, "the breaker's open state on /metrics")
        assert sample(text, "tenure_breaker_state", endpoint=endpoint, state="closed") == 0
        assert (sample(text, "tenure_processor_events_total", aggregate="breaker") or 0) >= 11
        assert "process_cpu_seconds_total" in text
    finally:
        if client is not None:
            client.close()
        breakers.stop()
