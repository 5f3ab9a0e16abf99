"""A whole Tenure (processor, projector, API, optionally gateway and ledger) as real processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.support.system import ServiceProcess, free_port, service_env, stop_all, wait_for_http, wait_until


class TenureSystem:
    def __init__(self, bootstrap: str, tmp: Path, *, gateway: bool = False, **env: str) -> None:
        self.bootstrap = bootstrap
        self.tmp = tmp
        self.port = free_port()
        self.gateway_port = free_port()
        self.ledger_port = free_port()
        self.env = service_env(
            bootstrap,
            tmp / "state",
            TENURE_API_PORT=str(self.port),
            TENURE_GATEWAY_PORT=str(self.gateway_port),
            TENURE_LEDGER_PORT=str(self.ledger_port),
            TENURE_LEDGER_DB=str(tmp / "ledger.sqlite3"),
            TENURE_TOOLS=f"ledger=http://127.0.0.1:{self.ledger_port}",
            TENURE_DECISION_TIMEOUT_S="10",
            **env,
        )
        self.processor = ServiceProcess("lease-coordinator", "services.lease_coordinator", self.env, tmp)
        self.projector = ServiceProcess("projections", "services.projections", self.env, tmp)
        self.api = ServiceProcess("command-api", "services.command_api", self.env, tmp)
        self.with_gateway = gateway
        self.gateway = ServiceProcess("effect-gateway", "services.effect_gateway", self.env, tmp)
        self.ledger = ServiceProcess("fenced-ledger", "services.fenced_ledger", self.env, tmp)
        self.base = f"http://127.0.0.1:{self.port}"
        self.gateway_url = f"http://127.0.0.1:{self.gateway_port}"
        self.ledger_url = f"http://127.0.0.1:{self.ledger_port}"

    def start(self) -> TenureSystem:
        self.processor.start()
        self.projector.start()
        views = self.tmp / "state" / "projections" / "run_views" / "CURRENT"
        wait_until(views.exists, 30, "the projector's store")
        self.api.start()
        if self.with_gateway:
            self.ledger.start()
            self.gateway.start()
            wait_for_http(f"{self.ledger_url}/healthz")
            wait_for_http(f"{self.gateway_url}/readyz")  # /healthz is liveness only
        wait_for_http(f"{self.base}/healthz")
        return self

    def stop(self, *others: ServiceProcess) -> None:
        """Every process of the system (and `others`, a subclass's), stopped together."""
        stop_all((*others, self.gateway, self.ledger, self.api, self.projector, self.processor))

    def client(self, api_key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        return httpx.Client(base_url=self.base, timeout=30, headers=headers)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "services.tenure_cli", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )


def submit(
    client: httpx.Client, key: str, *, retry_safe: bool = False, tenant: str = "acme", max_attempts: int = 3
) -> dict[str, Any]:
    response = client.post(
        "/runs",
        headers={"Idempotency-Key": key},
        json={
            "tenant": tenant,
            "executionSpec": {"agent": "demo", "key": key},
            "timeoutSeconds": 600,
            "retrySafe": retry_safe,
            "maxAttempts": max_attempts,
        },
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def claim(
    client: httpx.Client,
    run_id: str,
    runner: str = "runner-a",
    lease_seconds: int = 3,
    heartbeat_seconds: int = 1,
) -> httpx.Response:
    return client.post(
        f"/runs/{run_id}/attempts",
        json={"runnerId": runner, "leaseSeconds": lease_seconds, "heartbeatSeconds": heartbeat_seconds},
    )


def heartbeat(
    client: httpx.Client, grant: dict[str, Any], sequence: int, epoch: int | None = None
) -> httpx.Response:
    return client.post(
        f"/attempts/{grant['attemptId']}/heartbeat",
        json={"leaseEpoch": epoch if epoch is not None else grant["epoch"], "sequence": sequence},
    )


def problem_type(response: httpx.Response) -> str:
    assert response.headers["content-type"].startswith("application/problem+json"), response.text
    return str(response.json()["type"]).removeprefix("/problems/")
