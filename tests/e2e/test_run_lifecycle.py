"""The Run lifecycle beyond the happy path, on real processes: cancel of running runs (EXE-7),
deadlines (EXE-10), preparation errors (EXE-11), explicit retries (EXE-5) and the agent revision a
run names (EXE-14)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.system import wait_until
from tests.support.tenure import TenureSystem, claim, heartbeat, problem_type

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenureSystem]:
    s = TenureSystem(
        tenure_topics, tmp_path_factory.mktemp("lifecycle"), TENURE_STOP_GRACE_SECONDS="2"
    ).start()
    yield s
    s.stop()


@pytest.fixture
def client(system: TenureSystem) -> Iterator[httpx.Client]:
    with system.client() as c:
        yield c


def _submit(
    client: httpx.Client, *, timeout: int = 600, retry_safe: bool = False, **extra: Any
) -> dict[str, Any]:
    response = client.post(
        "/runs",
        headers={"Idempotency-Key": f"lc-{uuid.uuid4()}"},
        json={
            "tenant": "acme",
            "executionSpec": {"agent": "lifecycle"},
            "timeoutSeconds": timeout,
            "retrySafe": retry_safe,
            **extra,
        },
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def _running(client: httpx.Client, run_id: str, lease_seconds: int = 60) -> dict[str, Any]:
    granted = claim(client, run_id, lease_seconds=lease_seconds, heartbeat_seconds=5)
    assert granted.status_code == 201, granted.text
    grant: dict[str, Any] = granted.json()
    assert heartbeat(client, grant, 1).status_code == 200
    return grant


def _report(client: httpx.Client, grant: dict[str, Any], sequence: int, outcome: str) -> httpx.Response:
    return client.post(
        f"/attempts/{grant['attemptId']}/report",
        json={"leaseEpoch": grant["epoch"], "sequence": sequence, "outcome": outcome},
    )


def _status(client: httpx.Client, run_id: str) -> str:
    return str(client.get(f"/runs/{run_id}").json()["status"])


def test_cancel_of_a_running_run_waits_for_the_runners_confirmation_EXE_7(client: httpx.Client) -> None:
    run = _submit(client)
    grant = _running(client, run["runId"])
    asked = client.post(f"/runs/{run['runId']}/cancel", json={"reason": "user changed plans"})
    assert asked.status_code == 200, asked.text
    assert asked.json()["status"] == "cancelling"
    assert problem_type(client.post(f"/runs/{run['runId']}/cancel", json={})) == "cancel-already-requested"
    told = heartbeat(client, grant, 2)
    assert (
        told.status_code == 200
        and told.json()["stopRequested"] is True
        and told.json()["stopKind"] == "cancel"
    )
    confirmed = _report(client, grant, 3, "cancelled")
    assert confirmed.status_code == 200, confirmed.text
    assert confirmed.json()["status"] == "cancelled"


def test_an_unconfirmed_cancel_ends_interrupted_never_cancelled_and_is_not_retried_EXE_7(
    client: httpx.Client,
) -> None:
    run = _submit(client, retry_safe=True)
    grant = _running(client, run["runId"])
    assert client.post(f"/runs/{run['runId']}/cancel", json={"reason": "stop"}).status_code == 200
    view = wait_until(
        lambda: (v := client.get(f"/runs/{run['runId']}").json())["status"] == "interrupted" and v,
        20,
        "the grace period to run out",
    )
    assert view["statusReason"].startswith("CANCEL_UNCONFIRMED")
    assert view["lease"]["certainty"] == "revoked", "the silent runner is fenced off"
    assert problem_type(heartbeat(client, grant, 2)) == "lease-revoked"
    time.sleep(1.0)
    assert _status(client, run["runId"]) == "interrupted", (
        "EXE-7: no automatic retry after an accepted cancel"
    )


def test_a_late_success_after_an_accepted_cancel_is_recorded_not_applied_EXE_7(client: httpx.Client) -> None:
    run = _submit(client)
    grant = _running(client, run["runId"])
    assert client.post(f"/runs/{run['runId']}/cancel", json={}).status_code == 200
    late = _report(client, grant, 2, "succeeded")
    assert late.status_code == 200, late.text
    view = late.json()
    assert view["status"] == "cancelled"
    assert "recorded, not applied" in view["statusReason"]
    reported = [h for h in view["history"] if h["type"] == "AttemptReported"]
    assert reported[-1]["details"]["outcome"] == "succeeded", "the success itself is on the record"


def test_the_deadline_is_fixed_at_first_assignment_and_a_confirmed_stop_fails_the_run_EXE_10(
    client: httpx.Client,
) -> None:
    run = _submit(client, timeout=3)
    grant = _running(client, run["runId"])
    deadline = client.get(f"/runs/{run['runId']}").json()["deadlineAt"]
    assert deadline == grant["serverTime"] + 3000
    answer = wait_until(
        lambda: (r := heartbeat(client, grant, int(time.time() * 10))).json().get("stopRequested") and r,
        20,
        "the deadline stop",
    )
    assert answer.json()["stopKind"] == "deadline"
    done = _report(client, grant, int(time.time() * 10) + 1, "failed")
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "failed" and done.json()["statusReason"].startswith("DEADLINE_EXCEEDED")


def test_an_unconfirmed_deadline_stop_ends_interrupted_without_retry_EXE_10(client: httpx.Client) -> None:
    run = _submit(client, timeout=2, retry_safe=True)
    _running(client, run["runId"])
    view = wait_until(
        lambda: (v := client.get(f"/runs/{run['runId']}").json())["status"] == "interrupted" and v,
        20,
        "the unconfirmed deadline stop",
    )
    assert view["statusReason"].startswith("DEADLINE_UNCONFIRMED")
    time.sleep(1.0)
    assert _status(client, run["runId"]) == "interrupted"


def test_a_preparation_error_requeues_until_attempts_run_out_then_fails_EXE_11(client: httpx.Client) -> None:
    response = client.post(
        "/runs",
        headers={"Idempotency-Key": f"prep-{uuid.uuid4()}"},
        json={"tenant": "acme", "executionSpec": {"agent": "prep"}, "timeoutSeconds": 600, "maxAttempts": 2},
    )
    run_id = response.json()["runId"]
    for attempt in (1, 2):
        grant = claim(client, run_id, lease_seconds=60, heartbeat_seconds=5).json()
        assert grant["attemptNumber"] == attempt
        failed = _report(client, grant, 1, "preparation_failed")
        assert failed.status_code == 200, failed.text
    view = client.get(f"/runs/{run_id}").json()
    assert view["status"] == "failed" and view["statusReason"].startswith("PREPARATION_FAILED")


def test_retrying_a_terminal_run_creates_a_new_run_that_points_back_EXE_5(client: httpx.Client) -> None:
    run = _submit(client)
    assert client.post(f"/runs/{run['runId']}/cancel", json={}).json()["status"] == "cancelled"
    refused = client.post(f"/runs/{run['runId']}/retry", json={})
    assert refused.status_code == 409 and problem_type(refused) == "retry-needs-acknowledgement"
    retried = client.post(
        f"/runs/{run['runId']}/retry",
        json={"acknowledgeRepeatedEffects": True},
        headers={"Idempotency-Key": "retry-1"},
    )
    assert retried.status_code == 201, retried.text
    child = retried.json()
    assert child["parentRunId"] == run["runId"] and child["runId"] != run["runId"]
    assert child["status"] == "queued" and child["executionSpec"] == run["executionSpec"]
    assert child["timeoutSeconds"] == run["timeoutSeconds"] and child["maxAttempts"] == run["maxAttempts"]
    assert _status(client, run["runId"]) == "cancelled", "the parent stays as it ended"


def test_an_interrupted_run_is_retried_in_place_only_with_acknowledgement_EXE_5(client: httpx.Client) -> None:
    run = _submit(client, retry_safe=False)
    claim(client, run["runId"], lease_seconds=2, heartbeat_seconds=1)
    wait_until(lambda: _status(client, run["runId"]) == "interrupted", 20, "the lease to expire")
    assert problem_type(client.post(f"/runs/{run['runId']}/retry", json={})) == "retry-needs-acknowledgement"
    again = client.post(
        f"/runs/{run['runId']}/retry", json={"acknowledgeRepeatedEffects": True, "reason": "ok"}
    )
    assert again.status_code == 200, again.text
    assert again.json()["status"] == "queued"
    second = claim(client, run["runId"], lease_seconds=30, heartbeat_seconds=5)
    assert second.status_code == 201 and second.json()["epoch"] == 2


def test_a_run_names_its_agent_revision_in_its_view_and_its_retry_EXE_14(client: httpx.Client) -> None:
    run = _submit(client, agentRevisionId="agrev-2026-03")
    assert run["agentRevisionId"] == "agrev-2026-03"
    read = client.get(f"/runs/{run['runId']}").json()
    assert read["agentRevisionId"] == "agrev-2026-03" and read["version"] == 1
    assert _submit(client)["agentRevisionId"] is None
    bad = client.post(
        "/runs",
        headers={"Idempotency-Key": f"lc-{uuid.uuid4()}"},
        json={"tenant": "acme", "executionSpec": {}, "timeoutSeconds": 60, "agentRevisionId": "a\nb"},
    )
    assert bad.status_code == 422 and problem_type(bad) == "validation-failed"
    assert client.post(f"/runs/{run['runId']}/cancel", json={}).json()["status"] == "cancelled"
    retried = client.post(
        f"/runs/{run['runId']}/retry",
        json={"acknowledgeRepeatedEffects": True},
        headers={"Idempotency-Key": "retry-rev"},
    )
    assert retried.status_code == 201, retried.text
    assert retried.json()["agentRevisionId"] == "agrev-2026-03", "the retry runs what its parent ran"
