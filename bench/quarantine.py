"""Issue 14 (QUA-3): how fast a quarantine reaches the gateway and the mediation gateway.

Real processes on a real broker (tests/support/quarantine.py's QuarantineSystem: coordinator,
projector, API, effect gateway, fenced ledger, quarantine processor). Per trial, a fresh run is
submitted and claimed (and, for the peer read, has produced an artifact); then an operator's
POST /runs/{id}/quarantine is the trigger (t0: just before it is sent) while a prober hammers:

  * trigger -> gateway refusing: POST /effects of the run, with an attempt the run never had
    (answered from the gateway's fold in ~1 ms, `stale-epoch`, nothing recorded), until the
    answer is `run-quarantined`: the gateway has folded the QuarantineStarted;
  * trigger -> peer read refused: GET /artifacts/{id}/envelope (the API's fold) until the
    artifact is TAINTED: from then on the mediation gateway refuses every read of it without a
    round trip (each trial ends with one real GET /artifacts/{id} by the peer, which must be a
    409 `artifact-quarantined`).

    PYTHONPATH=. python -m bench.quarantine [--trials 30]

A script, not a test: it measures and reports, it asserts only that the refusals happened.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from services.common.broker import start_broker
from services.common.kafka import create_topics
from services.common.topics import TOPICS
from tests.support.quarantine import QuarantineSystem, claim_run, submit_run, upload


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _probe(stop: threading.Event, hit: dict[str, float], send: Any, refused: Any) -> None:
    while not stop.is_set():
        answer = send()
        if refused(answer):
            hit["at"] = time.perf_counter()
            return


DECIDED: list[float] = []  # trigger sent -> QuarantineStarted decided (wall clocks, one host)


def _trigger(system: QuarantineSystem, run_id: str) -> float:
    with system.client("op-key") as client:
        t0, wall0 = time.perf_counter(), time.time()
        response = client.post(f"/runs/{run_id}/quarantine", json={"reason": "bench", "evidence": None})
    assert response.status_code == 202, response.text
    at = dt.datetime.fromisoformat(response.json()["trigger"]["at"].replace("Z", "+00:00")).timestamp()
    DECIDED.append((at - wall0) * 1000)
    return t0


def gateway_trial(system: QuarantineSystem, n: int) -> float:
    run_id = submit_run(system, f"bench-gw-{n}-{time.time_ns()}")
    claim_run(system, run_id, "run-a")
    http = httpx.Client(timeout=10, headers={"Authorization": "Bearer run-a"})
    body = {
        "runId": run_id,
        "attemptId": f"att_{run_id.removeprefix('run_')}_9",
        "epoch": 1,
        "idempotencyKey": "probe",
        "tool": "ledger",
        "operation": "credit",
        "payload": {"account": "acme", "amount": 1},
    }
    stop, hit = threading.Event(), {}
    prober = threading.Thread(
        target=_probe,
        args=(
            stop,
            hit,
            lambda: http.post(f"{system.gateway_url}/effects", json=body),
            lambda r: r.status_code == 409 and r.json().get("code") == "RUN_QUARANTINED",
        ),
    )
    prober.start()
    time.sleep(0.05)
    t0 = _trigger(system, run_id)
    prober.join(30)
    stop.set()
    http.close()
    assert "at" in hit, "the gateway never refused"
    return (hit["at"] - t0) * 1000


def peer_trial(system: QuarantineSystem, n: int) -> float:
    producer = submit_run(system, f"bench-pr-{n}-{time.time_ns()}")
    peer = submit_run(system, f"bench-pe-{n}-{time.time_ns()}")
    grant = claim_run(system, producer, "run-a")
    claim_run(system, peer, "run-b")
    artifact = upload(system, "run-a", grant, "out.txt", b"bench")["artifactRef"]
    http = httpx.Client(base_url=system.base, timeout=10, headers={"Authorization": "Bearer op-key"})
    stop, hit = threading.Event(), {}
    prober = threading.Thread(
        target=_probe,
        args=(
            stop,
            hit,
            lambda: http.get(f"/artifacts/{artifact}/envelope"),
            lambda r: r.status_code == 200 and r.json()["taint"] == "TAINTED",
        ),
    )
    prober.start()
    time.sleep(0.05)
    t0 = _trigger(system, producer)
    prober.join(30)
    stop.set()
    http.close()
    assert "at" in hit, "the artifact never became TAINTED"
    with system.client("run-b") as client:
        read = client.get(f"/artifacts/{artifact}", params={"runId": peer})
    assert read.status_code == 409 and read.json()["code"] == "ARTIFACT_QUARANTINED", read.text
    return (hit["at"] - t0) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tenure-bench-quarantine-") as tmp:
        workdir = Path(tmp)
        broker = start_broker(port=None, data_dir=workdir / "kafka" / "data", state_dir=workdir / "kafka")
        try:
            create_topics(broker.bootstrap_servers, TOPICS)
            system = QuarantineSystem(broker.bootstrap_servers, workdir, TENURE_LOG_LEVEL="WARNING").start()
            try:
                for n in range(3):  # warm-up: first connections, first partitions
                    gateway_trial(system, -1 - n)
                    peer_trial(system, -1 - n)
                DECIDED.clear()
                rows = {
                    "trigger -> gateway refusing": [gateway_trial(system, n) for n in range(args.trials)],
                    "trigger -> peer read refused": [peer_trial(system, n) for n in range(args.trials)],
                }
                rows["of which: trigger sent -> QuarantineStarted decided (ms clock)"] = list(DECIDED)
            finally:
                system.stop()
        finally:
            broker.stop()
    print(f"\n{args.trials} trials each (a fresh run per trial), from just before the trigger is sent:\n")
    print("| path | p50 ms | p99 ms | min ms | max ms | mean ms |")
    print("|---|---|---|---|---|---|")
    for name, values in rows.items():
        print(
            f"| {name} | {_pct(values, 0.5):.1f} | {_pct(values, 0.99):.1f} | {min(values):.1f} | "
            f"{max(values):.1f} | {statistics.fmean(values):.1f} |"
        )


if __name__ == "__main__":
    main()
