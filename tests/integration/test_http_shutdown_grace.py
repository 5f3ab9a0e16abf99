"""A SIGTERMed HTTP process stops within its shutdown grace, even with a request still held.

uvicorn's default waits for every open request; a tool answer held by a peer that died (the
simulated environment's "timeout after commit" sleeps its delay after the caller gave up) kept a
SIGTERMed process alive until its supervisor SIGKILLed it. TENURE_HTTP_SHUTDOWN_GRACE_S bounds
that wait for every HTTP process (services/common/http_serve.py), and the process then exits on
its own, cleanly, having answered the request it cut with a 503 problem and `Retry-After`
(services/common/http_serve.CutAtShutdown), never uvicorn's text/plain 500.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.system import ServiceProcess, free_port, service_env, wait_for_http, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

HELD_S = 60.0  # far past the grace: only the grace can end the wait
GRACE_S = 1


def test_a_sigterm_ends_a_process_holding_a_request_within_its_grace(tmp_path: Path) -> None:
    port = free_port()
    env = service_env(
        "127.0.0.1:1",
        tmp_path / "state",
        TENURE_SIM_PORT=str(port),
        TENURE_HTTP_SHUTDOWN_GRACE_S=str(GRACE_S),
    )
    sim = ServiceProcess("sim-environment", "services.sim_environment", env, tmp_path).start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{url}/healthz")
        armed = httpx.post(
            f"{url}/faults",
            json={"operation": "vm.provision", "kind": "timeout-after-commit", "delayS": HELD_S, "times": 1},
        )
        assert armed.status_code == 201, armed.text
        outcome: list[httpx.Response | httpx.HTTPError] = []

        def held_request() -> None:
            try:
                response = httpx.post(
                    f"{url}/effects",
                    json={"operation": "vm.provision", "payload": {"name": "held"}},
                    headers={"Idempotency-Key": "held-1", "X-Fencing-Epoch": "1", "X-Work-Id": "run_00/1"},
                    timeout=HELD_S + 30,
                )
                outcome.append(response)
            except httpx.HTTPError as exc:
                outcome.append(exc)

        caller = threading.Thread(target=held_request, daemon=True)
        caller.start()
        # The effect is applied before the answer is held: the probe finds it, so it is in flight.
        wait_until(lambda: httpx.get(f"{url}/effects/held-1").status_code == 200, 10, "the held effect")
        assert sim.process is not None
        started = time.monotonic()
        os.killpg(sim.process.pid, signal.SIGTERM)
        returncode = sim.process.wait(GRACE_S + 10)
        took = time.monotonic() - started
        assert took < GRACE_S + 5, f"stopped {took:.1f}s after SIGTERM with a {GRACE_S}s grace"
        assert returncode != -signal.SIGKILL
        caller.join(10)
        # The held request was cut, not answered as if its delay had passed.
        assert len(outcome) == 1 and isinstance(outcome[0], httpx.Response), outcome
        cut = outcome[0]
        assert cut.status_code == 503, cut.text
        assert cut.headers["content-type"].startswith("application/problem+json")
        assert cut.headers["retry-after"] == "1" and cut.headers["connection"] == "close"
        assert cut.json()["type"] == "/problems/unavailable" and cut.json()["instance"] == "/effects"
    finally:
        sim.stop(grace_s=2)
