"""RocksDB through rocksdict: the only module that imports rocksdict."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator, Mapping, cast

from rocksdict import AccessType, Options, Rdict, ReadOptions, WriteBatch

from services.common.store._contract import StoreReadOnly

__all__ = ["RocksStore"]


class RocksStore:
    """A RocksDB key-value store; `secondary=True` opens a read-only follower of a live writer."""

    def __init__(self, path: Path, *, secondary: bool = False) -> None:
        self._path = Path(path)
        self._secondary = secondary
        options = Options(raw_mode=True)
        if secondary:
            follower_dir = self._path.parent / f".{self._path.name}.secondary"
            follower_dir.mkdir(parents=True, exist_ok=True)
            options.set_max_open_files(-1)
            self._db = Rdict(
                str(self._path),
                options,
                access_type=AccessType.secondary(str(follower_dir)),
            )
        else:
            self._path.mkdir(parents=True, exist_ok=True)
            options.create_if_missing(True)
            self._db = Rdict(str(self._path), options)

    def get(self, key: str) -> bytes | None:
        value = self._db.get(key.encode("utf-8"))
        return cast(bytes, value) if value is not None else None

    def write(
        self,
        puts: Mapping[str, bytes],
        deletes: tuple[str, ...] = (),
        delete_ranges: tuple[tuple[str, str], ...] = (),
    ) -> None:
        if self._secondary:
            raise StoreReadOnly(f"{self._path} is open as a read-only secondary")
        batch = WriteBatch(raw_mode=True)
        for key, value in puts.items():
            batch.put(key.encode("utf-8"), value)
        for key in deletes:
            batch.delete(key.encode("utf-8"))
        for start, end in delete_ranges:  # after the puts: a batch applies in order
            batch.delete_range(start.encode("utf-8"), end.encode("utf-8"))
        self._db.write(batch)

    def scan(
        self, prefix: str, start_after: str | None = None, *, before: str | None = None
    ) -> Iterator[tuple[str, bytes]]:
        raw_prefix = prefix.encode("utf-8")
        skip = start_after.encode("utf-8") if start_after is not None else None
        start = max(raw_prefix, skip) if skip is not None else raw_prefix
        # An upper bound, so the iterator stops at the range's end instead of stepping over every
        # deleted key after it until the next live one: timers and leases leave runs of deletes
        # (tombstones) that only compaction removes, and an unbounded scan of a small prefix
        # next to them cost ~100 ms once 200,000 had piled up (0.005 ms bounded).
        upper = _successor(raw_prefix)
        if before is not None:
            raw_before = before.encode("utf-8")
            upper = raw_before if upper is None else min(upper, raw_before)
        read_opt = ReadOptions()
        if upper is not None:
            read_opt.set_iterate_upper_bound(upper)
        for key, value in self._db.items(from_key=start, read_opt=read_opt):
            raw_key = cast(bytes, key)
            if not raw_key.startswith(raw_prefix):
                return
            if skip is not None and raw_key <= skip:
                continue
            yield raw_key.decode("utf-8"), cast(bytes, value)

    def clear(self) -> None:
        if self._secondary:
            raise StoreReadOnly(f"{self._path} is open as a read-only secondary")
        keys = [cast(bytes, k) for k in self._db.keys()]  # noqa: SIM118 - an Rdict, not a dict
        batch = WriteBatch(raw_mode=True)
        for key in keys:
            batch.delete(key)
        self._db.write(batch)

    def refresh(self) -> None:
        if self._secondary:
            self._db.try_catch_up_with_primary()

    def close(self) -> None:
        self._db.close()

    @staticmethod
    def destroy(path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)


def _successor(prefix: bytes) -> bytes | None:
    """The smallest key above every key that starts with `prefix` (None: no such bound)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])
