"""Every process a trajectory needs, on a real broker, with the keys of an operator, a runner and
the orchestrator's service principal; optionally the semantic watchdog too.

Shared by the e2e suites that drive a saga over HTTP (tests/e2e/test_trajectory_api.py,
tests/e2e/test_watchdog_ladder.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.support.system import (
    ServiceProcess,
    service_env,
    stop_all,
    wait_for_http,
    wait_for_ready,
    wait_until,
)
from tests.support.tenure import free_port

__all__ = ["OPERATOR_KEY", "RUNNER", "RUNNER_KEY", "SERVICE_KEY", "SagaSystem"]

OPERATOR_KEY = "op-key"
RUNNER_KEY = "runner-key"
SERVICE_KEY = "saga-key"
RUNNER = "rita"

_PROCESSES = (
    ("lease-coordinator", "services.lease_coordinator"),
    ("projections", "services.projections"),
    ("command-api", "services.command_api"),
    ("sim-environment", "services.sim_environment"),
    ("effect-gateway", "services.effect_gateway"),
    ("saga-orchestrator", "services.saga_orchestrator"),
)


class SagaSystem:
    """The coordinator, projector, API, simulated environment, gateway and orchestrator (and, with
    `watchdog`, the watchdog), keys set: the orchestrator presents SERVICE_KEY to the effect
    gateway, which authenticates every effect (LEASE-1)."""

    def __init__(self, bootstrap: str, tmp: Path, *, watchdog: bool = False) -> None:
        self.tmp = tmp
        api_port, gateway_port, sim_port = free_port(), free_port(), free_port()
        self.watchdog_health = free_port()
        self.base = f"http://127.0.0.1:{api_port}"
        self.gateway_url = f"http://127.0.0.1:{gateway_port}"
        self.sim_url = f"http://127.0.0.1:{sim_port}"
        self._watchdog = watchdog
        env = service_env(
            bootstrap,
            tmp / "state",
            TENURE_API_PORT=str(api_port),
            TENURE_GATEWAY_PORT=str(gateway_port),
            TENURE_SIM_PORT=str(sim_port),
            TENURE_TOOLS=f"env={self.sim_url}",
            TENURE_GATEWAY_URL=self.gateway_url,
            TENURE_DECISION_TIMEOUT_S="10",
            TENURE_TOOL_TIMEOUT_S="2",
            TENURE_API_KEYS=f"{OPERATOR_KEY}=olga:operator,{RUNNER_KEY}={RUNNER}:submitter,"
            f"{SERVICE_KEY}=tenure-saga:service",
            TENURE_SERVICE_KEY=SERVICE_KEY,
            # Health ports of our own: other suites may run processors on the defaults.
            TENURE_COORDINATOR_HEALTH_PORT=str(free_port()),
            TENURE_PROJECTIONS_HEALTH_PORT=str(free_port()),
            TENURE_SAGA_HEALTH_PORT=str(free_port()),
            TENURE_WATCHDOG_HEALTH_PORT=str(self.watchdog_health),
        )
        processes = (*_PROCESSES, ("watchdog", "services.watchdog")) if watchdog else _PROCESSES
        self.services = [ServiceProcess(name, module, env, tmp) for name, module in processes]

    def start(self) -> SagaSystem:
        coordinator, projector, api, *others = self.services
        coordinator.start()
        projector.start()
        views = self.tmp / "state" / "projections" / "run_views" / "CURRENT"
        wait_until(views.exists, 30, "the projector's store")
        api.start()
        for service in others:
            service.start()
        wait_for_http(f"{self.sim_url}/healthz")
        wait_for_http(f"{self.gateway_url}/readyz", timeout_s=60)
        wait_for_http(f"{self.base}/healthz", timeout_s=60)
        if self._watchdog:
            wait_for_ready(self.watchdog_health, 60, self.services[-1])
        return self

    def stop(self) -> None:
        stop_all(reversed(self.services))

    def client(self, api_key: str) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=30, headers={"Authorization": f"Bearer {api_key}"})

    def audit(self) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"{self.sim_url}/audit").raise_for_status().json()
        return body

    def arm(self, operation: str, **fault: Any) -> None:
        response = httpx.post(
            f"{self.sim_url}/faults", json={"operation": operation, "kind": "error", **fault}
        )
        assert response.status_code == 201, response.text
