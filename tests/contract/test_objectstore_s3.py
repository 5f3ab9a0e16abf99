"""The ObjectStore contract against S3ObjectStore on a real S3-compatible server (moto's server
mode on 127.0.0.1, tests/support/s3.py), plus what only a remote store has: its layout in the
bucket (the filesystem store's, name for name), digest checks on what is read back, and
outages that surface as the port's ObjectStoreUnavailable, never as a botocore error. EXE-15."""

from __future__ import annotations

import hashlib
import io
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from services.common.objectstore import (
    CorruptObject,
    ManifestEntry,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreUnavailable,
    open_object_store,
)
from services.common.objectstore.s3 import S3ObjectStore, s3_client
from services.common.settings import TenureSettings
from tests.contract.test_objectstore_contract import BIG, KEY, PDF, ObjectStoreContract, sha
from tests.support.s3 import BUCKET, MotoS3, moto_s3

__all__ = ["moto_s3"]  # the fixture, used by this module's tests

pytestmark = pytest.mark.timeout(60)


def prefix_of(location: Path) -> str:
    """One prefix per test location: each test gets an empty store, and reopening finds its own."""
    return "contract/" + hashlib.sha256(str(location).encode()).hexdigest()[:16]


class TestS3ObjectStore(ObjectStoreContract):
    persistent = True

    @pytest.fixture(autouse=True)
    def _server(self, moto_s3: MotoS3) -> None:
        self.s3 = moto_s3

    def open_store(self, location: Path) -> ObjectStore:
        return S3ObjectStore(self.s3.tenure_client(), BUCKET, prefix_of(location))

    def blob_count(self, store: Any) -> int:
        return len(self.s3.names(store.prefix + "blobs/"))

    def leftovers(self, store: Any) -> list[str]:
        """Anything but blobs and key records, and any multipart upload left open."""
        stray = [
            n
            for n in self.s3.names(store.prefix)
            if not n.startswith((store.prefix + "blobs/", store.prefix + "keys/"))
        ]
        uploads = self.s3.plain_client().list_multipart_uploads(Bucket=BUCKET, Prefix=store.prefix)
        return stray + [u["Key"] for u in uploads.get("Uploads", [])]

    def corrupt_blob(self, store: Any, digest: str) -> None:
        plain = self.s3.plain_client()
        name = store.blob_name(digest)
        content = bytearray(plain.get_object(Bucket=BUCKET, Key=name)["Body"].read())
        content[0] ^= 0x01  # flip one bit of the first byte in the bucket
        plain.put_object(Bucket=BUCKET, Key=name, Body=bytes(content))

    # --- S3 only -------------------------------------------------------------------------------

    def test_layout_in_the_bucket_is_the_filesystem_layout_EXE_15(self, tmp_path: Path) -> None:
        store = self.open_store(tmp_path)
        assert isinstance(store, S3ObjectStore)
        stored = store.put(KEY, b"pdf bytes", max_bytes=100, media_type=PDF)
        hex_digest = stored.digest.removeprefix("sha256:")
        p = store.prefix
        assert self.s3.names(p) == [f"{p}blobs/sha256/{hex_digest[:2]}/{hex_digest}", f"{p}keys/{KEY}.json"]
        plain = self.s3.plain_client()
        assert (
            plain.get_object(Bucket=BUCKET, Key=store.blob_name(stored.digest))["Body"].read() == b"pdf bytes"
        )
        record = json.loads(plain.get_object(Bucket=BUCKET, Key=f"{p}keys/{KEY}.json")["Body"].read())
        assert record == {"key": KEY, "digest": stored.digest, "size_bytes": 9, "media_type": PDF}

    def test_bytes_damaged_in_the_bucket_are_never_served_EXE_15(self, tmp_path: Path) -> None:
        store = self.open_store(tmp_path)
        stored = store.put(KEY, BIG, max_bytes=len(BIG), media_type=PDF)
        self.corrupt_blob(store, stored.digest)
        with pytest.raises(CorruptObject, match="read back"):
            store.open(KEY)
        # A blob longer than its record is as damaged (and is not read to its end).
        plain = self.s3.plain_client()
        plain.put_object(Bucket=BUCKET, Key=store.blob_name(stored.digest), Body=BIG + b"extra")
        with pytest.raises(CorruptObject):
            store.open(KEY)

    def test_a_missing_blob_is_reported_not_hidden(self, tmp_path: Path) -> None:
        store = self.open_store(tmp_path)
        stored = store.put(KEY, b"soon gone", max_bytes=100, media_type=PDF)
        self.s3.plain_client().delete_object(Bucket=BUCKET, Key=store.blob_name(stored.digest))
        with pytest.raises(ObjectNotFound, match="blob is missing"):
            store.open(KEY)
        entry = ManifestEntry("a1", KEY, stored.digest, stored.size_bytes, PDF)
        assert store.verify([entry]) == [f"artifact a1: stored blob {stored.digest} is missing"]

    def test_the_factory_opens_the_configured_bucket(self, tmp_path: Path) -> None:
        settings = TenureSettings(
            object_store="s3",
            s3_bucket=BUCKET,
            s3_endpoint_url=self.s3.endpoint_url,
            s3_region="us-east-1",
            s3_access_key_id="testing",
            s3_secret_access_key="testing-secret",  # type: ignore[arg-type]  # pydantic coerces it
            s3_key_prefix="factory/" + prefix_of(tmp_path),
        )
        assert "testing-secret" not in repr(settings) and "testing-secret" not in str(settings.model_dump())
        store = open_object_store(settings, tmp_path / "unused")
        assert isinstance(store, S3ObjectStore) and not (tmp_path / "unused").exists()
        store.put("a/b.txt", b"via settings", max_bytes=100, media_type="text/plain")
        name = f"factory/{prefix_of(tmp_path)}/keys/a/b.txt.json"
        assert name in self.s3.names("factory/")
        assert "testing-secret" not in repr(store)
        default = open_object_store(TenureSettings(), tmp_path / "fs")
        assert type(default).__name__ == "FilesystemObjectStore", "the filesystem stays the default"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens on it once the socket is closed


