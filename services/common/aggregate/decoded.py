"""Decoded states kept beside the bytes they were read from or written as (issue 16).

An aggregate's next command reads back the state its last one wrote (a lease renewal every few
seconds), and decoding it was a tenth of the coordinator's CPU. A kept state is used only when
the stored bytes are exactly those it came with, so nothing that writes the store another way
(a restore, a rebuild) is ever answered from memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

__all__ = ["DecodedStates"]

S = TypeVar("S")


class DecodedStates(Generic[S]):
    """At most `bound` decoded states, the least recently kept going first (thread-safe: a
    processor's `load` is also called outside its lock)."""

    def __init__(self, decode: Callable[[bytes], S], bound: int = 20_000) -> None:
        self._decode = decode
        self.bound = bound
        self._kept: dict[str, tuple[bytes, S]] = {}  # oldest first
        self._lock = threading.Lock()

    def of(self, aggregate_id: str, raw: bytes) -> S:
        """The state `raw` holds: kept if it came with exactly these bytes, else decoded and kept."""
        with self._lock:
            kept = self._kept.get(aggregate_id)
        if kept is not None and kept[0] == raw:
            return kept[1]
        state = self._decode(raw)
        self.keep(((aggregate_id, raw, state),))
        return state

    def keep(self, entries: Iterable[tuple[str, bytes, S]]) -> None:
        with self._lock:
            kept = self._kept
            for aggregate_id, raw, state in entries:
                kept.pop(aggregate_id, None)  # re-inserted: the newest is last
                kept[aggregate_id] = (raw, state)
            while len(kept) > self.bound:
                del kept[next(iter(kept))]

    def ids(self) -> list[str]:
        """The kept aggregates, oldest first."""
        with self._lock:
            return list(self._kept)
