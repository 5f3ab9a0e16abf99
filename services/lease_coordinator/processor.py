"""The Run command processor: the Run aggregate as a definition of the one aggregate runtime.

The commit path and its crash-safety argument are the runtime's (services/common/aggregate/
processor.py). What is the Run's own:
  * its pure core: `decide` (with the lease policy, the tenant's reservations and the block
    list) and `evolve`, and `decide_timers` for the lease and deadline timers (LEASE-5, EXE-10),
    indexed by `next_timer_at`;
  * admission (EXE-2): a batch context that knows each tenant's reservations, the sum of the
    stored `tenant/<tenant>/<partition>` counts and what the batch has changed so far, and
    persists the batch's changes to those counts in the batch's one store write;
  * routing: a run's commands must arrive on its tenant shard's partition (services.common.
    routing), or they are counted as misrouted;
  * RenewLeases envelopes (issue 16): a batch renewal's RenewLease commands of one partition
    in one record, each decided as if it had come alone (services/common/aggregate/envelopes.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from services.common.aggregate import (
    AggregateDefinition,
    AggregateProcessor,
    BatchContext,
    BatchOutcome,
    Refused,
    StateCodec,
    StoreLayout,
    Transition,
)
from services.common.clock import Clock
from services.common.contracts import (
    COMMAND_TYPES,
    EVENT_TYPES,
    ClaimRun,
    LeaseRenewed,
    RenewLeases,
    RunCommand,
    RunEvent,
    SubmitRun,
)
from services.common.eventlog import EventLog
from services.common.frozen import replace as replace_fields
from services.common.health import ProcessorMetrics
from services.common.messages import MessageCodec
from services.common.routing import partition_for_run
from services.common.store import KeyValueStore
from services.common.topics import RUNS_COMMANDS, RUNS_EVENTS, RUNS_REJECTIONS, RUNS_RENEWALS, RUNS_STATES
from services.lease_coordinator.domain import (
    DEFAULT_POLICY,
    LeasePolicy,
    Rejection,
    RunState,
    TenantLoad,
    decide,
    decide_timers,
    evolve,
    is_keepalive,
    next_timer_at,
    rejection_event,
    reservations,
)
from services.lease_coordinator.metrics import LeaseMetrics
from services.lease_coordinator.state_codec import STATE_FORMAT, decode_state, encode_state

__all__ = [
    "BatchOutcome",
    "RunCommandProcessor",
    "RunDefinition",
    "TenantLoads",
    "checkpoint_key",
    "rejected_key",
    "state_key",
    "timer_failed_key",
    "timer_key",
]

log = logging.getLogger("tenure.lease_coordinator")
PROCESSOR = "lease coordinator"
LAYOUT = StoreLayout(state_prefix="run/")
# tenant/<tenant>/<partition> = "queued,active": the tenant's reservations held in that partition.
_TENANT_PREFIX = "tenant/"

# What the Run's `decide` needs besides state, command and time: (the tenant's reservations, for
# the commands that take one; the block policy's subjects).
Admission = tuple[TenantLoad | None, frozenset[str]]


def state_key(run_id: str) -> str:
    return LAYOUT.state_key(run_id)


def checkpoint_key(partition: int, topic: str = RUNS_EVENTS.name) -> str:
    return LAYOUT.checkpoint_key(topic, partition)


def rejected_key(command_id: str) -> str:
    return LAYOUT.rejected_key(command_id)


def timer_key(partition: int, due_ms: int, run_id: str) -> str:
    return LAYOUT.timer_key(partition, due_ms, run_id)


def timer_failed_key(run_id: str) -> str:
    return LAYOUT.timer_failed_key(run_id)


class TenantLoads(BatchContext[RunState, RunCommand, RunEvent, Admission]):
    """Each tenant's reservations for admission (EXE-2): the stored counts plus this batch's."""

    def __init__(self, store: KeyValueStore, blocked: Callable[[], frozenset[str]]) -> None:
        self._store = store
        self._blocked = blocked
        # (tenant, partition) -> [queued, active] change made by this batch
        self.delta: dict[tuple[str, int], list[int]] = {}

    def decide_context(self, command: RunCommand, state: RunState | None) -> Admission:
        return self._tenant_load(command, state), self._blocked()

    def _tenant_load(self, command: RunCommand, state: RunState | None) -> TenantLoad | None:
        """The tenant's reservations, for the two commands that take one."""
        if isinstance(command, SubmitRun):
            tenant = command.tenant
        elif isinstance(command, ClaimRun) and state is not None:
            tenant = state.tenant
        else:
            return None
        queued, active = 0, 0
        for _, raw in self._store.scan(f"{_TENANT_PREFIX}{tenant}/"):
            stored_queued, stored_active = (int(x) for x in raw.decode().split(","))
            queued += stored_queued
            active += stored_active
        for (delta_tenant, _), (dq, da) in self.delta.items():
            if delta_tenant == tenant:
                queued += dq
                active += da
        return TenantLoad(queued, active)

    def accept(self, partition: int, transitions: Sequence[Transition[RunState, RunEvent]]) -> None:
        # The reservation change of several events telescopes: first and last state suffice.
        old, new = reservations(transitions[0].before), reservations(transitions[-1].after)
        if old != new:
            delta = self.delta.setdefault((transitions[-1].after.tenant, partition), [0, 0])
            delta[0] += new.queued - old.queued
            delta[1] += new.active - old.active

    def accept_state(self, partition: int, state: RunState) -> None:
        # The fold of a run's events telescopes to its last state's reservations (see `accept`).
        # Its submission reserved a place, so the fold always wrote the tenant's count, even one
        # that is back at 0,0: so does this.
        delta = self.delta.setdefault((state.tenant, partition), [0, 0])
        now = reservations(state)
        delta[0] += now.queued
        delta[1] += now.active

    def writes(self) -> tuple[Mapping[str, bytes], Sequence[str]]:
        puts = {}
        for (tenant, partition), (dq, da) in self.delta.items():
            key = f"{_TENANT_PREFIX}{tenant}/{partition}"
            raw = self._store.get(key)
            queued, active = (int(x) for x in raw.decode().split(",")) if raw else (0, 0)
            puts[key] = f"{queued + dq},{active + da}".encode()
        return puts, ()


