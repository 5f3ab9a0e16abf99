"""The in-memory twin of the object store, for unit tests.

It shares key rules, the streaming size limit and the manifest check with the filesystem store
(see _store.py), so a test that passes here exercises the same refusals production applies.
"""

from __future__ import annotations

import hashlib
import io
import threading
from collections.abc import Iterable
from typing import BinaryIO

from services.common.objectstore._store import (
    DIGEST_PREFIX,
    ManifestEntry,
    ObjectNotFound,
    StoredObject,
    check_manifest,
    read_limited,
    same_or_refuse,
    sha256_digest,
    validate_key,
    validate_media_type,
)

__all__ = ["MemoryObjectStore"]


class MemoryObjectStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, StoredObject] = {}
        self._blobs: dict[str, bytes] = {}  # digest -> content, each content stored once

    def put(self, key: str, data: BinaryIO | bytes, *, max_bytes: int, media_type: str) -> StoredObject:
        validate_key(key)
        validate_media_type(media_type)
        hasher = hashlib.sha256()
        parts: list[bytes] = []
        for chunk in read_limited(key, data, max_bytes):
            hasher.update(chunk)
            parts.append(chunk)
        content = b"".join(parts)
        incoming = StoredObject(key, DIGEST_PREFIX + hasher.hexdigest(), len(content), media_type)
        with self._lock:
            existing = self._keys.get(key)
            if existing is not None:
                return same_or_refuse(existing, incoming)
            self._blobs.setdefault(incoming.digest, content)
            self._keys[key] = incoming
        return incoming

    def stat(self, key: str) -> StoredObject | None:
        validate_key(key)
        with self._lock:
            return self._keys.get(key)

    def open(self, key: str) -> BinaryIO:
        validate_key(key)
        with self._lock:
            stored = self._keys.get(key)
            content = None if stored is None else self._blobs.get(stored.digest)
        if content is None:
            raise ObjectNotFound(f"no object under key {key!r}")
        return io.BytesIO(content)

    def verify(self, entries: Iterable[ManifestEntry]) -> list[str]:
        return check_manifest(entries, self.stat, self._rehash_blob)

    def _rehash_blob(self, digest: str) -> tuple[str, int] | None:
        with self._lock:
            content = self._blobs.get(digest)
        return None if content is None else (sha256_digest(content), len(content))
