"""The API's decoded Run briefs (issue 16, services/projections/brief_cache.py): served from
memory, and never older than what the store holds, whatever the order of reader and writer."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.clock import ManualClock
from services.common.eventlog import MemoryEventLog
from services.common.messages import MessageCodec
from services.common.store import MemoryStore
from services.common.topics import RUNS_EVENTS
from services.lease_coordinator.domain import LeasePolicy
from services.lease_coordinator.processor import RunCommandProcessor
from services.projections.brief_cache import BriefCache
from services.projections.store import RunViewStore
from tests.support.lease_run import claim_cmd

from .strategies import submit_command
from .test_run_processor import CommandTopic, log_records

CODEC = MessageCodec()


class _CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.gets = 0

    def get(self, key: str) -> bytes | None:
        self.gets += 1
        return super().get(key)


def _submitted_then_claimed() -> tuple[MemoryEventLog, str, int]:
    """A run's events: submitted (log offsets up to the returned count), then claimed."""
    log, store, topic = MemoryEventLog(), MemoryStore(), CommandTopic()
    processor = RunCommandProcessor(log, store, CODEC, ManualClock(), LeasePolicy())
    processor.handle([topic.record(submit_command("acme", "k1", command_id="s-1"))])
    submitted = len(log_records(log, RUNS_EVENTS.name))
    run_id = next(key.removeprefix("run/") for key, _ in store.scan("run/"))
    processor.handle([topic.record(claim_cmd(run_id, command_id="c-1", lease_seconds=90))])
    return log, run_id, submitted


def test_a_brief_is_read_from_the_store_once_and_follows_every_write_lease_1() -> None:
    log, run_id, submitted = _submitted_then_claimed()
    records = log_records(log, RUNS_EVENTS.name)
    store = _CountingStore()
    views = RunViewStore(store, CODEC, cached_briefs=10)
    views.apply(records[:submitted])
    reads = store.gets
    first = views.brief(run_id)
    assert first is not None and first["holders"] == {}
    assert views.brief(run_id) is first and store.gets == reads, "written by this instance: never read"
    views.apply(records[submitted:])  # the claim: a holder now
    claimed = views.brief(run_id)
    assert claimed is not None and list(claimed["holders"].values()) == ["runner:runner-a"]
    assert claimed == RunViewStore(store, CODEC).brief(run_id), "the same as the store holds"
    assert views.brief("run_unknown") is None


def test_a_restarted_instance_fills_its_cache_from_the_store() -> None:
    log, run_id, _ = _submitted_then_claimed()
    store = _CountingStore()
    RunViewStore(store, CODEC).apply(log_records(log, RUNS_EVENTS.name))
    views = RunViewStore(store, CODEC, cached_briefs=10)
    reads = store.gets
    brief = views.brief(run_id)
    assert brief is not None and store.gets == reads + 1
    assert views.brief(run_id) is brief and store.gets == reads + 1


def test_a_wholesale_rewrite_of_the_runs_empties_the_cache() -> None:
    log, run_id, _ = _submitted_then_claimed()
    views = RunViewStore(MemoryStore(), CODEC, cached_briefs=10)
    views.apply(log_records(log, RUNS_EVENTS.name))
    assert views.brief(run_id) is not None
    views.clear_runs()
    assert views.brief(run_id) is None, "deleted runs are not served from memory"


def test_a_brief_read_before_a_write_never_replaces_the_write() -> None:
    cache = BriefCache(10)
    generation = cache.generation  # a reader took it, then read version 3 from the store
    cache.written({"run_a": {"version": 4}})  # meanwhile the writer stored version 4
    cache.fill("run_a", {"version": 3}, generation)
    assert cache.get("run_a") == {"version": 4}
    cache.clear()
    cache.fill("run_a", {"version": 4}, generation)  # read before the clear: dropped as well
    assert cache.get("run_a") is None
    cache.fill("run_a", {"version": 4}, cache.generation)
    assert cache.get("run_a") == {"version": 4}


@given(st.lists(st.sampled_from(["read", "write", "clear", "fill"]), max_size=30))
def test_any_interleaving_serves_a_brief_no_older_than_the_stores(steps: list[str]) -> None:
    """A model of one run: the store's version, a reader that took a generation and read the
    store at some point, and the cache; after every step the cache holds the store's version
    or nothing."""
    cache, stored = BriefCache(4), 0
    pending: tuple[int, int] | None = None  # (generation, version read)
    for step in steps:
        if step == "read":
            pending = (cache.generation, stored)
        elif step == "write":
            stored += 1
            cache.written({"run": {"version": stored}})
        elif step == "clear":
            cache.clear()
        elif pending is not None:
            cache.fill("run", {"version": pending[1]}, pending[0])
            pending = None
        held: dict[str, Any] | None = cache.get("run")
        assert held is None or held["version"] == stored


def test_a_full_cache_keeps_its_older_entries_so_a_cycle_of_runs_still_hits() -> None:
    cache = BriefCache(3)
    for cycle in range(3):
        hits = 0
        for n in range(5):  # five runs renewed in turn, three places
            if cache.get(f"run_{n}") is not None:
                hits += 1
            else:
                cache.fill(f"run_{n}", {"n": n}, cache.generation)
        assert len(cache) == 3
        assert hits == (0 if cycle == 0 else 2), "the first two stay resident; the rest churn one place"


def test_a_cache_holds_at_least_one_run() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        BriefCache(0)
