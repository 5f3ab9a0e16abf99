"""`tenure up --runner-host RUN --agent-command CMD` runs a managed runner host in the fleet.

The host is started once the fleet is up and waits for the run to be submitted (its id is known
in advance: the tenant and Idempotency-Key name it); it claims the run, runs the agent command
contained, reports its outcome, and is not restarted once its one run is over.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from services.common.ids import run_id_for
from tests.support.runner_host import leftovers
from tests.support.system import REPO_ROOT, free_port, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="the managed runner host needs root (cgroups, netns)"),
]


def test_tenure_up_runs_a_managed_runner_host_for_one_run(tmp_path: Path) -> None:
    key, host_id = f"up-rh-{uuid.uuid4().hex[:8]}", f"u{uuid.uuid4().hex[:8]}"
    run_id = run_id_for("acme", key)
    done = tmp_path / "agent-ran"
    api_port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    env.update(
        PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        TENURE_STATE_DIR=str(tmp_path / "state"),
        TENURE_API_PORT=str(api_port),
        TENURE_KAFKA_PORT=str(free_port()),
        TENURE_LOG_LEVEL="WARNING",
        TENURE_RUNNER_HOST_ID=host_id,
        **{
            f"TENURE_{name}_PORT": str(free_port())
            for name in (
                "GATEWAY", "LEDGER", "SIM", "COORDINATOR_HEALTH", "PROJECTIONS_HEALTH", "SAGA_HEALTH",
                "WATCHDOG_HEALTH", "BREAKERS_HEALTH", "QUARANTINE_HEALTH", "SCHEDULES_HEALTH",
                "RUNNER_HOST_HEALTH",
            )
        },
    )  # fmt: skip
    agent = f"{sys.executable} -c \"import pathlib; pathlib.Path('{done}').write_text('ran')\""
    log_path = tmp_path / "tenure-up.log"
    with log_path.open("wb") as log:
        up = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.tenure_cli",
                "up",
                "--runner-host",
                run_id,
                "--agent-command",
                agent,
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: "Tenure is up." in log_path.read_text() or up.poll() is not None, 150, "tenure up")
        assert up.poll() is None, log_path.read_text()[-4000:]
        api = f"http://127.0.0.1:{api_port}"
        created = httpx.post(
            f"{api}/runs",
            headers={"Idempotency-Key": key},
            json={"tenant": "acme", "executionSpec": {"agent": "managed"}, "timeoutSeconds": 600},
            timeout=30,
        )
        assert created.status_code == 201 and created.json()["runId"] == run_id, created.text
        wait_until(
            lambda: httpx.get(f"{api}/runs/{run_id}", timeout=10).json()["status"] == "succeeded",
            60,
            "the run succeeded through the managed runner host",
        )
        assert done.read_text() == "ran"
        wait_until(lambda: "runner-host exited with 0" in log_path.read_text(), 20, "the host's exit")
        time.sleep(1.0)  # a few supervisor ticks: it must not be restarted
        output = log_path.read_text()
        assert output.count("runner-host exited with 0") == 1 and "runner-host restarted" not in output
        assert leftovers(host_id) == []
    finally:
        if up.poll() is None:
            os.kill(up.pid, signal.SIGTERM)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait(10)
    assert "Tenure stopped." in log_path.read_text()
