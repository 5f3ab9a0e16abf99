"""services.common.heap: the start-up heap is frozen out of the full collections, and what is
made afterwards is still collected (a reference cycle made later does not leak)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from services.common.heap import freeze_startup_heap


@pytest.fixture
def thawed() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the test session collects as before


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
