"""Idempotency-Key has Stripe's semantics on every route that takes one (issue 10).

A key names one request: the same key with the same canonical request is the first answer again
(same status, same run or grant, nothing new decided); the same key with a different request is
409 idempotency-key-conflict naming the fields that differ, and nothing is published. The API
runs over tests/support/api_harness.py: the real app, routes and views, the real pure cores
deciding, no broker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.contracts import (
    CancelRun,
    ClaimRun,
    ProposeStep,
    ProvideInput,
    RetryRun,
    StartTrajectory,
    SubmitRun,
    TakeOverLease,
)
from tests.support.api_harness import api_client

KEYS = "rita-key=rita:submitter,sam-key=sam:submitter,olga-key=olga:operator"
RITA = {"Authorization": "Bearer rita-key"}
SAM = {"Authorization": "Bearer sam-key"}
OLGA = {"Authorization": "Bearer olga-key"}
SPEC = {"agent": "triage-bot", "input": "ticket 42"}


def _submission(**changes: Any) -> dict[str, Any]:
    return {"tenant": "acme", "executionSpec": SPEC, "timeoutSeconds": 600, "retrySafe": False, **changes}


def _submit(client: Any, key: str, headers: dict[str, str] = RITA, **changes: Any) -> httpx.Response:
    response: httpx.Response = client.post(
        "/runs", headers={**headers, "Idempotency-Key": key}, json=_submission(**changes)
    )
    return response


def _conflict(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 409, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["type"] == "/problems/idempotency-key-conflict", body
    return body


def _run(client: Any, key: str = "run-1") -> str:
    created = _submit(client, key)
    assert created.status_code == 201, created.text
    return str(created.json()["runId"])


def _claim(client: Any, run_id: str, key: str | None, headers: dict[str, str] = RITA, **body: Any) -> Any:
    extra = {"Idempotency-Key": key} if key else {}
    return client.post(
        f"/runs/{run_id}/attempts", headers={**headers, **extra}, json={"runnerId": "runner-a", **body}
    )


@pytest.fixture()
def api(tmp_path: Path) -> Any:
    with api_client(tmp_path, api_keys=KEYS) as pair:
        yield pair


# --- POST /runs ---------------------------------------------------------------------------------


def test_submit_with_a_changed_timeout_or_retry_safe_is_a_conflict_naming_the_fields(api: Any) -> None:
    client, tenure = api
    first = _submit(client, "k-1")
    assert first.status_code == 201, first.text

    body = _conflict(_submit(client, "k-1", timeoutSeconds=900))
    assert body["fields"] == ["timeoutSeconds"]
    assert "timeoutSeconds" in body["detail"] and body["runId"] == first.json()["runId"]
    assert _conflict(_submit(client, "k-1", retrySafe=True))["fields"] == ["retrySafe"]
    assert _conflict(_submit(client, "k-1", retrySafe=True, maxAttempts=5))["fields"] == [
        "retrySafe",
        "maxAttempts",
    ]
    assert _conflict(_submit(client, "k-1", executionSpec={"agent": "x"}))["fields"] == ["executionSpec"]
    assert len(tenure.commands_of(SubmitRun)) == 1, "a conflicting request publishes nothing"
    view = client.get(f"/runs/{first.json()['runId']}", headers=RITA).json()
    assert view["timeoutSeconds"] == 600 and view["retrySafe"] is False, "the run is unchanged"


def test_submit_repeated_with_the_same_body_is_the_same_run(api: Any) -> None:
    client, tenure = api
    first = _submit(client, "k-2")
    again = _submit(client, "k-2")
    assert again.status_code == 200 and again.json() == first.json()
    assert again.headers["location"] == f"/runs/{first.json()['runId']}"
    # Defaults applied are the same request: omitting maxAttempts is sending its default.
    assert _submit(client, "k-2", maxAttempts=3).status_code == 200
    assert len(tenure.commands_of(SubmitRun)) == 1


def test_submit_under_another_principals_key_is_a_conflict(api: Any) -> None:
    client, _ = api
    assert _submit(client, "k-3").status_code == 201
    assert _conflict(_submit(client, "k-3", headers=SAM))["fields"] == ["principal"]


# --- claims -------------------------------------------------------------------------------------


def test_a_repeated_claim_answers_the_grant_it_made_not_already_granted(api: Any) -> None:
    client, tenure = api
    run_id = _run(client)
    granted = _claim(client, run_id, "claim-1", leaseSeconds=30, capabilities=["checkpoint-v1"])
    assert granted.status_code == 201, granted.text
    again = _claim(client, run_id, "claim-1", leaseSeconds=30, capabilities=["checkpoint-v1"])
    assert again.status_code == 201, again.text
    assert again.json() == granted.json(), "the same grant, field for field"
    assert len(tenure.commands_of(ClaimRun)) == 1


def test_a_claim_under_the_same_key_with_another_body_is_a_conflict(api: Any) -> None:
    client, tenure = api
    run_id = _run(client)
    assert _claim(client, run_id, "claim-2", leaseSeconds=30).status_code == 201
    assert _conflict(_claim(client, run_id, "claim-2", leaseSeconds=60))["fields"] == ["leaseSeconds"]
    body = _conflict(_claim(client, run_id, "claim-2", runnerId="runner-b", leaseSeconds=30))
    assert body["fields"] == ["runnerId"]
    # leaseSeconds left out: the coordinator's default, which the view cannot tell from 30.
    assert "leaseSeconds" in _conflict(_claim(client, run_id, "claim-2"))["fields"]
    assert _conflict(_claim(client, run_id, "claim-2", headers=SAM, leaseSeconds=30))["fields"] == [
        "principal"
    ]
    assert len(tenure.commands_of(ClaimRun)) == 1


def test_claims_without_a_key_are_separate_requests(api: Any) -> None:
    client, _ = api
    run_id = _run(client)
    assert _claim(client, run_id, None).status_code == 201
    second = _claim(client, run_id, None)
    assert second.status_code == 409 and second.json()["type"] == "/problems/run-not-claimable"


def test_a_repeated_takeover_answers_the_grant_it_made(api: Any) -> None:
    client, tenure = api
    run_id = _run(client)
    assert _claim(client, run_id, "claim-3").status_code == 201
    body = {"reason": "runner host lost", "newHolder": "olga"}
    headers = {**OLGA, "Idempotency-Key": "take-1"}
    taken = client.post(f"/runs/{run_id}/lease/takeover", headers=headers, json=body)
    assert taken.status_code == 200, taken.text
    again = client.post(f"/runs/{run_id}/lease/takeover", headers=headers, json=body)
    assert again.status_code == 200 and again.json() == taken.json()
    other = client.post(f"/runs/{run_id}/lease/takeover", headers=headers, json={**body, "reason": "other"})
    assert _conflict(other)["fields"] == ["reason"]
    assert len(tenure.commands_of(TakeOverLease)) == 1


# --- cancel, retry ------------------------------------------------------------------------------


def test_cancel_under_the_same_key(api: Any) -> None:
    client, tenure = api
    run_id = _run(client)
    headers = {**RITA, "Idempotency-Key": "cancel-1"}
    first = client.post(f"/runs/{run_id}/cancel", headers=headers, json={"reason": "changed my mind"})
    assert first.status_code == 200, first.text
    again = client.post(f"/runs/{run_id}/cancel", headers=headers, json={"reason": "changed my mind"})
    assert again.status_code == 200 and again.json() == first.json()
    other = client.post(f"/runs/{run_id}/cancel", headers=headers, json={"reason": "another reason"})
    assert _conflict(other)["fields"] == ["reason"]
    assert len(tenure.commands_of(CancelRun)) == 1


def test_retry_of_an_ended_run_under_the_same_key(api: Any) -> None:
    client, tenure = api
    run_id = _run(client)
    assert client.post(f"/runs/{run_id}/cancel", headers=RITA, json={}).status_code == 200
    headers = {**RITA, "Idempotency-Key": "retry-1"}
    body = {"acknowledgeRepeatedEffects": True, "reason": "try again"}
    first = client.post(f"/runs/{run_id}/retry", headers=headers, json=body)
    assert first.status_code == 201, first.text
    child = first.json()["runId"]
    assert child != run_id and first.json()["parentRunId"] == run_id
    again = client.post(f"/runs/{run_id}/retry", headers=headers, json=body)
    assert again.status_code == 201 and again.json()["runId"] == child
    assert again.headers["location"] == f"/runs/{child}"
    # The new run does not record the retry's reason: it is named as a candidate.
    other = client.post(f"/runs/{run_id}/retry", headers=headers, json={**body, "reason": "other"})
    assert "reason" in _conflict(other)["fields"]
    assert len([c for c in tenure.commands_of(SubmitRun) if c.parent_run_id == run_id]) == 1
    assert not tenure.commands_of(RetryRun)


# --- runner commands ----------------------------------------------------------------------------


def test_a_report_repeated_with_another_body_is_a_conflict(api: Any) -> None:
    client, _ = api
    run_id = _run(client)
    grant = _claim(client, run_id, "claim-4").json()
    report = {"leaseEpoch": grant["epoch"], "sequence": 1, "outcome": "failed", "detail": "boom"}
    url = f"/attempts/{grant['attemptId']}/report"
    first = client.post(url, headers=RITA, json=report)
    assert first.status_code == 200, first.text
    assert client.post(url, headers=RITA, json=report).json() == first.json()
    assert _conflict(client.post(url, headers=RITA, json={**report, "detail": "other"}))["fields"] == [
        "detail"
    ]


def test_an_answer_repeated_with_another_value_is_a_conflict(api: Any) -> None:
    client, tenure = api
    run_id = _run(client)
    grant = _claim(client, run_id, "claim-5", capabilities=["checkpoint-v1"]).json()
    attempt = grant["attemptId"]
    ok = client.post(f"/attempts/{attempt}/heartbeat", headers=RITA, json={"leaseEpoch": 1, "sequence": 1})
    assert ok.status_code == 200, ok.text
    asked = client.post(
        f"/attempts/{attempt}/input-request",
        headers=RITA,
        json={
            "leaseEpoch": 1,
            "sequence": 2,
            "checkpointDigest": "sha256:" + "0" * 64,
            "inputSchema": {"type": "object"},
            "prompt": "approve?",
            "expiresAt": grant["serverTime"] + 600_000,
        },
    )
    assert asked.status_code == 200, asked.text
    answer = {"responseId": "r-1", "answer": {"approved": True}}
    first = client.post(f"/runs/{run_id}/input", headers=RITA, json=answer)
    assert first.status_code == 200, first.text
    assert client.post(f"/runs/{run_id}/input", headers=RITA, json=answer).status_code == 200
    other = client.post(f"/runs/{run_id}/input", headers=RITA, json={**answer, "answer": {"approved": False}})
    assert _conflict(other)["fields"] == ["answer"]
    assert len(tenure.commands_of(ProvideInput)) == 1


# --- trajectory routes --------------------------------------------------------------------------


def test_trajectory_commands_under_the_same_key(api: Any) -> None:
    client, tenure = api
    run_id = _run(client)
    grant = _claim(client, run_id, "claim-6").json()
    lease = {"attemptId": grant["attemptId"], "leaseEpoch": grant["epoch"]}
    url = f"/runs/{run_id}/trajectory"
    start = {**lease, "pivotApproval": "none"}
    started = client.post(url, headers={**RITA, "Idempotency-Key": "t-1"}, json=start)
    assert started.status_code == 201, started.text
    again = client.post(url, headers={**RITA, "Idempotency-Key": "t-1"}, json=start)
    assert again.status_code == 201 and again.json()["version"] == started.json()["version"]
    human = {**lease, "pivotApproval": "human"}
    other = client.post(url, headers={**RITA, "Idempotency-Key": "t-1"}, json=human)
    assert _conflict(other)["fields"] == ["pivotApproval"]
    assert len(tenure.commands_of(StartTrajectory)) == 1

    step = {**lease, "tool": "cache.warm", "params": {"name": "front"}}
    steps = f"{url}/steps"
    proposed = client.post(steps, headers={**RITA, "Idempotency-Key": "s-1"}, json=step)
    assert proposed.status_code == 202, proposed.text
    repeated = client.post(steps, headers={**RITA, "Idempotency-Key": "s-1"}, json=step)
    assert repeated.status_code == 202 and repeated.json()["replayed"] is True
    assert repeated.json()["stepIndex"] == proposed.json()["stepIndex"]
    changed = client.post(
        steps, headers={**RITA, "Idempotency-Key": "s-1"}, json={**step, "params": {"name": "back"}}
    )
    assert _conflict(changed)["fields"] == ["params"]
    assert len(tenure.commands_of(ProposeStep)) == 1


def test_abort_under_the_same_key_with_another_reason_is_a_conflict(api: Any) -> None:
    """Finish, abort and adopt record only who sent them: a different body is told by the command
    id's fingerprint, and the fields the view does not record are named as candidates."""
    client, _ = api
    run_id = _run(client)
    grant = _claim(client, run_id, "claim-7").json()
    lease = {"attemptId": grant["attemptId"], "leaseEpoch": grant["epoch"]}
    url = f"/runs/{run_id}/trajectory"
    assert client.post(url, headers=RITA, json=lease).status_code == 201
    headers = {**RITA, "Idempotency-Key": "a-1"}
    aborted = client.post(f"{url}/abort", headers=headers, json={**lease, "reason": "not needed"})
    assert aborted.status_code == 200, aborted.text
    again = client.post(f"{url}/abort", headers=headers, json={**lease, "reason": "not needed"})
    assert again.status_code == 200 and again.json()["version"] == aborted.json()["version"]
    changed = _conflict(client.post(f"{url}/abort", headers=headers, json={**lease, "reason": "other"}))
    assert "reason" in changed["fields"] and "principal" not in changed["fields"]
