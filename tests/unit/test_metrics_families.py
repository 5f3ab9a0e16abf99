"""Each Prometheus family drives its real code path and is read back from the process's registry.

Processors run over the in-memory twins (MemoryEventLog, MemoryStore, ManualClock) through the
same harnesses as their own unit tests; what the metrics see is what the aggregate runtime
committed (services/common/metrics.py `ProcessorMetrics.committed`), never the requests.
HTTP families are read from the apps' own /metrics (services/common/http_metrics.py).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from services.breakers.processor import BreakerProcessor
from services.common.aggregate import AggregateProcessor
from services.common.clock import ManualClock
from services.common.contracts import RecoveryDecided
from services.common.eventlog import MemoryEventLog
from services.common.http_metrics import install_http_metrics
from services.common.kafka import InboundRecord, OffsetsStalled
from services.common.messages import MessageCodec
from services.common.metrics import StreamMetrics
from services.common.store import MemoryStore
from services.common.topics import BREAKERS_COMMANDS, PROGRESS_OBSERVATIONS, SCHEDULES_COMMANDS
from services.schedules.processor import ScheduleProcessor
from services.sim_environment.app import create_app as sim_app
from services.watchdog.processor import WatchdogProcessor
from tests.support.api_harness import api_client
from tests.support.gateway import OfflineGateway, gateway_app
from tests.support.lease_run import claim_cmd, renew_cmd
from tests.unit.breakers import support as breaker
from tests.unit.schedules.contract_case import fresh as fresh_schedule
from tests.unit.test_lease_timers_processor import Coordinator, _claimed, _submitted
from tests.unit.test_trajectory_processor import Client, Harness, drive_to_unwind, logged_events
from tests.unit.watchdog.test_ladder import seed_loop

CODEC = MessageCodec()
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, on the minute


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A sample's value; 0 for a series never touched (a counter not yet incremented)."""
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def run_registry(coordinator: Coordinator) -> CollectorRegistry:
    return coordinator.processor.metrics.registry


class Processor:
    """Any aggregate processor over the twins, fed commands on the partitions they route to."""

    def __init__(self, build: Any, topic: str) -> None:
        self.log, self.store, self.clock = MemoryEventLog(), MemoryStore(), ManualClock(T0)
        self.processor: AggregateProcessor[Any, Any, Any, Any] = build(self.log, self.store, self.clock)
        self.topic = topic
        self._offsets: dict[int, int] = defaultdict(int)

    def partition(self, aggregate_id: str) -> int:
        return self.processor.definition.expected_partition(aggregate_id) or 0

    def own(self, aggregate_id: str) -> None:
        self.processor.restore_partitions({self.partition(aggregate_id)})

    def send(self, *commands: Any) -> None:
        for command in commands:
            partition = self.partition(command.run_id)
            out = CODEC.outbound(self.topic, command.run_id, command, partition)
            offset = self._offsets[partition]
            self._offsets[partition] += 1
            self.processor.handle([InboundRecord(out.topic, partition, offset, out.key, out.value)])

    @property
    def registry(self) -> CollectorRegistry:
        return self.processor.metrics.registry


# --- the runtime: batches, transactions, aborts, restores -----------------------------------------


def test_batches_and_transactions_are_timed_and_a_failed_commit_counts_as_aborted_dur_1() -> None:
    coordinator = Coordinator()
    run_id = _submitted(coordinator)
    registry = run_registry(coordinator)
    assert value(registry, "tenure_processor_batch_seconds_count", aggregate="run") == 1
    assert value(registry, "tenure_processor_transaction_seconds_count", aggregate="run") == 1
    coordinator.log.fail_next_commit = True
    with pytest.raises(ConnectionError):
        coordinator.send(claim_cmd(run_id, "runner-a", command_id="claim-1"))
    assert value(registry, "tenure_processor_transactions_aborted_total", aggregate="run") == 1
    assert value(registry, "tenure_lease_grants_total", via="claim") == 0, (
        "nothing committed, nothing granted"
    )
    coordinator.send(claim_cmd(run_id, "runner-a", command_id="claim-1"))  # the redelivery
    assert value(registry, "tenure_lease_grants_total", via="claim") == 1
    assert value(registry, "tenure_processor_transactions_aborted_total", aggregate="run") == 1


def test_a_stalled_fence_offset_send_is_counted_apart_from_other_aborts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    coordinator = Coordinator()
    run_id = _submitted(coordinator)
    registry = run_registry(coordinator)
    commit = coordinator.log.commit

    def stalled(records: Any) -> Any:
        monkeypatch.setattr(coordinator.log, "commit", commit)  # only this one stalls
        raise OffsetsStalled("the group coordinator is away")

    monkeypatch.setattr(coordinator.log, "commit", stalled)
    with pytest.raises(OffsetsStalled):
        coordinator.send(claim_cmd(run_id, "runner-a", command_id="claim-1"))
    assert value(registry, "tenure_processor_offsets_stalled_total", aggregate="run") == 1
    assert value(registry, "tenure_processor_transactions_aborted_total", aggregate="run") == 1
    coordinator.log.fail_next_commit = True
    with pytest.raises(ConnectionError):
        coordinator.send(claim_cmd(run_id, "runner-a", command_id="claim-1"))
    assert value(registry, "tenure_processor_offsets_stalled_total", aggregate="run") == 1
    assert value(registry, "tenure_processor_transactions_aborted_total", aggregate="run") == 2


