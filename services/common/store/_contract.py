"""The store contract both implementations honour (see tests/contract/test_store_contract.py)."""

from __future__ import annotations

from typing import Iterator, Mapping, Protocol

__all__ = ["KeyValueStore", "StoreReadOnly"]


class StoreReadOnly(Exception):
    """A write was attempted through a read-only (secondary) view of a store."""


class KeyValueStore(Protocol):
    def get(self, key: str) -> bytes | None: ...

    def write(
        self,
        puts: Mapping[str, bytes],
        deletes: tuple[str, ...] = (),
        delete_ranges: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """Apply all puts and deletes atomically: after a crash either all or none are visible.
        Each `(start, end)` of `delete_ranges` deletes every key `start <= key < end`, in one
        operation whatever the number of keys (a range tombstone in RocksDB). Deletes win over
        puts of the same key in one write."""
        ...

    def scan(
        self, prefix: str, start_after: str | None = None, *, before: str | None = None
    ) -> Iterator[tuple[str, bytes]]:
        """Every (key, value) whose key starts with `prefix`, in key order, after `start_after`
        and (when given) below `before`."""
        ...

    def clear(self) -> None: ...

    def refresh(self) -> None:
        """Make a read-only view see the writer's latest data (no-op for the writer)."""
        ...

    def close(self) -> None: ...
