"""The helpers every bench shares through bench.foundation: progress lines, nearest-rank
percentiles, Tenure's services as subprocesses (environment, spawn, liveness, API readiness) and
the CPU seconds each process used per phase."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from services.common.settings import repo_root
from services.projections.service import views_path

__all__ = [
    "CpuMeter",
    "Service",
    "cpu_seconds",
    "percentile",
    "say",
    "service_env",
    "spawn",
    "wait_for_api",
    "wait_for_views",
]


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, q in 0..100; NaN when there are no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5))) - 1]


# --- CPU accounting and services as subprocesses ----------------------------------------------


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@dataclass
class CpuMeter:
    """CPU seconds each process used per phase: where the machine's two cores went."""

    pids: dict[str, int] = field(default_factory=dict)
    phases: list[tuple[str, float, dict[str, float]]] = field(default_factory=list)

    def snapshot(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def measure(
        self, phase: str, before: dict[str, float], wall_s: float, until: dict[str, float] | None = None
    ) -> None:
        """The phase from `before` to `until` (a snapshot taken when it ended; now if None)."""
        after = self.snapshot() if until is None else until
        self.phases.append((phase, wall_s, {n: after[n] - before[n] for n in after if n in before}))


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    log_file: Path

    def check_alive(self) -> None:
        if (code := self.process.poll()) is not None:
            raise RuntimeError(f"{self.name} exited with {code}; log tail:\n{self.log_tail()}")

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def service_env(bootstrap: str, state_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TENURE_API_KEYS", None)  # the bench talks to its own API in development mode
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo_root()), env.get("PYTHONPATH", "")) if p)
    env.update(KAFKA_BOOTSTRAP_SERVERS=bootstrap, TENURE_STATE_DIR=str(state_dir), **extra)
    return env


def spawn(name: str, module: str, workdir: Path, env: dict[str, str]) -> Service:
    workdir.mkdir(parents=True, exist_ok=True)
    log_file = workdir / f"{name}.log"
    with log_file.open("wb") as out:
        # cwd is the service's temp dir, so faust's <app>-data folder never lands in the repo.
        process = subprocess.Popen(
            [sys.executable, "-m", module],
            env=env,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    say(f"started {name} pid {process.pid} (log {log_file})")
    return Service(name, process, log_file)


def wait_for_api(base_url: str, service: Service, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        service.check_alive()
        try:
            if httpx.get(f"{base_url}/healthz", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the API at {base_url} was not healthy after {timeout_s:.0f}s")


def wait_for_views(views_dir: Path, projector: Service, timeout_s: float = 60.0) -> Path:
    """The projector's views store, once the projector has created it (readers open it then)."""
    path, deadline = views_path(views_dir), time.monotonic() + timeout_s
    while not (path / "CURRENT").exists():
        projector.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"the projector did not create {path} within {timeout_s:.0f}s")
        time.sleep(0.1)
    return path
