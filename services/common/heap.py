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
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["SERVICE_THRESHOLDS", "freeze_startup_heap", "no_cycle_collection"]

# (young, middle, old): collect the young generation every 20,000 net container allocations,
# the middle one every 50 young collections, everything every 100 middle ones (CPython's own
# rule still postpones a full pass until a quarter of the heap is new).
SERVICE_THRESHOLDS = (20_000, 50, 100)


def freeze_startup_heap() -> int:
    """Collect once, freeze every object that is left, and set the service thresholds; the
    number frozen."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVICE_THRESHOLDS)
    return gc.get_freeze_count()


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
