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

Services collect on a clock of their own (`CollectorSchedule`, on by default), not on CPython's
count. CPython starts a young pass when container allocations minus deallocations pass the
threshold, and a renewal replaces a kept state: the count barely moves, while every state kept
since the last pass stays in the young generation. At 100,000 live leases (about ten tracked
objects each) that is about a million objects, and the pass that finally comes walks them all:
one such pass over 100 ms was the stall of the one missed 100,000-lease run (docs/benchmarks.md,
2026-12-07). On a clock, a young pass walks what survived since the last one, whatever the count
says: a tenth of a second of work, about a millisecond at 5,000 renewals/s; the middle generation
every tenth pass (one second of survivors, ~10-20 ms); and the full pass, which walks everything
(~0.4 s over 100,000 kept leases), once an hour by default, because only it frees a reference
cycle that outlived the middle generation and Tenure's own state makes none.
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
    "CollectorSchedule",
    "GcPauses",
    "ScheduledCollector",
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
# Set while `no_cycle_collection` runs: the scheduled passes wait for it too.
_bulk_work = threading.Event()
_pause_clock_lock = threading.Lock()


def gc_pauses() -> dict[int, GcPauses]:
    """The passes of each generation (0 young, 1 middle, 2 full) timed since the process started
    timing them (`time_gc_pauses`, which `freeze_startup_heap` calls)."""
    return _pause_clock.snapshot()


@dataclass(frozen=True)
class CollectorSchedule:
    """When a service's collector passes run (see the module docstring). `young_interval_s`: a
    young pass this often, 0 for CPython's own schedule (`SERVICE_THRESHOLDS`); every
    `middle_every`-th one collects the middle generation too; a full pass every
    `full_interval_s`, 0 for never."""

    young_interval_s: float = 0.1
    middle_every: int = 10
    full_interval_s: float = 3600.0


class ScheduledCollector:
    """A daemon thread that runs the collector's passes on `schedule`'s clock while CPython's own
    automatic collection is off; `stop` gives the automatic collection back."""

    def __init__(self, schedule: CollectorSchedule) -> None:
        self.schedule = schedule
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tenure-gc-schedule", daemon=True)

    def start(self) -> ScheduledCollector:
        gc.disable()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        gc.enable()

    def _run(self) -> None:
        plan = self.schedule
        young_passes = 0
        next_full = time.monotonic() + plan.full_interval_s
        while not self._stop.wait(plan.young_interval_s):
            if _bulk_work.is_set():
                continue  # `no_cycle_collection`: the bulk work's objects are collected after it
            if plan.full_interval_s > 0 and time.monotonic() >= next_full:
                gc.collect(2)
                next_full = time.monotonic() + plan.full_interval_s
                continue
            young_passes += 1
            gc.collect(1 if young_passes % max(plan.middle_every, 1) == 0 else 0)


_scheduled: list[ScheduledCollector] = []
_scheduled_lock = threading.Lock()  # start and stop of the one schedule may race in tests


def freeze_startup_heap(schedule: CollectorSchedule | None = None) -> int:
    """Collect once, freeze every object that is left, collect from now on by `schedule` (or, at
    `young_interval_s` 0, by CPython's count with the service thresholds), and time the
    collector's passes (`gc_pauses`); the number frozen. Once per process: a second call
    freezes again and keeps the schedule already running."""
    schedule = schedule or CollectorSchedule()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVICE_THRESHOLDS)
    time_gc_pauses()
    with _scheduled_lock:
        if schedule.young_interval_s > 0 and not _scheduled:
            _scheduled.append(ScheduledCollector(schedule).start())
    return gc.get_freeze_count()


def stop_collector_schedule() -> None:
    """Stop the schedule `freeze_startup_heap` started, if any (tests; a process just exits)."""
    with _scheduled_lock:
        while _scheduled:
            _scheduled.pop().stop()


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
    _bulk_work.set()
    try:
        yield
    finally:
        _bulk_work.clear()
        if enabled:
            gc.enable()
