"""Decoded Run briefs kept in memory for the heartbeat path (issue 16).

A batch renewal reads the brief of every lease it renews (LEASE-1's holder check and the stop
flags): 5,000 a second at the issue's load, each a RocksDB read and a JSON decode, about 9% of
the API's CPU at 100,000 live leases (py-spy, docs/benchmarks.md). The API instance folds its
own views, so the RunViewStore that writes a brief is the one that reads it, and it keeps the
decoded brief of each run it wrote or read.

Why it never serves a brief older than the store's:
  * the writer puts each brief it wrote into the cache after its store write (`written`), and
    drops everything after a write that replaces the runs wholesale (`clear`);
  * a reader fills a miss with what it read from the store only if no write happened since it
    took the generation before its read (`fill`), so a brief read before a write can never
    overwrite the write's, whatever the threads' interleaving.

Bounded: past `limit` runs, an insertion evicts the most recently inserted entry (dict.popitem).
Heartbeats visit the runs in a cycle; evicting the oldest would evict every run before its next
visit, while this keeps `limit` of them resident and misses only on the rest.

The dicts handed out are shared between readers: read them, never change them.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["BriefCache"]


class BriefCache:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a brief cache holds at least 1 run, not {limit}")
        self._limit = limit
        self._briefs: dict[str, dict[str, Any]] = {}
        self._generation = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._briefs)

    def get(self, run_id: str) -> dict[str, Any] | None:
        return self._briefs.get(run_id)

    @property
    def generation(self) -> int:
        """Take it before reading the store for a miss; hand it to `fill`."""
        return self._generation

    def fill(self, run_id: str, brief: dict[str, Any], generation: int) -> None:
        """A brief a reader read from the store after taking `generation`; kept only if nothing
        was written since and no newer one is here."""
        with self._lock:
            if generation == self._generation and run_id not in self._briefs:
                self._insert(run_id, brief)

    def written(self, briefs: Mapping[str, dict[str, Any]]) -> None:
        """The writer stored these briefs (call it after the store write)."""
        with self._lock:
            self._generation += 1
            for run_id, brief in briefs.items():
                self._briefs.pop(run_id, None)
                self._insert(run_id, brief)

    def clear(self) -> None:
        """The writer replaced or deleted runs wholesale (call it after the store write)."""
        with self._lock:
            self._generation += 1
            self._briefs.clear()

    def _insert(self, run_id: str, brief: dict[str, Any]) -> None:
        if len(self._briefs) >= self._limit:
            self._briefs.popitem()  # the most recently inserted: see the module docstring
        self._briefs[run_id] = brief
