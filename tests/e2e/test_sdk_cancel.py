"""EXE-7 and EXE-11 through the runner SDK alone, on real processes.

A runner that uses only the SDK must be able to learn of a cancel and confirm it: the stop
request comes on a renewal answer, the LeaseKeeper surfaces it, the runner stops and reports
`cancelled` through the keeper, and the run ends `cancelled`. A preparation failure is reported
through the SDK the same way and requeues the run until its attempts run out (EXE-11).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.runner_sdk import Certainty, LeaseKeeper, StopRequest, TenureClient
from tests.support.system import wait_until
from tests.support.tenure import TenureSystem

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenureSystem]:
    s = TenureSystem(
        tenure_topics, tmp_path_factory.mktemp("sdk-cancel"), TENURE_STOP_GRACE_SECONDS="20"
    ).start()
    yield s
    s.stop()


@pytest.fixture
def api(system: TenureSystem) -> Iterator[httpx.Client]:
    with system.client() as c:
        yield c


@pytest.fixture
def sdk(system: TenureSystem) -> Iterator[TenureClient]:
    with TenureClient(system.base, system.gateway_url, timeout_s=5.0) as c:
        yield c


def _submit(api: httpx.Client, max_attempts: int = 3) -> str:
    response = api.post(
        "/runs",
        headers={"Idempotency-Key": f"sdk-{uuid.uuid4()}"},
        json={
            "tenant": "acme",
            "executionSpec": {"agent": "sdk-cancel"},
            "timeoutSeconds": 600,
            "maxAttempts": max_attempts,
        },
    )
    assert response.status_code == 201, response.text
    return str(response.json()["runId"])


def test_an_sdk_runner_sees_the_cancel_stops_and_confirms_it_EXE_7(
    api: httpx.Client, sdk: TenureClient
) -> None:
    run_id = _submit(api)
    told: list[StopRequest] = []
    keeper = LeaseKeeper.claim(sdk, run_id, "sdk-runner", [], 15, 1, on_stop_requested=told.append)
    steps = 0
    stopped = threading.Event()

    def work() -> None:
        # The runner's own loop: one unit of work per tick until the SDK says stop.
        nonlocal steps
        while keeper.wait_for_stop_request(0.05) is None:
            steps += 1
        stopped.set()

    with keeper:
        worker = threading.Thread(target=work, name="runner-work", daemon=True)
        worker.start()
        wait_until(
            lambda: keeper.last_renewal is not None and keeper.last_renewal.run_status == "running",
            15,
            "the run to be running under the SDK's renewals",
        )
        assert not keeper.stop_requested
        asked = api.post(f"/runs/{run_id}/cancel", json={"reason": "the user changed plans"})
        assert asked.status_code == 200 and asked.json()["status"] == "cancelling", asked.text

        assert stopped.wait(15), "the runner never saw the stop request"
        worker.join(5)
        stop = keeper.stop_request
        assert stop is not None and told == [stop], "the callback fires once with the same request"
        assert stop.kind == "cancel" and stop.run_status == "cancelling"
        assert stop.grace_until is not None and stop.confirm_by is not None
        assert keeper.state is Certainty.VALID, "a stop request does not take the lease away"
        assert api.get(f"/runs/{run_id}").json()["status"] == "cancelling", "not cancelled before confirmed"

        view = keeper.finish("cancelled", detail=f"stopped after {steps} steps")
    assert view["status"] == "cancelled", view
    assert keeper.state is Certainty.RELEASED and not keeper.running
    final: dict[str, Any] = api.get(f"/runs/{run_id}").json()
    assert final["status"] == "cancelled"
    reported = [h for h in final["history"] if h["type"] == "AttemptReported"]
    assert reported[-1]["details"]["outcome"] == "cancelled"


def test_an_sdk_runner_reports_a_preparation_failure_until_attempts_run_out_EXE_11(
    api: httpx.Client, sdk: TenureClient
) -> None:
    run_id = _submit(api, max_attempts=2)
    for attempt in (1, 2):
        # Reported before the keeper's first renewal: the first heartbeat starts the run.
        keeper = LeaseKeeper.claim(sdk, run_id, "sdk-runner", [], 15, 1)
        assert keeper.lease.attempt_number == attempt
        keeper.finish("preparation_failed", "IMAGE_PULL", "no such image")
        assert keeper.state is Certainty.RELEASED
        expected = "queued" if attempt == 1 else "failed"
        wait_until(lambda e=expected: api.get(f"/runs/{run_id}").json()["status"] == e, 10, expected)
    final = api.get(f"/runs/{run_id}").json()
    assert final["status"] == "failed" and final["statusReason"].startswith("PREPARATION_FAILED")
