"""The seeded rebuild shows what the full fold shows, on a real broker (issue 16).

Random Run lives (tests/unit/run_walks.py: every event the coordinator can write, takeovers,
cancels, retries, timers) are committed to runs.events as the coordinator commits them: in units,
each transaction also carrying the latest state of every run it changed and its checkpoint on
the state changelog (runs.states). Then the views are rebuilt twice, by folding every event and
seeded from the changelog (services/projections/seeded_rebuild.py), and compared: every brief,
status index and held entry byte for byte, every fold and every rendered view. Then more events
arrive and both stores follow them (a seeded run is folded from its history at its next event).

The module starts a broker of its own: its changelog is written here alone, so what makes it
whole (a unit that began at offset 0 of each partition) is this module's to say.
"""

from __future__ import annotations

import random
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.command_api.projection import ApiProjection
from services.common.aggregate.changelog import unit_records
from services.common.broker import free_port, start_broker
from services.common.contracts import RunEvent
from services.common.kafka import (
    CommittedEnds,
    OutboundRecord,
    TopicFollower,
    TransactionalWriter,
    create_topics,
)
from services.common.messages import MessageCodec
from services.common.store import MemoryStore, RocksStore
from services.common.topics import (
    RUNS_EVENTS,
    RUNS_RENEWALS,
    RUNS_STATES,
    TRAJECTORIES_EVENTS,
    WATCHDOG_EVENTS,
)
from services.lease_coordinator.domain import RunState, evolve
from services.lease_coordinator.state_codec import STATE_FORMAT, encode_state
from services.projections import seeded_rebuild
from services.projections.service import RebuildStopped, rebuild, seed_run_views
from services.projections.store import SEEDED_FOLD, RunViewStore
from tests.unit.run_walks import ACTIONS, ADVANCES, RunWalk

# Serial: it starts a broker of its own, which the parallel phase's timing tests feel.
pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(300)]

_CODEC = MessageCodec()


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    state_dir: Path = tmp_path_factory.mktemp("kafka-seeded-rebuild")
    handle = start_broker(
        port=free_port(), state_dir=state_dir, data_dir=state_dir / "data", timeout=90.0, die_with_parent=True
    )
    try:
        topics = [RUNS_EVENTS, RUNS_STATES, TRAJECTORIES_EVENTS, WATCHDOG_EVENTS, RUNS_RENEWALS]
        create_topics(handle.bootstrap_servers, topics)
        yield handle.bootstrap_servers
    finally:
        handle.stop()


class _Coordinator:
    """Commits events in units as the coordinator does: events, changed states, checkpoints."""

    def __init__(self, bootstrap: str) -> None:
        self._writer = TransactionalWriter(bootstrap, f"test-seeded-rebuild-{time.monotonic_ns()}")
        self._states: dict[str, RunState] = {}
        self._folded_to = dict.fromkeys(range(RUNS_EVENTS.partitions), 0)

    def commit(self, events: list[RunEvent], per_unit: int) -> None:
        for start in range(0, len(events), per_unit):
            unit = events[start : start + per_unit]
            touched: dict[str, int] = {}
            records: list[OutboundRecord] = []
            for event in unit:
                partition = _partition(event.run_id)
                records.append(_CODEC.outbound(RUNS_EVENTS.name, event.run_id, event, partition))
                self._states[event.run_id] = evolve(self._states.get(event.run_id), event)
                touched[event.run_id] = partition
            changed = [(run_id, p, encode_state(self._states[run_id])) for run_id, p in touched.items()]
            folded_to = {p: self._folded_to[p] for p in set(touched.values())}
            written = self._writer.commit(
                records + unit_records(RUNS_STATES.name, changed, folded_to, STATE_FORMAT)
            )
            for (topic, partition), offset in written.items():
                if topic == RUNS_EVENTS.name:
                    self._folded_to[partition] = offset + 1

    def close(self) -> None:
        self._writer.close()


def _partition(run_id: str) -> int:
    return zlib.crc32(run_id.encode()) % RUNS_EVENTS.partitions


def _walks(count: int, steps: int, rng: random.Random, prefix: str) -> list[RunWalk]:
    walks = []
    for index in range(count):
        walk = RunWalk(f"{prefix}-{index}", retry_safe=rng.random() < 0.7, timeout_seconds=3600)
        for _ in range(rng.randint(1, steps)):
            walk.step(rng.choice(ACTIONS), rng.randint(0, 11), rng.choice(ADVANCES))
        walks.append(walk)
    return walks


def _interleaved(lives: list[list[RunEvent]]) -> list[RunEvent]:
    queues = [list(reversed(events)) for events in lives]
    out: list[RunEvent] = []
    while any(queues):
        for queue in queues:
            if queue:
                out.append(queue.pop())
    return out


