"""services.common.heap: the start-up heap is frozen out of the full collections, and what is
made afterwards is still collected (a reference cycle made later does not leak)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from services.common.heap import SERVICE_THRESHOLDS, freeze_startup_heap


@pytest.fixture
def thawed() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()  # the rest of the test session collects as before
    gc.set_threshold(*thresholds)


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_what_exists_is_frozen_and_a_later_cycle_is_still_collected(thawed: None) -> None:
    frozen = freeze_startup_heap()
    assert frozen > 1000 and gc.get_freeze_count() == frozen, "the imported frameworks are frozen"
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a cycle made after start-up: only the collector can free it
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None
    assert gc.get_freeze_count() == frozen, "a collection leaves the frozen generation alone"


def test_a_service_collects_its_young_generation_less_often_and_still_collects_it(thawed: None) -> None:
    freeze_startup_heap()
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
