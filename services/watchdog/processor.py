"""The watchdog processor: the semantic watchdog as a definition of the one aggregate runtime.

The commit path and its crash-safety argument are the runtime's (services/common/aggregate/
processor.py): commands from progress.observations, events to watchdog.events, refusals to
watchdog.rejections, state in RocksDB restored from the log. What is the watchdog's own:
  * its pure core (services/watchdog/domain): the detectors and the ladder in `decide`, with the
    deployment's thresholds as a value, and `evolve`;
  * routing: a run's observations must arrive on its run's partition (services.common.routing);
  * a side output in the SAME Kafka transaction as each InterventionIssued: the
    RecordWatchdogIntervention command that tells the run's trajectory (trajectories.commands,
    the run's partition). A crash cannot separate the two, and a restore sends nothing again:
    an intervention reaches the saga exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from services.common.aggregate import (
    AggregateDefinition,
    AggregateProcessor,
    Refused,
    StateCodec,
    StoreLayout,
)
from services.common.clock import Clock
from services.common.contracts import (
    WATCHDOG_COMMAND_TYPES,
    WATCHDOG_EVENT_TYPES,
    InterventionIssued,
    RecordWatchdogIntervention,
    WatchdogCommand,
    WatchdogEvent,
)
from services.common.eventlog import EventLog
from services.common.health import ProcessorMetrics
from services.common.ids import derived_id
from services.common.kafka import OutboundRecord
from services.common.messages import MessageCodec
from services.common.routing import partition_for_run, trajectory_command_record
from services.common.store import KeyValueStore
from services.common.topics import PROGRESS_OBSERVATIONS, WATCHDOG_EVENTS, WATCHDOG_REJECTIONS
from services.watchdog.domain import DEFAULT_THRESHOLDS, Rejection, Thresholds, WatchdogState, decide, evolve
from services.watchdog.metrics import WatchdogMetrics
from services.watchdog.state_codec import decode_state, encode_state

__all__ = ["ACTOR", "WatchdogDefinition", "WatchdogProcessor", "intervention_command"]

log = logging.getLogger("tenure.watchdog")
PROCESSOR = "watchdog"
ACTOR = "tenure-watchdog"
LAYOUT = StoreLayout(state_prefix="watchdog/")


def intervention_command(event: InterventionIssued) -> RecordWatchdogIntervention:
    """What the run's trajectory is told of an intervention; its id derives from the
    intervention's, so a redelivery is dropped by the trajectory (its `causes`)."""
    return RecordWatchdogIntervention(
        command_id=derived_id("cmd", event.intervention_id, "trajectory"),
        run_id=event.run_id,
        issued_at=event.occurred_at,
        correlation_id=event.correlation_id,
        actor=ACTOR,
        intervention_id=event.intervention_id,
        level=event.level,
        code=event.code,
        action_hash=event.action_hash,
        period=event.period,
        checkpoint_step=event.checkpoint_step,
        detector=event.detector,
        detail=(
            f"{event.detector} (k={event.period}) at watchdog turn {event.turn}, returned to step "
            f"{event.returned_to_step}; rollbacks {event.rollbacks_used}/{event.rollback_budget}"
        ),
        message=event.message,
    )


class WatchdogDefinition(AggregateDefinition[WatchdogState, WatchdogCommand, WatchdogEvent, None]):
    """The Watchdog aggregate (services/watchdog/domain) on progress.observations."""

    name = "watchdog"
    processor_name = PROCESSOR
    log = log
    events_topic = WATCHDOG_EVENTS.name
    rejections_topic = WATCHDOG_REJECTIONS.name
    command_types = WATCHDOG_COMMAND_TYPES
    event_types = WATCHDOG_EVENT_TYPES
    command_kind = "watchdog command"
    layout = LAYOUT
    state_codec = StateCodec(encode_state, decode_state)

    def __init__(self, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> None:
        self.thresholds = thresholds

    # The domain functions are looked up when called, so a test can replace them in this module.
    def decide(
        self, state: WatchdogState | None, command: WatchdogCommand, now_ms: int, context: None
    ) -> Sequence[WatchdogEvent] | Refused:
        decision = decide(state, command, now_ms, self.thresholds)
        if isinstance(decision, Rejection):
            return self.refused(command, decision.code.value, decision.detail, decision.state, now_ms)
        return decision

    def evolve(self, state: WatchdogState | None, event: WatchdogEvent) -> WatchdogState:
        return evolve(state, event)

    def expected_partition(self, aggregate_id: str) -> int:
        return partition_for_run(aggregate_id, PROGRESS_OBSERVATIONS.partitions)

    def transaction_outputs(
        self, event: WatchdogEvent, codec: MessageCodec, state: WatchdogState | None = None
    ) -> Sequence[OutboundRecord]:
        if not isinstance(event, InterventionIssued):
            return ()
        return (trajectory_command_record(codec, intervention_command(event)),)


class WatchdogProcessor(AggregateProcessor[WatchdogState, WatchdogCommand, WatchdogEvent, None]):
    """The watchdog's single writer: `handle` batches of progress.observations."""

    def __init__(
        self,
        event_log: EventLog,
        store: KeyValueStore,
        codec: MessageCodec,
        clock: Clock,
        thresholds: Thresholds = DEFAULT_THRESHOLDS,
        metrics: ProcessorMetrics | None = None,
    ) -> None:
        super().__init__(
            WatchdogDefinition(thresholds),
            event_log,
            store,
            codec,
            clock,
            metrics=metrics or ProcessorMetrics("watchdog"),
        )
        WatchdogMetrics(self.metrics)  # counts what each committed transaction holds