def _assert_same_views(folded: RunViewStore, seeded: RunViewStore, store_of: dict[int, MemoryStore]) -> None:
    full, fast = store_of[id(folded)], store_of[id(seeded)]
    for prefix in ("brief/", "idx/", "held/"):
        assert dict(fast.scan(prefix)) == dict(full.scan(prefix)), prefix
    ends = dict(full.scan("offset/"))
    assert {k: int(v) for k, v in fast.scan("offset/")}.keys() == {k: int(v) for k, v in ends.items()}.keys()
    assert all(int(v) >= int(ends[k]) for k, v in fast.scan("offset/"))
    run_ids = [key.removeprefix("fold/") for key, _ in full.scan("fold/")]
    assert run_ids == [key.removeprefix("fold/") for key, _ in fast.scan("fold/")]
    for run_id in run_ids:
        assert seeded.fold(run_id) == folded.fold(run_id), run_id
    assert seeded.all_views() == folded.all_views()


def _follow(bootstrap: str, views: RunViewStore) -> int:
    """Fold what was written since the views' offsets, as the projector's follower does."""
    follower = TopicFollower(bootstrap, [RUNS_EVENTS.name], start_at=views.offsets(), client_id="test-follow")
    try:
        ends = follower.end_offsets(RUNS_EVENTS.name)
        folded = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            records = follower.poll(max_records=1000, timeout_s=0.2)
            folded += views.apply(records) if records else 0
            positions = follower.positions(RUNS_EVENTS.name)
            if all(positions.get(p, 0) >= end for p, end in ends.items() if end):
                return folded
        raise TimeoutError("the follower did not reach the topic's end")
    finally:
        follower.close()


