"""The KeyValueStore contract (services/common/store/_contract.py), run against every store.

`StoreContract` holds the tests; each concrete class only says how to make, reopen and close
its store and which capabilities it has, so MemoryStore (the unit-test twin) cannot drift from
RocksStore (production). The processors' crash-safety (DUR-1) leans on two clauses proven here:
`write` applies puts and deletes atomically, and a persistent store keeps them across reopen.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.common.store import KeyValueStore, MemoryStore, RocksStore, StoreReadOnly

KEYS = {
    "run/b": b"2",
    "run/a": b"1",
    "run/c/nested": b"3",
    "runs": b"not under run/",
    "checkpoint/runs.events/0": b"17",
    "idx/queued/0001767225600000/run_x": b"",
    "r\u00e9sum\u00e9/\u2603": "unicode value \u2713".encode(),
}


class StoreContract:
    """Every test here must hold for every KeyValueStore; subclasses provide the fixtures."""

    persistent: bool = False

    def open_store(self, location: Path) -> KeyValueStore:
        raise NotImplementedError

    @pytest.fixture
    def make_store(self, tmp_path: Path) -> Iterator[Callable[[], KeyValueStore]]:
        """Opens (or reopens) the store at one location; everything opened is closed afterwards."""
        opened: list[KeyValueStore] = []

        def make() -> KeyValueStore:
            store = self.open_store(tmp_path / "store")
            opened.append(store)
            return store

        yield make
        for store in reversed(opened):
            with contextlib.suppress(Exception):  # already closed by the test itself
                store.close()

    @pytest.fixture
    def store(self, make_store: Callable[[], KeyValueStore]) -> KeyValueStore:
        return make_store()

    # --- get / write -------------------------------------------------------------------------

    def test_get_of_a_missing_key_is_none(self, store: KeyValueStore) -> None:
        assert store.get("nothing/here") is None

    def test_write_then_get(self, store: KeyValueStore) -> None:
        store.write(KEYS)
        for key, value in KEYS.items():
            assert store.get(key) == value
            assert isinstance(store.get(key), bytes)

    def test_write_overwrites(self, store: KeyValueStore) -> None:
        store.write({"k": b"old"})
        store.write({"k": b"new"})
        assert store.get("k") == b"new"

    def test_empty_value_is_a_value_not_a_missing_key(self, store: KeyValueStore) -> None:
        store.write({"present": b""})
        assert store.get("present") == b""

    def test_batch_of_puts_and_deletes_applies_together(self, store: KeyValueStore) -> None:
        store.write({"run/a": b"1", "run/b": b"2", "checkpoint/0": b"5"})
        store.write({"run/c": b"3", "checkpoint/0": b"6"}, deletes=("run/a", "never/existed"))
        assert store.get("run/a") is None
        assert (store.get("run/b"), store.get("run/c"), store.get("checkpoint/0")) == (b"2", b"3", b"6")

    def test_a_key_both_put_and_deleted_in_one_batch_ends_deleted(self, store: KeyValueStore) -> None:
        store.write({"k": b"old"})
        store.write({"k": b"new"}, deletes=("k",))
        assert store.get("k") is None

    def test_a_batch_that_cannot_be_written_is_refused_whole(self, store: KeyValueStore) -> None:
        """Atomicity and fidelity: a batch with one bad entry (a str value, e.g. a forgotten
        .encode(); a non-bytes value; a key that is not UTF-8 encodable) raises and writes NO
        key of the batch. The twin must refuse what RocksDB refuses, or a unit test passes with
        a value production cannot store."""
        store.write({"kept": b"1"})
        bad_batches: list[dict[str, Any]] = [
            {"a/first": b"ok", "b/second": "text, not bytes", "c/third": b"ok"},
            {"a/first": b"ok", "b/second": 12345, "c/third": b"ok"},
            {"a/first": b"ok", "b/\ud800": b"lone surrogate key", "c/third": b"ok"},
        ]
        for bad in bad_batches:
            with pytest.raises((TypeError, ValueError)):
                store.write(bad, deletes=("kept",))
            assert store.get("a/first") is None, bad
            assert store.get("c/third") is None, bad
            assert store.get("kept") == b"1", bad

    def test_a_delete_range_removes_the_keys_from_start_to_before_end(self, store: KeyValueStore) -> None:
        keys = ["b/00", "b/01", "b/01/x", "b/02", "b/020", "b/03", "c/01"]
        store.write({k: b"v" for k in ["a/99", *keys]})
        store.write({"b/015": b"put in the range, same write"}, delete_ranges=(("b/01", "b/03"),))
        assert [k for k, _ in store.scan("")] == ["a/99", "b/00", "b/03", "c/01"]

    def test_a_delete_range_applies_with_the_writes_other_entries(self, store: KeyValueStore) -> None:
        store.write({"offset/0": b"1", "r/1": b"x", "r/2": b"y", "s/1": b"z"})
        store.write({"offset/0": b"2"}, deletes=("s/1",), delete_ranges=(("r/", "r0"), ("q/", "q0")))
        assert dict(store.scan("")) == {"offset/0": b"2"}
        store.write({"r/3": b"after"})
        assert store.get("r/3") == b"after", "a later put in a deleted range is kept"

    def test_writing_nothing_is_allowed(self, store: KeyValueStore) -> None:
        store.write({})
        assert list(store.scan("")) == []

    # --- scan --------------------------------------------------------------------------------

    def test_scan_by_prefix_in_key_order(self, store: KeyValueStore) -> None:
        store.write(KEYS)
        assert list(store.scan("run/")) == [("run/a", b"1"), ("run/b", b"2"), ("run/c/nested", b"3")]
        assert [k for k, _ in store.scan("run")] == ["run/a", "run/b", "run/c/nested", "runs"]
        assert [k for k, _ in store.scan("")] == sorted(KEYS)
        assert list(store.scan("zzz")) == []
        assert list(store.scan("r\u00e9")) == [("r\u00e9sum\u00e9/\u2603", KEYS["r\u00e9sum\u00e9/\u2603"])]

    def test_scan_orders_numbers_as_text(self, store: KeyValueStore) -> None:
        store.write({"p/10": b"", "p/9": b"", "p/0000000009": b"", "p/0000000010": b""})
        assert [k for k, _ in store.scan("p/")] == ["p/0000000009", "p/0000000010", "p/10", "p/9"]

    def test_scan_start_after_is_exclusive(self, store: KeyValueStore) -> None:
        store.write(KEYS)
        assert [k for k, _ in store.scan("run/", start_after="run/a")] == ["run/b", "run/c/nested"]
        assert [k for k, _ in store.scan("run/", start_after="run/b")] == ["run/c/nested"]
        assert list(store.scan("run/", start_after="run/c/nested")) == []

    def test_scan_start_after_a_key_that_does_not_exist(self, store: KeyValueStore) -> None:
        store.write(KEYS)
        assert [k for k, _ in store.scan("run/", start_after="run/aa")] == ["run/b", "run/c/nested"]
        # before the prefix: the whole prefix; after it: nothing
        assert [k for k, _ in store.scan("run/", start_after="a")] == ["run/a", "run/b", "run/c/nested"]
        assert list(store.scan("run/", start_after="zzz")) == []

    def test_scan_before_is_an_exclusive_upper_bound(self, store: KeyValueStore) -> None:
        store.write(KEYS)
        assert [k for k, _ in store.scan("run/", before="run/b")] == ["run/a"]
        assert [k for k, _ in store.scan("run/", before="run/c")] == ["run/a", "run/b"]
        assert [k for k, _ in store.scan("run/", start_after="run/a", before="run/c/z")] == [
            "run/b",
            "run/c/nested",
        ]
        assert list(store.scan("run/", before="run/")) == []
        # a bound past the prefix's end is the prefix's end
        assert [k for k, _ in store.scan("run/", before="zzz")] == ["run/a", "run/b", "run/c/nested"]

    def test_scan_of_a_prefix_ending_in_high_bytes(self, store: KeyValueStore) -> None:
        # The bounded iterator's end is the prefix's successor; a last character with the
        # highest UTF-8 lead byte must still find its keys.
        store.write({"p\U0010ffff/a": b"1", "p\U0010ffff/b": b"2", "q": b"3"})
        assert [k for k, _ in store.scan("p\U0010ffff")] == ["p\U0010ffff/a", "p\U0010ffff/b"]

    def test_a_scan_next_to_many_deleted_keys_stays_quick(self, store: KeyValueStore) -> None:
        """Deleted keys after a prefix (the timer index next to the tenant loads) must not be
        stepped over one by one: the scan stops at the prefix's end."""
        store.write({"tenant/acme/0": b"1,0", "tenant/acme/1": b"0,1"})
        dead = {f"timer/{i:09d}": b"" for i in range(50_000)}
        store.write(dead)
        store.write({}, deletes=tuple(dead))
        store.write({"zz": b""})
        started = time.perf_counter()
        for _ in range(50):
            assert [k for k, _ in store.scan("tenant/acme/")] == ["tenant/acme/0", "tenant/acme/1"]
        assert (time.perf_counter() - started) / 50 < 0.005

    def test_paging_with_start_after_visits_every_key_once(self, store: KeyValueStore) -> None:
        keys = [f"idx/{i:05d}" for i in range(23)]
        store.write({k: k.encode() for k in keys} | {"idy/0": b"", "idw/0": b""})
        seen: list[str] = []
        last: str | None = None
        while True:
            page = []
            for key, _ in store.scan("idx/", start_after=last):
                page.append(key)
                if len(page) == 5:
                    break
            if not page:
                break
            seen += page
            last = page[-1]
        assert seen == keys

    def test_scan_reflects_deletes(self, store: KeyValueStore) -> None:
        store.write(KEYS)
        store.write({}, deletes=("run/b",))
        assert [k for k, _ in store.scan("run/")] == ["run/a", "run/c/nested"]

    # --- clear / refresh / reopen ------------------------------------------------------------

    def test_clear_removes_everything(self, store: KeyValueStore) -> None:
        store.write(KEYS)
        store.clear()
        assert list(store.scan("")) == []
        assert all(store.get(k) is None for k in KEYS)
        store.write({"after": b"clear"})
        assert list(store.scan("")) == [("after", b"clear")]

    def test_refresh_of_a_writer_changes_nothing(self, store: KeyValueStore) -> None:
        store.write(KEYS)
        store.refresh()
        assert dict(store.scan("")) == KEYS

    def test_reopen_keeps_data_exactly_when_the_store_is_persistent(
        self, make_store: Callable[[], KeyValueStore]
    ) -> None:
        """Capability `persistent`: RocksStore keeps every committed batch across close/reopen
        (the processors' restart path); the in-memory twin honestly starts empty."""
        first = make_store()
        first.write(KEYS)
        first.write({}, deletes=("runs",))
        first.close()
        reopened = make_store()
        expected = {k: v for k, v in KEYS.items() if k != "runs"} if self.persistent else {}
        assert dict(reopened.scan("")) == expected


