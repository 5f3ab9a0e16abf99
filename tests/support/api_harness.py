"""The command API over an in-process stand-in for Kafka and the processors, for unit tests.

`InMemoryTenure` takes the API's published records and decides them with the real pure cores
(the lease coordinator's, the saga orchestrator's, the semantic watchdog's and the circuit
breakers' `decide`/`evolve`; an intervention is sent on to the trajectory as the watchdog
processor does; breaker events are folded into the API's board, a BreakerHistoryFold, as its
follower would), folds the events into
the real projection stores (over a MemoryStore that the API's real ViewReader reads) and hands
each decision to the API's DecisionBooks, as the decision followers would. It can also play an
outage: a broker that never acknowledges (`down`), a full producer queue (`queue_full`), or a
broker that takes records but whose processors decide nothing (`undecided`).

Integration tests use the real broker and processes instead (tests/support/tenure.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from services.breakers.client import BreakerClient
from services.breakers.domain import DEFAULT_POLICY as DEFAULT_BREAKER_POLICY
from services.breakers.domain import BreakerPolicy, BreakerState
from services.breakers.domain import Rejection as BreakerRejection
from services.breakers.domain import decide as decide_breaker
from services.breakers.domain import decide_timers as decide_breaker_timers
from services.breakers.domain import evolve as evolve_breaker
from services.command_api.app import create_app
from services.command_api.breaker_board import BreakerHistoryFold, configured_bulkheads
from services.command_api.context import ApiDependencies, ViewReader
from services.common.auth import parse_api_keys
from services.common.clock import SystemClock
from services.common.contracts import (
    BREAKER_COMMAND_TYPES,
    TRAJECTORY_COMMAND_TYPES,
    WATCHDOG_COMMAND_TYPES,
    BlockChanged,
    CommandRejected,
    InterventionIssued,
    RecordCallOutcome,
    RenewLeases,
    RunCommand,
)
from services.common.decisions import Decided, DecisionBook, FollowerHealth, Rejected
from services.common.ids import derived_id
from services.common.kafka import InboundRecord, OutboundRecord
from services.common.messages import MessageCodec
from services.common.objectstore import FilesystemObjectStore
from services.common.policy import subject_key
from services.common.routing import breaker_command_record
from services.common.settings import TenureSettings, repo_root
from services.common.store import MemoryStore
from services.common.topics import RUNS_EVENTS, TRAJECTORIES_EVENTS, WATCHDOG_EVENTS
from services.lease_coordinator.domain import decide as decide_run
from services.lease_coordinator.domain import evolve as evolve_run
from services.lease_coordinator.domain import rejection_event
from services.lease_coordinator.domain.state import Rejection as RunRejection
from services.projections.store import RunViewStore
from services.projections.trajectory_store import TrajectoryViewStore
from services.projections.watchdog_store import WatchdogViewStore
from services.saga_orchestrator.domain import Rejection as SagaRejection
from services.saga_orchestrator.domain import SagaContext, load_catalog
from services.saga_orchestrator.domain import decide as decide_trajectory
from services.saga_orchestrator.domain import evolve as evolve_trajectory
from services.watchdog.domain import DEFAULT_THRESHOLDS, Thresholds
from services.watchdog.domain import Rejection as WatchdogRejection
from services.watchdog.domain import decide as decide_watchdog
from services.watchdog.domain import evolve as evolve_watchdog
from services.watchdog.processor import intervention_command

__all__ = ["FakeBlocks", "InMemoryTenure", "api_client"]

CATALOG = repo_root() / "services" / "sim_environment" / "tools.json"


class FakeBlocks:
    """The block policy as the API's BlockList shows it, fed by the harness."""

    def __init__(self) -> None:
        self._blocked: dict[str, BlockChanged] = {}
        self.current = True

    def apply(self, change: BlockChanged) -> None:
        key = subject_key(change.subject_kind, change.subject)
        if change.blocked:
            self._blocked[key] = change
        else:
            self._blocked.pop(key, None)

    def blocked(self) -> frozenset[str]:
        return frozenset(self._blocked)

    def entries(self) -> list[BlockChanged]:
        return sorted(self._blocked.values(), key=lambda b: (b.subject_kind, b.subject))

    def wait_for(self, key: str, blocked: bool, timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (key in self._blocked) == blocked:
                return True
            time.sleep(0.005)
        return False

    def wait_until_current(self, timeout_s: float = 30.0) -> bool:
        return self.current

    def close(self) -> None:
        """Nothing to stop."""


class _Book(DecisionBook):
    """A DecisionBook whose health the test can set."""

    def __init__(self) -> None:
        super().__init__()
        self.state = FollowerHealth(True, "in memory", 0)

    def health(self) -> FollowerHealth:
        return self.state


class InMemoryTenure:
    """Broker, lease coordinator, saga orchestrator and projector in one object (see module doc)."""

    def __init__(self) -> None:
        self.codec = MessageCodec()
        self.clock = SystemClock()
        self.store = MemoryStore()
        self.run_views = RunViewStore(self.store, self.codec)
        self.trajectory_views = TrajectoryViewStore(self.store, self.codec)
        self.watchdog_views = WatchdogViewStore(self.store, self.codec)
        self.run_book = _Book()
        self.trajectory_book = _Book()
        self.watchdog_book = _Book()
        self.watchdog_thresholds: Thresholds = DEFAULT_THRESHOLDS
        self.watchdog_states: dict[str, Any] = {}
        self.blocks = FakeBlocks()
        # The circuit breakers: the processor's states, and the API's board they are folded into
        # (set `breakers_seen = False` to play a board that has not heard of a decision yet).
        self.breaker_policy: BreakerPolicy = DEFAULT_BREAKER_POLICY
        self.breaker_states: dict[str, BreakerState] = {}
        self.breakers = BreakerHistoryFold(self.clock)
        self.breaker_book = _Book()
        self.breakers_seen = True
        self._outcome_seq = 0
        self.saga = SagaContext(load_catalog(CATALOG))
        self.run_states: dict[str, Any] = {}
        self.trajectory_states: dict[str, Any] = {}
        self.rejected: set[str] = set()
        self.commands: list[Any] = []  # every command the API published, decoded (envelopes opened)
        self.envelopes: list[RenewLeases] = []  # the RenewLeases records among them, as published
        self.mode = "up"  # up | down | queue_full | undecided
        self.shed_after_s = 0.0  # the API's admission control (TENURE_API_SHED_AFTER_MS); 0: off
        self.kafka_error: str | None = None
        self._parked: list[tuple[OutboundRecord, Future[int]]] = []
        self._offset = 0
        self._lock = threading.Lock()

    # --- the publisher the API sees -------------------------------------------------------------

    def publish(self, record: OutboundRecord) -> Future[int]:
        if self.mode == "queue_full":
            raise BufferError("Local: Queue full")
        future: Future[int] = Future()
        if self.mode == "down":
            self._parked.append((record, future))  # never acknowledged while the broker is away
            return future
        self._take(record, future)
        return future

    def reachable(self, timeout_s: float = 0.5) -> str | None:
        if self.mode == "down":
            return 'KafkaError{code=_TRANSPORT,val=-195,str="all brokers down"}'
        return self.kafka_error

    def close(self, timeout_s: float = 10.0) -> None:
        """Nothing to flush."""

    def back_up(self) -> None:
        """The broker is back: records produced during the outage are delivered now."""
        self.mode = "up"
        parked, self._parked = self._parked, []
        for record, future in parked:
            self._take(record, future)

    # --- what the processors do -------------------------------------------------------------------

    def _take(self, record: OutboundRecord, future: Future[int]) -> None:
        with self._lock:
            self._offset += 1
            offset = self._offset
            message = self.codec.decode(record.value)
            if isinstance(message, RenewLeases):
                self.envelopes.append(message)
                self.commands.extend(message.commands())
            else:
                self.commands.append(message)
            if isinstance(message, BlockChanged):
                self.blocks.apply(message)
            elif self.mode != "undecided":
                if isinstance(message, BREAKER_COMMAND_TYPES):
                    self._decide_breaker(message)
                elif isinstance(message, TRAJECTORY_COMMAND_TYPES):
                    self._decide_trajectory(message)
                elif isinstance(message, WATCHDOG_COMMAND_TYPES):
                    self._decide_watchdog(message)
                elif isinstance(message, RenewLeases):  # opened as the coordinator opens it
                    for command in message.commands():
                        self._decide_run(command)
                else:
                    self._decide_run(message)
        if not future.done():
            future.set_result(offset)

    def _decide_run(self, command: RunCommand) -> None:
        if command.command_id in self.rejected:
            return  # refused once, refused for good (as the processor does)
        now = self.clock.now_ms()
        state = self.run_states.get(command.run_id)
        decision = decide_run(state, command, now, blocked=self.blocks.blocked())
        if isinstance(decision, RunRejection):
            self.rejected.add(command.command_id)
            refusal = rejection_event(state, command, decision, now)
            self.run_book.deliver(command.command_id, Rejected(refusal))
            return
        for event in decision:
            state = evolve_run(state, event)
            self.run_views.apply([self._inbound(RUNS_EVENTS.name, event)])
        if state is not None:
            self.run_states[command.run_id] = state
        for event in decision:
            self.run_book.deliver(event.causation_id, Decided(event))

    def _refusal(self, command: Any, decision: Any, now: int) -> CommandRejected:
        after = decision.state
        return CommandRejected(
            event_id=derived_id("rej", command.command_id),
            run_id=command.run_id,
            occurred_at=now,
            causation_id=command.command_id,
            correlation_id=command.correlation_id,
            actor=command.actor,
            command_type=type(command).__name__,
            code=decision.code,
            detail=decision.detail,
            current_status=after.status.value if after is not None else None,
            current_version=after.version if after is not None else 0,
        )

    def _decide_watchdog(self, command: Any) -> None:
        if command.command_id in self.rejected:
            return
        now = self.clock.now_ms()
        state = self.watchdog_states.get(command.run_id)
        decision = decide_watchdog(state, command, now, self.watchdog_thresholds)
        if isinstance(decision, WatchdogRejection):
            self.rejected.add(command.command_id)
            self.watchdog_book.deliver(command.command_id, Rejected(self._refusal(command, decision, now)))
            return
        for event in decision:
            state = evolve_watchdog(state, event)
            self.watchdog_views.apply([self._inbound(WATCHDOG_EVENTS.name, event)])
        if state is not None:
            self.watchdog_states[command.run_id] = state
        for event in decision:
            self.watchdog_book.deliver(event.causation_id, Decided(event))
        for event in decision:
            if isinstance(event, InterventionIssued):
                # The watchdog processor's side output, in the same transaction (WD-5).
                self._decide_trajectory(intervention_command(event))

    def _decide_trajectory(self, command: Any) -> None:
        if command.command_id in self.rejected:
            return
        now = self.clock.now_ms()
        state = self.trajectory_states.get(command.run_id)
        decision = decide_trajectory(state, command, now, self.saga)
        if isinstance(decision, SagaRejection):
            self.rejected.add(command.command_id)
            self.trajectory_book.deliver(command.command_id, Rejected(self._refusal(command, decision, now)))
            return
        for event in decision:
            state = evolve_trajectory(state, event)
            self.trajectory_views.apply([self._inbound(TRAJECTORIES_EVENTS.name, event)])
        if state is not None:
            self.trajectory_states[command.run_id] = state
        for event in decision:
            self.trajectory_book.deliver(event.causation_id, Decided(event))

    def _decide_breaker(self, command: Any) -> None:
        if command.command_id in self.rejected:
            return
        now = self.clock.now_ms()
        state = self.breaker_states.get(command.run_id)
        decision = decide_breaker(state, command, now, self.breaker_policy)
        if isinstance(decision, BreakerRejection):
            self.rejected.add(command.command_id)
            self.breaker_book.deliver(command.command_id, Rejected(self._refusal(command, decision, now)))
            return
        self._breaker_events(command.run_id, decision)

    def _breaker_events(self, endpoint: str, events: Any) -> None:
        state = self.breaker_states.get(endpoint)
        for event in events:
            state = evolve_breaker(state, event)
            if self.breakers_seen:
                self.breakers.apply(event)
        if state is not None:
            self.breaker_states[endpoint] = state
        for event in events:
            self.breaker_book.deliver(event.causation_id, Decided(event))

    def breaker_timers(self, now_ms: int) -> None:
        """The breaker processor's timer tick at `now_ms` (half-opening, canary expiry)."""
        with self._lock:
            for endpoint, state in list(self.breaker_states.items()):
                self._breaker_events(endpoint, decide_breaker_timers(state, now_ms))

    def report_outcomes(self, endpoint: str, outcomes: list[str], instance: str = "gw-test") -> None:
        """A gateway instance reports calls to `endpoint` (RecordCallOutcome, as its client does)."""
        for outcome in outcomes:
            self._outcome_seq += 1
            command = RecordCallOutcome(
                command_id=derived_id("cmd", instance, "outcome", str(self._outcome_seq)),
                run_id=endpoint,
                issued_at=self.clock.now_ms(),
                correlation_id=endpoint,
                actor="tenure-gateway",
                instance_id=instance,
                seq=self._outcome_seq,
                outcome=outcome,
                duration_ms=5,
            )
            self.publish(breaker_command_record(self.codec, command))

    def _inbound(self, topic: str, event: Any) -> InboundRecord:
        out = self.codec.outbound(topic, event.run_id, event)
        self._offset += 1
        return InboundRecord(topic, 0, self._offset, out.key, out.value, (), self.clock.now_ms())

    def commands_of(self, kind: type[Any]) -> list[Any]:
        return [c for c in self.commands if isinstance(c, kind)]

    # --- the API's dependencies ------------------------------------------------------------------

    def dependencies(self, tmp: Path, api_keys: str = "", decision_timeout_s: float = 1.0) -> ApiDependencies:
        return ApiDependencies(
            publisher=self,
            decisions=self.run_book,
            views=ViewReader(tmp / "views", self.codec, store=self.store),
            codec=self.codec,
            clock=self.clock,
            api_keys=parse_api_keys(api_keys),
            decision_timeout_s=decision_timeout_s,
            shed_after_s=self.shed_after_s,
            objects=FilesystemObjectStore(tmp / "artifacts"),
            blocks=self.blocks,  # type: ignore[arg-type]
            trajectory_decisions=self.trajectory_book,
            watchdog_decisions=self.watchdog_book,
            breakers=self.breakers,
            breaker_client=BreakerClient(
                self, self.breaker_book, "tenure-command-api", codec=self.codec, clock=self.clock
            ),
            breaker_decisions=self.breaker_book,
            bulkheads=configured_bulkheads(TenureSettings()),
        )


@contextmanager
def api_client(
    tmp: Path, *, api_keys: str = "", decision_timeout_s: float = 1.0, tenure: InMemoryTenure | None = None
) -> Iterator[tuple[TestClient, InMemoryTenure]]:
    """A TestClient on the real app over an InMemoryTenure (started and stopped with the app)."""
    system = tenure or InMemoryTenure()
    app = create_app(lambda: system.dependencies(tmp, api_keys, decision_timeout_s))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, system
