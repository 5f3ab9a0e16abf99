"""`tenure up` supervises everything it starts, the bundled broker included, and leaves no orphan.

Real processes throughout: `python -m services.tenure_cli up` with its own state dir, its own
bundled broker on a free port, and every service on free ports; the broker and the supervisor
are SIGKILLed for real (issue 10).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.common import broker
from services.tenure_cli.supervisor import SERVICES
from tests.support.processes import adopting_orphans, alive, children_of
from tests.support.system import REPO_ROOT, wait_until
from tests.support.tenure import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

UP_TIMEOUT_S = 90.0


class Up:
    """One `tenure up` as a real process, with the ports and state dir it was given."""

    def __init__(self, tmp: Path) -> None:
        self.state_dir = tmp / "state"
        self.log_path = tmp / "tenure-up.log"
        self.api_port = free_port()
        self.kafka_port = free_port()
        env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
        env.update(
            PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            TENURE_STATE_DIR=str(self.state_dir),
            TENURE_API_PORT=str(self.api_port),
            TENURE_KAFKA_PORT=str(self.kafka_port),
            TENURE_GATEWAY_PORT=str(free_port()),
            TENURE_LEDGER_PORT=str(free_port()),
            TENURE_SIM_PORT=str(free_port()),
            # Free ports for the processors' health endpoints too: other suites run next to us.
            TENURE_COORDINATOR_HEALTH_PORT=str(free_port()),
            TENURE_PROJECTIONS_HEALTH_PORT=str(free_port()),
            TENURE_SAGA_HEALTH_PORT=str(free_port()),
            TENURE_LOG_LEVEL="WARNING",
        )
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "services.tenure_cli", "up"],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_up(self) -> None:
        deadline = time.monotonic() + UP_TIMEOUT_S
        while "Tenure is up." not in self.output():
            assert self.process.poll() is None, f"tenure up exited early:\n{self.output()[-4000:]}"
            assert time.monotonic() < deadline, f"not up in {UP_TIMEOUT_S}s:\n{self.output()[-4000:]}"
            time.sleep(0.2)

    def broker_pid(self) -> int | None:
        try:
            state = json.loads((self.state_dir / "kafka" / "broker.json").read_text())
        except (OSError, ValueError):
            return None
        pid = state.get("pid")
        return pid if isinstance(pid, int) and alive(pid) else None

    def children(self) -> set[int]:
        return children_of(self.process.pid)


def api_ready(port: int) -> str | None:
    """The API's readiness: /readyz, or /healthz where the API has no /readyz (yet)."""
    for path in ("/readyz", "/healthz"):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
                return path if answer.status == 200 else None
        except urllib.error.HTTPError as error:
            if error.code != 404:
                return None
        except OSError:
            return None
    return None


def _answers_api_versions(port: int) -> bool:
    try:
        return bool(broker.api_versions("127.0.0.1", port))
    except (OSError, struct.error, broker.BrokerError):
        return False


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    with adopting_orphans():
        system = Up(tmp_path)
        try:
            yield system
        finally:
            _clean_up(system)


def _clean_up(system: Up) -> None:
    """Whatever the test did, never leave a broker or a service behind."""
    pids = system.children()
    if system.process.poll() is None:
        os.kill(system.process.pid, signal.SIGKILL)
        system.process.wait(10)
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def test_a_sigkilled_broker_is_restarted_and_a_sigkilled_supervisor_leaves_no_child(up: Up) -> None:
    up.wait_up()
    first_broker = up.broker_pid()
    assert first_broker is not None and first_broker in up.children()
    assert api_ready(up.api_port) is not None

    os.kill(first_broker, signal.SIGKILL)
    killed = time.monotonic()
    second_broker = wait_until(
        lambda: (pid := up.broker_pid()) is not None and pid != first_broker and pid, 30, "a new broker"
    )
    # On the same port: the address every service was given.
    wait_until(lambda: _answers_api_versions(up.kafka_port), 30, "the new broker on the same port")
    # Ready again: a /readyz that checks Kafka first fails, then answers 200 once it is back.
    how = wait_until(lambda: api_ready(up.api_port), 30, "the API ready again")
    recovered = time.monotonic() - killed
    assert "kafka exited with -9; restarting" in up.output()
    assert second_broker in up.children()

    children = up.children()
    assert len(children) == len(SERVICES) + 1, children  # the broker and every service
    os.kill(up.process.pid, signal.SIGKILL)
    up.process.wait(10)
    began = time.monotonic()
    wait_until(lambda: not any(alive(pid) for pid in children), 5, f"no child of {children} alive")
    print(
        f"broker back and API ready ({how}) {recovered:.1f}s after the kill; "
        f"children gone {time.monotonic() - began:.2f}s after the supervisor's SIGKILL"
    )


def test_sigterm_stops_services_then_the_broker_and_nothing_is_left(up: Up) -> None:
    up.wait_up()
    children = up.children()
    broker_pid = up.broker_pid()
    assert broker_pid in children and len(children) == len(SERVICES) + 1, children
    up.process.send_signal(signal.SIGTERM)
    assert up.process.wait(40) == 0, up.output()[-4000:]
    output = up.output()
    assert output.rstrip().endswith("Tenure stopped."), output[-2000:]
    assert output.index("services stopped; stopping kafka") < output.index("Tenure stopped.")
    assert not any(alive(pid) for pid in children)
    assert not (up.state_dir / "kafka" / "broker.json").exists()
    # The broker was stopped by SIGTERM in time (a clean, controlled shutdown), not killed.
    assert f"pid {broker_pid} ignored SIGTERM" not in output
