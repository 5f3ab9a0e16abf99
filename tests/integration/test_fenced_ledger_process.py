"""The fenced ledger as a real process: what it acknowledged survives SIGKILL (LEASE-3, REC-6).

`python -m services.fenced_ledger` is started on a free port, killed with SIGKILL right after
effects committed (one acknowledged, one whose acknowledgement was still being delayed by the
fault plan), and restarted on the same SQLite file. The effects, the balance and the fencing
bar are all still there, so a restarted recipient keeps refusing the previous holder and keeps
answering the reconcile-before-retry probe. Needs no Kafka.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 15.0

pytestmark = pytest.mark.timeout(60)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LedgerProcess:
    def __init__(self, process: subprocess.Popen[bytes], base_url: str, log: Path) -> None:
        self.process = process
        self.base_url = base_url
        self.log = log

    def sigkill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)
        assert self.process.returncode == -signal.SIGKILL


@pytest.fixture
def start_ledger(tmp_path: Path) -> Iterator[Callable[[Path], LedgerProcess]]:
    started: list[LedgerProcess] = []
    port = _free_port()

    def start(db_path: Path) -> LedgerProcess:
        log = tmp_path / f"ledger-{len(started)}.log"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            "TENURE_LEDGER_PORT": str(port),
            "TENURE_LEDGER_DB": str(db_path),
            "TENURE_LEDGER_FAULTS": "1",
        }
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "services.fenced_ledger"],
                cwd=REPO_ROOT,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        ledger = LedgerProcess(process, f"http://127.0.0.1:{port}", log)
        started.append(ledger)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"ledger exited with {process.returncode}:\n{log.read_text()}")
            try:
                if httpx.get(f"{ledger.base_url}/healthz", timeout=0.5).status_code == 200:
                    return ledger
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        pytest.fail(f"ledger did not answer /healthz within {START_TIMEOUT_S}s:\n{log.read_text()}")

    yield start
    for ledger in started:
        if ledger.process.poll() is None:
            ledger.process.kill()
            ledger.process.wait(timeout=10)


def _post(base_url: str, key: str, epoch: int, operation: str, amount: int, timeout: float = 5.0) -> Any:
    return httpx.post(
        f"{base_url}/effects",
        headers={"Idempotency-Key": key, "X-Work-Id": "run-42", "X-Fencing-Epoch": str(epoch)},
        json={"operation": operation, "payload": {"account": "acct", "amount": amount}},
        timeout=timeout,
    )


def test_committed_effects_and_the_epoch_bar_survive_sigkill_LEASE_3_REC_6(
    tmp_path: Path, start_ledger: Callable[[Path], LedgerProcess]
) -> None:
    db_path = tmp_path / "state" / "fenced_ledger.sqlite3"

    # 1. An acknowledged effect, then SIGKILL at once: no clean shutdown, no checkpoint.
    first = start_ledger(db_path)
    created = _post(first.base_url, "k1", 2, "credit", 100)
    assert created.status_code == 201, created.text
    first.sigkill()

    second = start_ledger(db_path)
    probe = httpx.get(f"{second.base_url}/effects/k1", timeout=5)
    assert probe.status_code == 200
    assert probe.json()["result"] == created.json()
    assert httpx.get(f"{second.base_url}/accounts/acct", timeout=5).json()["balance"] == 100
    stale = _post(second.base_url, "k-old", 1, "debit", 10)
    assert stale.status_code == 409
    assert stale.json()["type"] == "/problems/stale-epoch"
    assert stale.json()["highestEpoch"] == 2
    replay = _post(second.base_url, "k1", 2, "credit", 100)
    assert (replay.status_code, replay.headers["idempotent-replay"]) == (200, "true")

    # 2. An effect whose acknowledgement is lost: the caller times out while the server sleeps
    #    after its commit, and the server is killed before it ever answers.
    armed = httpx.post(
        f"{second.base_url}/faults", json={"delayAfterCommitMs": 20_000, "times": 1}, timeout=5
    )
    assert armed.status_code == 200
    with pytest.raises(httpx.ReadTimeout):
        _post(second.base_url, "k2", 3, "debit", 30, timeout=1.0)
    second.sigkill()

    third = start_ledger(db_path)
    # Reconcile before retry: the probe says the effect happened, so the caller must not resend.
    lost_ack = httpx.get(f"{third.base_url}/effects/k2", timeout=5)
    assert lost_ack.status_code == 200
    assert (lost_ack.json()["epoch"], lost_ack.json()["result"]["balance"]) == (3, 70)
    work = httpx.get(f"{third.base_url}/works/run-42", timeout=5).json()
    assert work["highestEpoch"] == 3
    assert [e["idempotencyKey"] for e in work["effects"]] == ["k1", "k2"]
    assert httpx.get(f"{third.base_url}/accounts/acct", timeout=5).json()["balance"] == 70
    assert _post(third.base_url, "k-old-2", 2, "debit", 1).json()["highestEpoch"] == 3
    # The fault plan is process memory, not ledger state: the restarted ledger answers at once.
    assert httpx.get(f"{third.base_url}/faults", timeout=5).json() == {"remaining": 0}
    assert not [line for line in third.log.read_text().splitlines() if "Traceback" in line]