def test_a_restore_counts_its_partitions_and_events_but_no_lease_grant_again_dur_1() -> None:
    coordinator = Coordinator()
    run_id = _submitted(coordinator)
    _claimed(coordinator, run_id)
    again = coordinator.restart()
    again.own(run_id)
    registry = run_registry(again)
    assert value(registry, "tenure_processor_restores_total", aggregate="run") == 1
    assert value(registry, "tenure_processor_restored_events_total", aggregate="run") == 2
    assert value(registry, "tenure_processor_restore_seconds_count", aggregate="run") == 1
    assert value(registry, "tenure_lease_grants_total", via="claim") == 0, "granted by the first incarnation"


# --- leases (LEASE-4, LEASE-5) ----------------------------------------------------------------------


def test_lease_grants_renewals_jeopardy_and_expiries_are_counted_from_committed_events_lease_5() -> None:
    coordinator = Coordinator()
    run_id = _submitted(coordinator, retry_safe=False)
    registry = run_registry(coordinator)
    claimed = _claimed(coordinator, run_id)
    coordinator.send(claim_cmd(run_id, "runner-b"))  # refused: the run is claimed
    assert value(registry, "tenure_lease_grants_total", via="claim") == 1
    coordinator.send(renew_cmd(run_id, claimed.attempt_id, 1, 1))
    coordinator.send(renew_cmd(run_id, claimed.attempt_id, 1, 1))  # a duplicate: no second renewal
    assert value(registry, "tenure_lease_renewals_total") == 1
    coordinator.at(claimed.expires_at - 1).tick()
    assert value(registry, "tenure_lease_at_risk_total") == 1
    assert value(registry, "tenure_lease_expiries_total") == 0
    coordinator.at(claimed.expires_at + 1).tick()  # the timer decides it: no request at all
    assert value(registry, "tenure_lease_expiries_total") == 1


# --- recovery decisions by gate (REC-1) -------------------------------------------------------------


def test_recovery_decisions_are_counted_by_gate_and_action_rec_1() -> None:
    harness = Harness()
    client = Client(harness, "acme")
    drive_to_unwind(client)
    decided = [e for e in logged_events(harness.log)[client.run_id] if isinstance(e, RecoveryDecided)]
    assert decided
    registry = harness.processor.metrics.registry
    for event in decided:
        count = sum(1 for e in decided if (e.gate, e.action) == (event.gate, event.action))
        assert (
            value(registry, "tenure_recovery_decisions_total", gate=event.gate, decision=event.action)
            == count
        )
    assert value(registry, "tenure_pivot_gate_verdicts_total", verdict="passed") == 1


# --- watchdog interventions by level (WD-5) ----------------------------------------------------------


def test_watchdog_interventions_are_counted_by_level_and_detections_by_detector_wd_5() -> None:
    dog = Processor(
        lambda log, store, clock: WatchdogProcessor(log, store, CODEC, clock), PROGRESS_OBSERVATIONS.name
    )
    steps = seed_loop(9)
    dog.own(steps[0].run_id)
    dog.send(*steps)
    for level in ("1", "2", "3"):
        assert value(dog.registry, "tenure_watchdog_interventions_total", level=level) == 1, level
    assert value(dog.registry, "tenure_watchdog_detections_total", detector="cycle") >= 1


# --- schedule firing lag (EXE-14) ---------------------------------------------------------------------


def test_a_firing_decided_late_observes_its_lag_in_seconds_exe_14() -> None:
    schedules = Processor(
        lambda log, store, clock: ScheduleProcessor(log, store, CODEC, clock), SCHEDULES_COMMANDS.name
    )
    create = fresh_schedule("metrics")  # every minute, UTC
    schedules.own(create.run_id)
    schedules.clock.advance(1_000)
    schedules.send(create)
    schedules.clock.advance(60_000 - 1_000 + 250)  # the minute's tick comes 250 ms late
    schedules.processor.tick()
    registry = schedules.registry
    assert value(registry, "tenure_schedule_firings_total", outcome="decided") == 1
    assert value(registry, "tenure_schedule_firing_lag_seconds_count") == 1
    assert value(registry, "tenure_schedule_firing_lag_seconds_sum") == pytest.approx(0.25)
    assert value(registry, "tenure_schedule_firing_lag_seconds_bucket", le="0.25") == 1
    assert value(registry, "tenure_schedule_firing_lag_seconds_bucket", le="0.1") == 0


