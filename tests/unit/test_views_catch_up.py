"""The API's view reads catch up with the projection only when they may be behind (issue 11).

Catching up a RocksDB secondary on every read was a third of the API's CPU under load. The
decision followers hear every event of both aggregates, so a read knows whether the view it
finds can be behind: it catches up only when a newer version has been heard of, or when its
last catch-up is older than a moment (what happened before the followers started). The
long-poll is woken by the same book the moment a newer version is heard.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from services.command_api.context import ViewReader
from services.common.decisions import DecisionBook
from services.common.messages import MessageCodec
from services.common.store import MemoryStore
from tests.support.stored_views import run_view_keys

pytestmark = pytest.mark.timeout(30)


class CountingStore(MemoryStore):
    """A store whose writes stay invisible to reads until `refresh`, like a secondary."""

    def __init__(self) -> None:
        super().__init__()
        self.refreshes = 0
        self.pending: dict[str, bytes] = {}

    def stage(self, keys: dict[str, bytes]) -> None:
        self.pending.update(keys)

    def refresh(self) -> None:
        self.refreshes += 1
        for key, value in self.pending.items():
            self.write({key: value})
        self.pending.clear()


def _reader(tmp_path: Path, store: CountingStore, book: DecisionBook) -> ViewReader:
    return ViewReader(tmp_path, MessageCodec(), store, heard_run=book.newest_heard)


def test_a_read_of_a_view_that_is_current_does_not_catch_up(tmp_path: Path) -> None:
    store, book = CountingStore(), DecisionBook()
    r1, keys = run_view_keys("r1", 3)
    store.write(keys)
    book.heard(r1, 3)
    reader = _reader(tmp_path, store, book)
    reader.get(r1)  # the first read catches up (nothing was refreshed yet)
    before = store.refreshes
    for _ in range(50):
        assert reader.get(r1)["version"] == 3  # type: ignore[index]
    assert store.refreshes == before, "reads of a current view caught up with the projection"


def test_a_read_after_a_newer_version_was_heard_catches_up_and_sees_it(tmp_path: Path) -> None:
    store, book = CountingStore(), DecisionBook()
    r1, keys = run_view_keys("r1", 3)
    store.write(keys)
    book.heard(r1, 3)
    reader = _reader(tmp_path, store, book)
    reader.get(r1)
    store.stage(run_view_keys("r1", 4)[1])
    assert reader.get(r1)["version"] == 3  # type: ignore[index]  # nothing newer heard of yet
    book.heard(r1, 4)
    time.sleep(ViewReader._REFRESH_EVERY_S * 2)
    assert reader.get(r1)["version"] == 4  # type: ignore[index]


def test_without_news_a_read_still_catches_up_after_a_moment(tmp_path: Path) -> None:
    """Events from before the followers started are never heard: the periodic catch-up shows them."""
    store, book = CountingStore(), DecisionBook()
    reader = _reader(tmp_path, store, book)
    r2, keys = run_view_keys("r2", 1)
    assert reader.get(r2) is None
    store.stage(keys)
    time.sleep(ViewReader._SETTLED_S * 1.5)
    view = reader.get(r2)
    assert view is not None and (view["runId"], view["version"], view["status"]) == (r2, 1, "queued")


def test_the_book_wakes_a_waiter_the_moment_a_newer_version_is_heard() -> None:
    book = DecisionBook()

    async def scenario() -> tuple[int | None, float, int | None, int | None]:
        book.heard("r1", 2)
        waiter = asyncio.create_task(book.wait_past("r1", 2, 5.0))
        await asyncio.sleep(0.05)
        began = time.monotonic()
        book.heard("r1", 2)  # a repeat wakes nobody
        book.heard("r1", 1)  # nor an older version
        await asyncio.sleep(0.05)
        assert not waiter.done()
        book.heard("r1", 3)
        woke = await waiter
        took = time.monotonic() - began
        already = await book.wait_past("r1", 1, 0.0)  # known past it: at once
        nothing = await book.wait_past("r9", 0, 0.05)  # never heard of: the timeout
        return woke, took, already, nothing

    woke, took, already, nothing = asyncio.run(scenario())
    assert woke == 3 and took < 1.0
    assert already == 3 and nothing is None
    assert book.newest_heard("r1") == 3 and book.newest_heard("r9") == 0
