"""What every route needs: Kafka publisher, decision followers, view reader, metrics, auth.

`ApiContext.publish_and_wait` is the one way a route issues a Run command (and
`publish_trajectory_and_wait` a trajectory command): register for the decision, publish, wait
(bounded) for the decision event or rejection, and optionally for the view that shows it.
"""

from __future__ import annotations

import asyncio
import builtins
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from fastapi import Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter, Histogram

from services.command_api.auth import Principal, load_api_keys, principal_of
from services.command_api.models import PendingCommand
from services.command_api.problems import REJECTION_PROBLEMS, ApiProblem, problem_response
from services.common.clock import Clock, SystemClock
from services.common.contracts import TRAJECTORY_EVENT_TYPES, RunCommand, TrajectoryCommand
from services.common.decisions import Decided, DecisionListener, Rejected, publish_and_await
from services.common.kafka import CommandPublisher, OutboundRecord
from services.common.messages import MessageCodec
from services.common.objectstore import FilesystemObjectStore, ObjectStore
from services.common.policy import BlockList
from services.common.routing import command_record, trajectory_command_record
from services.common.store import RocksStore
from services.common.topics import TRAJECTORIES_EVENTS, TRAJECTORIES_REJECTIONS
from services.projections.store import RunViewStore
from services.projections.trajectory_store import TrajectoryViewStore

__all__ = [
    "ApiContext",
    "ApiDependencies",
    "Outcome",
    "ViewReader",
    "check_holder",
    "open_dependencies",
    "pending_response",
    "rejection_problem",
]


class ViewReader:
    """Opens the projector's RocksDB as a read-only secondary, once it exists.

    Run views and trajectory views share that store, so one catch-up serves both."""

    # Catching up with the primary costs a few file reads; many waiting requests share one.
    _REFRESH_EVERY_S = 0.002

    def __init__(self, path: Path, codec: MessageCodec) -> None:
        self._path = path
        self._codec = codec
        self._views: RunViewStore | None = None
        self._trajectories: TrajectoryViewStore | None = None
        self._lock = threading.Lock()
        self._refreshed_at = 0.0

    def _store(self) -> RunViewStore:
        if self._views is None:
            if not (self._path / "CURRENT").exists():
                raise ApiProblem("unavailable", "the run views are not built yet; is projections running?")
            store = RocksStore(self._path, secondary=True)
            self._trajectories = TrajectoryViewStore(store, self._codec)
            self._views = RunViewStore(store, self._codec)
        return self._views

    def _fresh_store(self) -> RunViewStore:
        store = self._store()
        with self._lock:
            now = time.monotonic()
            if now - self._refreshed_at >= self._REFRESH_EVERY_S:
                store.refresh()
                self._refreshed_at = now
        return store

    def get(self, run_id: str) -> dict[str, Any] | None:
        return self._fresh_store().get(run_id)

    def brief(self, run_id: str) -> dict[str, Any] | None:
        return self._fresh_store().brief(run_id)

    def list(self, status: str | None, limit: int, cursor: str | None) -> Any:
        return self._fresh_store().list(status, limit, cursor)

    def _fresh_trajectories(self) -> TrajectoryViewStore:
        self._fresh_store()
        assert self._trajectories is not None
        return self._trajectories

    def trajectory(self, run_id: str) -> dict[str, Any] | None:
        return self._fresh_trajectories().get(run_id)

    def open_incidents(self) -> builtins.list[dict[str, Any]]:
        return self._fresh_trajectories().open_incidents()

    def incident(self, incident_id: str) -> dict[str, Any] | None:
        return self._fresh_trajectories().incident(incident_id)

    async def wait_for_trajectory_version(
        self, run_id: str, version: int, timeout_s: float
    ) -> dict[str, Any] | None:
        """The run's trajectory view once the projection has applied `version`, or None on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            view = await asyncio.to_thread(self.trajectory, run_id)
            if view is not None and int(view["version"]) >= version:
                return view
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(self._REFRESH_EVERY_S)

    async def wait_for_version(self, run_id: str, version: int, timeout_s: float) -> dict[str, Any] | None:
        """The run's view once the projection has applied `version`, or None on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            view = await asyncio.to_thread(self.get, run_id)
            if view is not None and int(view["version"]) >= version:
                return view
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(self._REFRESH_EVERY_S)


@dataclass
class ApiDependencies:
    publisher: CommandPublisher
    decisions: DecisionListener
    views: ViewReader
    codec: MessageCodec
    clock: Clock
    api_keys: dict[str, Principal]
    decision_timeout_s: float
    objects: ObjectStore
    blocks: BlockList
    # Decisions of the saga orchestrator (trajectories.events / trajectories.rejections).
    trajectory_decisions: DecisionListener

    def close(self) -> None:
        self.blocks.close()
        self.trajectory_decisions.close()
        self.decisions.close()
        self.publisher.close()


def open_dependencies(
    bootstrap_servers: str, views_path: Path, decision_timeout_s: float, artifacts_path: Path
) -> ApiDependencies:
    codec = MessageCodec()
    return ApiDependencies(
        publisher=CommandPublisher(bootstrap_servers, client_id="tenure-command-api"),
        decisions=DecisionListener(bootstrap_servers, codec),
        views=ViewReader(views_path, codec),
        codec=codec,
        clock=SystemClock(),
        api_keys=load_api_keys(),
        decision_timeout_s=decision_timeout_s,
        objects=FilesystemObjectStore(artifacts_path),
        blocks=BlockList(bootstrap_servers, client_id="tenure-api-policy"),
        trajectory_decisions=DecisionListener(
            bootstrap_servers,
            codec,
            topics=(TRAJECTORIES_EVENTS.name, TRAJECTORIES_REJECTIONS.name),
            event_types=TRAJECTORY_EVENT_TYPES,
            client_id="tenure-api-trajectory-decisions",
        ),
    )


