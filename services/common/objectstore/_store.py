"""The artifact object store port (EXE-15): value types, errors, and the rules both stores share.

Objects are content-addressed by SHA-256 and reached through immutable keys such as
"runs/<runId>/<attemptId>/report.pdf". The ResultManifest names artifacts only by id, key,
digest, size and media type (never a URL), so `verify` is how the service checks, before
terminal success, that what the runner claims to have uploaded is really there and intact.

The key rules, the streaming size limit and the manifest check live here, not in each store, so
the in-memory twin cannot accept a key or an upload that the filesystem store would refuse.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Protocol

__all__ = [
    "CHUNK_BYTES",
    "DIGEST_PREFIX",
    "MAX_KEY_CHARS",
    "CorruptKeyRecord",
    "CorruptObject",
    "InvalidKey",
    "InvalidMediaType",
    "KeyExists",
    "ManifestEntry",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectStoreUnavailable",
    "ObjectTooLarge",
    "StoredObject",
    "check_manifest",
    "key_record_text",
    "parse_key_record",
    "read_limited",
    "same_or_refuse",
    "sha256_digest",
    "validate_key",
    "validate_media_type",
]

CHUNK_BYTES = 64 * 1024
MAX_KEY_CHARS = 512
# Each key segment becomes a file or directory name (plus ".json"); Linux caps names at 255 bytes.
MAX_SEGMENT_BYTES = 250
MAX_MEDIA_TYPE_CHARS = 255
DIGEST_PREFIX = "sha256:"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class ObjectStoreError(Exception):
    """Base of every object store error."""


class InvalidKey(ObjectStoreError, ValueError):
    """The key is not a safe relative path (see `validate_key`)."""


class InvalidMediaType(ObjectStoreError, ValueError):
    """The media type is not of the form "type/subtype"."""


class ObjectTooLarge(ObjectStoreError):
    """More bytes arrived than the upload allows; nothing was stored."""

    def __init__(self, key: str, max_bytes: int) -> None:
        super().__init__(f"object {key!r} exceeds its limit of {max_bytes} bytes; nothing was stored")
        self.key = key
        self.max_bytes = max_bytes


class KeyExists(ObjectStoreError):
    """The key already holds a different object; keys are immutable."""


class ObjectNotFound(ObjectStoreError, LookupError):
    """No object is stored under the key (or its blob is gone)."""


class CorruptKeyRecord(ObjectStoreError):
    """The record that maps a key to its digest cannot be read back."""


class CorruptObject(ObjectNotFound):
    """The bytes read back do not match the digest the key was stored with.

    A kind of ObjectNotFound: the object as stored is gone, and damaged bytes are never served."""


class ObjectStoreUnavailable(ObjectStoreError):
    """The store could not be reached or did not answer (a remote store's outage, throttling,
    refused credentials). Nothing is known about the object: an API answers 503 with
    Retry-After, and a manifest check is not a verdict on the artifacts."""


@dataclass(frozen=True, slots=True)
class StoredObject:
    key: str
    digest: str  # "sha256:<64 lowercase hex>"
    size_bytes: int
    media_type: str


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One artifact as a ResultManifest claims it (EXE-15)."""

    artifact_id: str
    key: str
    digest: str
    size_bytes: int
    media_type: str


class ObjectStore(Protocol):
    def put(self, key: str, data: BinaryIO | bytes, *, max_bytes: int, media_type: str) -> StoredObject:
        """Store `data` under `key`, reading it in chunks and refusing it (ObjectTooLarge, nothing
        left behind) as soon as more than `max_bytes` arrive. Putting the same content and media
        type again is idempotent; anything else under an existing key raises KeyExists."""
        ...

    def stat(self, key: str) -> StoredObject | None: ...

    def open(self, key: str) -> BinaryIO:
        """The stored bytes, for reading; raises ObjectNotFound."""
        ...

    def verify(self, entries: Iterable[ManifestEntry]) -> list[str]:
        """Every problem with the entries against what is stored, including stored bytes that
        no longer match their digest; empty when all entries check out."""
        ...


def key_record_text(stored: StoredObject) -> str:
    """The key record both persistent stores write, byte for byte the same JSON."""
    record = {
        "key": stored.key,
        "digest": stored.digest,
        "size_bytes": stored.size_bytes,
        "media_type": stored.media_type,
    }
    return json.dumps(record, ensure_ascii=False, sort_keys=True)


