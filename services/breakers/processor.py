"""The breaker processor: one circuit breaker per tool endpoint on the one aggregate runtime.

The commit path and its crash-safety argument are the runtime's (services/common/aggregate/
processor.py): commands from breakers.commands, events to breakers.events, refusals to
breakers.rejections, state in RocksDB restored from the log. What is the breaker's own:
  * its pure core (services/breakers/domain): `decide` with the deployment's policy as a value,
    `evolve`, and the timers: the end of the cooldown (Open -> Half-open) and the end of the
    canary's lease (the slot is free again), indexed by `next_timer_at`;
  * routing: an endpoint's commands must arrive on the partition its id hashes to
    (services.common.routing `partition_for_endpoint`), or they are counted as misrouted.

The aggregate id is the endpoint id, in the header's `run_id` slot (the runtime's default
`aggregate_id` reads it there); see services/common/contracts/breakers.py.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from services.breakers.domain import (
    DEFAULT_POLICY,
    BreakerPolicy,
    BreakerState,
    Rejection,
    decide,
    decide_timers,
    evolve,
    next_timer_at,
)
from services.breakers.metrics import BreakerStateCollector
from services.breakers.state_codec import decode_state, encode_state
from services.common.aggregate import (
    AggregateDefinition,
    AggregateProcessor,
    Refused,
    StateCodec,
    StoreLayout,
)
from services.common.clock import Clock
from services.common.contracts import (
    BREAKER_COMMAND_TYPES,
    BREAKER_EVENT_TYPES,
    BreakerCommand,
    BreakerEvent,
)
from services.common.eventlog import EventLog
from services.common.health import ProcessorMetrics
from services.common.messages import MessageCodec
from services.common.routing import partition_for_endpoint
from services.common.store import KeyValueStore
from services.common.topics import BREAKERS_COMMANDS, BREAKERS_EVENTS, BREAKERS_REJECTIONS

__all__ = ["LAYOUT", "BreakerDefinition", "BreakerProcessor"]

log = logging.getLogger("tenure.breakers")
PROCESSOR = "breakers"
LAYOUT = StoreLayout(state_prefix="breaker/")


class BreakerDefinition(AggregateDefinition[BreakerState, BreakerCommand, BreakerEvent, None]):
    """The Breaker aggregate (services/breakers/domain) on breakers.commands."""

    name = "breaker"
    processor_name = PROCESSOR
    log = log
    events_topic = BREAKERS_EVENTS.name
    rejections_topic = BREAKERS_REJECTIONS.name
    command_types = BREAKER_COMMAND_TYPES
    event_types = BREAKER_EVENT_TYPES
    command_kind = "breaker command"
    layout = LAYOUT
    state_codec = StateCodec(encode_state, decode_state)
    has_timers = True

    def __init__(self, policy: BreakerPolicy = DEFAULT_POLICY) -> None:
        self.policy = policy

    # The domain functions are looked up when called, so a test can replace them in this module.
    def decide(
        self, state: BreakerState | None, command: BreakerCommand, now_ms: int, context: None
    ) -> Sequence[BreakerEvent] | Refused:
        decision = decide(state, command, now_ms, self.policy)
        if isinstance(decision, Rejection):
            return self.refused(command, decision.code.value, decision.detail, decision.state, now_ms)
        return decision

    def evolve(self, state: BreakerState | None, event: BreakerEvent) -> BreakerState:
        return evolve(state, event)

    def expected_partition(self, aggregate_id: str) -> int:
        return partition_for_endpoint(aggregate_id, BREAKERS_COMMANDS.partitions)

    def next_timer_at(self, state: BreakerState | None) -> int | None:
        return next_timer_at(state)

    def decide_timers(self, state: BreakerState, now_ms: int) -> Sequence[BreakerEvent]:
        return decide_timers(state, now_ms)


class BreakerProcessor(AggregateProcessor[BreakerState, BreakerCommand, BreakerEvent, None]):
    """The breakers' single writer: `handle` batches of breakers.commands, `tick` the timers."""

    def __init__(
        self,
        event_log: EventLog,
        store: KeyValueStore,
        codec: MessageCodec,
        clock: Clock,
        policy: BreakerPolicy = DEFAULT_POLICY,
        metrics: ProcessorMetrics | None = None,
    ) -> None:
        super().__init__(
            BreakerDefinition(policy),
            event_log,
            store,
            codec,
            clock,
            metrics=metrics or ProcessorMetrics("breaker"),
        )
        BreakerStateCollector(self.owned_states).register(self.metrics.registry)

    def owned_states(self) -> list[BreakerState]:
        """The breakers of the partitions this instance owns, as stored (for /metrics)."""
        owned = self.restored_partitions()
        states = (decode_state(raw) for _, raw in self._store.scan(LAYOUT.state_prefix))
        partitions = BREAKERS_COMMANDS.partitions
        return [s for s in states if partition_for_endpoint(s.endpoint, partitions) in owned]
