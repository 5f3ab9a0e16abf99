"""The ObjectStore contract (services/common/objectstore/_store.py), run against every store.

`ObjectStoreContract` holds the tests; each concrete class says how to make its store and how to
reach behind it (count blobs, find leftovers, damage a blob), so MemoryObjectStore (the
unit-test twin) cannot drift from FilesystemObjectStore (the default). EXE-15: uploads are
bounded, artifacts are named by digest/size/media type, and `verify` is the check the service
makes before terminal success.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, cast

import pytest

from services.common.objectstore import (
    CorruptKeyRecord,
    FilesystemObjectStore,
    InvalidKey,
    InvalidMediaType,
    KeyExists,
    ManifestEntry,
    MemoryObjectStore,
    ObjectNotFound,
    ObjectStore,
    ObjectTooLarge,
    StoredObject,
)

PDF = "application/pdf"
KEY = "runs/run_1/att_1/report.pdf"
# Large enough to span several 64 KiB chunks, deterministic so failures reproduce.
BIG = hashlib.sha256(b"seed").digest() * 7000


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class EndlessStream(io.RawIOBase):
    """An upload that never ends; records how much the store asked for."""

    def __init__(self) -> None:
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        assert 0 < size <= 1 << 20, f"the store must read in bounded chunks, asked for {size}"
        self.bytes_read += size
        return b"x" * size


class FailingStream(io.RawIOBase):
    """An upload whose connection drops after some bytes."""

    def __init__(self) -> None:
        self.calls = 0

    def read(self, size: int = -1) -> bytes:
        self.calls += 1
        if self.calls > 2:
            raise ConnectionResetError("runner went away")
        return b"y" * 1000


INVALID_KEYS: list[Any] = [
    "", "/abs/report.pdf", "runs/../etc/passwd", "..", "runs//a", "runs/a/", "./a", "a/./b",
    "k" * 513, "a\\b", "a\x00b", "a\nb", "bad\ud800", "a.json/b", "s" * 251, 42, None,
]  # fmt: skip


class ObjectStoreContract:
    persistent = False

    def open_store(self, location: Path) -> ObjectStore:
        raise NotImplementedError

    def blob_count(self, store: Any) -> int:
        raise NotImplementedError

    def leftovers(self, store: Any) -> list[str]:
        """Anything an interrupted upload could leave behind (temp files); [] when clean."""
        raise NotImplementedError

    def corrupt_blob(self, store: Any, digest: str) -> None:
        raise NotImplementedError

    @pytest.fixture
    def store(self, tmp_path: Path) -> ObjectStore:
        return self.open_store(tmp_path / "objects")

    # --- put / stat / open -------------------------------------------------------------------

    @pytest.mark.parametrize("as_stream", [False, True])
    def test_round_trip(self, store: ObjectStore, as_stream: bool) -> None:
        data: Any = io.BytesIO(BIG) if as_stream else BIG
        stored = store.put(KEY, data, max_bytes=len(BIG), media_type=PDF)
        assert stored == StoredObject(KEY, sha(BIG), len(BIG), PDF)
        assert store.stat(KEY) == stored
        with store.open(KEY) as reader:
            assert reader.read() == BIG
        assert self.leftovers(store) == []

    def test_empty_object_and_unicode_key(self, store: ObjectStore) -> None:
        key = "runs/r\u00e9sum\u00e9/\u2603 notes.txt"
        assert store.put(key, b"", max_bytes=0, media_type="text/plain; charset=utf-8").size_bytes == 0
        assert store.open(key).read() == b""

    def test_missing_key(self, store: ObjectStore) -> None:
        assert store.stat("runs/none/here.bin") is None
        with pytest.raises(ObjectNotFound):
            store.open("runs/none/here.bin")

    def test_equal_content_is_stored_once(self, store: ObjectStore) -> None:
        a = store.put("runs/r/a1/out.bin", BIG, max_bytes=len(BIG), media_type=PDF)
        b = store.put("runs/r/a2/out.bin", io.BytesIO(BIG), max_bytes=len(BIG), media_type="x/y")
        assert a.digest == b.digest and self.blob_count(store) == 1
        store.put("runs/r/a3/out.bin", BIG + b"!", max_bytes=len(BIG) + 1, media_type=PDF)
        assert self.blob_count(store) == 2
        assert store.open("runs/r/a2/out.bin").read() == BIG

    # --- EXE-15: bounded uploads -------------------------------------------------------------

    def test_exe15_size_limit_is_enforced_mid_stream_leaving_nothing(self, store: ObjectStore) -> None:
        stream = EndlessStream()
        with pytest.raises(ObjectTooLarge, match="100000 bytes"):
            store.put(KEY, cast(BinaryIO, stream), max_bytes=100_000, media_type=PDF)
        assert stream.bytes_read == 100_001, "must stop reading right after the limit is passed"
        assert store.stat(KEY) is None
        assert self.blob_count(store) == 0 and self.leftovers(store) == []
        with pytest.raises(ObjectTooLarge):
            store.put(KEY, BIG, max_bytes=len(BIG) - 1, media_type=PDF)
        assert store.stat(KEY) is None and self.blob_count(store) == 0
        assert store.put(KEY, BIG, max_bytes=len(BIG), media_type=PDF).size_bytes == len(BIG)

    def test_a_broken_upload_leaves_nothing(self, store: ObjectStore) -> None:
        with pytest.raises(ConnectionResetError):
            store.put(KEY, cast(BinaryIO, FailingStream()), max_bytes=10_000, media_type=PDF)
        assert store.stat(KEY) is None
        assert self.blob_count(store) == 0 and self.leftovers(store) == []

    def test_bad_limits_and_media_types_are_refused(self, store: ObjectStore) -> None:
        with pytest.raises(ValueError, match="max_bytes"):
            store.put(KEY, b"x", max_bytes=-1, media_type=PDF)
        bad_media_types: list[Any] = ["", "pdf", "/pdf", "application/", 7]
        for media_type in bad_media_types:
            with pytest.raises(InvalidMediaType):
                store.put(KEY, b"x", max_bytes=10, media_type=media_type)
        assert store.stat(KEY) is None

    # --- immutable keys ----------------------------------------------------------------------

    def test_keys_are_immutable_but_repeating_a_put_is_idempotent(self, store: ObjectStore) -> None:
        first = store.put(KEY, b"v1", max_bytes=10, media_type=PDF)
        assert store.put(KEY, io.BytesIO(b"v1"), max_bytes=10, media_type=PDF) == first
        with pytest.raises(KeyExists, match="already holds"):
            store.put(KEY, b"v2", max_bytes=10, media_type=PDF)
        with pytest.raises(KeyExists):
            store.put(KEY, b"v1", max_bytes=10, media_type="text/plain")
        assert store.stat(KEY) == first
        assert store.open(KEY).read() == b"v1"

    @pytest.mark.parametrize("key", INVALID_KEYS, ids=repr)
    def test_invalid_keys_are_refused(self, store: ObjectStore, key: Any) -> None:
        with pytest.raises(InvalidKey):
            store.put(key, b"x", max_bytes=10, media_type=PDF)
        with pytest.raises(InvalidKey):
            store.stat(key)
        with pytest.raises(InvalidKey):
            store.open(key)
        assert self.blob_count(store) == 0

    def test_longest_allowed_key(self, store: ObjectStore) -> None:
        key = "a" * 250 + "/" + "b" * 250 + "/" + "c.json"
        assert len(key) == 508
        store.put(key, b"long", max_bytes=10, media_type=PDF)
        assert store.open(key).read() == b"long"
        store.put("a.json", b"sibling", max_bytes=10, media_type=PDF)  # a final ".json" is fine

    # --- EXE-15: verify ----------------------------------------------------------------------

    def test_exe15_verify_accepts_a_correct_manifest(self, store: ObjectStore) -> None:
        a = store.put("runs/r/a/one.pdf", b"one", max_bytes=10, media_type=PDF)
        b = store.put("runs/r/a/two.pdf", b"one", max_bytes=10, media_type=PDF)
        entries = [
            ManifestEntry(f"a{i}", s.key, s.digest, s.size_bytes, s.media_type) for i, s in enumerate([a, b])
        ]
        assert store.verify(entries) == []
        assert store.verify([]) == []

    def test_exe15_verify_names_each_problem(self, store: ObjectStore) -> None:
        ok = store.put("runs/r/a/ok.pdf", b"0123456789ab", max_bytes=100, media_type=PDF)
        bad_key = "runs/../x"
        problems = store.verify(
            [
                ManifestEntry("a0", ok.key, ok.digest, 12, PDF),
                ManifestEntry("a1", "runs/r/a/never.pdf", ok.digest, 12, PDF),
                ManifestEntry("a2", ok.key, sha(b"other"), 12, PDF),
                ManifestEntry("a3", ok.key, ok.digest, 10, PDF),
                ManifestEntry("a4", ok.key, ok.digest, 12, "image/png"),
                ManifestEntry("a5", bad_key, ok.digest, 12, PDF),
            ]
        )
        assert problems[0].startswith("artifact a1: missing")
        assert problems[1:4] == [
            f"artifact a2: digest {sha(b'other')} != stored {ok.digest}",
            "artifact a3: size 10 != stored 12",
            f"artifact a4: media type image/png != stored {PDF}",
        ]
        assert problems[4].startswith("artifact a5: ") and bad_key in problems[4]
        assert len(problems) == 5

    def test_exe15_verify_rehashes_stored_bytes(self, store: ObjectStore) -> None:
        good = store.put("runs/r/a/good.bin", b"good bytes", max_bytes=100, media_type=PDF)
        bad = store.put("runs/r/a/bad.bin", b"will be damaged", max_bytes=100, media_type=PDF)
        self.corrupt_blob(store, bad.digest)
        entries = [ManifestEntry(s.key, s.key, s.digest, s.size_bytes, s.media_type) for s in (good, bad)]
        problems = store.verify(entries)
        assert len(problems) == 1
        assert problems[0].startswith(f"artifact {bad.key}: stored blob {bad.digest} is corrupt")

    # --- concurrency -------------------------------------------------------------------------

    def run_threads(self, count: int, work: Callable[[int], Any]) -> list[Any]:
        results: list[Any] = [None] * count
        start = threading.Barrier(count)

        def run(i: int) -> None:
            start.wait()
            try:
                results[i] = work(i)
            except Exception as exc:
                results[i] = exc

        threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
        return results

    def test_concurrent_puts_of_equal_content_end_with_one_blob(self, store: ObjectStore) -> None:
        same_key = self.run_threads(6, lambda i: store.put(KEY, BIG, max_bytes=len(BIG), media_type=PDF))
        other_keys = self.run_threads(
            6, lambda i: store.put(f"runs/r/a{i}/x.pdf", io.BytesIO(BIG), max_bytes=len(BIG), media_type=PDF)
        )
        assert all(isinstance(r, StoredObject) and r.digest == sha(BIG) for r in same_key + other_keys)
        assert len(set(same_key)) == 1
        assert self.blob_count(store) == 1 and self.leftovers(store) == []

    def test_concurrent_puts_of_different_content_under_one_key_have_one_winner(
        self, store: ObjectStore
    ) -> None:
        results = self.run_threads(6, lambda i: store.put(KEY, b"v%d" % i, max_bytes=10, media_type=PDF))
        winners = [r for r in results if isinstance(r, StoredObject)]
        assert len(winners) == 1, results
        assert all(isinstance(r, KeyExists) for r in results if r is not winners[0])
        assert store.stat(KEY) == winners[0]
        assert store.verify([ManifestEntry("a", KEY, winners[0].digest, 2, PDF)]) == []

    def test_reopen_keeps_objects_exactly_when_persistent(self, tmp_path: Path) -> None:
        self.open_store(tmp_path / "objects").put(KEY, b"kept", max_bytes=10, media_type=PDF)
        reopened = self.open_store(tmp_path / "objects")
        assert (reopened.stat(KEY) is not None) == self.persistent


class TestMemoryObjectStore(ObjectStoreContract):
    persistent = False

    def open_store(self, location: Path) -> ObjectStore:
        return MemoryObjectStore()

    def blob_count(self, store: Any) -> int:
        return len(store._blobs)

    def leftovers(self, store: Any) -> list[str]:
        return []  # nothing is staged outside the blob dict

    def corrupt_blob(self, store: Any, digest: str) -> None:
        content = store._blobs[digest]
        store._blobs[digest] = bytes([content[0] ^ 0x01]) + content[1:]


class TestFilesystemObjectStore(ObjectStoreContract):
    persistent = True

    def open_store(self, location: Path) -> ObjectStore:
        return FilesystemObjectStore(location)

    def blob_count(self, store: Any) -> int:
        return sum(1 for p in (store.root / "blobs").rglob("*") if p.is_file())

    def leftovers(self, store: Any) -> list[str]:
        return sorted(p.name for p in (store.root / "tmp").iterdir())

    def corrupt_blob(self, store: Any, digest: str) -> None:
        blob = self.blob_path(store.root, digest)
        os.chmod(blob, 0o600)  # blobs are published read-only
        content = bytearray(blob.read_bytes())
        content[0] ^= 0x01  # flip one bit of the first byte on disk
        blob.write_bytes(bytes(content))

    @staticmethod
    def blob_path(root: Path, digest: str) -> Path:
        hex_digest = digest.removeprefix("sha256:")
        return root / "blobs" / "sha256" / hex_digest[:2] / hex_digest

    # --- filesystem only ---------------------------------------------------------------------

    def test_layout_on_disk(self, tmp_path: Path) -> None:
        store = FilesystemObjectStore(tmp_path)
        stored = store.put(KEY, b"pdf bytes", max_bytes=100, media_type=PDF)
        blob = self.blob_path(tmp_path, stored.digest)
        assert blob.read_bytes() == b"pdf bytes"
        assert blob.stat().st_mode & 0o222 == 0, "blobs are published read-only"
        record = json.loads((tmp_path / "keys" / f"{KEY}.json").read_text(encoding="utf-8"))
        assert record == {"key": KEY, "digest": stored.digest, "size_bytes": 9, "media_type": PDF}

    def test_a_missing_blob_is_reported_not_hidden(self, tmp_path: Path) -> None:
        store = FilesystemObjectStore(tmp_path)
        stored = store.put(KEY, b"soon gone", max_bytes=100, media_type=PDF)
        self.blob_path(tmp_path, stored.digest).unlink()
        with pytest.raises(ObjectNotFound, match="blob is missing"):
            store.open(KEY)
        entry = ManifestEntry("a1", KEY, stored.digest, stored.size_bytes, PDF)
        assert store.verify([entry]) == [f"artifact a1: stored blob {stored.digest} is missing"]

    def test_a_damaged_key_record_is_reported_not_trusted(self, tmp_path: Path) -> None:
        store = FilesystemObjectStore(tmp_path)
        stored = store.put(KEY, b"data", max_bytes=100, media_type=PDF)
        (tmp_path / "keys" / f"{KEY}.json").write_text('{"key": "runs/other"', encoding="utf-8")
        with pytest.raises(CorruptKeyRecord):
            store.stat(KEY)
        problems = store.verify([ManifestEntry("a1", KEY, stored.digest, 4, PDF)])
        assert len(problems) == 1 and problems[0].startswith("artifact a1: key record")
