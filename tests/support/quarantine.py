"""A whole Tenure with the quarantine processor, as real processes (QUA-1..QUA-3 tests, bench).

`QuarantineSystem` is TenureSystem (coordinator, projector, API, effect gateway, fenced ledger)
plus `python -m services.quarantine`, with API keys for every role, the quarantine executor
pointed at this gateway and the ledger as the recipient it fences; with `saga=True` also the
simulated environment and the saga orchestrator (its steps' outputs are artifacts too). Helpers
claim, upload under a grant and read through the mediation gateway the way a runner does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.support.system import ServiceProcess, wait_for_http, wait_until
from tests.support.tenure import TenureSystem, free_port

KEYS = {
    "op-key": "olga:operator",
    "ver-key": "vera:verifier",
    "svc-key": "svc:service",
    "sub-key": "dana:submitter",
    "run-a": "runner-a:runner",
    "run-b": "runner-b:runner",
    "run-c": "runner-c:runner",
}
API_KEYS = ",".join(f"{k}={v}" for k, v in KEYS.items())


class QuarantineSystem(TenureSystem):
    def __init__(self, bootstrap: str, tmp: Path, *, saga: bool = False, **env: str) -> None:
        self.quarantine_port = free_port()
        self.sim_port = free_port()
        self.sim_url = f"http://127.0.0.1:{self.sim_port}"
        self.with_saga = saga
        super().__init__(
            bootstrap,
            tmp,
            gateway=True,
            TENURE_API_KEYS=API_KEYS,
            TENURE_SERVICE_KEY="svc-key",
            TENURE_QUARANTINE_HEALTH_PORT=str(self.quarantine_port),
            TENURE_TOOL_EGRESS="ledger=127.0.0.1|ledger.internal",
            **env,
        )
        self.env["TENURE_GATEWAY_URL"] = self.gateway_url
        if saga:
            self.env["TENURE_SIM_PORT"] = str(self.sim_port)
            self.env["TENURE_TOOLS"] += f",env={self.sim_url}"
        self.quarantine = ServiceProcess("quarantine", "services.quarantine", self.env, tmp)
        self.sim = ServiceProcess("sim-environment", "services.sim_environment", self.env, tmp)
        self.saga = ServiceProcess("saga-orchestrator", "services.saga_orchestrator", self.env, tmp)

    def start(self) -> QuarantineSystem:
        self.quarantine.start()
        if self.with_saga:
            self.sim.start()
            self.saga.start()
        super().start()
        wait_for_http(f"http://127.0.0.1:{self.quarantine_port}/readyz", 60)
        if self.with_saga:
            wait_for_http(f"{self.sim_url}/healthz")
        return self

    def stop(self, *others: ServiceProcess) -> None:
        saga = (self.saga, self.sim) if self.with_saga else ()
        super().stop(*others, *saga, self.quarantine)


def as_(system: TenureSystem, key: str) -> httpx.Client:
    return system.client(key)


def submit_run(system: TenureSystem, key: str, spec: dict[str, Any] | None = None) -> str:
    with system.client("sub-key") as client:
        response = client.post(
            "/runs",
            headers={"Idempotency-Key": key},
            json={
                "tenant": "acme",
                "executionSpec": spec or {"agent": "demo", "key": key},
                "timeoutSeconds": 600,
            },
        )
    assert response.status_code == 201, response.text
    return str(response.json()["runId"])


def claim_run(system: TenureSystem, run_id: str, runner_key: str, lease_seconds: int = 120) -> dict[str, Any]:
    with system.client(runner_key) as client:
        response = client.post(
            f"/runs/{run_id}/attempts", json={"runnerId": runner_key, "leaseSeconds": lease_seconds}
        )
    assert response.status_code in (200, 201), response.text
    body: dict[str, Any] = response.json()
    return body


def upload(
    system: TenureSystem,
    runner_key: str,
    grant_of: dict[str, Any],
    name: str,
    data: bytes,
    derived_from: list[str] = (),  # type: ignore[assignment]
    step: int | None = None,
) -> dict[str, Any]:
    with system.client(runner_key) as client:
        grant = client.post(
            f"/attempts/{grant_of['attemptId']}/uploads",
            json={"leaseEpoch": grant_of["epoch"], "destination": name, "maxBytes": 4096},
        )
        assert grant.status_code == 201, grant.text
        params: list[tuple[str, str | int]] = [("derivedFrom", d) for d in derived_from]
        if step is not None:
            params.append(("step", step))
        stored = client.put(f"/uploads/{grant.json()['grantId']}", content=data, params=params)
    assert stored.status_code == 201, stored.text
    body: dict[str, Any] = stored.json()
    return body


def quarantine_view(system: TenureSystem, run_id: str, key: str = "op-key", **params: int) -> dict[str, Any]:
    with system.client(key) as client:
        response = client.get(f"/runs/{run_id}/quarantine", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def wait_for_stage(system: TenureSystem, run_id: str, stage: str, timeout_s: float = 30) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        view = quarantine_view(system, run_id)
        return view if view["stages"][stage] is not None else None

    found: dict[str, Any] = wait_until(done, timeout_s, f"stage {stage} of {run_id}")
    return found
