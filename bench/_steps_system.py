"""Tenure's step path as subprocesses for bench/durable_steps.py, and a bench-side supervisor.

`StepsSystem` starts a broker (services.common.broker) and the six processes a durable step
passes through: lease coordinator, projector, command API, simulated environment, effect gateway
and saga orchestrator, plus the watchdog, which takes in every step's observation (WD-1), and
the breakers, which take in every effect's outcome (BRK-1), on temp state dirs. `supervise()`
is called from the main thread in a loop: whatever has exited (a process the bench SIGKILLed, or
one that exited on its own, e.g. a processor that could not commit while the broker was down) is
started again at once, the broker on the same port and data dir. Every start happens on the main
thread, under a lifeline (services.common.lifeline), so a SIGKILLed bench leaves nothing behind;
`kill()` may be called from the workload's thread. Nothing here imports from tests/.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.foundation import say, service_env
from services.common.broker import BrokerHandle, free_port, start_broker, stop_process
from services.common.kafka import create_topics
from services.common.lifeline import lifeline_argv
from services.common.topics import TOPICS

__all__ = ["KILLABLE", "Proc", "Restart", "StepsSystem"]

# (name, module) in start order; the API opens the projector's views store, so it comes after.
SERVICES = (
    ("lease_coordinator", "services.lease_coordinator"),
    ("projections", "services.projections"),
    ("command_api", "services.command_api"),
    ("sim_environment", "services.sim_environment"),
    ("effect_gateway", "services.effect_gateway"),
    ("saga_orchestrator", "services.saga_orchestrator"),
    # Not on a step's path, but every step's observation is its input (WD-1): it runs, as in
    # `tenure up`, so its CPU and its transactions are in the figures.
    ("watchdog", "services.watchdog"),
    # Every effect's outcome is reported to the tool's breaker (BRK-1), as in `tenure up`.
    ("breakers", "services.breakers"),
)
# Recovery scenario name -> the process it SIGKILLs.
KILLABLE = {"orchestrator": "saga_orchestrator", "coordinator": "lease_coordinator", "broker": "kafka"}
READY_TIMEOUT_S = 120.0


@dataclass
class Restart:
    """One exit the supervisor saw, and when it started the process again (time.monotonic())."""

    name: str
    exited_at: float
    exit_code: int | None
    by_bench: bool  # the bench SIGKILLed it on purpose
    restarted_at: float | None = None


class Proc:
    """One Tenure process: started in a session of its own, output appended to its log."""

    def __init__(self, name: str, module: str, env: dict[str, str], workdir: Path) -> None:
        self.name = name
        self.module = module
        self.env = env
        self.workdir = workdir
        self.log_file = workdir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:  # the child keeps its own copy of the descriptor
            log.write(f"\n===== start #{self.starts + 1} =====\n".encode())
            log.flush()
            # cwd is the service's temp dir, so faust's <app>-data folder never lands in the repo.
            self.process = subprocess.Popen(
                lifeline_argv([sys.executable, "-m", self.module]),
                env=self.env,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.starts += 1

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def sigkill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)  # our own child's group, by its pid

    def stop(self, grace_s: float = 15.0) -> str:
        if self.process is None or self.process.poll() is not None:
            return "not running"
        return stop_process(self.process.pid, grace_s, self.process)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class StepsSystem:
    """The broker and the eight processes; `supervise()` restarts whatever exited, at once."""

    def __init__(
        self, workdir: Path, tag: str, *, saga_workers: int, tool_timeout_s: float, time_scale: float = 0.0
    ) -> None:
        self.workdir = workdir
        self.tag = tag
        self.api_url = f"http://127.0.0.1:{free_port()}"
        self.gateway_url = f"http://127.0.0.1:{free_port()}"
        self.sim_url = f"http://127.0.0.1:{free_port()}"
        self.health_ports = {
            "lease_coordinator": free_port(),
            "projections": free_port(),
            "saga_orchestrator": free_port(),
            "watchdog": free_port(),
            "breakers": free_port(),
        }
        self.saga_workers = saga_workers
        self.tool_timeout_s = tool_timeout_s
        self.time_scale = time_scale
        self.broker: BrokerHandle | None = None
        self.bootstrap = ""
        self._broker_port = 0
        self.procs: dict[str, Proc] = {}
        self.restarts: list[Restart] = []
        self._lock = threading.Lock()
        self._killed: dict[str, float] = {}  # name -> when the bench SIGKILLed it
        self._down: dict[str, Restart] = {}
        self.supervising = False
        self._http = httpx.Client(timeout=5.0)

    # --- start and stop ---------------------------------------------------------------------

    def start(self) -> StepsSystem:
        self.start_broker()
        self.start_services()
        return self

    def start_broker(self) -> None:
        kafka = self.workdir / "kafka"
        self.broker = start_broker(
            port=None, data_dir=kafka / "data", state_dir=kafka, timeout=180, die_with_parent=True
        )
        self.bootstrap = self.broker.bootstrap_servers
        self._broker_port = int(self.bootstrap.rsplit(":", 1)[1])
        create_topics(self.bootstrap, TOPICS)

    def start_services(self) -> None:
        env = service_env(
            self.bootstrap,
            self.workdir / "state",
            TENURE_INSTANCE_ID=f"bench-{self.tag}",
            TENURE_API_PORT=self.api_url.rsplit(":", 1)[1],
            TENURE_GATEWAY_PORT=self.gateway_url.rsplit(":", 1)[1],
            TENURE_GATEWAY_URL=self.gateway_url,
            TENURE_SIM_PORT=self.sim_url.rsplit(":", 1)[1],
            TENURE_TOOLS=f"env={self.sim_url}",
            TENURE_SIM_TIME_SCALE=f"{self.time_scale:g}",
            TENURE_TOOL_TIMEOUT_S=f"{self.tool_timeout_s:g}",
            TENURE_SAGA_WORKERS=str(self.saga_workers),
            TENURE_COORDINATOR_HEALTH_PORT=str(self.health_ports["lease_coordinator"]),
            TENURE_PROJECTIONS_HEALTH_PORT=str(self.health_ports["projections"]),
            TENURE_SAGA_HEALTH_PORT=str(self.health_ports["saga_orchestrator"]),
            TENURE_WATCHDOG_HEALTH_PORT=str(self.health_ports["watchdog"]),
            TENURE_BREAKERS_HEALTH_PORT=str(self.health_ports["breakers"]),
            # The simulated environment stands for every tool behind one gateway tool ("env"),
            # and the recovery workload keeps 200 of its calls in flight at once: its bulkhead
            # (BRK-4) is sized for that, as a deployment would size it for its load (the default,
            # an external pool of 16, would make the scenario a test of the bulkhead instead).
            TENURE_BULKHEAD_TOOLS="env=internal:256/256/30000",
        )
        for name, module in SERVICES:
            self.procs[name] = Proc(name, module, env, self.workdir / name)
        self.procs["lease_coordinator"].start()
        self.procs["projections"].start()
        views = self.workdir / "state" / "projections" / "run_views" / "CURRENT"
        self._wait(views.exists, "the projector's views store", 60.0)
        for name, _ in SERVICES[2:]:  # after the coordinator and the projector
            self.procs[name].start()
        for name, proc in self.procs.items():
            say(f"started {name} pid {proc.pid} (log {proc.log_file})")
        self.wait_ready()

    def stop(self) -> None:
        self.supervising = False
        for name, _ in reversed(SERVICES):
            proc = self.procs.get(name)
            if proc is not None:
                say(f"stopped {name}: {proc.stop()}")
        if self.broker is not None and self.broker.owned:
            say(f"stopped broker: {self.broker.stop()}")
        self._http.close()

    # --- readiness ----------------------------------------------------------------------------

    def ready_urls(self) -> dict[str, str]:
        urls = {name: f"http://127.0.0.1:{port}/readyz" for name, port in self.health_ports.items()}
        urls["command_api"] = f"{self.api_url}/readyz"
        urls["effect_gateway"] = f"{self.gateway_url}/readyz"
        urls["sim_environment"] = f"{self.sim_url}/healthz"
        return urls

    def not_ready(self) -> list[str]:
        waiting = []
        for name, url in self.ready_urls().items():
            try:
                if self._http.get(url, timeout=2.0).status_code != 200:
                    waiting.append(name)
            except httpx.HTTPError:
                waiting.append(name)
        return waiting

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Until every process answers its readiness probe; supervises meanwhile."""
        began = time.monotonic()
        waiting: list[str] = []

        def ready() -> bool:
            nonlocal waiting
            self.supervise()
            waiting = self.not_ready()
            return not waiting

        try:
            self._wait(ready, "every process to be ready", timeout_s)
        except TimeoutError:
            tails = "\n".join(f"--- {n}:\n{self.procs[n].log_tail(15)}" for n in waiting if n in self.procs)
            raise TimeoutError(f"not ready after {timeout_s:.0f}s: {waiting}\n{tails}") from None
        return time.monotonic() - began

    def _wait(self, check: object, what: str, timeout_s: float) -> None:
        assert callable(check)
        deadline = time.monotonic() + timeout_s
        while not check():
            for proc in self.procs.values():
                code = proc.exit_code()
                if code is not None and not self.supervising:
                    raise RuntimeError(f"{proc.name} exited with {code}; log tail:\n{proc.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
            time.sleep(0.2)

    # --- the supervisor (main thread only) -----------------------------------------------------

    def kill(self, name: str) -> float:
        """SIGKILL `name` (a service, or "kafka"); returns when (time.monotonic()). Any thread."""
        with self._lock:
            at = time.monotonic()
            self._killed[name] = at
        if name == "kafka":
            assert self.broker is not None and self.broker.pid is not None
            os.kill(self.broker.pid, signal.SIGKILL)  # our own child, by its pid
        else:
            self.procs[name].sigkill()
        return at

    def supervise(self) -> None:
        """One round: note what has exited and start it again at once (main thread)."""
        if not self.supervising:
            return
        for name, proc in self.procs.items():
            code = proc.exit_code()
            if code is not None:
                restart = self._exited(name, code)
                proc.start()
                restart.restarted_at = time.monotonic()
                say(f"supervisor: {name} exited ({code}); started again as pid {proc.pid}")
        if self.broker is not None and self.broker.owned and not self.broker.running():
            restart = self._exited("kafka", self.broker.exit_code())
            self.broker.stop(grace_seconds=1.0)  # reaps the child and forgets broker.json
            kafka = self.workdir / "kafka"
            self.broker = start_broker(
                port=self._broker_port,
                data_dir=kafka / "data",
                state_dir=kafka,
                timeout=180,
                die_with_parent=True,
            )
            restart.restarted_at = time.monotonic()
            say(f"supervisor: broker restarted as pid {self.broker.pid} on {self.bootstrap}")

    def _exited(self, name: str, code: int | None) -> Restart:
        with self._lock:
            killed = self._killed.pop(name, None)
        restart = Restart(name, killed if killed is not None else time.monotonic(), code, killed is not None)
        self.restarts.append(restart)
        return restart

    # --- for the CPU meter and the report --------------------------------------------------------

    def pids(self) -> dict[str, int]:
        pids = {name: proc.pid for name, proc in self.procs.items() if proc.pid is not None}
        if self.broker is not None and self.broker.pid is not None and self.broker.owned:
            pids["kafka"] = self.broker.pid
        return pids

    def check_alive(self) -> None:
        if self.supervising:
            return
        for proc in self.procs.values():
            code = proc.exit_code()
            if code is not None:
                raise RuntimeError(f"{proc.name} exited with {code}; log tail:\n{proc.log_tail()}")