class RunDefinition(AggregateDefinition[RunState, RunCommand, RunEvent, Admission]):
    """The Run aggregate (services/lease_coordinator/domain) on runs.commands."""

    name = "run"
    processor_name = PROCESSOR
    log = log
    events_topic = RUNS_EVENTS.name
    rejections_topic = RUNS_REJECTIONS.name
    changelog_topic = RUNS_STATES.name
    # Renewals of an active lease between two on runs.events (LeasePolicy.keepalive_fraction).
    keepalive_topic = RUNS_RENEWALS.name
    # The layout of encode_state's JSON: a restore ignores changelog states of another one.
    state_format = STATE_FORMAT
    command_types = COMMAND_TYPES
    # A runner host's renewals of one partition's runs in one record (services.common.routing).
    envelope_types = (RenewLeases,)
    event_types = EVENT_TYPES
    command_kind = "Run command"
    layout = LAYOUT
    state_codec = StateCodec(encode_state, decode_state)
    has_timers = True

    def __init__(self, policy: LeasePolicy, blocked: Callable[[], frozenset[str]]) -> None:
        self.policy = policy
        self.blocked = blocked

    # The domain functions are looked up when called, so a test can replace them in this module.
    def decide(
        self, state: RunState | None, command: RunCommand, now_ms: int, context: Admission
    ) -> Sequence[RunEvent] | Refused:
        load, blocked = context
        decision = decide(state, command, now_ms, self.policy, load, blocked)
        if isinstance(decision, Rejection):
            return Refused(rejection_event(state, command, decision, now_ms))
        return decision

    def evolve(self, state: RunState | None, event: RunEvent) -> RunState:
        return evolve(state, event)

    def commands_in(self, envelope: RenewLeases) -> Sequence[RunCommand]:
        return envelope.commands()

    def is_keepalive(self, durable: RunState, events: Sequence[RunEvent]) -> bool:
        return is_keepalive(durable, events, self.policy)

    def replaces_kept(self, events: Sequence[RunEvent]) -> bool:
        # A renewal's event holds the command's sequence and `now + TTL`: what a kept renewal
        # changed (the last sequence, the expiry) only decided whether it was accepted.
        return len(events) == 1 and isinstance(events[0], LeaseRenewed) and not events[0].run_started

    def at_version(self, state: RunState, version: int) -> RunState:
        return replace_fields(state, version=version)

    def expected_partition(self, aggregate_id: str) -> int:
        return partition_for_run(aggregate_id, RUNS_COMMANDS.partitions)

    def next_timer_at(self, state: RunState | None) -> int | None:
        return next_timer_at(state)

    def decide_timers(self, state: RunState, now_ms: int) -> Sequence[RunEvent]:
        return decide_timers(state, now_ms, self.policy)

    def begin(self, store: KeyValueStore) -> TenantLoads:
        return TenantLoads(store, self.blocked)


class RunCommandProcessor(AggregateProcessor[RunState, RunCommand, RunEvent, Admission]):
    """The Run processor: `handle` batches of runs.commands, `tick` the lease timers."""

    def __init__(
        self,
        event_log: EventLog,
        store: KeyValueStore,
        codec: MessageCodec,
        clock: Clock,
        policy: LeasePolicy = DEFAULT_POLICY,
        blocked: Callable[[], frozenset[str]] = frozenset,
        metrics: ProcessorMetrics | None = None,
        *,
        changelog_every_ms: int = 0,
    ) -> None:
        super().__init__(
            RunDefinition(policy, blocked),
            event_log,
            store,
            codec,
            clock,
            metrics=metrics or ProcessorMetrics("run"),
            changelog_every_ms=changelog_every_ms,  # services/common/aggregate/changelog_lag.py
        )
        LeaseMetrics(self.metrics)  # counts what each committed transaction holds
