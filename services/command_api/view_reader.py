"""The API's reads of the run, trajectory and watchdog views: this instance's own projection.

Each API instance folds the view topics into a store of its own (services/command_api/projection.py,
with the projector's own fold code), so any number of instances serve behind a load balancer and
none reads another process's disk. A read of a view is read-your-writes across instances: it
first waits (bounded by the request's deadline) until this instance has folded each topic up to
where Kafka says it ends now, so a command decided through any instance shows; if that cannot
happen in time the read is a 503 with Retry-After, never a stale view after the client's own write.

The heartbeat path reads the small brief (`brief`, `watchdog_brief`) without that round trip when
the instance's own decision follower has heard nothing newer than the brief it finds: those
answers are fenced by the coordinator, which decides on its own state, not on the view.

`store` is for unit tests: a store the caller folds into itself, read as it is.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import threading
import time
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable

from services.command_api.problems import ApiProblem
from services.command_api.projection import ApiProjection
from services.common.clock import Clock, SystemClock
from services.common.decisions import FollowerHealth
from services.common.messages import MessageCodec
from services.common.store import KeyValueStore
from services.common.topics import RUNS_EVENTS, RUNS_RENEWALS, TRAJECTORIES_EVENTS, WATCHDOG_EVENTS
from services.projections.renewal_store import (
    RenewalHistoryStore,
    leased,
    retained_since,
    view_with_kept_renewals,
)
from services.projections.store import Page, RunViewStore
from services.projections.trajectory_store import TrajectoryViewStore
from services.projections.watchdog_store import WatchdogViewStore

__all__ = ["READ_DEADLINE", "ViewReader"]

# The request's deadline (time.monotonic()), set by the API's routers: a read's wait for the fold
# is bounded by it. asyncio.to_thread copies the context, so the reading thread sees it.
READ_DEADLINE: ContextVar[float | None] = ContextVar("tenure_read_deadline", default=None)
_RETRY_AFTER_S = 1


class ViewReader:
    """Reads this instance's own projection (`projection`), or a store a unit test fills."""

    # A given store (a unit test's, or a RocksDB secondary) is caught up with `refresh`, at
    # most this often, and only when a read may be behind: when a newer version was heard of
    # than the view found, or the last catch-up is _SETTLED_S old (issue 11: catching up on
    # every read was a third of the API's CPU). A waiter without a projection looks this often.
    _REFRESH_EVERY_S = 0.002
    _SETTLED_S = 0.1

    def __init__(
        self,
        path: Path,
        codec: MessageCodec,
        store: KeyValueStore | None = None,
        *,
        heard_run: Callable[[str], int] | None = None,
        heard_trajectory: Callable[[str], int] | None = None,
        heard_watchdog: Callable[[str], int] | None = None,
        projection: ApiProjection | None = None,
        wait_s: float = 10.0,
        clock: Clock | None = None,
    ) -> None:
        self._path = path
        self._clock = clock or SystemClock()
        self._projection = projection
        self._wait_s = wait_s
        self._heard_run = heard_run
        self._heard_trajectory = heard_trajectory
        self._heard_watchdog = heard_watchdog
        self._given = store
        self._lock = threading.Lock()
        self._refreshed_at = 0.0
        self._views: RunViewStore | None = None
        self._trajectories: TrajectoryViewStore | None = None
        self._watchdogs: WatchdogViewStore | None = None
        if store is not None and projection is None:
            self._views = RunViewStore(store, codec)
            self._trajectories = TrajectoryViewStore(store, codec)
            self._watchdogs = WatchdogViewStore(store, codec)
        self._renewals = RenewalHistoryStore(store, codec) if store is not None else None

    # --- the stores and the barrier -----------------------------------------------------------

    def _runs(self) -> RunViewStore:
        if self._views is None and self._projection is not None:
            self._trajectories = self._projection.trajectories
            self._watchdogs = self._projection.watchdogs
            self._views = self._projection.runs
        if self._views is None:
            raise ApiProblem("unavailable", "the run views are not built yet: this API has no projection")
        return self._views

    def _trajectory_store(self) -> TrajectoryViewStore:
        self._runs()
        assert self._trajectories is not None
        return self._trajectories

    def _watchdog_store(self) -> WatchdogViewStore:
        self._runs()
        assert self._watchdogs is not None
        return self._watchdogs

    def _remaining(self) -> float:
        deadline = READ_DEADLINE.get()
        return self._wait_s if deadline is None else max(0.0, deadline - time.monotonic())

    def _barrier(self, topic: str) -> None:
        """Wait until this instance has folded `topic` up to its end as of now, or refuse (503)."""
        views = self._runs()
        if self._projection is None:
            self._refresh(views)
            return
        timeout_s = self._remaining()
        try:
            current = self._projection.barrier(topic, timeout_s)
        except Exception as exc:  # Kafka did not say where the log ends
            raise _unavailable(f"where {topic} ends is not known ({exc})") from exc
        if not current:
            raise _unavailable(f"this API's views did not fold {topic} up to its end within {timeout_s:.2g}s")

    def _refresh(self, views: RunViewStore) -> None:
        """Catch a given store up (a no-op for one written in place)."""
        with self._lock:
            now = time.monotonic()
            if now - self._refreshed_at >= self._REFRESH_EVERY_S:
                views.refresh()
                self._refreshed_at = now

    def health(self) -> FollowerHealth:
        """Ready once this instance's own views have caught up with the logs at start."""
        if self._projection is not None:
            return self._projection.health()
        if self._views is None:
            return FollowerHealth(False, "the run views are not built yet: this API has no projection")
        return FollowerHealth(True, "the views store is open")

    def _current(
        self,
        topic: str,
        read: Callable[[], dict[str, Any] | None],
        heard: Callable[[str], int] | None,
        run_id: str,
    ) -> dict[str, Any] | None:
        """`read()` of a brief: as found, when this instance heard of nothing newer; else fresh."""
        return self._current_many(topic, lambda _: read(), heard, [run_id])[run_id]

    def _current_many(
        self,
        topic: str,
        read: Callable[[str], dict[str, Any] | None],
        heard: Callable[[str], int] | None,
        run_ids: builtins.list[str],
    ) -> dict[str, dict[str, Any] | None]:
        """`_current` of many briefs, with one barrier for all those that need one.

        A batch renewal reads a brief per lease: a barrier each, one after another, cost a query
        of the log's ends per lease (250 of them made a batch's answer wait seconds)."""
        self._runs()
        found: dict[str, dict[str, Any] | None] = {}
        behind = list(dict.fromkeys(run_ids))
        if heard is not None:
            with self._lock:  # a given store: caught up a moment ago (a projection: always)
                settled = time.monotonic() - self._refreshed_at < self._SETTLED_S
            if settled or self._projection is not None:
                unsure = []
                for run_id in behind:
                    view = read(run_id)
                    if view is not None and heard(run_id) <= int(view["version"]):
                        found[run_id] = view
                    else:
                        unsure.append(run_id)
                behind = unsure
        if behind:
            self._barrier(topic)
            for run_id in behind:
                found[run_id] = read(run_id)
        return found

    def _given_current(
        self, topic: str, read: Callable[[], dict[str, Any] | None], run_id: str
    ) -> dict[str, Any] | None:
        """A full read: with a projection, after the barrier; a given store, as `_current`."""
        if self._projection is None and topic == RUNS_EVENTS.name and run_id:
            return self._current(topic, read, self._heard_run, run_id)
        if self._projection is None and topic == TRAJECTORIES_EVENTS.name and run_id:
            return self._current(topic, read, self._heard_trajectory, run_id)
        if self._projection is None and topic == WATCHDOG_EVENTS.name and run_id:
            return self._current(topic, read, self._heard_watchdog, run_id)
        self._barrier(topic)
        return read()

    # --- reads --------------------------------------------------------------------------------

    def get(self, run_id: str) -> dict[str, Any] | None:
        return self._given_current(RUNS_EVENTS.name, lambda: self._runs().get(run_id), run_id)

    def brief(self, run_id: str) -> dict[str, Any] | None:
        return self._current(RUNS_EVENTS.name, lambda: self._runs().brief(run_id), self._heard_run, run_id)

    def briefs(self, run_ids: builtins.list[str]) -> dict[str, dict[str, Any] | None]:
        """`brief` of each run, with at most one wait for the fold (a batch renewal's holder checks)."""
        return self._current_many(RUNS_EVENTS.name, lambda r: self._runs().brief(r), self._heard_run, run_ids)

    def kept_renewals(self, run_id: str) -> dict[int, list[dict[str, Any]]]:
        """The run's renewals on runs.renewals, by epoch (LEASE-2), everything on it as of now folded."""
        history = self._renewal_history()
        return history.of(run_id, self._retained_since()) if history is not None else {}

    def _retained_since(self) -> int:
        return retained_since(self._clock.now_ms())

    def _renewal_history(self) -> RenewalHistoryStore | None:
        """The renewal history, with everything on runs.renewals as of now folded."""
        if self._projection is None:
            self._runs()
            return self._renewals
        self._barrier(RUNS_RENEWALS.name)
        return self._projection.renewals

    def views(self, run_ids: builtins.list[str]) -> dict[str, dict[str, Any] | None]:
        """`get` of each run, with at most one wait for the fold."""
        if self._projection is None:
            return {run_id: self.get(run_id) for run_id in dict.fromkeys(run_ids)}
        if run_ids:
            self._barrier(RUNS_EVENTS.name)
        return {run_id: self._runs().get(run_id) for run_id in dict.fromkeys(run_ids)}

    def fresh_brief(self, run_id: str) -> dict[str, Any] | None:
        """The brief with everything on the log as of now folded (a holder check of a new lease)."""
        self._barrier(RUNS_EVENTS.name)
        return self._runs().brief(run_id)

    def list(self, status: str | None, limit: int, cursor: str | None) -> Page:
        """A page of Run views, each lease with its kept renewals merged in, as GET /runs/{id}
        serves it (issue 16: most renewals are on runs.renewals, not runs.events)."""
        self._barrier(RUNS_EVENTS.name)
        page = self._runs().list(status, limit, cursor)
        if not any(leased(view) for view in page.items):
            return page
        history = self._renewal_history()
        if history is None:
            return page
        since = self._retained_since()
        merged = [
            view_with_kept_renewals(view, history.of(view["runId"], since)) if leased(view) else view
            for view in page.items
        ]
        return dataclasses.replace(page, items=merged)

    def held_by(self, principal: str) -> dict[str, str]:
        """{run id: claiming command id} of the runs whose lease `principal` holds, with everything
        on the log as of now folded (a keyed claim-next repeat: a grant another instance made)."""
        self._barrier(RUNS_EVENTS.name)
        return self._runs().held_by(principal)

    def trajectory(self, run_id: str) -> dict[str, Any] | None:
        return self._given_current(
            TRAJECTORIES_EVENTS.name, lambda: self._trajectory_store().get(run_id), run_id
        )

    def trajectory_folded(self, run_id: str) -> dict[str, Any] | None:
        """The trajectory view as this instance has folded it, without the barrier's query
        (a long-poll's first look); with a given store, as `trajectory`."""
        if self._projection is None:
            return self.trajectory(run_id)
        return self._trajectory_store().get(run_id)

    def step_output(self, run_id: str, step_index: int) -> str | None:
        """The exact output text of a committed step (a saga step's artifact, QUA-2), else None."""
        self._barrier(TRAJECTORIES_EVENTS.name)
        fold = self._trajectory_store().fold(run_id)
        step = fold.state.step(step_index) if fold is not None else None
        return step.output if step is not None and step.status.value == "committed" else None

    def watchdog(self, run_id: str) -> dict[str, Any] | None:
        """The run's watchdog view (WD-5), None while the run has no watchdog."""
        return self._given_current(WATCHDOG_EVENTS.name, lambda: self._watchdog_store().get(run_id), run_id)

    def watchdog_brief(self, run_id: str) -> dict[str, Any] | None:
        """The few watchdog fields a runner's answers carry (one small read per heartbeat)."""
        return self._current(
            WATCHDOG_EVENTS.name, lambda: self._watchdog_store().brief(run_id), self._heard_watchdog, run_id
        )

    def watchdog_briefs(self, run_ids: builtins.list[str]) -> dict[str, dict[str, Any] | None]:
        """`watchdog_brief` of each run, with at most one wait for the fold."""
        return self._current_many(
            WATCHDOG_EVENTS.name, lambda r: self._watchdog_store().brief(r), self._heard_watchdog, run_ids
        )

    def open_incidents(self) -> builtins.list[dict[str, Any]]:
        self._barrier(TRAJECTORIES_EVENTS.name)
        return self._trajectory_store().open_incidents()

    def incident(self, incident_id: str) -> dict[str, Any] | None:
        self._barrier(TRAJECTORIES_EVENTS.name)
        return self._trajectory_store().incident(incident_id)

    # --- waits for a version the caller knows was decided ------------------------------------

    async def wait_for_version(self, run_id: str, version: int, timeout_s: float) -> dict[str, Any] | None:
        """The run's view once this instance has folded `version`, or None on timeout."""
        return await self._wait(lambda r: self._runs().get(r), run_id, version, timeout_s)

    async def wait_for_trajectory_version(
        self, run_id: str, version: int, timeout_s: float
    ) -> dict[str, Any] | None:
        """The run's trajectory view once this instance has folded `version`, or None on timeout."""
        return await self._wait(lambda r: self._trajectory_store().get(r), run_id, version, timeout_s)

    async def wait_for_watchdog_version(
        self, run_id: str, version: int, timeout_s: float
    ) -> dict[str, Any] | None:
        """The run's watchdog view once this instance has folded `version`, or None on timeout."""
        return await self._wait(lambda r: self._watchdog_store().get(r), run_id, version, timeout_s)

    async def _wait(
        self, read: Callable[[str], dict[str, Any] | None], run_id: str, version: int, timeout_s: float
    ) -> dict[str, Any] | None:
        """Read, and read again each time the projection folds more, until `version` shows.

        The version is known decided (its decision was heard), so no barrier is needed: the fold
        wakes the waiter the moment it has written a batch, at no polling cost."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        progress = self._projection.progress if self._projection is not None else None
        while True:
            generation = progress.generation if progress is not None else 0
            try:
                # Each read is bounded too: a store that stops answering must not hold the request.
                view = await asyncio.wait_for(
                    asyncio.to_thread(read, run_id), max(0.0, deadline - loop.time())
                )
            except TimeoutError:
                return None
            if view is not None and int(view["version"]) >= version:
                return view
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            if progress is None:
                await asyncio.sleep(self._REFRESH_EVERY_S)
            elif not await progress.changed_since(generation, remaining):
                return None


def _unavailable(detail: str) -> ApiProblem:
    return ApiProblem(
        "unavailable",
        f"{detail}; a view older than a write it may have made is not served",
        headers={"Retry-After": str(_RETRY_AFTER_S)},
        retryAfterSeconds=_RETRY_AFTER_S,
    )
