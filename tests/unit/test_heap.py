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
