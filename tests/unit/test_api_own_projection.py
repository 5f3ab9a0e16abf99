"""The wait-for-version logic of an API instance's own projection (issue 16, read-your-writes).

A read waits until this instance has folded each partition up to where the log ended when the
read began (`LogEnds` + `FoldProgress`), so a write made through any instance shows; when the
fold cannot get there within the bound the read is a 503 with Retry-After, never stale. A wait
for a version the instance heard decided is woken by the fold itself.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.command_api.problems import ApiProblem
from services.command_api.projection import ApiProjection, FoldProgress, LogEnds, folded_past
from services.command_api.view_reader import READ_DEADLINE, ViewReader
from services.common.decisions import FollowerHealth
from services.common.messages import MessageCodec
from services.common.store import MemoryStore
from services.common.topics import RUNS_EVENTS, WATCHDOG_EVENTS
from services.projections.fold_codec import encode_view
from services.projections.store import RunViewStore
from services.projections.trajectory_store import TrajectoryViewStore
from services.projections.watchdog_store import WatchdogViewStore
from tests.support.stored_views import run_id_of, run_view_keys

pytestmark = pytest.mark.timeout(120)

TOPIC = RUNS_EVENTS.name


class FakeProjection:
    """ApiProjection's read side over a MemoryStore: its real barrier, progress and LogEnds; the
    "log" is a list of (partition, run id, version) and a thread folds it at its own pace."""

    def __init__(self, partitions: int = 3, fold_delay_s: float = 0.0) -> None:
        self.store = MemoryStore()
        codec = MessageCodec()
        self.runs = RunViewStore(self.store, codec)
        self.trajectories = TrajectoryViewStore(self.store, codec)
        self.watchdogs = WatchdogViewStore(self.store, codec)
        self.progress = FoldProgress()
        self.log: dict[int, list[tuple[str, int]]] = {p: [] for p in range(partitions)}
        self.lock = threading.Lock()
        self.ends = LogEnds(self._ends)
        self.fold_delay_s = fold_delay_s
        self.stop = threading.Event()
        self.folder = threading.Thread(target=self._fold, daemon=True)

    barrier = ApiProjection.barrier

    def health(self) -> FollowerHealth:
        return FollowerHealth(True, "fake")

    def _ends(self, topic: str) -> dict[int, int]:
        with self.lock:
            return {p: len(records) for p, records in self.log.items()}

    def append(self, partition: int, run_id: str, version: int) -> None:
        """A committed write of the run stored_views.py keys by `run_id`: on the log, not yet
        folded."""
        with self.lock:
            self.log[partition].append((run_id, version))

    def _fold(self) -> None:
        done = dict.fromkeys(self.log, 0)
        while not self.stop.is_set():
            with self.lock:
                pending = [(p, n, self.log[p][n]) for p, n in done.items() if n < len(self.log[p])]
            if not pending:
                time.sleep(0.0005)
                continue
            p, n, (run_id, version) = random.choice(pending)
            time.sleep(self.fold_delay_s)
            self.store.write(run_view_keys(run_id, version)[1])
            done[p] = n + 1
            self.progress.advance(TOPIC, {p: n + 1})


def _reader(projection: FakeProjection, wait_s: float = 5.0) -> ViewReader:
    return ViewReader(
        Path("unused"),
        MessageCodec(),
        heard_run=lambda run_id: 0,
        projection=projection,  # type: ignore[arg-type]
        wait_s=wait_s,
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    writes=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=25),
    delay_ms=st.sampled_from([0.0, 0.2, 1.0]),
)
def test_a_read_after_a_write_never_sees_a_view_older_than_that_write(
    writes: list[tuple[int, int]], delay_ms: float
) -> None:
    """Whatever the fold's pace, each read sees at least the version written before it began."""
    projection = FakeProjection(fold_delay_s=delay_ms / 1000)
    projection.folder.start()
    reader = _reader(projection)
    versions: dict[str, int] = {}
    try:
        for partition, run in writes:
            run_id = f"run-{partition}-{run}"  # a run's events all go to one partition
            versions[run_id] = versions.get(run_id, 0) + 1
            projection.append(partition, run_id, versions[run_id])
            view = reader.get(run_id_of(run_id))
            assert view is not None and view["version"] == versions[run_id]
    finally:
        projection.stop.set()


def test_a_read_the_fold_cannot_catch_up_with_in_time_is_a_503_with_retry_after() -> None:
    projection = FakeProjection()  # its folder never starts: the write stays unfolded
    projection.append(0, "run-x", 1)
    reader = _reader(projection, wait_s=0.2)
    began = time.monotonic()
    with pytest.raises(ApiProblem) as refused:
        reader.get(run_id_of("run-x"))
    assert time.monotonic() - began < 2.0
    assert refused.value.slug == "unavailable" and refused.value.headers["Retry-After"] == "1"
    # The request's own deadline bounds the wait when it is set (the routers set it).
    token = READ_DEADLINE.set(time.monotonic() + 0.05)
    try:
        began = time.monotonic()
        with pytest.raises(ApiProblem):
            reader.get(run_id_of("run-x"))
        assert time.monotonic() - began < 1.0
    finally:
        READ_DEADLINE.reset(token)


