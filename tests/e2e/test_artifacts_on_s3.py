"""Artifacts on S3 end to end (issue 16, EXE-15): the API configured with TENURE_OBJECT_STORE=s3
against a real S3-compatible server (moto's server mode on 127.0.0.1, tests/support/s3.py),
with the real broker and processes. An upload through the API lands in the bucket under the
filesystem store's names (checked with a plain boto3 client, not Tenure's), byte for byte; the
success report's manifest is verified against the bucket (the API rehashes the blob it reads
back); and bytes damaged in the bucket fail the next manifest check."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.s3 import BUCKET, MotoS3, moto_s3
from tests.support.tenure import TenureSystem, heartbeat

__all__ = ["moto_s3"]

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

PREFIX = "e2e-tenure"


@pytest.fixture(scope="module")
def system(
    tenure_topics: str, tmp_path_factory: pytest.TempPathFactory, moto_s3: MotoS3
) -> Iterator[TenureSystem]:
    s = TenureSystem(tenure_topics, tmp_path_factory.mktemp("s3"), **moto_s3.tenure_env(PREFIX)).start()
    yield s
    s.stop()


def _running(client: httpx.Client) -> dict[str, Any]:
    run = client.post(
        "/runs",
        headers={"Idempotency-Key": f"s3-{uuid.uuid4()}"},
        json={"tenant": "acme", "executionSpec": {"agent": "writes"}, "timeoutSeconds": 600},
    ).json()
    grant: dict[str, Any] = client.post(
        f"/runs/{run['runId']}/attempts",
        json={"runnerId": "runner-s3", "leaseSeconds": 60, "heartbeatSeconds": 5},
    ).json()
    assert heartbeat(client, grant, 1).status_code == 200
    return grant


def _upload(client: httpx.Client, grant: dict[str, Any], name: str, data: bytes) -> httpx.Response:
    granted = client.post(
        f"/attempts/{grant['attemptId']}/uploads",
        json={
            "leaseEpoch": grant["epoch"],
            "destination": name,
            "maxBytes": 1 << 20,
            "mediaType": "text/csv",
        },
    )
    assert granted.status_code == 201, granted.text
    return client.put(granted.json()["uploadUrl"], content=data)


def _report(client: httpx.Client, grant: dict[str, Any], name: str, data: bytes) -> dict[str, Any]:
    manifest = [
        {
            "artifactId": name,
            "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
            "sizeBytes": len(data),
            "mediaType": "text/csv",
        }
    ]
    done = client.post(
        f"/attempts/{grant['attemptId']}/report",
        json={"leaseEpoch": grant["epoch"], "sequence": 2, "outcome": "succeeded", "manifest": manifest},
    )
    assert done.status_code == 200, done.text
    view: dict[str, Any] = done.json()
    return view


def test_an_upload_lands_in_the_bucket_and_its_manifest_is_verified_there_EXE_15(
    system: TenureSystem, moto_s3: MotoS3
) -> None:
    data = b"".join(b"row %d,%s\n" % (i, hashlib.sha256(b"%d" % i).hexdigest().encode()) for i in range(5000))
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with system.client() as client:
        grant = _running(client)
        stored = _upload(client, grant, "table.csv", data)
        assert stored.status_code == 201, stored.text
        key = stored.json()["key"]
        assert stored.json()["digest"] == digest and stored.json()["sizeBytes"] == len(data)

        plain = moto_s3.plain_client()  # not Tenure's client: what any S3 user sees
        hex_digest = digest.removeprefix("sha256:")
        blob = f"{PREFIX}/blobs/sha256/{hex_digest[:2]}/{hex_digest}"
        record_name = f"{PREFIX}/keys/{key}.json"
        assert {blob, record_name} <= set(moto_s3.names(PREFIX + "/"))
        assert plain.get_object(Bucket=BUCKET, Key=blob)["Body"].read() == data, "byte for byte"
        record = json.loads(plain.get_object(Bucket=BUCKET, Key=record_name)["Body"].read())
        assert record == {"key": key, "digest": digest, "size_bytes": len(data), "media_type": "text/csv"}

        view = _report(client, grant, "table.csv", data)
        assert view["status"] == "succeeded", view.get("statusReason")
        assert view["resultManifest"][0]["digest"] == digest

        # Bytes damaged in the bucket are found by the next run's manifest check.
        other = _running(client)
        damaged = b"other,content\n" * 100
        assert _upload(client, other, "table.csv", damaged).status_code == 201
        other_hex = hashlib.sha256(damaged).hexdigest()
        plain.put_object(
            Bucket=BUCKET, Key=f"{PREFIX}/blobs/sha256/{other_hex[:2]}/{other_hex}", Body=b"x" + damaged[1:]
        )
        failed = _report(client, other, "table.csv", damaged)
        assert failed["status"] == "failed"
        assert failed["statusReason"].startswith("MANIFEST_INVALID") and "corrupt" in failed["statusReason"]