# --- breaker states (BRK-1) ------------------------------------------------------------------------


def test_breaker_state_is_one_for_the_state_each_owned_breaker_is_in_brk_1() -> None:
    breakers = Processor(
        lambda log, store, clock: BreakerProcessor(log, store, CODEC, clock, breaker.POLICY),
        BREAKERS_COMMANDS.name,
    )
    endpoint = breaker.ENDPOINT
    breakers.own(endpoint)
    breakers.send(*(breaker.outcome(seq) for seq in range(1, 11)))  # ten transport failures
    registry = breakers.registry
    assert value(registry, "tenure_breaker_state", endpoint=endpoint, state="open") == 1
    for state in ("closed", "half-open", "forced-open", "disabled"):
        assert value(registry, "tenure_breaker_state", endpoint=endpoint, state=state) == 0, state
    breakers.processor.forget_assignment()  # its partition moved to another instance
    assert registry.get_sample_value("tenure_breaker_state", {"endpoint": endpoint, "state": "open"}) is None


# --- consumer lag -----------------------------------------------------------------------------------


def test_consumer_lag_is_the_high_watermark_past_the_last_record_handled_per_partition() -> None:
    metrics = StreamMetrics("tenure-test")
    records = [InboundRecord("runs.commands", p, o, b"k", b"v") for p, o in ((0, 4), (0, 7), (3, 2))]
    ends = {("runs.commands", 0): 10, ("runs.commands", 3): 3}
    metrics.consumed(records, lambda topic, partition: ends.get((topic, partition)))
    registry = metrics.registry
    assert value(registry, "tenure_consumer_lag_records", topic="runs.commands", partition="0") == 2
    assert value(registry, "tenure_consumer_lag_records", topic="runs.commands", partition="3") == 0
    metrics.revoked()
    assert (
        registry.get_sample_value("tenure_consumer_lag_records", {"topic": "runs.commands", "partition": "0"})
        is None
    )


# --- HTTP requests by route template and status ------------------------------------------------------


def test_http_requests_are_counted_by_route_template_method_and_status() -> None:
    app = FastAPI()
    registry = install_http_metrics(app)

    @app.get("/items/{item_id}")
    async def item(item_id: str) -> dict[str, str]:
        return {"id": item_id}

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a handler bug")

    with TestClient(app, raise_server_exceptions=False) as client:
        for item_id in ("a", "b", "run_0123"):
            assert client.get(f"/items/{item_id}").status_code == 200
        assert client.post("/items/a").status_code == 405
        assert client.get("/no/such/path/123").status_code == 404
        assert client.get("/boom").status_code == 500
        assert client.request("PROPFIND", "/items/a").status_code == 405
        text = client.get("/metrics").text
    route = "/items/{item_id}"
    assert value(registry, "tenure_http_requests_total", route=route, method="GET", status="200") == 3
    assert value(registry, "tenure_http_requests_total", route=route, method="POST", status="405") == 1
    assert value(registry, "tenure_http_requests_total", route="unmatched", method="GET", status="404") == 1
    assert value(registry, "tenure_http_requests_total", route="/boom", method="GET", status="500") == 1
    assert value(registry, "tenure_http_requests_total", route=route, method="OTHER", status="405") == 1
    assert value(registry, "tenure_http_request_duration_seconds_count", route=route, method="GET") == 3
    assert "run_0123" not in text and "/no/such/path" not in text, "raw paths never become labels"
    assert "process_cpu_seconds_total" in text


def test_the_api_counts_requests_by_route_and_serves_the_process_collector(tmp_path: Path) -> None:
    with api_client(tmp_path) as (client, _):
        client.get("/runs/run_nope")
        client.post("/runs", content=b"x" * (2 * 1024 * 1024), headers={"Content-Type": "application/json"})
        text = client.get("/metrics").text
    status = client_status_line(text, "/runs/{run_id}", "GET")
    assert status, text
    assert 'tenure_http_requests_total{method="POST",route="/runs",status="413"} 1.0' in text, (
        "the guard's refusal"
    )
    assert "process_cpu_seconds_total" in text, "the API's registry has the process collector"


def client_status_line(text: str, route: str, method: str) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if line.startswith("tenure_http_requests_total{")
        and f'route="{route}"' in line
        and f'method="{method}"' in line
    ]


def test_the_gateway_and_the_sim_serve_metrics_with_their_requests_and_the_process_collector() -> None:
    with TestClient(gateway_app(OfflineGateway())) as gateway:
        gateway.get("/runs/run_nope/fencing")
        text = gateway.get("/metrics").text
    assert client_status_line(text, "/runs/{run_id}/fencing", "GET"), text
    assert "process_cpu_seconds_total" in text
    with TestClient(sim_app()) as sim:
        sim.get("/healthz")
        text = sim.get("/metrics").text
    assert 'tenure_http_requests_total{method="GET",route="/healthz",status="200"} 1.0' in text
    assert "process_cpu_seconds_total" in text
