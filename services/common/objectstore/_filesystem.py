"""The default object store: content-addressed blobs and immutable key records on a filesystem.

Layout under `root`:
    blobs/sha256/<hh>/<hex>   the bytes, once per distinct content, read-only
    keys/<key>.json           {"key", "digest", "size_bytes", "media_type"}
    tmp/                      uploads in progress; same filesystem, so publishing is a rename

Every file is written to tmp/, fsynced, then published with os.link, which is atomic and fails
if the name exists: readers never see half a file, two writers of one key cannot both win, and
an existing blob is never overwritten. The blob is published before its key record, so a crash
in between leaves at worst an unreferenced blob, never a key whose bytes are missing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from services.common.objectstore._store import (
    CHUNK_BYTES,
    DIGEST_PREFIX,
    CorruptKeyRecord,
    ManifestEntry,
    ObjectNotFound,
    StoredObject,
    check_manifest,
    key_record_text,
    parse_key_record,
    read_limited,
    same_or_refuse,
    validate_key,
    validate_media_type,
)

__all__ = ["FilesystemObjectStore"]

_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH


class FilesystemObjectStore:
    def __init__(self, root: Path) -> None:
        self._root = Path(root)
        self._blob_dir = self._root / "blobs" / "sha256"
        self._key_dir = self._root / "keys"
        self._tmp_dir = self._root / "tmp"
        for directory in (self._blob_dir, self._key_dir, self._tmp_dir):
            directory.mkdir(parents=True, exist_ok=True)

    @property
    def root(self) -> Path:
        return self._root

    def put(self, key: str, data: BinaryIO | bytes, *, max_bytes: int, media_type: str) -> StoredObject:
        validate_key(key)
        validate_media_type(media_type)
        with self._temp_file("blob-") as (out, temp_path):
            hasher = hashlib.sha256()
            size = 0
            for chunk in read_limited(key, data, max_bytes):
                hasher.update(chunk)
                out.write(chunk)
                size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
            out.close()
            incoming = StoredObject(key, DIGEST_PREFIX + hasher.hexdigest(), size, media_type)
            os.chmod(temp_path, _READ_ONLY)
            self._publish(temp_path, self._blob_path(incoming.digest))
        return self._record_key(incoming)

    def stat(self, key: str) -> StoredObject | None:
        record = self._record_path(validate_key(key))
        try:
            text = record.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise CorruptKeyRecord(f"key record {record} cannot be read: {exc}") from exc
        return parse_key_record(key, str(record), text)

    def open(self, key: str) -> BinaryIO:
        stored = self.stat(key)
        if stored is None:
            raise ObjectNotFound(f"no object under key {key!r}")
        try:
            return self._blob_path(stored.digest).open("rb")
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"key {key!r} refers to {stored.digest}, whose blob is missing") from exc

    def verify(self, entries: Iterable[ManifestEntry]) -> list[str]:
        return check_manifest(entries, self.stat, self._rehash_blob)

    # --- internals ---------------------------------------------------------------------------

    def _blob_path(self, digest: str) -> Path:
        match = _DIGEST.fullmatch(digest)
        if match is None:
            raise CorruptKeyRecord(f"{digest!r} is not a sha256 digest")
        hex_digest = match.group(1)
        return self._blob_dir / hex_digest[:2] / hex_digest

    def _record_path(self, key: str) -> Path:
        return self._key_dir / f"{key}.json"

    def _record_key(self, incoming: StoredObject) -> StoredObject:
        with self._temp_file("key-") as (out, temp_path):
            out.write(key_record_text(incoming).encode("utf-8"))
            out.flush()
            os.fsync(out.fileno())
            out.close()
            if self._publish(temp_path, self._record_path(incoming.key)):
                return incoming
        existing = self.stat(incoming.key)
        if existing is None:  # only if someone deleted the record behind the store's back
            raise CorruptKeyRecord(f"key record of {incoming.key!r} vanished while being compared")
        return same_or_refuse(existing, incoming)

    def _publish(self, temp_path: Path, target: Path) -> bool:
        """Link the finished temp file to `target`; False if `target` already existed."""
        self._make_dirs(target.parent)
        try:
            os.link(temp_path, target)
        except FileExistsError:
            return False
        _fsync_dir(target.parent)
        return True

    def _make_dirs(self, directory: Path) -> None:
        # Each new directory's entry must be durable in its parent, or a crash could lose it
        # along with everything published beneath it.
        missing: list[Path] = []
        while not directory.is_dir():
            missing.append(directory)
            directory = directory.parent
        for new_dir in reversed(missing):
            with contextlib.suppress(FileExistsError):  # a concurrent put made it first
                new_dir.mkdir()
            _fsync_dir(new_dir.parent)

    @contextlib.contextmanager
    def _temp_file(self, prefix: str) -> Iterator[tuple[BinaryIO, Path]]:
        """A new file in tmp/, removed afterwards whatever happens (published files are links)."""
        fd, name = tempfile.mkstemp(dir=self._tmp_dir, prefix=prefix, suffix=".part")
        temp_path = Path(name)
        try:
            with os.fdopen(fd, "wb") as out:
                yield out, temp_path
        finally:
            temp_path.unlink(missing_ok=True)

    def _rehash_blob(self, digest: str) -> tuple[str, int] | None:
        hasher = hashlib.sha256()
        size = 0
        try:
            with self._blob_path(digest).open("rb") as blob:
                while chunk := blob.read(CHUNK_BYTES):
                    hasher.update(chunk)
                    size += len(chunk)
        except FileNotFoundError:
            return None
        return DIGEST_PREFIX + hasher.hexdigest(), size


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