def test_an_unreachable_store_raises_the_ports_own_error_for_every_call() -> None:
    client = s3_client(
        endpoint_url=f"http://127.0.0.1:{closed_port()}",
        region="us-east-1",
        access_key_id="k",
        secret_access_key="do-not-show-me",
        timeout_s=0.5,
        max_attempts=1,
    )
    store = S3ObjectStore(client, BUCKET, "down")
    calls = [
        lambda: store.put(KEY, b"x", max_bytes=10, media_type=PDF),
        lambda: store.put(KEY, io.BytesIO(b"x"), max_bytes=10, media_type=PDF),
        lambda: store.stat(KEY),
        lambda: store.open(KEY),
        # An outage is no verdict on a manifest: raised, never reported as the artifact's problem.
        lambda: store.verify([ManifestEntry("a1", KEY, sha(b"x"), 1, PDF)]),
    ]
    for call in calls:
        with pytest.raises(ObjectStoreUnavailable, match=f"s3://{BUCKET}") as caught:
            call()
        assert "do-not-show-me" not in str(caught.value) and "127.0.0.1" not in str(caught.value)


def test_a_missing_bucket_is_an_outage_not_a_missing_object(moto_s3: MotoS3) -> None:
    store = S3ObjectStore(moto_s3.tenure_client(max_attempts=1), "no-such-bucket-here", "")
    with pytest.raises(ObjectStoreUnavailable, match="NoSuchBucket"):
        store.put(KEY, b"x", max_bytes=10, media_type=PDF)
    with pytest.raises(ObjectStoreUnavailable):
        store.stat(KEY)