@dataclass(frozen=True)
class Outcome:
    """A decided command: its (last seen) event and, when asked for, the view that shows it."""

    decided: Decided
    view: dict[str, Any] | None


class ApiContext:
    def __init__(self) -> None:
        self.metrics = CollectorRegistry()
        self._commands_total = Counter(
            "tenure_api_commands_total",
            "Commands published, by type and outcome.",
            ["command", "outcome"],
            registry=self.metrics,
        )
        self._decision_seconds = Histogram(
            "tenure_api_decision_seconds",
            "Time from publishing a command to its decision.",
            ["command"],
            registry=self.metrics,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self._deps: ApiDependencies | None = None

    @property
    def deps(self) -> ApiDependencies:
        if self._deps is None:
            raise ApiProblem("unavailable", "the API is starting")
        return self._deps

    def open(self, deps: ApiDependencies) -> None:
        self._deps = deps

    def close(self) -> None:
        if self._deps is not None:
            self._deps.close()

    def principal(self, request: Request) -> Principal:
        return principal_of(request, self.deps.api_keys)

    async def view(self, run_id: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(self.deps.views.get, run_id)

    async def publish_and_wait(
        self, command: RunCommand, *, wait_for_view: bool = True
    ) -> Outcome | Rejected | PendingCommand:
        d = self.deps
        return await self._publish_and_wait(
            command_record(d.codec, command),
            command,
            d.decisions,
            d.views.wait_for_version if wait_for_view else None,
        )

    async def publish_trajectory_and_wait(
        self, command: TrajectoryCommand, *, wait_for_view: bool = True
    ) -> Outcome | Rejected | PendingCommand:
        """Like publish_and_wait, for the saga orchestrator's commands and trajectory views."""
        d = self.deps
        return await self._publish_and_wait(
            trajectory_command_record(d.codec, command),
            command,
            d.trajectory_decisions,
            d.views.wait_for_trajectory_version if wait_for_view else None,
        )

    async def _publish_and_wait(
        self,
        record: OutboundRecord,
        command: RunCommand | TrajectoryCommand,
        listener: DecisionListener,
        wait_for_view: Callable[[str, int, float], Awaitable[dict[str, Any] | None]] | None,
    ) -> Outcome | Rejected | PendingCommand:
        d = self.deps
        kind = type(command).__name__
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            answer = await publish_and_await(
                d.publisher, listener, record, command.command_id, d.decision_timeout_s
            )
        except Exception as exc:
            raise ApiProblem("unavailable", f"could not publish the command to Kafka: {exc}") from exc
        result: Outcome | Rejected | PendingCommand
        if isinstance(answer, Rejected):
            result = answer
        elif isinstance(answer, Decided) and wait_for_view is None:
            result = Outcome(answer, None)
        elif isinstance(answer, Decided):
            assert wait_for_view is not None
            remaining = max(0.0, d.decision_timeout_s - (loop.time() - started))
            view = await wait_for_view(command.run_id, answer.event.version, remaining)
            result = Outcome(answer, view) if view is not None else self._pending(command)
        else:
            result = self._pending(command)
        self._decision_seconds.labels(kind).observe(loop.time() - started)
        label = {Outcome: "accepted", Rejected: "rejected"}.get(type(result), "pending")
        self._commands_total.labels(kind, label).inc()
        return result

    def _pending(self, command: RunCommand | TrajectoryCommand) -> PendingCommand:
        return PendingCommand(
            runId=command.run_id,
            commandId=command.command_id,
            detail=(
                f"no decision within {self.deps.decision_timeout_s}s; the command is durable, poll the run"
            ),
        )


async def check_holder(ctx: ApiContext, who_name: str, run_id: str, attempt_id: str) -> dict[str, Any] | None:
    """Only the lease's holder principal may speak for it (LEASE-1); returns the run's brief.

    The coordinator fences by attempt and epoch; this check adds that knowing an attempt id is
    not enough to use it. It reads the projection's small per-run brief, not the whole view,
    because every heartbeat passes here.
    """
    brief = await asyncio.to_thread(ctx.deps.views.brief, run_id)
    if brief is None:
        return None  # the coordinator answers unknown-attempt
    holder = brief["holders"].get(attempt_id)
    if holder and holder != who_name:
        raise ApiProblem(
            "not-lease-holder",
            f"{who_name} does not hold lease {brief['leaseIds'][attempt_id]}",
            runId=run_id,
        )
    return brief


def rejection_problem(rejected: Rejected, path: str, **overrides: str) -> JSONResponse:
    r = rejected.rejection
    slug = overrides.get(r.code) or REJECTION_PROBLEMS.get(r.code, "command-rejected")
    return problem_response(
        slug,
        r.detail,
        path,
        code=r.code,
        runId=r.run_id,
        currentStatus=r.current_status,
        commandId=r.causation_id,
    )


def pending_response(pending: PendingCommand) -> JSONResponse:
    return JSONResponse(pending.model_dump(), status_code=202, headers={"Location": f"/runs/{pending.runId}"})
