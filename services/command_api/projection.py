"""The API instance's own projection of runs, trajectories and watchdogs, and its read barrier.

Each API instance folds runs.events, trajectories.events and watchdog.events into a RocksDB of
its own (`<state_dir>/api-<instance_id>/views`) with the projector's own stores
(services/projections: `RunViewStore.apply` and friends, which fold with each aggregate's view
`apply`), so no instance reads another process's disk and any number of them can serve behind a
load balancer. The offsets are written with the views in one atomic write, so a restart resumes
from its own checkpoint and folds only the tail of each log. A new instance (no runs.events
offsets) first builds its Run views seeded from the state changelog, as `tenure rebuild` does
(`_seed_runs`; docs/architecture.md, "A rebuild seeded from the state changelog").

Read-your-writes across instances is the `barrier`: a read first asks Kafka where the topic ends
now (`LogEnds`: one ListOffsets request for the committed ends, shared by every read that arrived
before it was sent) and waits until this instance has folded every partition up to there
(`FoldProgress`). A command the client saw decided, on whichever instance, is committed below
those ends, so the view then shows it. If the fold cannot get there within the bound the read is
refused (503), never answered stale.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from services.common.backoff import Backoff
from services.common.decisions import FollowerHealth
from services.common.kafka import CommittedEnds, InboundRecord, TopicFollower
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.store import RocksStore
from services.common.topics import (
    RUNS_EVENTS,
    RUNS_RENEWALS,
    RUNS_STATES,
    TRAJECTORIES_EVENTS,
    WATCHDOG_EVENTS,
)
from services.projections.renewal_store import RenewalHistoryStore
from services.projections.service import seed_run_views
from services.projections.store import RunViewStore
from services.projections.trajectory_store import TrajectoryViewStore
from services.projections.watchdog_store import WatchdogViewStore

__all__ = ["VIEW_TOPICS", "ApiProjection", "FoldProgress", "LogEnds", "api_views_path", "folded_past"]

log = logging.getLogger("tenure.api.projection")

# runs.renewals: LEASE-2's renewals kept off runs.events (services/projections/renewal_store.py).
VIEW_TOPICS = (RUNS_EVENTS.name, TRAJECTORIES_EVENTS.name, WATCHDOG_EVENTS.name, RUNS_RENEWALS.name)

_Apply = Callable[[Iterable[InboundRecord], Callable[[InboundRecord, UndecodableRecord], None]], int]


def api_views_path(state_dir: Path, instance_id: str) -> Path:
    """This API instance's own views store: never another process's."""
    return state_dir / f"api-{instance_id}" / "views"


def folded_past(folded: Mapping[int, int], ends: Mapping[int, int]) -> bool:
    """Whether every partition is folded up to its end (an empty partition's end is 0)."""
    return all(folded.get(partition, 0) >= end for partition, end in ends.items())


class FoldProgress:
    """How far each topic is folded (next offset per partition), and waits for it to get further.

    Written by the follower threads, waited on by request threads (`wait_past`) and by the event
    loop (`changed_since`); a position only ever grows."""

    def __init__(self, topics: Iterable[str] = VIEW_TOPICS) -> None:
        self._cond = threading.Condition()
        self._folded: dict[str, dict[int, int]] = {topic: {} for topic in topics}
        self._generation = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def advance(self, topic: str, positions: Mapping[int, int]) -> None:
        with self._cond:
            folded = self._folded.setdefault(topic, {})
            moved = False
            for partition, position in positions.items():
                if position > folded.get(partition, 0):
                    folded[partition] = position
                    moved = True
            if not moved:
                return
            self._generation += 1
            self._cond.notify_all()
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future)

    def folded(self, topic: str) -> dict[int, int]:
        with self._cond:
            return dict(self._folded.get(topic, {}))

    @property
    def generation(self) -> int:
        with self._cond:
            return self._generation

    def wait_past(self, topic: str, ends: Mapping[int, int], timeout_s: float) -> bool:
        """Block until `topic` is folded up to `ends`; False if `timeout_s` passes first."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not folded_past(self._folded.get(topic, {}), ends):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    async def changed_since(self, generation: int, timeout_s: float) -> bool:
        """Wait until something is folded after `generation` was read; False on timeout."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._cond:
            if self._generation != generation:
                return True
            self._waiters.append((loop, future))
        try:
            await asyncio.wait_for(future, max(0.0, timeout_s))
            return True
        except TimeoutError:
            return False
        finally:
            with self._cond:
                self._waiters = [w for w in self._waiters if w[1] is not future]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class LogEnds:
    """Where a topic ends now, asked of Kafka once for many readers.

    A reader needs ends asked for *after* it arrived (what was decided before its read began is
    below them), so each call joins the next query not yet sent; while one is in flight, the
    readers that arrive meanwhile share the one after it. One query at a time, whatever the load."""

    def __init__(self, query: Callable[[str], dict[int, int]]) -> None:
        self._query = query
        self._cond = threading.Condition()
        self._started: dict[str, int] = {}
        self._done: dict[str, int] = {}
        self._result: dict[str, dict[int, int] | BaseException] = {}
        self._busy = False

    def ends(self, topic: str, timeout_s: float) -> dict[int, int] | None:
        """{partition: end} from a query sent after this call; None if none answered in time.

        Raises what the query raised (Kafka unreachable)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            needed = self._started.get(topic, 0) + 1
            while self._done.get(topic, 0) < needed:
                if not self._busy:
                    self._run_round(topic)
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            result = self._result[topic]
        if isinstance(result, BaseException):
            raise result
        return result

    def _run_round(self, topic: str) -> None:
        """Send one query with the lock released; called holding it, returns holding it."""
        self._busy = True
        number = self._started[topic] = self._started.get(topic, 0) + 1
        result: dict[int, int] | BaseException
        self._cond.release()
        try:
            result = self._query(topic)
        except Exception as exc:  # handed to every reader of this round
            result = exc
        finally:
            self._cond.acquire()
        self._busy = False
        self._result[topic] = result
        self._done[topic] = number
        self._cond.notify_all()


class ApiProjection:
    """Follows the view topics into this instance's own store, one thread per topic."""

    _POLL_S = 0.05

    def __init__(
        self,
        bootstrap_servers: str,
        path: Path,
        codec: MessageCodec,
        client_id: str = "tenure-api-views",
        *,
        seed_runs: bool = True,
        on_kept: Callable[[list[tuple[str, dict[str, Any]]]], None] | None = None,
        cached_briefs: int = 0,
    ) -> None:
        """`seed_runs`: an empty store's Run views are seeded from the state changelog before
        they follow runs.events (`_seed_runs`); False folds every event (bench/api_catch_up.py
        compares the two). `on_kept`: each batch of runs.renewals records, decoded, once this
        store holds them (the API's DecisionListener.deliver_kept answers their commands).
        `cached_briefs`: Run briefs kept decoded in memory (services/projections/brief_cache.py)."""
        path.mkdir(parents=True, exist_ok=True)
        self._seed_runs_first = seed_runs
        self._bootstrap = bootstrap_servers
        self._client_id = client_id
        try:
            self.store = RocksStore(path)
        except Exception as exc:  # most often: another API instance has this folder open
            raise RuntimeError(
                f"the API's own views store {path} cannot be opened ({exc}); two API instances on "
                "one state dir need distinct TENURE_INSTANCE_IDs"
            ) from exc
        self._codec = codec
        # This instance alone writes its store, so it may keep the briefs it wrote (issue 16).
        self.runs = RunViewStore(self.store, codec, cached_briefs=cached_briefs)
        self.trajectories = TrajectoryViewStore(self.store, codec)
        self.watchdogs = WatchdogViewStore(self.store, codec)
        self.renewals = RenewalHistoryStore(self.store, codec)
        if self.renewals.discard_legacy_layout():  # before the offsets are read: the topic again
            log.info("the API's renewal history moved to time buckets: reading runs.renewals again")
        self.progress = FoldProgress()
        self._sides: dict[str, tuple[Callable[[], dict[int, int]], _Apply]] = {
            RUNS_EVENTS.name: (self.runs.offsets, self.runs.apply),
            TRAJECTORIES_EVENTS.name: (self.trajectories.offsets, self.trajectories.apply),
            WATCHDOG_EVENTS.name: (self.watchdogs.offsets, self.watchdogs.apply),
            RUNS_RENEWALS.name: (
                self.renewals.offsets,
                lambda records, undecodable: self.renewals.apply(records, undecodable, on_kept),
            ),
        }
        self._targets: dict[str, dict[int, int] | None] = dict.fromkeys(VIEW_TOPICS)
        self._failures: dict[str, str | None] = dict.fromkeys(VIEW_TOPICS)
        self._caught_up_s: dict[str, float] = {}
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._seeding: tuple[int, int] | None = None  # (read, of) while the Run views are seeded
        # Opened on first use: opening the API must not wait for a broker.
        self._ends_query: CommittedEnds | None = None
        self._ends_lock = threading.Lock()
        self.ends = LogEnds(self._query_ends)
        self._threads = [
            threading.Thread(target=self._follow, args=(topic,), name=f"api-views-{topic}", daemon=True)
            for topic in VIEW_TOPICS
        ]
        for thread in self._threads:
            thread.start()

    # --- reads' barrier ---------------------------------------------------------------------

    def _query_ends(self, topic: str) -> dict[int, int]:
        with self._ends_lock:  # one admin client, one query at a time
            if self._ends_query is None:
                self._ends_query = CommittedEnds(self._bootstrap)
            query = self._ends_query  # close() may drop it while this query runs
        return query.ends(topic)

    def barrier(self, topic: str, timeout_s: float) -> bool:
        """Wait until this instance has folded `topic` up to where it ends now; False: not in time."""
        started = time.monotonic()
        ends = self.ends.ends(topic, timeout_s)
        if ends is None:
            return False
        return self.progress.wait_past(topic, ends, max(0.0, timeout_s - (time.monotonic() - started)))

    # --- following --------------------------------------------------------------------------

    def _follow(self, topic: str) -> None:
        backoff = Backoff(base_s=0.1, cap_s=5.0)
        while not self._stop.is_set():
            try:
                self._follow_once(topic, backoff)
            except Exception as exc:  # a broker outage or a bad event: resume from the store
                if self._stop.is_set():
                    return
                log.warning("following %s into the API's views failed (%s); resuming", topic, exc)
                self._failures[topic] = f"{type(exc).__name__}: {exc}"
                self._stop.wait(backoff.next_delay())

    def _follow_once(self, topic: str, backoff: Backoff) -> None:
        offsets, apply = self._sides[topic]
        if topic == RUNS_EVENTS.name and self._seed_runs_first:
            self._seed_runs()
        start_at = offsets()
        self.progress.advance(topic, start_at)
        follower = TopicFollower(self._bootstrap, [topic], start_at=start_at, client_id=self._client_id)
        try:
            if self._targets[topic] is None:  # where the log ended when this instance started
                self._targets[topic] = follower.end_offsets(topic)
            while not self._stop.is_set():
                records = follower.poll(max_records=2000, timeout_s=self._POLL_S)
                if records:
                    apply(records, self._undecodable)
                # After the fold is written: the positions, past transaction markers too.
                positions = {p: o for p, o in follower.positions(topic).items() if o >= 0}
                for record in records:
                    positions[record.partition] = max(positions.get(record.partition, 0), record.offset + 1)
                self.progress.advance(topic, positions)
                if self._failures[topic] is not None:
                    log.info("following %s into the API's views again", topic)
                    self._failures[topic] = None
                    backoff.reset()
                self._note_caught_up(topic)
        finally:
            follower.close()

    def _seed_runs(self) -> None:
        """A new instance (no runs.events offsets) builds its Run views seeded from the state
        changelog before it follows, instead of folding every event (issue 16); a restart with
        offsets continues from them. A seeding cut short (a crash, close) stored no offsets, so
        the next start seeds again: close stops it (RebuildStopped, which `_follow` ends on)."""
        last_said = [time.monotonic()]

        def progress(seen: int, total: int) -> None:
            self._seeding = (seen, total)
            if time.monotonic() - last_said[0] >= 5.0:
                last_said[0] = time.monotonic()
                log.info("seeding the API's Run views: %d of %d runs.events records read", seen, total)

        self._seeding = (0, 0)
        try:
            report = seed_run_views(
                self._bootstrap, self.runs, self._codec, progress, stop=self._stop, ends_of=self._query_ends
            )
        finally:
            self._seeding = None
        if report is not None:
            log.info(
                "seeded the API's Run views in %.2fs: %d runs from %d events, %d seeded from %s",
                report.seconds,
                report.runs,
                report.events,
                report.seeded,
                RUNS_STATES.name,
            )

    def _undecodable(self, record: InboundRecord, error: UndecodableRecord) -> None:
        # The projector dead-letters it; each API instance only reads past it.
        log.error("skipping undecodable %s[%d]@%d: %s", record.topic, record.partition, record.offset, error)

    def _note_caught_up(self, topic: str) -> None:
        targets = self._targets[topic]
        if topic in self._caught_up_s or targets is None:
            return
        if folded_past(self.progress.folded(topic), targets):
            self._caught_up_s[topic] = time.monotonic() - self._started
            log.info("the API's views caught up with %s in %.2fs", topic, self._caught_up_s[topic])

    # --- health -----------------------------------------------------------------------------

    def caught_up_seconds(self) -> float | None:
        """How long start-up catch-up took (all three topics), None while catching up."""
        if len(self._caught_up_s) < len(VIEW_TOPICS):
            return None
        return max(self._caught_up_s.values())

    def health(self) -> FollowerHealth:
        """Ready once every topic is folded up to where it ended at start, while none fails."""
        failing = [f"{t}: {why}" for t, why in self._failures.items() if why is not None]
        if failing:
            return FollowerHealth(False, "following fails: " + "; ".join(failing))
        dead = [t.name for t in self._threads if not t.is_alive()]
        if dead and not self._stop.is_set():
            return FollowerHealth(False, f"follower threads stopped: {', '.join(dead)}")
        if (seeding := self._seeding) is not None:
            return FollowerHealth(
                False,
                f"the API's own views: seeding {RUNS_EVENTS.name} from {RUNS_STATES.name}, "
                f"{seeding[0]} of {seeding[1]} records read",
            )
        behind: dict[str, int] = {}
        for topic in VIEW_TOPICS:
            targets = self._targets[topic]
            if targets is None:
                return FollowerHealth(False, f"the API's own views: {topic} not followed yet")
            folded = self.progress.folded(topic)
            behind[topic] = sum(max(0, end - folded.get(p, 0)) for p, end in targets.items())
        lag = sum(behind.values())
        if topic_behind := {t: n for t, n in behind.items() if t not in self._caught_up_s and n}:
            detail = ", ".join(f"{t} {n} records" for t, n in topic_behind.items())
            return FollowerHealth(False, f"the API's own views are catching up: {detail} behind", lag)
        took = self.caught_up_seconds()
        return FollowerHealth(
            True, f"the API's own views are current (caught up in {took or 0.0:.2f}s at start)", lag
        )

    def describe(self) -> dict[str, Any]:
        return {topic: self.progress.folded(topic) for topic in VIEW_TOPICS}

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)
        with self._ends_lock:  # an admin client holds no group or offsets: dropping it is enough
            self._ends_query = None
        self.store.close()
