"""The saga orchestrator serves liveness, readiness and metrics on its health port (issue 10).

The lease coordinator's and the projector's probes are exercised in test_deadletter.py, where
they also count dead letters; this is the third processor, started as a real process on the
real broker: /readyz answers 200 once its partitions are assigned and restored, /metrics says
how many it owns."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from services.common.topics import TRAJECTORIES_COMMANDS
from tests.support.system import ServiceProcess, free_port, service_env, wait_for_ready

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_the_saga_orchestrator_is_ready_once_its_partitions_are_restored(
    tenure_topics: str, tmp_path: Path
) -> None:
    port = free_port()
    env = service_env(tenure_topics, tmp_path / "state", TENURE_SAGA_HEALTH_PORT=str(port))
    saga = ServiceProcess("saga-orchestrator", "services.saga_orchestrator", env, tmp_path).start()
    try:
        ready = wait_for_ready(port, 90, saga)
        partitions = list(range(TRAJECTORIES_COMMANDS.partitions))
        assert ready["service"] == "tenure-saga-orchestrator"
        assert ready["checks"]["assignment"] == {
            "ok": True,
            "detail": f"{TRAJECTORIES_COMMANDS.name} partitions {partitions}",
        }
        assert ready["checks"]["restore"]["ok"] and ready["checks"]["dependencies"]["ok"]
        live = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert live.json() == {"status": "ok", "service": "tenure-saga-orchestrator"}
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert (
            f'tenure_stream_assigned_partitions{{app="tenure-saga-orchestrator"}} {len(partitions)}.0'
            in metrics
        )
        assert 'tenure_processor_restores_total{aggregate="trajectory"}' in metrics
        assert "process_resident_memory_bytes" in metrics
    finally:
        saga.stop()
