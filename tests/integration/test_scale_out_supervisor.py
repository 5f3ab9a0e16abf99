"""`tenure up --instances coordinator=2` runs two lease coordinators in one group (issue 16).

The real supervisor with its own bundled broker and state dir: both coordinators become ready
on their own health ports (the default + 0 and + 1 x TENURE_INSTANCE_PORT_STRIDE), between them
they own every runs.commands partition, each some, and SIGTERM stops them all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.tenure_cli.supervisor import SERVICES
from tests.support.processes import adopting_orphans, alive, children_of
from tests.support.scale import Instance
from tests.support.system import REPO_ROOT, ServiceProcess, wait_until
from tests.support.tenure import free_port

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(180)]

STRIDE = 7


def test_up_with_two_coordinator_instances_splits_the_partitions_between_them(tmp_path: Path) -> None:
    coordinator_port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    env.update(
        PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        TENURE_STATE_DIR=str(tmp_path / "state"),
        TENURE_API_PORT=str(free_port()),
        TENURE_KAFKA_PORT=str(free_port()),
        TENURE_GATEWAY_PORT=str(free_port()),
        TENURE_LEDGER_PORT=str(free_port()),
        TENURE_SIM_PORT=str(free_port()),
        TENURE_COORDINATOR_HEALTH_PORT=str(coordinator_port),
        TENURE_PROJECTIONS_HEALTH_PORT=str(free_port()),
        TENURE_SAGA_HEALTH_PORT=str(free_port()),
        TENURE_INSTANCE_PORT_STRIDE=str(STRIDE),
        TENURE_SESSION_TIMEOUT_S="6",
        TENURE_LOG_LEVEL="WARNING",
    )
    log_path = tmp_path / "tenure-up.log"
    with adopting_orphans(), log_path.open("wb") as log:
        up = subprocess.Popen(
            [sys.executable, "-m", "services.tenure_cli", "up", "--instances", "coordinator=2"],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        children: set[int] = set()
        try:

            def output() -> str:
                return log_path.read_text(errors="replace")

            def is_up() -> bool:
                assert up.poll() is None, f"tenure up exited early:\n{output()[-4000:]}"
                return "Tenure is up." in output()

            wait_until(is_up, 120, "Tenure to be up", poll_s=0.3)
            assert "instances: lease-coordinator x2" in output()
            children = children_of(up.pid)
            assert len(children) == len(SERVICES) + 2, children  # the broker, every service, one more
            probe = ServiceProcess("unused", "unused", {}, tmp_path)
            instances = [Instance(str(i), probe, coordinator_port + i * STRIDE) for i in (0, 1)]

            def split() -> list[frozenset[int]] | None:
                owned = [i.readiness() for i in instances]
                parts = [p for ready, p in owned if ready and p]
                return parts if len(parts) == 2 else None

            parts = wait_until(split, 60, "both coordinators to own partitions", poll_s=0.3)
            assert sorted(p for part in parts for p in part) == [0, 1, 2, 3], parts
            # Several instances: tenure up turns the generation fence on for them (issue 16),
            # and only for them (the lone projector, API... keep the default).
            fenced = {}
            for pid in children:
                environ = dict(
                    item.split("=", 1)
                    for item in Path(f"/proc/{pid}/environ").read_text(errors="replace").split("\0")
                    if "=" in item
                )
                if "TENURE_INSTANCE_ID" in environ:
                    fenced[environ["TENURE_INSTANCE_ID"]] = environ.get("TENURE_GROUP_FENCE")
            assert fenced == {"0": "true", "1": "true"}, fenced
            print(f"tenure up --instances coordinator=2: {parts}")
            up.send_signal(signal.SIGTERM)
            assert up.wait(60) == 0, output()[-4000:]
            began = time.monotonic()
            wait_until(lambda: not any(alive(pid) for pid in children), 10, "every child to stop")
            print(f"all stopped {time.monotonic() - began:.1f} s after tenure up exited")
        finally:
            if up.poll() is None:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait(10)
            for pid in children:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
