"""The SDK's worker model on real processes (issue 17): workers that claim with the server-side
claim-next (POST /queues/{queue}/claim), renew, and report, racing on one queue; tenant fairness;
and the SDK as its own distribution (sdk/, tenure-sdk) installed in a clean venv without the
server's dependencies, running a worker against the running system.

Every run is done exactly once (LEASE-1: one holder at a time), and a tenant that queued two runs
behind another tenant's eight is served within the first claims, not after the eight.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.runner_sdk import RunsClient
from tests.support.system import wait_until
from tests.support.tenure import TenureSystem

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "support" / "sdk_worker_main.py"
SERVER_ONLY = ("faust", "rocksdict", "confluent_kafka", "fastapi")


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenureSystem]:
    s = TenureSystem(tenure_topics, tmp_path_factory.mktemp("sdk-worker")).start()
    yield s
    s.stop()


@pytest.fixture
def api(system: TenureSystem) -> Iterator[httpx.Client]:
    with system.client() as c:
        yield c


def submit(api: httpx.Client, tenant: str, queue: str, **spec: Any) -> str:
    """Through the SDK's client for submitting services (RunsClient), as a service would."""
    with RunsClient(str(api.base_url)) as runs:
        return str(runs.submit(tenant, {"queue": queue, **spec}, 600)["runId"])


def start_worker(
    python: str, system: TenureSystem, queue: str, name: str, idle_s: float
) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.Popen(
        [python, str(WORKER), system.base, queue, name, str(idle_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd="/",  # nothing of the repository on the path but what the interpreter installs
    )


def outcomes(process: subprocess.Popen[str], timeout_s: float) -> list[dict[str, Any]]:
    out, err = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, err[-3000:]
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def claimed_at(api: httpx.Client, run_id: str) -> int:
    view = api.get(f"/runs/{run_id}").json()
    return int(view["attempts"][0]["claimedAt"])


def test_two_workers_racing_on_one_queue_do_every_run_exactly_once_and_fairly_LEASE_1(
    system: TenureSystem, api: httpx.Client
) -> None:
    queue = f"race-{uuid.uuid4().hex[:8]}"
    big = [submit(api, "big-tenant", queue, n=i) for i in range(8)]
    small = [submit(api, "small-tenant", queue, n=i) for i in range(2)]
    failing = submit(api, "small-tenant", queue, fail=True)
    workers = [start_worker(sys.executable, system, queue, f"w{i}", 4.0) for i in range(2)]
    lines = [line for w in workers for line in outcomes(w, 120)]
    done = [line for line in lines if "runId" in line]
    # Every run exactly once: no run is worked by both workers, none is left.
    assert sorted(d["runId"] for d in done) == sorted([*big, *small, failing])
    assert {d["runner"] for d in done} == {"w0", "w1"}, "both workers should have claimed runs"
    by_run = {d["runId"]: d["outcome"] for d in done}
    assert by_run.pop(failing) == "failed"
    assert set(by_run.values()) == {"succeeded"}
    for run_id in [*big, *small]:
        wait_until(lambda r=run_id: api.get(f"/runs/{r}").json()["status"] == "succeeded", 20, run_id)
    failed = api.get(f"/runs/{failing}").json()
    assert failed["status"] == "failed", failed["status"]
    # Fairness: the small tenant's runs, queued behind eight of the big one's, are among the
    # first claims (tenants take turns), not the ninth and tenth (two racing workers may swap a
    # neighbouring pair, hence the margin).
    order = sorted([*big, *small, failing], key=lambda r: claimed_at(api, r))
    assert {order.index(r) for r in small} <= set(range(6)), order  # FIFO would give {8, 9}


def test_the_sdk_installs_alone_in_a_clean_venv_and_its_worker_completes_a_run(
    system: TenureSystem, api: httpx.Client, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    python = str(venv / "bin" / "python")
    pip = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(REPO / "sdk")],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-3000:]
    probe = (
        "import importlib.util, json, tenure_sdk; "
        f"print(json.dumps({{m: importlib.util.find_spec(m) is not None for m in {SERVER_ONLY!r}}}), "
        "sep='\\n'); print(tenure_sdk.__file__)"
    )
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=30, cwd="/")
    assert found.returncode == 0, found.stderr
    importable, where = found.stdout.splitlines()[:2]
    assert json.loads(importable) == dict.fromkeys(SERVER_ONLY, False)
    assert str(venv) in where  # the installed distribution, not the repository's source
    queue = f"venv-{uuid.uuid4().hex[:8]}"
    run_id = submit(api, "acme", queue)
    lines = outcomes(start_worker(python, system, queue, "venv-worker", 2.0), 60)
    assert {"runId": run_id, "outcome": "succeeded", "runner": "venv-worker"} in lines
    assert lines[-1] == {"done": "venv-worker", "module": "tenure_sdk"}
    with RunsClient(system.base) as runs:
        assert runs.wait_for_outcome(run_id, timeout_s=20)["status"] == "succeeded"
