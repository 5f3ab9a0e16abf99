"""The whole of Tenure as OS processes for the scoreboard, with SIGKILL-and-restart of any one.

Config 4 of the scoreboard runs against this: lease coordinator, projections, command API, effect
gateway, saga orchestrator, and the simulated environment the tools act on. `kill_and_restart`
is what a host failure does to one of Tenure's own processes, followed by what a supervisor
(`tenure up`, systemd, Kubernetes) does next: start it again at once, on the same state dir.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from services.common.broker import free_port
from services.common.settings import repo_root

__all__ = ["API_KEY", "KILLABLE", "TenureProcesses"]

# One key with the operator role: a restarted runner takes its run's lease over (LEASE-6).
API_KEY = "bench-runner-key"
PRINCIPAL = "bench-runner"
# The saga orchestrator's own key: the effect gateway authenticates every effect (LEASE-1).
SERVICE_KEY = "bench-saga-key"
KILLABLE = ("saga-orchestrator", "lease-coordinator", "effect-gateway", "projections", "command-api")
_MODULES = {
    "lease-coordinator": "services.lease_coordinator",
    "projections": "services.projections",
    "command-api": "services.command_api",
    "sim-environment": "services.sim_environment",
    "effect-gateway": "services.effect_gateway",
    "saga-orchestrator": "services.saga_orchestrator",
}


@dataclass
class _Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    restarts: list[float] = field(default_factory=list)


class TenureProcesses:
    def __init__(self, bootstrap: str, workdir: Path, *, tool_timeout_s: float = 2.0) -> None:
        self.workdir = workdir
        ports = {name: free_port() for name in ("api", "gateway", "sim")}
        self.api_url = f"http://127.0.0.1:{ports['api']}"
        self.gateway_url = f"http://127.0.0.1:{ports['gateway']}"
        self.sim_url = f"http://127.0.0.1:{ports['sim']}"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo_root()), env.get("PYTHONPATH", "")) if p)
        env.update(
            KAFKA_BOOTSTRAP_SERVERS=bootstrap,
            TENURE_STATE_DIR=str(workdir / "state"),
            TENURE_INSTANCE_ID=f"faults-{ports['api']}",
            TENURE_API_PORT=str(ports["api"]),
            TENURE_GATEWAY_PORT=str(ports["gateway"]),
            TENURE_SIM_PORT=str(ports["sim"]),
            TENURE_TOOLS=f"env={self.sim_url}",
            TENURE_GATEWAY_URL=self.gateway_url,
            TENURE_API_KEYS=f"{API_KEY}={PRINCIPAL}:operator,{SERVICE_KEY}=tenure-saga:service",
            TENURE_SERVICE_KEY=SERVICE_KEY,
            TENURE_DECISION_TIMEOUT_S="10",
            TENURE_TOOL_TIMEOUT_S=str(tool_timeout_s),
            TENURE_LOG_LEVEL="WARNING",
            # Stopped runs are not retried behind the benchmark's back: each trajectory is one run.
            TENURE_AUTO_RETRY="false",
        )
        self._env = env
        self._children: dict[str, _Child] = {}

    # --- life cycle ---------------------------------------------------------------------------

    def _spawn(self, name: str) -> subprocess.Popen[bytes]:
        home = self.workdir / name
        home.mkdir(parents=True, exist_ok=True)
        log = home / f"{name}.log"
        with log.open("ab") as out:
            out.write(f"\n===== start at {time.strftime('%H:%M:%S')} =====\n".encode())
            out.flush()
            process = subprocess.Popen(
                [sys.executable, "-m", _MODULES[name]],
                env=self._env,
                cwd=home,  # faust's own data folder lands here, never in the repo
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if name in self._children:
            self._children[name].process = process
        else:
            self._children[name] = _Child(name, process, log)
        return process

    def start(self, timeout_s: float = 90.0) -> TenureProcesses:
        self._spawn("lease-coordinator")
        self._spawn("projections")
        self._wait(
            lambda: (self.workdir / "state" / "projections" / "run_views" / "CURRENT").exists(),
            timeout_s,
            "the projector's store",
        )
        for name in ("command-api", "sim-environment", "effect-gateway", "saga-orchestrator"):
            self._spawn(name)
        for url in (f"{self.sim_url}/healthz", f"{self.gateway_url}/readyz", f"{self.api_url}/healthz"):
            self._wait(lambda u=url: _answers(u), timeout_s, url)
        return self

    def _wait(self, ready: object, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():  # type: ignore[operator]
            for child in self._children.values():
                if child.process.poll() is not None:
                    raise RuntimeError(f"{child.name} exited; see {child.log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(0.1)

    def kill_and_restart(self, name: str) -> float:
        """SIGKILL `name` (and its process group), start it again at once; seconds until it is
        serving again (HTTP health for the HTTP services, process start for the processors)."""
        child = self._children[name]
        started = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.process.pid, signal.SIGKILL)
        child.process.wait(10)
        self._spawn(name)
        child.restarts.append(time.time())
        probes = {"command-api": f"{self.api_url}/healthz", "effect-gateway": f"{self.gateway_url}/readyz"}
        health = probes.get(name)
        if health is not None:
            self._wait(lambda: _answers(health), 60, f"{name} to serve again")
        return time.monotonic() - started

    def restarts(self) -> dict[str, int]:
        return {name: len(child.restarts) for name, child in self._children.items()}

    def check_alive(self) -> None:
        for child in self._children.values():
            if child.process.poll() is not None:
                raise RuntimeError(f"{child.name} exited with {child.process.returncode}; see {child.log}")

    def stop(self) -> None:
        for child in reversed(list(self._children.values())):
            if child.process.poll() is None:
                try:
                    os.killpg(child.process.pid, signal.SIGTERM)
                    child.process.wait(15)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(child.process.pid, signal.SIGKILL)
                    child.process.wait(10)

    def __enter__(self) -> TenureProcesses:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False