class TestMemoryStore(StoreContract):
    persistent = False

    def open_store(self, location: Path) -> KeyValueStore:
        return MemoryStore()


class TestRocksStore(StoreContract):
    persistent = True

    def open_store(self, location: Path) -> KeyValueStore:
        return RocksStore(location)

    # --- Rocks only: the read-only follower the command API reads views through -------------

    def test_secondary_sees_the_writers_data_after_refresh(self, tmp_path: Path) -> None:
        writer = RocksStore(tmp_path / "views")
        follower: RocksStore | None = None
        try:
            writer.write({"view/a": b"1"})
            follower = RocksStore(tmp_path / "views", secondary=True)
            assert follower.get("view/a") == b"1"
            writer.write({"view/b": b"2", "view/a": b"1b"}, deletes=())
            writer.write({}, deletes=("view/a",))
            follower.refresh()
            assert follower.get("view/a") is None
            assert list(follower.scan("view/")) == [("view/b", b"2")]
            writer.clear()
            follower.refresh()
            assert list(follower.scan("")) == []
        finally:
            if follower is not None:
                follower.close()
            writer.close()

    def test_secondary_refuses_writes_and_clear(self, tmp_path: Path) -> None:
        writer = RocksStore(tmp_path / "views")
        writer.write({"view/a": b"1"})
        follower = RocksStore(tmp_path / "views", secondary=True)
        try:
            with pytest.raises(StoreReadOnly):
                follower.write({"view/x": b"nope"})
            with pytest.raises(StoreReadOnly):
                follower.write({}, deletes=("view/a",))
            with pytest.raises(StoreReadOnly):
                follower.clear()
            follower.refresh()
            assert writer.get("view/x") is None
            assert writer.get("view/a") == b"1"
            assert follower.get("view/a") == b"1"
        finally:
            follower.close()
            writer.close()