def test_a_seeded_rebuild_shows_what_folding_every_event_shows_and_follows_on_DUR_1(
    bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small polls and writes, so that a run's history is stored as several packed values.
    monkeypatch.setattr(seeded_rebuild, "_POLL", 50)
    monkeypatch.setattr(seeded_rebuild, "_ENTRIES_PER_WRITE", 40)
    rng = random.Random(16)
    walks = _walks(80, 30, rng, "seeded")
    coordinator = _Coordinator(bootstrap)
    try:
        coordinator.commit(_interleaved([w.events for w in walks]), per_unit=40)

        folded_store, seeded_store = MemoryStore(), MemoryStore()
        folded, seeded = RunViewStore(folded_store, _CODEC), RunViewStore(seeded_store, _CODEC)
        full_report = rebuild(bootstrap, folded, seeded=False)
        report = rebuild(bootstrap, seeded)
        assert report.events == full_report.events == sum(len(w.events) for w in walks)
        assert report.runs == full_report.runs == len(walks)
        # Most runs are seeded from the changelog; the last units' runs are folded (their events
        # are at or past the checkpoint the changelog names).
        assert 0 < report.seeded < report.runs
        assert report.changelog_records > 0
        seeded_runs = {k.removeprefix("fold/") for k, v in seeded_store.scan("fold/") if v == SEEDED_FOLD}
        assert len(seeded_runs) == report.seeded
        stores = {id(folded): folded_store, id(seeded): seeded_store}
        _assert_same_views(folded, seeded, stores)
        assert any(True for _ in seeded_store.scan("held/")), "some leases are held: compared"
        packed = [k for k, v in seeded_store.scan("hist/") if v.startswith(b"\xff")]
        assert len({k.rsplit("/", 1)[0] for k in packed}) < len(packed), "runs of several packed values"

        # More events of every kind arrive, for seeded runs among others; both stores follow them.
        written = {w.key: len(w.events) for w in walks}
        for walk in walks[::2]:
            for _ in range(rng.randint(1, 4)):
                walk.step(rng.choice(ACTIONS), rng.randint(0, 11), rng.choice(ADVANCES))
        later = _walks(5, 10, rng, "later")
        new_events = _interleaved([w.events[written[w.key] :] for w in walks] + [w.events for w in later])
        coordinator.commit(new_events, per_unit=25)
    finally:
        coordinator.close()
    assert _follow(bootstrap, folded) == _follow(bootstrap, seeded) == len(new_events)
    _assert_same_views(folded, seeded, stores)
    # A seeded run with an event since is seeded no more: its fold was folded and written.
    stepped = {e.run_id for e in new_events}
    still = {k.removeprefix("fold/") for k, v in seeded_store.scan("fold/") if v == SEEDED_FOLD}
    assert still == seeded_runs - stepped
    assert still and seeded_runs & stepped, "some seeded runs had events since, some did not"


def _caught_up(projection: ApiProjection) -> None:
    deadline = time.monotonic() + 120
    while projection.caught_up_seconds() is None:
        assert time.monotonic() < deadline, projection.health().detail
        time.sleep(0.1)


def test_a_new_api_instance_seeds_its_run_views_and_a_restart_continues_from_its_offsets(
    bootstrap: str, tmp_path: Path
) -> None:
    """A new API instance (an empty store) builds its Run views seeded from the changelog, not by
    folding every event; they equal the full fold's, and after a restart it follows on from its
    own offsets (the seeded marks of runs without events since stay: nothing was seeded again)."""
    rng = random.Random(17)
    walks = _walks(40, 25, rng, "api")
    coordinator = _Coordinator(bootstrap)
    try:
        coordinator.commit(_interleaved([w.events for w in walks]), per_unit=30)
        full_store = MemoryStore()
        full = RunViewStore(full_store, _CODEC)
        rebuild(bootstrap, full, seeded=False)

        projection = ApiProjection(bootstrap, tmp_path / "api-views", _CODEC)
        try:
            _caught_up(projection)
            seeded = {k for k, v in projection.store.scan("fold/") if v == SEEDED_FOLD}
            assert seeded, "the new instance seeded its Run views from the changelog"
            assert projection.runs.all_views() == full.all_views()
            assert dict(projection.store.scan("brief/")) == dict(full_store.scan("brief/"))
            assert projection.health().ready, projection.health().detail
        finally:
            projection.close()

        written = {w.key: len(w.events) for w in walks}
        for walk in walks[::3]:
            walk.step(rng.choice(ACTIONS), rng.randint(0, 11), rng.choice(ADVANCES))
        new_events = _interleaved([w.events[written[w.key] :] for w in walks])
        coordinator.commit(new_events, per_unit=10)
    finally:
        coordinator.close()
    _follow(bootstrap, full)
    projection = ApiProjection(bootstrap, tmp_path / "api-views", _CODEC)
    try:
        _caught_up(projection)
        assert projection.runs.all_views() == full.all_views()
        stepped = {f"fold/{e.run_id}" for e in new_events}
        assert seeded & stepped, "some seeded runs had events since"
        still = {k for k, v in projection.store.scan("fold/") if v == SEEDED_FOLD}
        assert still == seeded - stepped, "a restart follows on; it does not seed again"
    finally:
        projection.close()


def _committed_and_folded(bootstrap: str, walks: list[RunWalk]) -> tuple[list[RunWalk], RunViewStore]:
    """The walks' events committed as the coordinator commits them, and their full fold."""
    coordinator = _Coordinator(bootstrap)
    try:
        coordinator.commit(_interleaved([w.events for w in walks]), per_unit=20)
    finally:
        coordinator.close()
    full = RunViewStore(MemoryStore(), _CODEC)
    rebuild(bootstrap, full, seeded=False)
    return walks, full


def test_an_api_instance_whose_seeding_was_cut_short_seeds_again_and_keeps_its_other_keys(
    bootstrap: str, tmp_path: Path
) -> None:
    """A seeding cut short (the API killed mid-way: history written, no folds, no offsets) is
    seeded again at the next start, and only the Run's keys are replaced."""
    walks, full = _committed_and_folded(bootstrap, _walks(20, 15, random.Random(18), "cut"))

    path = tmp_path / "api-views"
    path.mkdir(parents=True)
    store = RocksStore(path)
    cut = RunViewStore(store, _CODEC)
    cut.begin_rebuild()
    half = walks[0].events[: len(walks[0].events) // 2 + 1]
    cut.write_entries(
        [(e.run_id, e.version, _CODEC.outbound(RUNS_EVENTS.name, e.run_id, e).value) for e in half]
    )
    store.write({"test/another-view": b"kept"})
    assert cut.offsets() == {}
    store.close()

    projection = ApiProjection(bootstrap, path, _CODEC)
    try:
        _caught_up(projection)
        assert any(v == SEEDED_FOLD for _, v in projection.store.scan("fold/")), "seeded again"
        assert projection.runs.all_views() == full.all_views()
        assert projection.store.get("test/another-view") == b"kept"
    finally:
        projection.close()


def test_a_seeding_stops_when_asked_and_the_next_one_seeds_again(bootstrap: str) -> None:
    """A seeding whose stop event is set (the API closing mid-way) stops at its next look and
    writes no offsets, so the next start seeds again; it asks the caller's query where the log
    ends rather than opening an admin client of its own."""
    _, full = _committed_and_folded(bootstrap, _walks(15, 12, random.Random(19), "stop"))

    ends, asked = CommittedEnds(bootstrap), []

    def ends_of(topic: str) -> dict[int, int]:
        asked.append(topic)
        return ends.ends(topic)

    stop = threading.Event()
    views = RunViewStore(MemoryStore(), _CODEC)
    with pytest.raises(RebuildStopped):
        # Asked to stop at the first progress report: after the log's first poll.
        seed_run_views(bootstrap, views, _CODEC, lambda seen, total: stop.set(), stop=stop, ends_of=ends_of)
    assert asked == [RUNS_EVENTS.name]
    assert views.offsets() == {}, "a stopped seeding stores no offsets"
    report = seed_run_views(bootstrap, views, _CODEC)
    assert report is not None and report.seeded > 0
    assert views.all_views() == full.all_views()
