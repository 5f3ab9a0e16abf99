"""The object store on S3 (or any S3-compatible server): the one module that imports boto3.

The layout under the key prefix is the filesystem store's, name for name, so the two hold the
same objects under the same names and a bucket can be filled by copying a directory:
    <prefix>blobs/sha256/<hh>/<hex>   the bytes, once per distinct content
    <prefix>keys/<key>.json           {"key", "digest", "size_bytes", "media_type"}, the same JSON

How the filesystem's guarantees carry over:
- Readers never see half an object: a PUT is atomic in S3.
- Two writers of one key cannot both win: the key record is written with `If-None-Match: *`
  (a conditional write), and the loser compares what won (same_or_refuse), as os.link does.
- The blob is written before its key record, so a crash in between leaves an unreferenced
  blob, never a key whose bytes are missing.
- An upload is hashed while it is spooled locally (bounded by `max_bytes`, as everywhere), so
  nothing reaches the bucket before the digest, its name, is known; the PUT carries that
  digest as its x-amz-checksum-sha256, which S3 checks against what it received.
- What is read back is checked: `open` hashes the bytes as it downloads them and refuses
  (CorruptObject) bytes that do not match the key's digest; `verify` rehashes every blob.

Every failure of S3 itself (unreachable, timed out, throttled, 5xx, refused credentials, no such
bucket) raises ObjectStoreUnavailable, never a botocore exception, and its message names the
bucket and the operation only: no endpoint, no credential.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import tempfile
from collections.abc import Iterable, Iterator
from typing import IO, Any, BinaryIO, cast

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from services.common.objectstore._store import (
    CHUNK_BYTES,
    DIGEST_PREFIX,
    CorruptKeyRecord,
    CorruptObject,
    ManifestEntry,
    ObjectNotFound,
    ObjectStoreUnavailable,
    StoredObject,
    check_manifest,
    key_record_text,
    parse_key_record,
    read_limited,
    same_or_refuse,
    validate_key,
    validate_media_type,
)

__all__ = ["S3ObjectStore", "s3_client"]

# Uploads up to this size are spooled in memory, larger ones in a local temp file.
SPOOL_IN_MEMORY_BYTES = 8 << 20
# S3's answers to "no such object".
_NOT_FOUND = frozenset({"404", "NoSuchKey", "NotFound"})
# S3's answers to a conditional write whose condition failed (412), or that raced another
# conditional write of the same name (409 ConditionalRequestConflict: try again).
_EXISTS = frozenset({"412", "PreconditionFailed"})
_CONFLICT = frozenset({"409", "ConditionalRequestConflict"})
_RECORD_TRIES = 5


def s3_client(
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
    session_token: str | None = None,
    addressing_style: str = "auto",
    timeout_s: float = 5.0,
    max_attempts: int = 3,
) -> Any:
    """A boto3 S3 client with bounded timeouts and retries, so an outage answers within a
    request's deadline instead of botocore's minute of retries. Empty credentials: boto3's own
    chain (environment, profile, instance role)."""
    if addressing_style == "auto":
        # S3-compatible servers (MinIO, moto, Ceph) on an IP or a single host need path style.
        addressing_style = "path" if endpoint_url else "virtual"
    config = Config(
        connect_timeout=timeout_s,
        read_timeout=timeout_s,
        retries={"mode": "standard", "max_attempts": max_attempts},
        s3={"addressing_style": addressing_style},
    )
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url or None,
        region_name=region or None,
        aws_access_key_id=access_key_id or None,
        aws_secret_access_key=secret_access_key or None,
        aws_session_token=session_token or None,
        config=config,
    )


class S3ObjectStore:
    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        if not bucket:
            raise ValueError("the S3 object store needs a bucket (TENURE_S3_BUCKET)")
        self._s3 = client
        self._bucket = bucket
        cleaned = prefix.strip("/")
        if cleaned:
            validate_key(cleaned)  # the same rules as keys: no "..", no control characters
        self._prefix = f"{cleaned}/" if cleaned else ""

    def __repr__(self) -> str:  # never the client: its repr is harmless, but say only what is public
        return f"S3ObjectStore(bucket={self._bucket!r}, prefix={self._prefix!r})"

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def prefix(self) -> str:
        return self._prefix

    def blob_name(self, digest: str) -> str:
        hex_digest = digest.removeprefix(DIGEST_PREFIX)
        return f"{self._prefix}blobs/sha256/{hex_digest[:2]}/{hex_digest}"

    def record_name(self, key: str) -> str:
        return f"{self._prefix}keys/{key}.json"

    # --- the port -------------------------------------------------------------------------------

    def put(self, key: str, data: BinaryIO | bytes, *, max_bytes: int, media_type: str) -> StoredObject:
        validate_key(key)
        validate_media_type(media_type)
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY_BYTES) as spool:
            hasher = hashlib.sha256()
            size = 0
            for chunk in read_limited(key, data, max_bytes):
                hasher.update(chunk)
                spool.write(chunk)
                size += len(chunk)
            incoming = StoredObject(key, DIGEST_PREFIX + hasher.hexdigest(), size, media_type)
            blob = self.blob_name(incoming.digest)
            if not self._exists(blob):  # equal content is stored once
                spool.seek(0)
                checksum = base64.b64encode(hasher.digest()).decode("ascii")
                with self._mapped(f"storing the blob of {key!r}"):
                    self._s3.put_object(
                        Bucket=self._bucket,
                        Key=blob,
                        Body=spool,
                        ContentLength=size,
                        ContentType="application/octet-stream",
                        ChecksumSHA256=checksum,
                    )
        return self._record_key(incoming)

    def stat(self, key: str) -> StoredObject | None:
        name = self.record_name(validate_key(key))
        with self._mapped(f"reading the key record of {key!r}"):
            try:
                answer = self._s3.get_object(Bucket=self._bucket, Key=name)
                raw = answer["Body"].read()
            except ClientError as exc:
                if _code(exc) in _NOT_FOUND:
                    return None
                raise
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptKeyRecord(f"key record {name} cannot be read: {exc}") from exc
        return parse_key_record(key, name, text)

    def open(self, key: str) -> BinaryIO:
        stored = self.stat(key)
        if stored is None:
            raise ObjectNotFound(f"no object under key {key!r}")
        # Handed to the caller, who closes it (closed here on any failure).
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY_BYTES)  # noqa: SIM115
        try:
            actual = self._download(stored.digest, spool, limit=stored.size_bytes)
            if actual is None:
                raise ObjectNotFound(f"key {key!r} refers to {stored.digest}, whose blob is missing")
            if actual != (stored.digest, stored.size_bytes):
                raise CorruptObject(
                    f"key {key!r}: the bytes read back are not {stored.digest} "
                    f"({stored.size_bytes} bytes); nothing of them is served"
                )
            spool.seek(0)
        except BaseException:
            spool.close()
            raise
        return cast(BinaryIO, spool)

    def verify(self, entries: Iterable[ManifestEntry]) -> list[str]:
        return check_manifest(entries, self.stat, self._rehash_blob)

    # --- internals ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _mapped(self, what: str) -> Iterator[None]:
        """botocore's failures as the port's own: ObjectStoreUnavailable, without secrets."""
        try:
            yield
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            raise ObjectStoreUnavailable(
                f"the object store (s3://{self._bucket}) refused {what}: {_code(exc)} (HTTP {status})"
            ) from exc
        except BotoCoreError as exc:
            raise ObjectStoreUnavailable(
                f"the object store (s3://{self._bucket}) did not answer {what}: {type(exc).__name__}"
            ) from exc

    def _exists(self, name: str) -> bool:
        with self._mapped("looking for a blob"):
            try:
                self._s3.head_object(Bucket=self._bucket, Key=name)
            except ClientError as exc:
                if _code(exc) in _NOT_FOUND:
                    return False
                raise
        return True

    def _record_key(self, incoming: StoredObject) -> StoredObject:
        body = key_record_text(incoming).encode("utf-8")
        name = self.record_name(incoming.key)
        for _ in range(_RECORD_TRIES):
            with self._mapped(f"recording key {incoming.key!r}"):
                try:
                    self._s3.put_object(
                        Bucket=self._bucket,
                        Key=name,
                        Body=body,
                        ContentType="application/json",
                        IfNoneMatch="*",
                    )
                    return incoming
                except ClientError as exc:
                    if _code(exc) not in _EXISTS | _CONFLICT:
                        raise
            existing = self.stat(incoming.key)
            if existing is not None:
                return same_or_refuse(existing, incoming)
            # 409: a concurrent conditional write of this name had not finished; try again.
        raise ObjectStoreUnavailable(
            f"the object store (s3://{self._bucket}) kept answering conflicts for key {incoming.key!r}"
        )

    def _download(self, digest: str, out: IO[bytes] | None, *, limit: int | None) -> tuple[str, int] | None:
        """(digest, size) of the blob's bytes as read, written to `out`; None if it is gone.

        With `limit`, reading stops one byte past it: a blob longer than its record says is
        corrupt, and need not be read to its end to know."""
        hasher = hashlib.sha256()
        size = 0
        with self._mapped(f"reading blob {digest}"):
            try:
                answer = self._s3.get_object(Bucket=self._bucket, Key=self.blob_name(digest))
            except ClientError as exc:
                if _code(exc) in _NOT_FOUND:
                    return None
                raise
            body = answer["Body"]
            try:
                while chunk := body.read(CHUNK_BYTES):
                    hasher.update(chunk)
                    size += len(chunk)
                    if out is not None:
                        out.write(chunk)
                    if limit is not None and size > limit:
                        break
            finally:
                body.close()
        return DIGEST_PREFIX + hasher.hexdigest(), size

    def _rehash_blob(self, digest: str) -> tuple[str, int] | None:
        return self._download(digest, None, limit=None)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))
