"""More command API instances next to a system's own, each with its own port and instance id.

Each instance keeps its own projection in `<state_dir>/api-<instance_id>/views`
(services/command_api/projection.py); these helpers start extra ones as real processes and
check that none of them has another process's views store open.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from tests.support.system import ServiceProcess, wait_for_readyz
from tests.support.tenure import free_port

__all__ = ["ApiInstance", "open_paths_of", "wait_until_ready"]


class ApiInstance:
    """One more `python -m services.command_api` on the environment `env` (of another API)."""

    def __init__(self, env: dict[str, str], log_dir: Path, instance_id: str) -> None:
        self.port = free_port()
        self.instance_id = instance_id
        self.env = dict(env, TENURE_API_PORT=str(self.port), TENURE_INSTANCE_ID=instance_id)
        self.process = ServiceProcess(f"command-api-{instance_id}", "services.command_api", self.env, log_dir)
        self.base = f"http://127.0.0.1:{self.port}"

    @property
    def views_path(self) -> Path:
        return Path(self.env["TENURE_STATE_DIR"]) / f"api-{self.instance_id}" / "views"

    def start(self) -> ApiInstance:
        self.process.start()
        return self

    def stop(self) -> None:
        self.process.stop()

    def client(self, api_key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        return httpx.Client(base_url=self.base, timeout=30, headers=headers)


def wait_until_ready(base: str, process: ServiceProcess, timeout_s: float = 90.0) -> dict[str, Any]:
    """Wait for the API's GET /readyz 200 (its own views caught up); returns that body."""
    return wait_for_readyz(base, timeout_s, process, poll_s=0.05)


def open_paths_of(process: ServiceProcess) -> set[str]:
    """The files every process of `process`'s group has open (it runs in a session of its own)."""
    assert process.process is not None
    group = process.process.pid
    paths: set[str] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != group:
                continue
            fds = Path("/proc", entry, "fd")
            for fd in fds.iterdir():
                try:
                    paths.add(os.readlink(fd))
                except OSError:
                    continue
        except (OSError, ProcessLookupError):
            continue
    return paths
