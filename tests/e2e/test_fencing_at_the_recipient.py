"""LEASE-3/LEASE-4/EXE-6 with a real runner process, the effect gateway and the fenced ledger.

The paused holder: runner A (a real process using the SDK) claims epoch 1 and sends effects; it
is frozen with SIGSTOP past its lease; the run is requeued and runner B claims epoch 2 and sends
an effect; A is resumed. Nothing of A's lands after B took over: its SDK refuses to send (lost),
the coordinator refuses its heartbeat and report, the gateway refuses its effect, and the ledger,
which is not Tenure, refuses its epoch by itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.system import wait_until
from tests.support.tenure import TenureSystem, claim, heartbeat, problem_type, submit

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenureSystem]:
    s = TenureSystem(
        tenure_topics,
        tmp_path_factory.mktemp("fencing"),
        gateway=True,
        TENURE_TOOL_TIMEOUT_S="1",
        TENURE_LEDGER_FAULTS="1",
    ).start()
    yield s
    s.stop()


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _effect(gateway: str, run_id: str, attempt_id: str, epoch: int, key: str) -> httpx.Response:
    return httpx.post(
        f"{gateway}/effects",
        json={
            "runId": run_id,
            "attemptId": attempt_id,
            "epoch": epoch,
            "idempotencyKey": key,
            "tool": "ledger",
            "operation": "credit",
            "payload": {"account": f"acct-{run_id}", "amount": 1},
        },
        timeout=30,
    )


def test_a_paused_holder_lands_nothing_after_the_takeover_LEASE_3_LEASE_4_EXE_6(
    system: TenureSystem, tmp_path: Path
) -> None:
    with system.client() as client:
        run_id = submit(client, f"paused-{uuid.uuid4()}", retry_safe=True)["runId"]
    out = tmp_path / "runner-a.jsonl"
    args = ["--api", system.base, "--gateway", system.gateway_url, "--run", run_id, "--out", str(out)]
    with open(tmp_path / "runner-a.err", "wb") as err:  # the child keeps its own descriptor
        runner = subprocess.Popen(
            [sys.executable, "-m", "tests.support.runner_process", *args, "--lease", "3", "--heartbeat", "1"],
            env=system.env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_until(
            lambda: any(e["event"] == "effect" and e["outcome"] == "committed" for e in _lines(out)),
            60,
            "runner A's first committed effect",
        )
        grant_a = next(e for e in _lines(out) if e["event"] == "claimed")
        assert grant_a["epoch"] == 1

        os.kill(runner.pid, signal.SIGSTOP)
        paused_at = time.time()
        with system.client() as client:
            wait_until(
                lambda: client.get(f"/runs/{run_id}").json()["status"] == "queued",
                30,
                "the lease to expire and the run to be requeued",
            )
            granted = claim(client, run_id, runner="runner-b", lease_seconds=30, heartbeat_seconds=5)
            assert granted.status_code == 201, granted.text
            grant_b = granted.json()
        assert grant_b["epoch"] == 2
        b_effect = _effect(system.gateway_url, run_id, grant_b["attemptId"], 2, f"runner-b-{run_id}-1")
        assert b_effect.status_code == 200 and b_effect.json()["outcome"] == "committed", b_effect.text
        landed_before_resume = httpx.get(f"{system.ledger_url}/works/{run_id}").json()
        assert landed_before_resume["highestEpoch"] == 2

        os.kill(runner.pid, signal.SIGCONT)
        resumed_at = time.time()
        wait_until(
            lambda: any(e["at"] > resumed_at and e["event"] == "refused" for e in _lines(out)),
            30,
            "runner A to try again after resuming",
        )
        time.sleep(1.0)
    finally:
        runner.kill()
        runner.wait(10)

    after_resume = [e for e in _lines(out) if e["at"] > paused_at]
    assert after_resume, "runner A tried nothing after its pause"
    assert not [e for e in after_resume if e["event"] == "effect"], f"an effect of A landed: {after_resume}"
    assert {e["error"] for e in after_resume} <= {"LeaseLost", "LeaseInJeopardy"}, after_resume

    # The coordinator, the gateway and the recipient each refuse A's epoch on their own.
    with system.client() as client:
        a = {"attemptId": grant_a["attemptId"], "epoch": 1}
        assert problem_type(heartbeat(client, a, 99)) == "stale-epoch"
        report = client.post(
            f"/attempts/{grant_a['attemptId']}/report",
            json={"leaseEpoch": 1, "sequence": 100, "outcome": "succeeded"},
        )
        assert problem_type(report) == "stale-epoch"
        view = client.get(f"/runs/{run_id}").json()
        assert view["status"] == "preparing" and view["lease"]["epoch"] == 2, "A's report changed nothing"
    stale = _effect(system.gateway_url, run_id, grant_a["attemptId"], 1, f"runner-a-{run_id}-late")
    assert stale.status_code == 409 and stale.json()["type"] == "/problems/stale-epoch", stale.text
    direct = httpx.post(
        f"{system.ledger_url}/effects",
        headers={"Idempotency-Key": f"direct-{run_id}", "X-Fencing-Epoch": "1", "X-Work-Id": run_id},
        json={"operation": "credit", "payload": {"account": f"acct-{run_id}", "amount": 1}},
    )
    assert direct.status_code == 409 and direct.json()["type"].endswith("stale-epoch"), direct.text

    ledger = httpx.get(f"{system.ledger_url}/works/{run_id}").json()
    assert ledger["highestEpoch"] == 2
    epoch_one = [e for e in ledger["effects"] if e["epoch"] == 1]
    assert len(epoch_one) == len([e for e in landed_before_resume["effects"] if e["epoch"] == 1])
    # Every effect A committed is in the ledger exactly once, and in the lease record too.
    committed_a = {e["key"] for e in _lines(out) if e["event"] == "effect" and e["outcome"] == "committed"}
    assert committed_a == {e["idempotencyKey"] for e in epoch_one}
    with system.client() as client:
        record = client.get(f"/runs/{run_id}/lease").json()
    recorded = {
        e["idempotencyKey"]: e["status"] for lease in record["previousLeases"] for e in lease["effects"]
    }
    assert all(recorded.get(key) == "committed" for key in committed_a)


def test_a_timeout_after_the_effect_happened_is_reconciled_by_a_probe_not_a_second_dispatch_REC_6(
    system: TenureSystem,
) -> None:
    with system.client() as client:
        run_id = submit(client, f"probe-{uuid.uuid4()}")["runId"]
        grant = claim(client, run_id, lease_seconds=60, heartbeat_seconds=10).json()
    # The ledger commits, then sleeps past the gateway's 1 s tool timeout: the acknowledgement is lost.
    armed = httpx.post(f"{system.ledger_url}/faults", json={"delayAfterCommitMs": 3000, "times": 1})
    assert armed.status_code == 200, armed.text
    key = f"probe-{run_id}"
    first = _effect(system.gateway_url, run_id, grant["attemptId"], 1, key)
    assert first.status_code == 200, first.text
    assert first.json()["outcome"] == "committed" and first.json()["reconciled"] is True
    again = _effect(system.gateway_url, run_id, grant["attemptId"], 1, key)
    assert again.status_code == 200 and again.json()["outcome"] == "committed"

    work = httpx.get(f"{system.ledger_url}/works/{run_id}").json()
    assert [e["idempotencyKey"] for e in work["effects"]] == [key], "dispatched twice"
    balance = httpx.get(f"{system.ledger_url}/accounts/acct-{run_id}").json()["balance"]
    assert balance == 1
    with system.client() as client:
        effects = client.get(f"/runs/{run_id}/lease").json()["lease"]["effects"]
    assert [(e["idempotencyKey"], e["status"]) for e in effects] == [(key, "committed")]