def parse_key_record(key: str, where: str, text: str) -> StoredObject:
    """The StoredObject a key record describes; CorruptKeyRecord unless it is `key`'s and sound."""
    try:
        fields = json.loads(text)
        stored = StoredObject(
            key=fields["key"],
            digest=fields["digest"],
            size_bytes=fields["size_bytes"],
            media_type=fields["media_type"],
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptKeyRecord(f"key record {where} is not a valid record: {exc!r}") from exc
    if (
        stored.key != key
        or not isinstance(stored.digest, str)
        or _DIGEST.fullmatch(stored.digest) is None
        or not isinstance(stored.size_bytes, int)
        or isinstance(stored.size_bytes, bool)
        or stored.size_bytes < 0
        or not isinstance(stored.media_type, str)
    ):
        raise CorruptKeyRecord(f"key record {where} does not describe key {key!r}: {text[:200]!r}")
    return stored


def sha256_digest(data: bytes) -> str:
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()


def same_or_refuse(existing: StoredObject, incoming: StoredObject) -> StoredObject:
    """Keys are immutable: a repeated put of the same object is a no-op, anything else refused."""
    if (existing.digest, existing.media_type) == (incoming.digest, incoming.media_type):
        return existing
    raise KeyExists(
        f"key {existing.key!r} already holds {existing.digest} ({existing.media_type}); "
        f"refusing {incoming.digest} ({incoming.media_type})"
    )


def validate_key(key: object) -> str:
    """Return `key` if it is a safe relative path, else raise InvalidKey.

    Refused: non-strings, empty or longer than MAX_KEY_CHARS, absolute paths, empty, "." or
    ".." segments, backslashes, control characters, text that is not UTF-8 encodable, segments
    longer than MAX_SEGMENT_BYTES, and a ".json" suffix on any but the last segment (the
    filesystem store records key "a/b" in "a/b.json", which must never be key "a/b.json/c"'s
    directory).
    """
    if not isinstance(key, str):
        raise InvalidKey(f"key must be a str, not {type(key).__name__}")
    if not key or len(key) > MAX_KEY_CHARS:
        raise InvalidKey(f"key must have 1 to {MAX_KEY_CHARS} characters, got {len(key)}")
    if key.startswith("/"):
        raise InvalidKey(f"key {key!r} must be relative, not absolute")
    if "\\" in key or any(ord(ch) < 32 or ord(ch) == 127 for ch in key):
        raise InvalidKey(f"key {key!r} contains a backslash or a control character")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidKey(f"key {key!r} is not valid UTF-8 text") from exc
    segments = key.split("/")
    for index, segment in enumerate(segments):
        if segment in ("", ".", ".."):
            raise InvalidKey(f"key {key!r} has an empty, '.' or '..' segment")
        if len(segment.encode("utf-8")) > MAX_SEGMENT_BYTES:
            raise InvalidKey(f"key {key!r} has a segment longer than {MAX_SEGMENT_BYTES} bytes")
        if index < len(segments) - 1 and segment.endswith(".json"):
            raise InvalidKey(f"key {key!r}: only the last segment may end in '.json'")
    return key


def validate_media_type(media_type: object) -> str:
    """Return `media_type` if it looks like "type/subtype[; parameters]", else raise."""
    if not isinstance(media_type, str) or len(media_type) > MAX_MEDIA_TYPE_CHARS:
        raise InvalidMediaType(f"media type {media_type!r} is not of the form 'type/subtype'")
    kind, _, subtype = media_type.partition(";")[0].strip().partition("/")
    if not kind or not subtype or any(ord(ch) < 32 or ord(ch) == 127 for ch in media_type):
        raise InvalidMediaType(f"media type {media_type!r} is not of the form 'type/subtype'")
    return media_type


def read_limited(key: str, data: BinaryIO | bytes, max_bytes: int) -> Iterator[bytes]:
    """Yield `data` in chunks; raise ObjectTooLarge as soon as more than `max_bytes` arrived.

    Never asks a stream for more than one byte past the limit, so an oversized upload is cut
    off without being read to its end.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ValueError(f"max_bytes must be an int >= 0, got {max_bytes!r}")
    if isinstance(data, bytes | bytearray | memoryview):
        if len(data) > max_bytes:
            raise ObjectTooLarge(key, max_bytes)
        view = memoryview(data)
        for start in range(0, len(view), CHUNK_BYTES):
            yield bytes(view[start : start + CHUNK_BYTES])
        return
    received = 0
    while True:
        chunk = data.read(min(CHUNK_BYTES, max_bytes - received + 1))
        if not chunk:
            return
        if not isinstance(chunk, bytes | bytearray):
            raise TypeError(f"object {key!r}: the stream must yield bytes, not {type(chunk).__name__}")
        received += len(chunk)
        if received > max_bytes:
            raise ObjectTooLarge(key, max_bytes)
        yield bytes(chunk)


def check_manifest(
    entries: Iterable[ManifestEntry],
    stat: Callable[[str], StoredObject | None],
    rehash_blob: Callable[[str], tuple[str, int] | None],
) -> list[str]:
    """The shared body of `ObjectStore.verify`.

    `rehash_blob(digest)` re-reads the stored bytes and returns their (digest, size), or None
    when the blob is gone. A manifest comes from a runner, so a bad key or an unreadable record
    is reported as a problem of that artifact rather than raised; ObjectStoreUnavailable is
    raised, never reported, since a store that did not answer has not found anything wrong.
    """
    problems: list[str] = []
    rehashed: dict[str, tuple[str, int] | None] = {}
    for entry in entries:
        label = f"artifact {entry.artifact_id}"
        try:
            stored = stat(entry.key)
        except ObjectStoreUnavailable:
            raise  # an outage says nothing about the artifact: no verdict, the caller answers 503
        except ObjectStoreError as exc:
            problems.append(f"{label}: {exc}")
            continue
        if stored is None:
            problems.append(f"{label}: missing (no object under key {entry.key!r})")
            continue
        if entry.digest != stored.digest:
            problems.append(f"{label}: digest {entry.digest} != stored {stored.digest}")
        if entry.size_bytes != stored.size_bytes:
            problems.append(f"{label}: size {entry.size_bytes} != stored {stored.size_bytes}")
        if entry.media_type != stored.media_type:
            problems.append(f"{label}: media type {entry.media_type} != stored {stored.media_type}")
        if stored.digest not in rehashed:
            rehashed[stored.digest] = rehash_blob(stored.digest)
        actual = rehashed[stored.digest]
        if actual is None:
            problems.append(f"{label}: stored blob {stored.digest} is missing")
        elif actual != (stored.digest, stored.size_bytes):
            problems.append(
                f"{label}: stored blob {stored.digest} is corrupt "
                f"(rehashes to {actual[0]}, {actual[1]} bytes)"
            )
    return problems
