"""The start-up heap, taken out of the cyclic garbage collector's full passes.

A Tenure process imports its frameworks (FastAPI, pydantic, faust, fastavro's parsed schemas)
before it serves: over 100,000 objects that live as long as the process. CPython's full
collection walks every tracked object, those included, and it runs every few seconds under load
(each renewal replaces a cached state or fold): about 70 ms per pass on this machine for the
start-up objects alone, during which no thread of the process runs. That pause lands on
whichever acknowledgement is in flight. `gc.freeze()` moves what exists now to a permanent
generation that collections skip (Python's own advice for long-lived servers); objects made
later are collected as before, and frozen ones are still freed by reference counting.

The collector's thresholds are raised too (`SERVICE_THRESHOLDS`). CPython's default collects
the young generation every 700 net allocations of containers. Under load a batch of renewals
keeps thousands alive for a moment (the request, its commands, their records), so young
collections ran ~130 times a second in the API and promoted short-lived objects into the older
generations, whose full passes then walked the caches (decided states, folds, decisions) too.
Measured over one lease benchmark at 5,000 renewals/s (docs/benchmarks.md, "The collector's
thresholds"): the API spent 4.6 s in collections, with passes up to 184 ms, and the coordinator
2.1 s; at (20,000, 50, 100) about 0.3 s each, with passes up to ~50 ms, and 10-15% less CPU
per renewal in all. Cyclic garbage still goes: young cycles at the next young collection,
older ones at a full collection.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GC_PAUSE_BUCKETS",
    "SERVICE_THRESHOLDS",
    "GcPauses",
    "freeze_startup_heap",
    "gc_pauses",
    "no_cycle_collection",
    "time_gc_pauses",
]

# (young, middle, old): collect the young generation every 20,000 net container allocations,
# the middle one every 50 young collections, everything every 100 middle ones (CPython's own
# rule still postpones a full pass until a quarter of the heap is new).
SERVICE_THRESHOLDS = (20_000, 50, 100)


# Upper bounds (seconds) of the pause histogram: a young pass takes well under a millisecond, a
# full pass over a few million live objects hundreds of milliseconds.
GC_PAUSE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class GcPauses:
    """The collector's passes of one generation since the process started: how many, their
    total and longest time, and a cumulative count per bound of GC_PAUSE_BUCKETS."""

    count: int = 0
    total_s: float = 0.0
    longest_s: float = 0.0
    buckets: tuple[int, ...] = (0,) * len(GC_PAUSE_BUCKETS)


class _PauseClock:
    """Times every pass of the cyclic collector (gc.callbacks: "start" and "stop" around it), so
    that a latency spike can be laid beside the pauses that caused it (/metrics:
    tenure_process_gc_pause_seconds). No thread of the process runs during a pass, so the start
    and stop of one pass are never interleaved with another's.

    No lock: a pass can start in any thread at any allocation, one holding such a lock
    included, and would then wait for it forever. Each generation's figures are one immutable
    value, replaced whole under the GIL."""

    def __init__(self) -> None:
        self._started = 0.0
        self._by_generation: dict[int, GcPauses] = {}

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        generation = int(info.get("generation", 0))
        old = self._by_generation.get(generation, GcPauses())
        self._by_generation[generation] = GcPauses(
            old.count + 1,
            old.total_s + took,
            max(old.longest_s, took),
            tuple(n + (took <= bound) for n, bound in zip(old.buckets, GC_PAUSE_BUCKETS, strict=True)),
        )

    def snapshot(self) -> dict[int, GcPauses]:
        return dict(self._by_generation)


_pause_clock = _PauseClock()
_pause_clock_lock = threading.Lock()


def gc_pauses() -> dict[int, GcPauses]:
    """The passes of each generation (0 young, 1 middle, 2 full) timed since the process started
    timing them (`time_gc_pauses`, which `freeze_startup_heap` calls)."""
    return _pause_clock.snapshot()


def freeze_startup_heap() -> int:
    """Collect once, freeze every object that is left, set the service thresholds, and time the
    collector's passes from now on (`gc_pauses`); the number frozen."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVICE_THRESHOLDS)
    time_gc_pauses()
    return gc.get_freeze_count()


def time_gc_pauses() -> None:
    """Time every pass of the collector from now on (`gc_pauses`); once per process."""
    with _pause_clock_lock:
        if _pause_clock not in gc.callbacks:
            gc.callbacks.append(_pause_clock)


@contextmanager
def no_cycle_collection() -> Iterator[None]:
    """No cyclic collection while the block runs (reference counting still frees): for bulk
    work that allocates a few small objects per record and keeps many, none in a cycle. In a
    200,000-record rebuild the collector's passes over everything alive cost more than the work
    itself (~5 us a record in py-spy's samples, issue 16)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
