"""services.common.heap: the start-up heap is frozen out of the full collections, and what is
made afterwards is still collected (a reference cycle made later does not leak), on a clock of
the service's own: a young pass runs however little the allocation count moves."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable, Iterator

import pytest

from services.common.heap import (
    SERVICE_THRESHOLDS,
    CollectorSchedule,
    freeze_startup_heap,
    gc_pauses,
    no_cycle_collection,
    stop_collector_schedule,
)

COUNTED = CollectorSchedule(young_interval_s=0)  # CPython's own count-based schedule


@pytest.fixture
def thawed() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    stop_collector_schedule()
    gc.unfreeze()  # the rest of the test session collects as before
    gc.set_threshold(*thresholds)
    assert gc.isenabled()


def _passes(generation: int) -> int:
    pauses = gc_pauses().get(generation)
    return pauses.count if pauses else 0


def _eventually(condition: Callable[[], bool], within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _still_frozen(frozen: int) -> bool:
    """The permanent generation still holds what was frozen. Not an exact count: a frozen object
    leaves it when its last reference goes, and other threads of the test process (a worker's
    Kafka clients, thread pools) drop references at any moment (a fresh clone's run, 2026-12-07,
    saw 526,288 against 526,289). A collection that took the generation back would leave none."""
    now = gc.get_freeze_count()
    return frozen * 0.99 <= now <= frozen


def test_what_exists_is_frozen_and_a_later_cycle_is_still_collected(thawed: None) -> None:
    frozen = freeze_startup_heap(COUNTED)
    assert frozen > 1000 and _still_frozen(frozen), "the imported frameworks are frozen"
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a cycle made after start-up: only the collector can free it
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None
    assert _still_frozen(frozen), "a collection leaves the frozen generation alone"


def test_a_service_collects_its_young_generation_less_often_and_still_collects_it(thawed: None) -> None:
    freeze_startup_heap(COUNTED)
    assert gc.get_threshold() == SERVICE_THRESHOLDS
    before = gc.get_stats()[0]["collections"]
    nodes = [_Node() for _ in range(SERVICE_THRESHOLDS[0] + 1000)]  # more than the young threshold
    assert gc.get_stats()[0]["collections"] > before, "the young generation is still collected"
    del nodes


def test_every_pass_of_the_collector_is_timed_by_generation_and_served_on_metrics() -> None:
    from prometheus_client import generate_latest

    from services.common.heap import GC_PAUSE_BUCKETS, gc_pauses, time_gc_pauses
    from services.common.metrics import metrics_registry

    time_gc_pauses()
    time_gc_pauses()  # once per process, however often asked
    before = gc_pauses().get(2)
    gc.collect()
    after = gc_pauses()[2]
    assert after.count == (before.count if before else 0) + 1, "one full pass, timed once"
    assert 0 < after.longest_s <= after.total_s
    assert after.buckets[-1] == after.count or after.longest_s > GC_PAUSE_BUCKETS[-1]
    assert list(after.buckets) == sorted(after.buckets), "the bounds count cumulatively"
    text = generate_latest(metrics_registry()).decode()
    assert f'tenure_process_gc_pause_seconds_count{{generation="2"}} {float(after.count)}' in text
    assert 'tenure_process_gc_pause_longest_seconds{generation="2"}' in text


def test_on_a_clock_a_young_pass_runs_though_renewals_leave_the_allocation_count_still(thawed: None) -> None:
    """The stall of issue 16's 100,000-lease run: each renewal replaces a kept state, so CPython's
    count (allocations minus deallocations) never reaches its threshold, while the young
    generation fills with every state kept since. On the clock, young passes run anyway."""
    freeze_startup_heap(CollectorSchedule(young_interval_s=0.01, middle_every=3, full_interval_s=0))
    assert not gc.isenabled(), "CPython's count-based collection is off while the clock runs"
    kept = {lease: (_Node(), _Node()) for lease in range(1_000)}
    young, middle, full = _passes(0), _passes(1), _passes(2)
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:  # renewals: each replaces a kept state
        for lease in range(0, 1_000, 7):
            kept[lease] = (_Node(), _Node())
        assert gc.get_count()[0] < SERVICE_THRESHOLDS[0], "the count alone would never collect"
        time.sleep(0.001)
    assert _passes(0) - young >= 5, "young passes ran on the clock"
    assert _passes(1) - middle >= 2, "every third pass took the middle generation too"
    assert _passes(2) == full, "no full pass at full_interval_s 0"


def test_on_a_clock_a_later_cycle_is_collected_and_the_full_pass_comes_on_its_own_interval(
    thawed: None,
) -> None:
    fulls = _passes(2)
    freeze_startup_heap(CollectorSchedule(young_interval_s=0.01, middle_every=2, full_interval_s=0.2))
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    assert _eventually(lambda: gone() is None), "a cycle is freed without anyone calling gc.collect"
    assert _eventually(lambda: _passes(2) > fulls), "a full pass on its interval"


def test_bulk_work_holds_the_scheduled_passes_back(thawed: None) -> None:
    freeze_startup_heap(CollectorSchedule(young_interval_s=0.01, full_interval_s=0))
    assert _eventually(lambda: _passes(0) > 0)
    with no_cycle_collection():
        time.sleep(0.03)  # a pass that had already begun its wait may still finish
        during = _passes(0) + _passes(1)
        time.sleep(0.2)
        assert _passes(0) + _passes(1) == during, "no scheduled pass while bulk work runs"
    assert not gc.isenabled(), "the clock still collects, not CPython's count"
    assert _eventually(lambda: _passes(0) + _passes(1) > during), "and passes resume after it"
