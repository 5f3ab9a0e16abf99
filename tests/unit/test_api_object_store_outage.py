"""An outage of the artifact store answers 503 with Retry-After at the API, never a 500, and is
no verdict on a manifest (EXE-15): the S3 store pointed at a port nothing listens on, under the
real app over the in-process harness (tests/support/api_harness.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from services.command_api.app import create_app
from services.common.objectstore.s3 import S3ObjectStore, s3_client
from tests.support.api_harness import InMemoryTenure

pytestmark = pytest.mark.timeout(60)

KEYS = "rita-key=rita:submitter"
RITA = {"Authorization": "Bearer rita-key"}


def _dead_store() -> S3ObjectStore:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    client = s3_client(
        endpoint_url=f"http://127.0.0.1:{port}",
        region="us-east-1",
        access_key_id="k",
        secret_access_key="never-in-an-answer",
        timeout_s=0.5,
        max_attempts=1,
    )
    return S3ObjectStore(client, "tenure-artifacts")


@pytest.fixture()
def client(tmp_path: Path) -> Iterator[TestClient]:
    tenure = InMemoryTenure()
    deps = dataclasses.replace(tenure.dependencies(tmp_path, KEYS, 2.0), objects=_dead_store())
    with TestClient(create_app(lambda: deps), raise_server_exceptions=False) as c:
        yield c


def _unavailable(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert int(response.headers["retry-after"]) >= 1
    body: dict[str, Any] = response.json()
    assert body["type"] == "/problems/unavailable" and "s3://tenure-artifacts" in body["detail"]
    assert "never-in-an-answer" not in response.text
    return body


def test_an_object_store_outage_is_503_with_retry_after_on_upload_and_report_EXE_15(
    client: TestClient,
) -> None:
    run = client.post(
        "/runs",
        headers={**RITA, "Idempotency-Key": "s3-down"},
        json={"tenant": "acme", "executionSpec": {"k": 1}, "timeoutSeconds": 600},
    ).json()
    grant = client.post(f"/runs/{run['runId']}/attempts", headers=RITA, json={"runnerId": "r"}).json()
    attempt, epoch = grant["attemptId"], grant["epoch"]
    assert (
        client.post(
            f"/attempts/{attempt}/heartbeat", headers=RITA, json={"leaseEpoch": epoch, "sequence": 1}
        ).status_code
        == 200
    )
    granted = client.post(
        f"/attempts/{attempt}/uploads",
        headers=RITA,
        json={"leaseEpoch": epoch, "destination": "out.txt", "maxBytes": 100, "mediaType": "text/plain"},
    )
    assert granted.status_code == 201, granted.text
    _unavailable(client.put(granted.json()["uploadUrl"], headers=RITA, content=b"the bytes"))

    digest = "sha256:" + hashlib.sha256(b"the bytes").hexdigest()
    manifest = [{"artifactId": "out.txt", "digest": digest, "sizeBytes": 9, "mediaType": "text/plain"}]
    report = client.post(
        f"/attempts/{attempt}/report",
        headers=RITA,
        json={"leaseEpoch": epoch, "sequence": 2, "outcome": "succeeded", "manifest": manifest},
    )
    _unavailable(report)
    view = client.get(f"/runs/{run['runId']}", headers=RITA).json()
    assert view["status"] == "running", "a store that did not answer must not fail the run's manifest"
