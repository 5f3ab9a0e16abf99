"""The managed runner host (services.runner_host) as a real process, for tests and the bench."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.common.lifeline import lifeline_argv
from services.runner_host.child import Containment
from services.runner_host.freezer import v1_freezer_root, v2_root

__all__ = ["NOISY_CHILD", "RunnerHostProcess", "host_id", "leftovers"]

NOISY_CHILD = str(Path(__file__).resolve().parent / "noisy_child.py")


def host_id() -> str:
    """A host id of its own per test: its cgroups and namespaces are named after it."""
    return f"t{uuid.uuid4().hex[:10]}"


def leftovers(host: str) -> list[str]:
    """Cgroups and network namespaces of host id `host` that still exist."""
    prefix = f"tenure-{host}-"
    found = [
        str(p) for root in (v2_root(), v1_freezer_root()) if root is not None for p in root.glob(f"{prefix}*")
    ]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return found + [line for line in netns.splitlines() if line.startswith(prefix)]


class RunnerHostProcess:
    """`python -m services.runner_host --run-id RUN -- COMMAND` with the given environment."""

    def __init__(
        self,
        env: dict[str, str],
        run_id: str,
        command: Sequence[str],
        log_dir: Path,
        *,
        api_url: str,
        api_key: str = "",
        grace_s: float = 1.0,
        lease_seconds: int = 6,
        heartbeat_seconds: int = 1,
        **settings: str,
    ) -> None:
        self.id = host_id()
        self.log_path = log_dir / f"runner-host-{self.id}.log"
        self.out_path = log_dir / f"runner-host-{self.id}.out"
        self.env = {
            **env,
            "TENURE_RUNNER_HOST_ID": self.id,
            "TENURE_RUNNER_HOST_API_URL": api_url,
            "TENURE_RUNNER_HOST_API_KEY": api_key,
            "TENURE_RUNNER_HOST_STOP_GRACE_S": str(grace_s),
            "TENURE_RUNNER_HOST_HEALTH_PORT": "0",
            **settings,
        }
        self.argv = [
            sys.executable,
            "-m",
            "services.runner_host",
            "--run-id",
            run_id,
            "--lease-seconds",
            str(lease_seconds),
            "--heartbeat-seconds",
            str(heartbeat_seconds),
            "--workdir",
            str(log_dir),
            "--child-log",
            str(log_dir / f"child-{self.id}.log"),
            "--",
            *command,
        ]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RunnerHostProcess:
        with open(self.log_path, "ab") as log, open(self.out_path, "ab") as out:
            self.process = subprocess.Popen(
                lifeline_argv(self.argv), env=self.env, stdout=out, stderr=log, start_new_session=True
            )
        return self

    def wait(self, timeout_s: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout_s)

    def terminate(self, timeout_s: float = 15) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
        return self.process.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL the host if it still runs, and remove what a SIGKILLed host leaves behind
        (its cgroup and namespace: the next host of the same id would, but there is none)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
            Containment(self.id, freezer="sigstop", network="none").remove_stale()

    def summary(self) -> dict[str, Any]:
        """The host's last `{"runnerHost": {...}}` line."""
        for line in reversed(self.out_path.read_text().splitlines()):
            if line.startswith('{"runnerHost"'):
                found: dict[str, Any] = json.loads(line)["runnerHost"]
                return found
        raise AssertionError(f"no runnerHost summary in {self.out_path}; log:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
