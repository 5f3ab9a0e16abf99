"""The API's reads of the projector's views: run, trajectory and watchdog views, caught up lazily.

The projector owns the store; the API opens it as a read-only RocksDB secondary and catches up
with the primary only when a read may be behind (see `ViewReader._current`).
"""

from __future__ import annotations

import asyncio
import builtins
import threading
import time
from pathlib import Path
from typing import Any, Callable

from services.command_api.problems import ApiProblem
from services.common.decisions import FollowerHealth
from services.common.messages import MessageCodec
from services.common.store import KeyValueStore, RocksStore
from services.projections.store import RunViewStore
from services.projections.trajectory_store import TrajectoryViewStore
from services.projections.watchdog_store import WatchdogViewStore

__all__ = ["ViewReader"]


class ViewReader:
    """Opens the projector's RocksDB as a read-only secondary, once it exists.

    Run, trajectory and watchdog views share that store, so one catch-up serves all. `store` is
    for tests: a store the caller already has open instead of the projector's at `path`."""

    # Catching up with the primary costs a few file reads; many waiting requests share one.
    _REFRESH_EVERY_S = 0.002
    # A read of one aggregate's view catches up only when the API has heard of a version newer
    # than the view it finds (the decision followers hear every event), or when the last catch-up
    # is this old: that covers what happened before the followers started. Catching up on every
    # read was a third of the API's CPU under load.
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
    ) -> None:
        self._path = path
        self._codec = codec
        self._given = store
        self._views: RunViewStore | None = None
        self._trajectories: TrajectoryViewStore | None = None
        self._watchdogs: WatchdogViewStore | None = None
        self._lock = threading.Lock()
        self._refreshed_at = 0.0
        self._heard_run = heard_run
        self._heard_trajectory = heard_trajectory
        self._heard_watchdog = heard_watchdog

    def _store(self) -> RunViewStore:
        if self._views is None:
            if self._given is None and not (self._path / "CURRENT").exists():
                raise ApiProblem("unavailable", "the run views are not built yet; is projections running?")
            store = self._given if self._given is not None else RocksStore(self._path, secondary=True)
            self._trajectories = TrajectoryViewStore(store, self._codec)
            self._watchdogs = WatchdogViewStore(store, self._codec)
            self._views = RunViewStore(store, self._codec)
        return self._views

    def health(self) -> FollowerHealth:
        """Ready when the store is open and catches up with the projector."""
        try:
            self._fresh_store()
        except ApiProblem as exc:
            return FollowerHealth(False, exc.detail)
        except Exception as exc:  # a store that cannot be opened or refreshed is not ready
            return FollowerHealth(False, f"the views store cannot be read: {exc}")
        return FollowerHealth(True, "the views store is open")

    def _fresh_store(self) -> RunViewStore:
        store = self._store()
        with self._lock:
            now = time.monotonic()
            if now - self._refreshed_at >= self._REFRESH_EVERY_S:
                store.refresh()
                self._refreshed_at = now
        return store

    def _current(
        self, read: Callable[[], dict[str, Any] | None], heard: Callable[[str], int] | None, run_id: str
    ) -> dict[str, Any] | None:
        """`read()` of one aggregate's view, caught up first only if it may be behind."""
        self._store()
        if heard is not None:
            with self._lock:
                settled = time.monotonic() - self._refreshed_at < self._SETTLED_S
            if settled:
                view = read()
                if heard(run_id) <= (int(view["version"]) if view is not None else 0):
                    return view
        self._fresh_store()
        return read()

    def get(self, run_id: str) -> dict[str, Any] | None:
        return self._current(lambda: self._store().get(run_id), self._heard_run, run_id)

    def brief(self, run_id: str) -> dict[str, Any] | None:
        return self._current(lambda: self._store().brief(run_id), self._heard_run, run_id)

    def list(self, status: str | None, limit: int, cursor: str | None) -> Any:
        return self._fresh_store().list(status, limit, cursor)

    def _fresh_trajectories(self) -> TrajectoryViewStore:
        self._fresh_store()
        assert self._trajectories is not None
        return self._trajectories

    def trajectory(self, run_id: str) -> dict[str, Any] | None:
        def read() -> dict[str, Any] | None:
            self._store()
            assert self._trajectories is not None
            return self._trajectories.get(run_id)

        return self._current(read, self._heard_trajectory, run_id)

    def step_output(self, run_id: str, step_index: int) -> str | None:
        """The exact output text of a committed step (a saga step's artifact, QUA-2), else None."""
        fold = self._fresh_trajectories().fold(run_id)
        step = fold.state.step(step_index) if fold is not None else None
        return step.output if step is not None and step.status.value == "committed" else None

    def _watchdog_store(self) -> WatchdogViewStore:
        self._store()
        assert self._watchdogs is not None
        return self._watchdogs

    def watchdog(self, run_id: str) -> dict[str, Any] | None:
        """The run's watchdog view (WD-5), None while the run has no watchdog."""
        return self._current(lambda: self._watchdog_store().get(run_id), self._heard_watchdog, run_id)

    def watchdog_brief(self, run_id: str) -> dict[str, Any] | None:
        """The few watchdog fields a runner's answers carry (one small read per heartbeat)."""
        return self._current(lambda: self._watchdog_store().brief(run_id), self._heard_watchdog, run_id)

    async def wait_for_watchdog_version(
        self, run_id: str, version: int, timeout_s: float
    ) -> dict[str, Any] | None:
        """The run's watchdog view once the projection has applied `version`, or None on timeout."""
        return await self._wait(self.watchdog, run_id, version, timeout_s)

    def open_incidents(self) -> builtins.list[dict[str, Any]]:
        return self._fresh_trajectories().open_incidents()

    def incident(self, incident_id: str) -> dict[str, Any] | None:
        return self._fresh_trajectories().incident(incident_id)

    async def wait_for_trajectory_version(
        self, run_id: str, version: int, timeout_s: float
    ) -> dict[str, Any] | None:
        """The run's trajectory view once the projection has applied `version`, or None on timeout."""
        return await self._wait(self.trajectory, run_id, version, timeout_s)

    async def wait_for_version(self, run_id: str, version: int, timeout_s: float) -> dict[str, Any] | None:
        """The run's view once the projection has applied `version`, or None on timeout."""
        return await self._wait(self.get, run_id, version, timeout_s)

    async def _wait(
        self, read: Callable[[str], dict[str, Any] | None], run_id: str, version: int, timeout_s: float
    ) -> dict[str, Any] | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                # Each read is bounded too: a store that stops answering must not hold the request.
                view = await asyncio.wait_for(
                    asyncio.to_thread(read, run_id), max(0.0, deadline - loop.time())
                )
            except TimeoutError:
                return None
            if view is not None and int(view["version"]) >= version:
                return view
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(self._REFRESH_EVERY_S)
