"""The in-memory twin of the store, for pure unit tests."""

from __future__ import annotations

from typing import Iterator, Mapping

__all__ = ["MemoryStore"]


class MemoryStore:
    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self._data.get(key)

    def write(
        self,
        puts: Mapping[str, bytes],
        deletes: tuple[str, ...] = (),
        delete_ranges: tuple[tuple[str, str], ...] = (),
    ) -> None:
        # Refuse what RocksDB refuses, so a forgotten .encode() fails in unit tests too.
        for key in (*puts, *deletes, *(bound for pair in delete_ranges for bound in pair)):
            key.encode("utf-8")
        for key, value in puts.items():
            if not isinstance(value, bytes):
                raise ValueError(f"value of {key!r} must be bytes, not {type(value).__name__}")
        staged = dict(self._data)
        staged.update(puts)
        for key in deletes:
            staged.pop(key, None)
        for start, end in delete_ranges:  # str order is code-point order, RocksDB's UTF-8 byte order
            for key in [k for k in staged if start <= k < end]:
                del staged[key]
        self._data = staged

    def scan(
        self, prefix: str, start_after: str | None = None, *, before: str | None = None
    ) -> Iterator[tuple[str, bytes]]:
        for key in sorted(self._data):
            if before is not None and key >= before:
                return
            if key.startswith(prefix) and (start_after is None or key > start_after):
                # Keys are listed when the scan starts (RocksDB's iterator reads a snapshot);
                # one deleted meanwhile is passed over.
                value = self._data.get(key)
                if value is not None:
                    yield key, value

    def clear(self) -> None:
        self._data = {}

    def refresh(self) -> None:
        return None

    def close(self) -> None:
        return None