def test_each_reader_gets_ends_from_a_query_sent_after_it_arrived() -> None:
    """A reader arriving while a query is in flight must not take that query's (older) answer."""
    sent = 0
    release = threading.Event()
    first_in_flight = threading.Event()

    def query(topic: str) -> dict[int, int]:
        nonlocal sent
        sent += 1
        number = sent
        if number == 1:
            first_in_flight.set()
            release.wait(5)
        return {0: number}

    ends = LogEnds(query)
    answers: dict[str, dict[int, int] | None] = {}
    early = threading.Thread(target=lambda: answers.__setitem__("early", ends.ends(TOPIC, 5)))
    early.start()
    assert first_in_flight.wait(5)
    late = [
        threading.Thread(target=lambda i=i: answers.__setitem__(f"late{i}", ends.ends(TOPIC, 5)))
        for i in range(5)
    ]
    for thread in late:
        thread.start()
    time.sleep(0.05)
    release.set()
    for thread in (early, *late):
        thread.join(5)
    assert answers["early"] == {0: 1}
    # All five arrived during query 1: they share one later query, not one each.
    assert {tuple(v.items()) for k, v in answers.items() if k != "early" and v} == {((0, 2),)}
    assert sent == 2


def test_a_failing_query_is_raised_to_the_readers_of_its_round() -> None:
    def query(topic: str) -> dict[int, int]:
        raise RuntimeError("no broker")

    with pytest.raises(RuntimeError, match="no broker"):
        LogEnds(query).ends(TOPIC, 1.0)


@given(
    advances=st.lists(
        st.dictionaries(st.integers(0, 3), st.integers(0, 50), max_size=4), min_size=1, max_size=20
    ),
    ends=st.dictionaries(st.integers(0, 3), st.integers(0, 50), max_size=4),
)
def test_fold_progress_only_grows_and_is_past_ends_exactly_when_every_partition_is(
    advances: list[dict[int, int]], ends: dict[int, int]
) -> None:
    progress = FoldProgress([TOPIC])
    expected: dict[int, int] = {}
    for positions in advances:
        progress.advance(TOPIC, positions)
        for p, o in positions.items():
            expected[p] = max(expected.get(p, 0), o)
        assert progress.folded(TOPIC) == {p: o for p, o in expected.items() if o > 0}
    past = all(expected.get(p, 0) >= end for p, end in ends.items())
    assert folded_past(progress.folded(TOPIC), ends) is past
    assert progress.wait_past(TOPIC, ends, 0.0) is past


def test_a_wait_for_a_heard_version_is_woken_by_the_fold_not_by_polling() -> None:
    projection = FakeProjection()
    reader = _reader(projection)
    run_w = run_id_of("run-w")
    projection.store.write(run_view_keys("run-w", 1)[1])

    async def scenario() -> tuple[dict[str, Any] | None, float, dict[str, Any] | None]:
        def later() -> None:
            time.sleep(0.1)
            projection.store.write(run_view_keys("run-w", 2)[1])
            projection.progress.advance(TOPIC, {0: 1})

        threading.Thread(target=later, daemon=True).start()
        began = time.monotonic()
        shown = await reader.wait_for_version(run_w, 2, 5.0)
        took = time.monotonic() - began
        never = await reader.wait_for_version(run_w, 3, 0.1)  # never folded: the timeout
        return shown, took, never

    shown, took, never = asyncio.run(scenario())
    assert shown is not None and (shown["runId"], shown["version"]) == (run_w, 2) and took < 2.0
    assert never is None


def test_a_long_polls_first_look_reads_the_fold_without_asking_where_the_log_ends() -> None:
    """A trajectory long-poll's first look (`trajectory_folded`) costs no broker query: a view
    past the caller's version is news whatever the log holds. A full read still asks (the barrier)."""
    projection = FakeProjection()
    queries: list[str] = []
    counted = projection.ends._query
    projection.ends._query = lambda topic: (queries.append(topic), counted(topic))[1]  # type: ignore[method-assign]
    reader = _reader(projection)
    projection.store.write({"tview/run-t": encode_view({"runId": "run-t", "version": 4})})

    assert reader.trajectory_folded("run-t") == {"runId": "run-t", "version": 4}
    assert reader.trajectory_folded("run-none") is None
    assert queries == []
    assert reader.trajectory("run-t") == {"runId": "run-t", "version": 4}
    assert len(queries) == 1


def test_a_batch_of_briefs_waits_for_the_fold_once_not_once_per_run() -> None:
    """A batch renewal's holder checks and watchdog briefs (issue 16): every brief that may be
    behind (a newer version heard, or none found) is read after ONE query of the log's ends, and
    a brief already as new as anything heard costs no query at all."""
    projection = FakeProjection()
    queries: list[str] = []
    counted = projection.ends._query
    projection.ends._query = lambda topic: (queries.append(topic), counted(topic))[1]  # type: ignore[method-assign]
    heard = {f"run-{n}": (3 if n % 2 else 1) for n in range(250)}  # the odd ones: news not folded yet
    reader = ViewReader(
        Path("unused"),
        MessageCodec(),
        heard_run=lambda run_id: heard.get(run_id, 0),
        heard_watchdog=lambda run_id: 0,
        projection=projection,  # type: ignore[arg-type]
        wait_s=5.0,
    )
    briefs_stored = {f"brief/{r}": encode_view({"runId": r, "version": 1}) for r in heard}
    projection.store.write(briefs_stored)

    fresh = reader.briefs([r for r in heard if heard[r] == 1])
    assert queries == [] and all(b is not None and b["version"] == 1 for b in fresh.values())

    briefs = reader.briefs([*heard, "run-unknown"])
    assert queries == [TOPIC]
    assert set(briefs) == {*heard, "run-unknown"} and briefs["run-unknown"] is None
    assert all(briefs[r] == {"runId": r, "version": 1} for r in heard)

    # No watchdog view for any of them: one query for the lot, as one heartbeat alone would ask.
    watchdog = reader.watchdog_briefs(list(heard))
    assert queries == [TOPIC, WATCHDOG_EVENTS.name] and set(watchdog.values()) == {None}
