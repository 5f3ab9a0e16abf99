"""Waiting for input (EXE-8, EXE-9, EXE-10) and the verified result manifest (EXE-1, EXE-15),
on real processes and a real broker, driven over HTTP like a runner and a user would."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.system import wait_until
from tests.support.tenure import TenureSystem, heartbeat, problem_type

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

APPROVAL = {"type": "object", "properties": {"approve": {"type": "boolean"}}, "required": ["approve"]}


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenureSystem]:
    s = TenureSystem(tenure_topics, tmp_path_factory.mktemp("input")).start()
    yield s
    s.stop()


@pytest.fixture
def client(system: TenureSystem) -> Iterator[httpx.Client]:
    with system.client() as c:
        yield c


def _running(client: httpx.Client, capabilities: list[str] | None = None) -> tuple[str, dict[str, Any]]:
    run = client.post(
        "/runs",
        headers={"Idempotency-Key": f"in-{uuid.uuid4()}"},
        json={"tenant": "acme", "executionSpec": {"agent": "asks"}, "timeoutSeconds": 600},
    ).json()
    grant = client.post(
        f"/runs/{run['runId']}/attempts",
        json={
            "runnerId": "runner-i",
            "capabilities": capabilities or [],
            "leaseSeconds": 60,
            "heartbeatSeconds": 5,
        },
    ).json()
    assert heartbeat(client, grant, 1).status_code == 200
    return run["runId"], grant


def _ask(
    client: httpx.Client, grant: dict[str, Any], sequence: int, expires_in_ms: int = 60_000
) -> httpx.Response:
    return client.post(
        f"/attempts/{grant['attemptId']}/input-request",
        json={
            "leaseEpoch": grant["epoch"],
            "sequence": sequence,
            "checkpointDigest": "sha256:" + "c" * 64,
            "inputSchema": APPROVAL,
            "prompt": "Deploy to production?",
            "expiresAt": int(time.time() * 1000) + expires_in_ms,
        },
    )


def test_waiting_input_round_trip_with_a_repeated_response_id_EXE_8_EXE_9(client: httpx.Client) -> None:
    run_id, grant = _running(client, ["checkpoint-v1"])
    deadline = client.get(f"/runs/{run_id}").json()["deadlineAt"]
    asked = _ask(client, grant, 2)
    assert asked.status_code == 200, asked.text
    assert asked.json()["acknowledged"] is True and asked.json()["leaseReleased"] is True
    view = client.get(f"/runs/{run_id}").json()
    assert view["status"] == "waiting_input" and view["lease"]["certainty"] == "released"

    bad = client.post(f"/runs/{run_id}/input", json={"responseId": "r1", "answer": {"approve": "yes"}})
    assert bad.status_code == 422 and problem_type(bad) == "input-invalid"
    ok = client.post(f"/runs/{run_id}/input", json={"responseId": "r1", "answer": {"approve": True}})
    assert ok.status_code == 200, ok.text
    assert ok.json()["status"] == "queued"
    versions = ok.json()["version"]
    again = client.post(f"/runs/{run_id}/input", json={"responseId": "r1", "answer": {"approve": True}})
    assert again.status_code == 200 and again.json()["version"] == versions, "a repeat creates nothing"

    continued = client.post(
        f"/runs/{run_id}/attempts", json={"runnerId": "runner-j", "leaseSeconds": 60, "heartbeatSeconds": 5}
    )
    assert continued.status_code == 201, continued.text
    context = continued.json()["attemptContext"]
    assert context["checkpointDigest"] == "sha256:" + "c" * 64
    assert context["inputResponse"]["answer"] == {"approve": True}
    assert continued.json()["epoch"] == 2
    assert client.get(f"/runs/{run_id}").json()["deadlineAt"] == deadline, (
        "EXE-10: continuation keeps the deadline"
    )


def test_waiting_needs_the_checkpoint_capability_EXE_8(client: httpx.Client) -> None:
    _, grant = _running(client, [])
    assert problem_type(_ask(client, grant, 2)) == "capability-missing"


def test_an_unanswered_input_request_fails_the_run_with_input_expired_EXE_10(client: httpx.Client) -> None:
    run_id, grant = _running(client, ["checkpoint-v1"])
    assert _ask(client, grant, 2, expires_in_ms=1500).status_code == 200
    view = wait_until(
        lambda: (v := client.get(f"/runs/{run_id}").json())["status"] == "failed" and v,
        20,
        "the input request to expire",
    )
    assert view["statusReason"].startswith("INPUT_EXPIRED")
    late = client.post(f"/runs/{run_id}/input", json={"responseId": "late", "answer": {"approve": True}})
    assert late.status_code == 409


def _upload(
    client: httpx.Client, grant: dict[str, Any], name: str, data: bytes, max_bytes: int = 1000
) -> httpx.Response:
    granted = client.post(
        f"/attempts/{grant['attemptId']}/uploads",
        json={
            "leaseEpoch": grant["epoch"],
            "destination": name,
            "maxBytes": max_bytes,
            "mediaType": "text/plain",
        },
    )
    assert granted.status_code == 201, granted.text
    return client.put(granted.json()["uploadUrl"], content=data)


def test_success_needs_every_artifact_verified_EXE_1_EXE_15(client: httpx.Client) -> None:
    _, grant = _running(client)
    data = b"the deployment report\n"
    stored = _upload(client, grant, "report.txt", data)
    assert stored.status_code == 201, stored.text
    assert stored.json()["digest"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert _upload(client, grant, "big.bin", b"x" * 11, max_bytes=10).status_code == 413
    manifest = [
        {
            "artifactId": "report.txt",
            "digest": stored.json()["digest"],
            "sizeBytes": len(data),
            "mediaType": "text/plain",
        }
    ]
    done = client.post(
        f"/attempts/{grant['attemptId']}/report",
        json={"leaseEpoch": grant["epoch"], "sequence": 2, "outcome": "succeeded", "manifest": manifest},
    )
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "succeeded"
    assert done.json()["resultManifest"][0]["digest"] == stored.json()["digest"]


def test_a_manifest_with_a_missing_artifact_fails_the_run_EXE_15(client: httpx.Client) -> None:
    _, grant = _running(client)
    manifest = [
        {
            "artifactId": "never-uploaded.txt",
            "digest": "sha256:" + "0" * 64,
            "sizeBytes": 3,
            "mediaType": "text/plain",
        }
    ]
    done = client.post(
        f"/attempts/{grant['attemptId']}/report",
        json={"leaseEpoch": grant["epoch"], "sequence": 2, "outcome": "succeeded", "manifest": manifest},
    )
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "failed"
    assert (
        done.json()["statusReason"].startswith("MANIFEST_INVALID")
        and "never-uploaded.txt" in done.json()["statusReason"]
    )


def test_exit_zero_without_a_manifest_is_not_a_success_EXE_1(client: httpx.Client) -> None:
    _, grant = _running(client)
    done = client.post(
        f"/attempts/{grant['attemptId']}/report",
        json={"leaseEpoch": grant["epoch"], "sequence": 2, "outcome": "succeeded"},
    )
    assert done.status_code == 200 and done.json()["status"] == "failed"
    assert done.json()["statusReason"].startswith("MANIFEST_INVALID")
