"""What every route needs: Kafka publisher, decision followers, view reader, metrics, auth.

`ApiContext.publish_and_wait` is the one way a route issues a Run command (and
`publish_trajectory_and_wait` a trajectory command, `publish_watchdog_and_wait` a watchdog
command): register for the decision, publish, wait
for the decision event or rejection, and optionally for the view that shows it.

Every request has one deadline, TENURE_DECISION_TIMEOUT_S after it reached its route (set by the
routers' `start_request` dependency): the publish, the wait for the decision, the wait for the
view and every read of the views share it. A command Kafka did not acknowledge in time is a 503
with Retry-After; a command that is durable but undecided is a 202 to poll.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, Protocol, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from prometheus_client import Counter, Histogram

from services.breakers.client import BreakerClient
from services.command_api.admission import AdmissionControl
from services.command_api.as_of import read_run_events
from services.command_api.auth import Principal, load_api_keys, principal_of
from services.command_api.breaker_board import ApiBreakerBoard, BreakerHistoryFold, configured_bulkheads
from services.command_api.models import PendingCommand
from services.command_api.problems import REJECTION_PROBLEMS, ApiProblem, problem_response
from services.command_api.projection import ApiProjection
from services.command_api.view_reader import READ_DEADLINE, ViewReader
from services.common.auth import warn_if_development_mode
from services.common.clock import Clock, SystemClock
from services.common.contracts import (
    BREAKER_EVENT_TYPES,
    TRAJECTORY_EVENT_TYPES,
    WATCHDOG_EVENT_TYPES,
    RunCommand,
    RunEvent,
    TrajectoryCommand,
    WatchdogCommand,
)
from services.common.contracts.quarantine import QUARANTINE_EVENT_TYPES
from services.common.decisions import (
    Decided,
    DecisionBook,
    DecisionListener,
    NotDurable,
    Rejected,
    publish_and_await,
)
from services.common.kafka import CommandPublisher, OutboundRecord
from services.common.messages import MessageCodec
from services.common.metrics import metrics_registry
from services.common.objectstore import ObjectStore, open_object_store
from services.common.policy import BlockList
from services.common.routing import command_record, observation_record, trajectory_command_record
from services.common.settings import TenureSettings
from services.common.topics import (
    BREAKERS_EVENTS,
    BREAKERS_REJECTIONS,
    QUARANTINE_EVENTS,
    QUARANTINE_REJECTIONS,
    RUNS_EVENTS,
    RUNS_REJECTIONS,
    TRAJECTORIES_EVENTS,
    TRAJECTORIES_REJECTIONS,
    WATCHDOG_EVENTS,
    WATCHDOG_REJECTIONS,
)
from services.common.tracing import annotate
from services.projections.renewal_store import leased, view_with_kept_renewals
from services.quarantine.view import QuarantineBoard
from services.schedules.view import ScheduleBoard

__all__ = [
    "RETRY_AFTER_S",
    "ApiContext",
    "ApiDependencies",
    "ApiPublisher",
    "Outcome",
    "ViewReader",
    "check_holder",
    "delivery_timeout_for",
    "open_dependencies",
    "pending_response",
    "rejection_problem",
]


T = TypeVar("T")

# What a 503 tells the caller to wait before trying again: an outage of the broker is either
# over in a few seconds (a restart) or long, and a client polls either way.
RETRY_AFTER_S = 1
# How long a read may take once the deadline has passed (to answer what is known so far).
_LAST_READ_S = 0.2
# The request's deadline (loop time), set when it reaches its route.
_DEADLINE: ContextVar[float | None] = ContextVar("tenure_request_deadline", default=None)


class ApiPublisher(Protocol):
    def publish(self, record: OutboundRecord) -> Future[int]: ...

    def reachable(self, timeout_s: float = 0.5) -> str | None: ...

    def close(self, timeout_s: float = 10.0) -> None: ...


@dataclass
class ApiDependencies:
    publisher: ApiPublisher
    decisions: DecisionBook
    views: ViewReader
    codec: MessageCodec
    clock: Clock
    api_keys: dict[str, Principal]
    decision_timeout_s: float
    objects: ObjectStore
    blocks: BlockList
    # Decisions of the saga orchestrator (trajectories.events / trajectories.rejections).
    trajectory_decisions: DecisionBook
    # Decisions of the semantic watchdog (watchdog.events / watchdog.rejections); None: its
    # commands are published and answered 202 without waiting for a decision.
    watchdog_decisions: DecisionBook | None = None
    # The circuit breakers (BRK-1, BRK-2): their states with recent transitions (GET /breakers),
    # the client the operators' commands go through, and the decisions it waits for; None: the
    # breaker routes answer 503.
    breakers: BreakerHistoryFold | None = None
    breaker_client: BreakerClient | None = None
    breaker_decisions: DecisionBook | None = None
    # The effect gateway's bulkheads as configured (BRK-4; GET /bulkheads), or why they cannot be.
    bulkheads: dict[str, Any] | str | None = None
    # Quarantines and provenance graphs (QUA-1, QUA-2; services/command_api/quarantine_deps.py);
    # None: the quarantine and artifact routes answer 503.
    quarantine: Any = None
    # The schedules as folded from their log (EXE-14); None: the schedule routes answer 503.
    schedules: ScheduleBoard | None = None

    # This instance's own projection of the views (None: a unit test's store).
    projection: ApiProjection | None = None
    # One run's events read from its partition of runs.events, for a view as of a time or a
    # version (services/command_api/as_of.py): (run id, submitted at, until ms) -> events.
    # None: GET /runs/{id}?asOf= answers 503.
    run_history: Callable[[str, int, int | None], Iterator[RunEvent]] | None = None
    # Admission control for batch renewals (TENURE_API_SHED_AFTER_MS, lease_batch.py): refused
    # while a batch this instance waits for has waited longer than this; 0: never.
    shed_after_s: float = 0.0

    def close(self) -> None:
        if self.schedules is not None:
            self.schedules.close()
        if self.quarantine is not None:
            self.quarantine.close()
        if self.breakers is not None:
            self.breakers.close()
        if self.breaker_decisions is not None:
            self.breaker_decisions.close()
        if self.watchdog_decisions is not None:
            self.watchdog_decisions.close()
        self.blocks.close()
        self.trajectory_decisions.close()
        self.decisions.close()
        self.publisher.close()
        if self.projection is not None:
            self.projection.close()


def delivery_timeout_for(decision_timeout_s: float) -> float:
    """How long librdkafka may keep trying to deliver a command of a request.

    A little longer than the request waits, so a command that reaches the broker just after its
    request answered 503 is still written once (a retry with the same Idempotency-Key is the same
    command), but not the librdkafka default of five minutes of retries in the background."""
    return decision_timeout_s + max(2.0, decision_timeout_s)


def open_dependencies(
    bootstrap_servers: str, views_path: Path, decision_timeout_s: float, artifacts_path: Path
) -> ApiDependencies:
    """The API's Kafka clients, its own projection of the views, and the rest of what routes use.

    `views_path` is this instance's own views store (projection.api_views_path), folded by it.
    """
    codec = MessageCodec()
    api_keys = load_api_keys()
    warn_if_development_mode(api_keys, "tenure-command-api")
    decisions = DecisionListener(bootstrap_servers, codec, topics=(RUNS_EVENTS.name, RUNS_REJECTIONS.name))
    trajectory_decisions = DecisionListener(
        bootstrap_servers,
        codec,
        topics=(TRAJECTORIES_EVENTS.name, TRAJECTORIES_REJECTIONS.name),
        event_types=TRAJECTORY_EVENT_TYPES,
        client_id="tenure-api-trajectory-decisions",
    )
    watchdog_decisions = DecisionListener(
        bootstrap_servers,
        codec,
        topics=(WATCHDOG_EVENTS.name, WATCHDOG_REJECTIONS.name),
        event_types=WATCHDOG_EVENT_TYPES,
        client_id="tenure-api-watchdog-decisions",
    )
    breaker_decisions = DecisionListener(
        bootstrap_servers,
        codec,
        topics=(BREAKERS_EVENTS.name, BREAKERS_REJECTIONS.name),
        event_types=BREAKER_EVENT_TYPES,
        client_id="tenure-api-breaker-decisions",
    )
    publisher = CommandPublisher(
        bootstrap_servers,
        client_id="tenure-command-api",
        delivery_timeout_s=delivery_timeout_for(decision_timeout_s),
    )
    # A renewal kept off runs.events is answered from runs.renewals, which the projection reads
    # into the renewal history anyway: one consumer and one decode per renewal (issue 16).
    settings = TenureSettings()
    projection = ApiProjection(
        bootstrap_servers,
        views_path,
        codec,
        on_kept=decisions.deliver_kept,
        cached_briefs=settings.api_brief_cache_runs,
    )
    return ApiDependencies(
        publisher=publisher,
        decisions=decisions,
        views=ViewReader(
            views_path,
            codec,
            heard_run=lambda run_id: decisions.newest_heard(run_id),
            heard_trajectory=lambda run_id: trajectory_decisions.newest_heard(run_id),
            heard_watchdog=lambda run_id: watchdog_decisions.newest_heard(run_id),
            projection=projection,
            wait_s=decision_timeout_s,
        ),
        projection=projection,
        codec=codec,
        clock=SystemClock(),
        api_keys=api_keys,
        decision_timeout_s=decision_timeout_s,
        shed_after_s=settings.api_shed_after_ms / 1000,
        objects=open_object_store(settings, artifacts_path),  # filesystem unless S3
        blocks=BlockList(bootstrap_servers, client_id="tenure-api-policy"),
        trajectory_decisions=trajectory_decisions,
        watchdog_decisions=watchdog_decisions,
        breakers=ApiBreakerBoard(bootstrap_servers, codec, client_id="tenure-api-breakers"),
        breaker_client=BreakerClient(
            publisher, breaker_decisions, "tenure-command-api", actor="tenure-command-api", codec=codec
        ),
        breaker_decisions=breaker_decisions,
        bulkheads=configured_bulkheads(settings),
        quarantine=_quarantine_deps(bootstrap_servers, codec),
        schedules=ScheduleBoard(bootstrap_servers, "tenure-api-schedules"),
        run_history=lambda run_id, submitted_at, until_ms: read_run_events(
            bootstrap_servers, codec, run_id, submitted_at, until_ms
        ),
    )


def _quarantine_deps(bootstrap_servers: str, codec: MessageCodec) -> Any:
    from services.command_api.quarantine_deps import QuarantineDeps  # it imports this module

    return QuarantineDeps(
        board=QuarantineBoard(bootstrap_servers, codec, client_id="tenure-api-quarantine"),
        decisions=DecisionListener(
            bootstrap_servers,
            codec,
            topics=(QUARANTINE_EVENTS.name, QUARANTINE_REJECTIONS.name),
            event_types=QUARANTINE_EVENT_TYPES,
            client_id="tenure-api-quarantine-decisions",
        ),
    )


@dataclass(frozen=True)
class Outcome:
    """A decided command: its (last seen) event and, when asked for, the view that shows it."""

    decided: Decided
    view: dict[str, Any] | None


class ApiContext:
    def __init__(self) -> None:
        self.metrics = metrics_registry()  # with the process collector (services/common/metrics.py)
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
        self.admission = AdmissionControl(self.metrics, RETRY_AFTER_S)
        self._deps: ApiDependencies | None = None

    @property
    def deps(self) -> ApiDependencies:
        if self._deps is None:
            raise ApiProblem("unavailable", "the API is starting")
        return self._deps

    @property
    def development_mode(self) -> bool:
        return not self.deps.api_keys

    def open(self, deps: ApiDependencies) -> None:
        self._deps = deps

    def close(self) -> None:
        if self._deps is not None:
            self._deps.close()

    def principal(self, request: Request) -> Principal:
        return principal_of(request, self.deps.api_keys)

    async def authenticate(self, request: Request) -> None:
        """A router dependency: an unknown caller is 401 before its body is even validated."""
        self.principal(request)

    def guarded(self, **kwargs: Any) -> APIRouter:
        """A router whose every route authenticates its caller and runs within one deadline."""
        return APIRouter(dependencies=[Depends(self.start_request), Depends(self.authenticate)], **kwargs)

    # --- the request's deadline ---------------------------------------------------------------

    async def start_request(self) -> None:
        """A router dependency: the request's deadline starts when it reaches its route."""
        _DEADLINE.set(asyncio.get_running_loop().time() + self.deps.decision_timeout_s)
        # The same deadline for a view read's wait for the fold, which runs in a thread.
        READ_DEADLINE.set(time.monotonic() + self.deps.decision_timeout_s)

    def remaining(self) -> float:
        """Seconds left of the request's deadline (a whole timeout outside a request)."""
        deadline = _DEADLINE.get()
        if deadline is None:
            return self.deps.decision_timeout_s
        return max(0.0, deadline - asyncio.get_running_loop().time())

    async def bounded(self, awaitable: Awaitable[T], what: str) -> T:
        """`awaitable` within the request's deadline, else 503 unavailable with Retry-After.

        A read after the deadline (answering a 202 from the view) still gets a moment."""
        try:
            return await asyncio.wait_for(awaitable, max(self.remaining(), _LAST_READ_S))
        except TimeoutError as exc:
            raise self.unavailable(f"{what} did not answer within the request's deadline") from exc

    async def in_thread(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """A blocking call (a store read, a file check) within the request's deadline."""
        return await self.bounded(asyncio.to_thread(fn, *args), what)

    @contextmanager
    def admitted(self, route: str) -> Iterator[None]:
        """Admission control (services/command_api/admission.py) around a request: 503
        `overloaded` before anything is published while this instance is far behind."""
        deps = self.deps
        with self.admission.admitted(route, deps.shed_after_s, deps.decisions.oldest_wait_s()):
            yield

    def unavailable(self, detail: str, **extensions: Any) -> ApiProblem:
        return ApiProblem(
            "unavailable",
            f"{detail} (TENURE_DECISION_TIMEOUT_S={self.deps.decision_timeout_s:g}s)",
            headers={"Retry-After": str(RETRY_AFTER_S)},
            retryAfterSeconds=RETRY_AFTER_S,
            **extensions,
        )

    async def view(self, run_id: str) -> dict[str, Any] | None:
        return await self.in_thread("the run views", self.deps.views.get, run_id)

    async def brief(self, run_id: str) -> dict[str, Any] | None:
        """The run's brief (ViewReader.brief): as found unless a newer version was heard."""
        return await self.in_thread("the run views", self.deps.views.brief, run_id)

    async def with_every_renewal(self, run_id: str, view: dict[str, Any]) -> dict[str, Any]:
        """LEASE-2: the view's lease records with the renewals kept off runs.events (issue 16,
        on runs.renewals) merged in, everything on that topic as of now folded."""
        if not leased(view):
            return view
        kept = await self.in_thread("the renewal history", self.deps.views.kept_renewals, run_id)
        return view_with_kept_renewals(view, kept)

    async def trajectory_view(self, run_id: str) -> dict[str, Any] | None:
        return await self.in_thread("the trajectory views", self.deps.views.trajectory, run_id)

    async def trajectory_after(self, run_id: str, after: int, wait_s: float) -> dict[str, Any] | None:
        """The trajectory view once its version is above `after`, or as it is when `wait_s`
        (bounded by the request's deadline) has passed: a long-poll.

        The trajectory follower wakes the request the moment an event past `after` is on the
        log; the answer then waits only for the projection to apply it (milliseconds). A runner
        that long-polls learns of its step's commit without polling at all.

        The first look skips the read barrier: a view past `after` is news to the caller whether
        or not the log holds more, so the barrier's query (a broker round trip on every step of
        a runner's loop) is paid only when the fold shows nothing new."""
        folded = await self.in_thread("the trajectory views", self.deps.views.trajectory_folded, run_id)
        if folded is not None and int(folded["version"]) > after:
            return folded
        view = await self.trajectory_view(run_id)
        if view is None or int(view["version"]) > after or wait_s <= 0:
            return view
        wait_s = min(wait_s, max(0.0, self.remaining() - _LAST_READ_S))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        newer = await self.deps.trajectory_decisions.wait_past(run_id, after, wait_s)
        if newer is not None:
            shown = await self.deps.views.wait_for_trajectory_version(
                run_id, min(newer, after + 1), max(0.0, deadline - loop.time())
            )
            if shown is not None:
                return shown
        return await self.trajectory_view(run_id)

    # --- commands -----------------------------------------------------------------------------

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

    async def publish_watchdog_and_wait(
        self, command: WatchdogCommand, *, wait_for_view: bool = True
    ) -> Outcome | Rejected | PendingCommand:
        """Like publish_and_wait, for the semantic watchdog's commands (progress.observations)
        and watchdog views. Without a watchdog decision follower: published, then pending."""
        d = self.deps
        record = observation_record(d.codec, command)
        if d.watchdog_decisions is None:
            await self.publish_record(record, type(command).__name__)
            return self._pending(command)
        return await self._publish_and_wait(
            record,
            command,
            d.watchdog_decisions,
            d.views.wait_for_watchdog_version if wait_for_view else None,
        )

    async def publish_record(self, record: OutboundRecord, what: str) -> None:
        """Publish a record that is not a command (a policy change), within the deadline."""
        try:
            await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(self.deps.publisher.publish(record))), self.remaining()
            )
        except BufferError as exc:
            raise self.unavailable(f"{what}: the producer's queue is full; nothing was recorded") from exc
        except TimeoutError as exc:
            raise self.unavailable(
                f"{what}: Kafka did not acknowledge it in time; it may still be recorded, and sending "
                "the same change again is harmless"
            ) from exc
        except Exception as exc:
            raise self.unavailable(f"{what}: Kafka did not take it ({exc})") from exc

    async def _publish_and_wait(
        self,
        record: OutboundRecord,
        command: RunCommand | TrajectoryCommand | WatchdogCommand,
        listener: DecisionBook,
        wait_for_view: Callable[[str, int, float], Awaitable[dict[str, Any] | None]] | None,
    ) -> Outcome | Rejected | PendingCommand:
        d = self.deps
        kind = type(command).__name__
        annotate({"messaging.destination.name": record.topic}, command=command)  # the request's span
        loop = asyncio.get_running_loop()
        started = loop.time()
        if self.remaining() < _LAST_READ_S:
            # The reads before it used up the deadline: better not sent than sent and unanswered.
            raise self.unavailable("the request's deadline passed before its command was sent (nothing was)")
        try:
            answer = await publish_and_await(
                d.publisher, listener, record, command.command_id, self.remaining()
            )
        except NotDurable as exc:
            self._commands_total.labels(kind, "unavailable").inc()
            fate = "may still be recorded" if exc.may_land else "was not sent"
            raise self.unavailable(
                f"{exc}. The command {fate}; sending the same request again is safe: under the same "
                "Idempotency-Key (or, for a heartbeat or report, the same attempt and sequence) it is "
                "recognised as the same request and applied at most once",
                commandId=command.command_id,
                runId=command.run_id,
            ) from exc
        result: Outcome | Rejected | PendingCommand
        if isinstance(answer, Rejected):
            result = answer
        elif isinstance(answer, Decided) and wait_for_view is None:
            result = Outcome(answer, None)
        elif isinstance(answer, Decided):
            assert wait_for_view is not None
            view = await wait_for_view(command.run_id, answer.event.version, self.remaining())
            result = Outcome(answer, view) if view is not None else self._pending(command)
        else:
            result = self._pending(command)
        self._decision_seconds.labels(kind).observe(loop.time() - started)
        label = {Outcome: "accepted", Rejected: "rejected"}.get(type(result), "pending")
        self._commands_total.labels(kind, label).inc()
        return result

    def _pending(self, command: RunCommand | TrajectoryCommand | WatchdogCommand) -> PendingCommand:
        return PendingCommand(
            runId=command.run_id,
            commandId=command.command_id,
            detail=(
                f"the command is durable but no decision arrived within {self.deps.decision_timeout_s:g}s; "
                "poll the run (or repeat the request with the same Idempotency-Key)"
            ),
        )


async def check_holder(ctx: ApiContext, who_name: str, run_id: str, attempt_id: str) -> dict[str, Any] | None:
    """Only the lease's holder principal may speak for it (LEASE-1); returns the run's brief.

    The coordinator fences by attempt and epoch; this check adds that knowing an attempt id is
    not enough to use it. It reads the projection's small per-run brief, not the whole view,
    because every heartbeat passes here.
    """
    brief = await ctx.brief(run_id)
    if brief is None or attempt_id not in brief["holders"]:
        # Perhaps granted through another API instance a moment ago: ask the fold up to the end.
        brief = await ctx.in_thread("the run views", ctx.deps.views.fresh_brief, run_id)
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
