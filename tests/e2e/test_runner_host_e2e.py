"""The managed runner host with the real API, the real broker and real processes (QUA-1, EXE-7).

- EXE-7: a managed runner whose child ignores SIGTERM is cancelled: the host SIGTERMs it, waits
  the grace period, SIGKILLs it, and confirms the stop; the run ends `cancelled`.
- QUA-1: a managed runner whose child keeps writing a file and sending UDP packets (to the host
  end of its veth, where the test listens) is quarantined by an operator: the file stops growing,
  no packet arrives after severing, and both stages are reported to the API. This one needs the
  quarantine routes (services/command_api/routes_quarantine.py) and processor.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.runner_host import NOISY_CHILD, RunnerHostProcess, leftovers
from tests.support.system import REPO_ROOT, ServiceProcess, wait_until
from tests.support.tenure import TenureSystem

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="the managed runner host needs root (cgroups, netns)"),
]

KEYS = "sub-key=alice:submitter,runner-key=runner-1:runner,op-key=ops:operator,svc-key=tenure-svc:service"
QUARANTINE_ROUTES = REPO_ROOT / "services" / "command_api" / "routes_quarantine.py"


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenureSystem]:
    tmp = tmp_path_factory.mktemp("runner-host")
    s = TenureSystem(
        tenure_topics,
        tmp,
        TENURE_API_KEYS=KEYS,
        TENURE_SERVICE_KEY="svc-key",
        TENURE_STOP_GRACE_SECONDS="20",
        TENURE_QUARANTINE_HEALTH_PORT="0",
    )
    quarantine: ServiceProcess | None = None
    if QUARANTINE_ROUTES.exists():
        quarantine = ServiceProcess("quarantine", "services.quarantine", s.env, tmp)
    s.start()
    if quarantine is not None:
        quarantine.start()
    yield s
    if quarantine is not None:
        quarantine.stop(5.0)  # it has been seen to ignore SIGTERM for 15 s (its owner is told)
    s.stop()


def _submit(system: TenureSystem) -> str:
    with system.client("sub-key") as api:
        response = api.post(
            "/runs",
            headers={"Idempotency-Key": f"rh-{uuid.uuid4()}"},
            json={"tenant": "acme", "executionSpec": {"agent": "managed"}, "timeoutSeconds": 600},
        )
    assert response.status_code == 201, response.text
    return str(response.json()["runId"])


def _status(system: TenureSystem, run_id: str) -> str:
    with system.client("sub-key") as api:
        return str(api.get(f"/runs/{run_id}").json()["status"])


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _host(system: TenureSystem, run_id: str, command: list[str], tmp: Path, **env: str) -> RunnerHostProcess:
    return RunnerHostProcess(
        {**system.env, **env}, run_id, command, tmp, api_url=system.base, api_key="runner-key", grace_s=1.0
    ).start()


def test_exe7_a_managed_runner_is_force_stopped_after_the_grace_and_confirms(
    system: TenureSystem, tmp_path: Path
) -> None:
    """EXE-7: cancel -> SIGTERM (ignored) -> SIGKILL after the grace -> `cancelled` confirmed."""
    run_id = _submit(system)
    out = tmp_path / "out.txt"
    host = _host(
        system, run_id, [sys.executable, NOISY_CHILD, str(out)], tmp_path, RUNNER_TEST_IGNORE_SIGTERM="1"
    )
    try:
        wait_until(lambda: _status(system, run_id) == "running" and _lines(out) > 10, 30, "the run running")
        with system.client("sub-key") as api:
            asked = api.post(f"/runs/{run_id}/cancel", json={"reason": "user changed plans"})
        assert asked.status_code == 200 and asked.json()["status"] == "cancelling", asked.text
        assert host.wait(30) == 0, host.log_tail()
    finally:
        host.kill()
    summary = host.summary()
    assert (summary["outcome"], summary["forced"], summary["reported"]) == ("cancelled", True, True), summary
    assert summary["exitCode"] == -9
    wait_until(lambda: _status(system, run_id) == "cancelled", 15, "the run cancelled")
    assert leftovers(host.id) == []


class Listener:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("0.0.0.0", 0))  # the host end of any child's veth
        self.sock.setblocking(False)
        self.port = int(self.sock.getsockname()[1])

    def drain(self) -> int:
        count = 0
        while True:
            try:
                self.sock.recv(64)
            except BlockingIOError:
                return count
            count += 1


def _quarantine_view(system: TenureSystem, run_id: str) -> dict[str, Any]:
    with system.client("runner-key") as api:
        response = api.get(f"/runs/{run_id}/quarantine", params={"afterVersion": 0, "waitMs": 0})
    assert response.status_code == 200, response.text
    view: dict[str, Any] = response.json()
    return view


@pytest.mark.skipif(not QUARANTINE_ROUTES.exists(), reason="awaits services/command_api/routes_quarantine.py")
def test_qua1_an_operator_quarantines_a_managed_runner_frozen_severed_and_reported(
    system: TenureSystem, tmp_path: Path
) -> None:
    run_id = _submit(system)
    out = tmp_path / "out.txt"
    listener = Listener()
    command = [sys.executable, NOISY_CHILD, str(out), "env", str(listener.port)]
    host = _host(system, run_id, command, tmp_path)
    try:
        wait_until(
            lambda: _status(system, run_id) == "running" and _lines(out) > 10 and listener.drain() > 0,
            30,
            "the run running, its child writing and sending",
        )
        with system.client("op-key") as api:
            triggered = time.monotonic()
            asked = api.post(
                f"/runs/{run_id}/quarantine",
                json={
                    "reason": "egress to a host not on the allowlist",
                    "evidence": {"host": "evil.example"},
                },
            )
        assert asked.status_code in (200, 201, 202), asked.text
        # Frozen: the file stops growing (sampled until two reads 100 ms apart agree).
        previous = -1

        def stopped() -> bool:
            nonlocal previous
            now, previous = _lines(out), _lines(out)
            time.sleep(0.1)
            return _lines(out) == now

        wait_until(stopped, 10, "the child's file to stop growing")
        frozen_within = time.monotonic() - triggered
        listener.drain()
        size = _lines(out)
        time.sleep(0.5)
        assert _lines(out) == size, "the file grew after the freeze"
        assert listener.drain() == 0, "a packet arrived after the severing"

        def reported() -> bool:
            stages = _quarantine_view(system, run_id).get("stages") or {}
            return bool(stages.get("suspended")) and bool(stages.get("severed"))

        wait_until(reported, 20, "both stages reported to the API")
        stages = _quarantine_view(system, run_id)["stages"]
        assert stages["suspended"]["mechanism"] in ("cgroup-v2-freeze", "cgroup-v1-freezer")
        assert stages["severed"]["mechanism"] == "netns-link-down"
        assert host.terminate() == 0, host.log_tail()
    finally:
        host.kill()
        listener.sock.close()
    summary = host.summary()
    assert summary["outcome"] == "quarantined" and not summary["reported"], summary
    assert [s["accepted"] for s in summary["stages"]] == [True, True]
    assert summary["toFrozenMs"] is not None and summary["toFrozenMs"] < frozen_within * 1000
    assert leftovers(host.id) == [], "the host's cgroup and namespace outlived it"
