"""The projector: follows runs.events, trajectories.events and watchdog.events into their view stores.

Every kind of view lives in one RocksDB (the API follows it as a secondary); each topic is
followed by its own consumer from the offsets stored with its views, run views on the calling
thread and trajectory and watchdog views on threads of their own, so none waits for another's
polls. `rebuild` / `rebuild_trajectories` / `rebuild_watchdogs` refold a topic from offset 0.

`FollowProgress` is what the projector's /readyz reports: each topic folded up to where it
ended when its follower started (the views are current), and no follower failed.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

from services.common.health import Check, ProjectionMetrics
from services.common.kafka import CommandPublisher, InboundRecord, TopicFollower
from services.common.messages import MessageCodec, UndecodableRecord, deadletter_of
from services.common.store import RocksStore
from services.common.topics import DEADLETTER, RUNS_EVENTS, TRAJECTORIES_EVENTS, WATCHDOG_EVENTS
from services.projections.seeded_rebuild import RebuildStopped, rebuild_seeded
from services.projections.store import RunViewStore
from services.projections.trajectory_store import TrajectoryViewStore
from services.projections.watchdog_store import WatchdogViewStore

__all__ = [
    "FollowProgress",
    "RebuildReport",
    "RebuildStopped",
    "follow",
    "rebuild",
    "rebuild_trajectories",
    "rebuild_watchdogs",
    "seed_run_views",
    "views_path",
]

log = logging.getLogger("tenure.projections")

_Apply = Callable[[Iterable[InboundRecord], Callable[[InboundRecord, UndecodableRecord], None]], int]


def views_path(state_dir: Path) -> Path:
    return state_dir / "projections" / "run_views"


class FollowProgress:
    """Per followed topic: how far from the end it was at start-up, and whether it got there.

    Written by the follower threads, read by the health server's thread: each write replaces a
    value in a dict, which a reader sees whole."""

    def __init__(
        self,
        topics: tuple[str, ...] = (RUNS_EVENTS.name, TRAJECTORIES_EVENTS.name, WATCHDOG_EVENTS.name),
    ) -> None:
        self._behind: dict[str, int | None] = dict.fromkeys(topics)
        self._failure: str | None = None
        self._store_open = False

    def store_opened(self) -> None:
        self._store_open = True

    def behind(self, topic: str, records: int) -> None:
        self._behind[topic] = records

    def failed(self, why: str) -> None:
        self._failure = why

    def caught_up(self, topic: str) -> bool:
        return self._behind.get(topic) == 0

    def checks(self) -> list[Check]:
        checks = [
            Check("views-store", self._store_open, "open" if self._store_open else "not open yet"),
        ]
        for topic, behind in self._behind.items():
            if behind is None:
                checks.append(Check(topic, False, "follower not started yet"))
            elif behind:
                checks.append(Check(topic, False, f"catching up: {behind} records behind its end at start"))
            else:
                checks.append(Check(topic, True, "caught up"))
        if self._failure is not None:
            checks.append(Check("followers", False, self._failure))
        return checks


def follow(
    bootstrap_servers: str,
    path: Path,
    stop: threading.Event,
    progress: FollowProgress | None = None,
    metrics: ProjectionMetrics | None = None,
) -> None:
    """Fold new events until `stop` is set, resuming from the offsets stored with the views.

    A failure of any follower (e.g. a version gap) stops them all and is raised here."""
    progress = progress or FollowProgress()
    metrics = metrics or ProjectionMetrics()
    store = RocksStore(path)
    progress.store_opened()
    codec = MessageCodec()
    views = RunViewStore(store, codec)
    trajectories = TrajectoryViewStore(store, codec)
    watchdogs = WatchdogViewStore(store, codec)
    publisher = CommandPublisher(bootstrap_servers, client_id="tenure-projections-deadletter")

    def dead_letter(record: InboundRecord, error: UndecodableRecord) -> None:
        log.error("dead-lettering %s[%d]@%d: %s", record.topic, record.partition, record.offset, error)
        dead = deadletter_of(DEADLETTER.name, record, error.reason_code, str(error))
        publisher.publish(dead).result(30)
        metrics.deadlettered(error.reason_code)

    halt = threading.Event()
    failures: list[BaseException] = []

    def side_loop(topic: str, offsets: dict[int, int], apply: _Apply, client_id: str) -> None:
        try:
            _follow_topic(
                bootstrap_servers,
                topic,
                offsets,
                apply,
                dead_letter,
                client_id,
                lambda: stop.is_set() or halt.is_set(),
                progress,
                metrics,
            )
        except BaseException as exc:
            log.exception("the %s view follower failed", topic)
            failures.append(exc)
            progress.failed(f"the {topic} follower failed: {type(exc).__name__}: {exc}")
            halt.set()

    # (topic, its stored offsets, its store's apply, consumer client id, thread name)
    sides: list[tuple[str, dict[int, int], _Apply, str, str]] = [
        (
            TRAJECTORIES_EVENTS.name,
            trajectories.offsets(),
            trajectories.apply,
            "tenure-projections-trajectories",
            "trajectory-views",
        ),
        (
            WATCHDOG_EVENTS.name,
            watchdogs.offsets(),
            watchdogs.apply,
            "tenure-projections-watchdogs",
            "watchdog-views",
        ),
    ]
    workers = [threading.Thread(target=side_loop, args=side[:4], name=side[4], daemon=True) for side in sides]
    for worker in workers:
        worker.start()
    try:
        _follow_topic(
            bootstrap_servers,
            RUNS_EVENTS.name,
            views.offsets(),
            views.apply,
            dead_letter,
            "tenure-projections",
            lambda: stop.is_set() or halt.is_set(),
            progress,
            metrics,
        )
    except BaseException as exc:
        progress.failed(f"the {RUNS_EVENTS.name} follower failed: {type(exc).__name__}: {exc}")
        raise
    finally:
        halt.set()
        for worker in workers:
            worker.join(10)
        publisher.close()
    if failures:
        raise failures[0]


def _follow_topic(
    bootstrap_servers: str,
    topic: str,
    start_at: dict[int, int],
    apply: _Apply,
    dead_letter: Callable[[InboundRecord, UndecodableRecord], None],
    client_id: str,
    stopped: Callable[[], bool],
    progress: FollowProgress,
    metrics: ProjectionMetrics,
) -> None:
    follower = TopicFollower(bootstrap_servers, [topic], start_at=start_at, client_id=client_id)
    try:
        # Where the topic ends now: once the views have folded up to here they are current.
        targets = {p: end for p, end in follower.end_offsets(topic).items() if end > start_at.get(p, 0)}
        done = {p: start_at.get(p, 0) for p in targets}
        progress.behind(topic, sum(end - done[p] for p, end in targets.items()))
        if progress.caught_up(topic):
            metrics.caught_up(topic)
        while not stopped():
            records = follower.poll(max_records=1000, timeout_s=0.1)
            if records:
                apply(records, dead_letter)
                metrics.folded(topic, len(records))
                for r in records:
                    done[r.partition] = r.offset + 1
            elif not progress.caught_up(topic):
                # Transaction markers occupy offsets but are never delivered: ask where we are.
                _advance_past_markers(follower, topic, targets, done)
            if not progress.caught_up(topic):
                behind = sum(max(end - done.get(p, 0), 0) for p, end in targets.items())
                progress.behind(topic, behind)
                if behind == 0:
                    metrics.caught_up(topic)
                    log.info("the views caught up with %s (its end at start-up)", topic)
    finally:
        follower.close()


# A rebuild reads this many records per poll and folds up to _REBUILD_CHUNK of them at once.
_REBUILD_POLL = 10_000
_REBUILD_CHUNK = 50_000


@dataclass(frozen=True)
class RebuildReport:
    events: int
    runs: int
    seconds: float
    seeded: int = 0  # runs whose fold is left to be folded from their history when needed
    changelog_records: int = 0  # records of the state changelog read (a seeded rebuild)


def rebuild(
    bootstrap_servers: str,
    views: RunViewStore,
    progress: Callable[[int, int], None] | None = None,
    *,
    seeded: bool = True,
) -> RebuildReport:
    """Clear `views` and rebuild them from runs.events, from offset 0 up to its end as of the call.

    `seeded` (the default) takes each run's state from the state changelog and decodes few
    events (seeded_rebuild.py); False decodes and folds every event, as the follower does.
    Clearing empties the whole store, trajectory views included: their offsets go with them, so
    the next `follow` refolds trajectories.events from the start (or call rebuild_trajectories)."""
    started = time.monotonic()
    views.clear()
    if seeded:
        return _seeded(bootstrap_servers, views, MessageCodec(), progress, started)
    seen = _refold(bootstrap_servers, RUNS_EVENTS.name, views.apply, progress, started)
    return RebuildReport(events=seen, runs=views.count(), seconds=time.monotonic() - started)


def seed_run_views(
    bootstrap_servers: str,
    views: RunViewStore,
    codec: MessageCodec,
    progress: Callable[[int, int], None] | None = None,
    *,
    stop: threading.Event | None = None,
    ends_of: Callable[[str], Mapping[int, int]] | None = None,
) -> RebuildReport | None:
    """Before a store follows runs.events: if it has folded none of it (a new API instance, or a
    start-up seeding cut short), build its Run views seeded from the state changelog, about five
    times faster than folding every event (docs/architecture.md, "A rebuild seeded from the state
    changelog"). Only the Run views are replaced: the store's other views stay. None: the store
    has offsets, and its follower continues from them. `stop` and `ends_of`: as
    `rebuild_seeded` takes them (RebuildStopped once `stop` is set)."""
    if views.offsets():
        return None
    started = time.monotonic()
    views.clear_runs()
    return _seeded(bootstrap_servers, views, codec, progress, started, stop=stop, ends_of=ends_of)


def _seeded(
    bootstrap_servers: str,
    views: RunViewStore,
    codec: MessageCodec,
    progress: Callable[[int, int], None] | None,
    started: float,
    *,
    stop: threading.Event | None = None,
    ends_of: Callable[[str], Mapping[int, int]] | None = None,
) -> RebuildReport:
    report = rebuild_seeded(bootstrap_servers, views, codec, progress, stop=stop, ends_of=ends_of)
    seconds = time.monotonic() - started
    return RebuildReport(report.events, report.runs, seconds, report.seeded, report.changelog_records)


def rebuild_trajectories(
    bootstrap_servers: str,
    views: TrajectoryViewStore,
    progress: Callable[[int, int], None] | None = None,
) -> RebuildReport:
    """Clear the trajectory views and incidents and fold trajectories.events from offset 0.

    `runs` in the report counts trajectories (one per run that has one)."""
    started = time.monotonic()
    views.clear()
    seen = _refold(bootstrap_servers, TRAJECTORIES_EVENTS.name, views.apply, progress, started)
    return RebuildReport(events=seen, runs=len(views.all_views()), seconds=time.monotonic() - started)


def rebuild_watchdogs(
    bootstrap_servers: str,
    views: WatchdogViewStore,
    progress: Callable[[int, int], None] | None = None,
) -> RebuildReport:
    """Clear the watchdog views and fold watchdog.events from offset 0 (`runs`: watchdogs)."""
    started = time.monotonic()
    views.clear()
    seen = _refold(bootstrap_servers, WATCHDOG_EVENTS.name, views.apply, progress, started)
    return RebuildReport(events=seen, runs=len(views.all_views()), seconds=time.monotonic() - started)


def _refold(
    bootstrap_servers: str,
    topic: str,
    apply: Callable[[Iterable[InboundRecord]], int],
    progress: Callable[[int, int], None] | None,
    started: float,
) -> int:
    follower = TopicFollower(bootstrap_servers, [topic], "beginning", "tenure-rebuild")
    try:
        targets = {p: end for p, end in follower.end_offsets(topic).items() if end > 0}
        total = sum(targets.values())
        seen = 0
        done: dict[int, int] = {}
        progressed_at = time.monotonic()
        while any(done.get(p, 0) < end for p, end in targets.items()):
            records = follower.poll(max_records=_REBUILD_POLL, timeout_s=0.2)
            # What is already fetched joins one fold, up to a large chunk: each run's view is
            # then rendered and written once per chunk rather than once per poll (issue 16).
            while records and len(records) < _REBUILD_CHUNK:
                more = follower.poll(max_records=_REBUILD_POLL, timeout_s=0.0)
                if not more:
                    break
                records.extend(more)
            if records:
                apply(records)
                for r in records:
                    done[r.partition] = r.offset + 1
                seen += len(records)
                progressed_at = time.monotonic()
                if progress is not None:
                    progress(seen, total)
            elif time.monotonic() - progressed_at > 600:
                raise TimeoutError("the rebuild read nothing for 600s")
            else:
                # Transaction markers occupy offsets but are never delivered: ask where we are.
                _advance_past_markers(follower, topic, targets, done)
    finally:
        follower.close()
    return seen


def _advance_past_markers(
    follower: TopicFollower, topic: str, targets: dict[int, int], done: dict[int, int]
) -> None:
    for partition, position in follower.positions(topic).items():
        if position >= 0 and partition in targets:
            done[partition] = max(done.get(partition, 0), position)
