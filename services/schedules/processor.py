"""The schedules processor: one Schedule per schedule id on the one aggregate runtime (EXE-14).

The commit path and its crash-safety argument are the runtime's (services/common/aggregate/
processor.py): commands from schedules.commands, events to schedules.events, refusals to
schedules.rejections, state in RocksDB restored from the log. What is the schedule's own:
  * its pure core (services/schedules/domain): decide/evolve and the firing timer at
    `next_run_at`, on this processor's clock (the coordinator's clock for schedules);
  * the run a firing starts: `transaction_outputs` puts the SubmitRun of every FiringDecided
    on runs.commands IN THE SAME Kafka transaction as the event. Intent and submission land
    together or not at all; a SIGKILL between deciding and committing leaves neither, and the
    next incarnation decides the same firing again under the same idempotency key (so the same
    run id: the coordinator answers a repeat with nothing). No window exists in which the intent
    is durable and the submission lost, so no "re-submit on restart" pass is needed;
  * an index schedrun/<runId> = scheduleId of the schedule's active runs, which the follower
    (services/schedules/follower.py) reads to tell each schedule how its runs ended.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from services.common.aggregate import (
    AggregateDefinition,
    AggregateProcessor,
    Refused,
    StateCodec,
    StoreLayout,
)
from services.common.clock import Clock
from services.common.contracts.schedules import (
    SCHEDULE_COMMAND_TYPES,
    SCHEDULE_EVENT_TYPES,
    FiringDecided,
    ScheduleCommand,
    ScheduleEvent,
)
from services.common.eventlog import EventLog
from services.common.health import ProcessorMetrics
from services.common.kafka import OutboundRecord
from services.common.messages import MessageCodec
from services.common.routing import command_record, partition_for_schedule
from services.common.store import KeyValueStore
from services.common.topics import SCHEDULES_COMMANDS, SCHEDULES_EVENTS, SCHEDULES_REJECTIONS
from services.schedules.domain import (
    Rejection,
    ScheduleState,
    decide,
    decide_timers,
    evolve,
    next_timer_at,
    submission,
)
from services.schedules.metrics import ScheduleMetrics
from services.schedules.state_codec import decode_state, encode_state

__all__ = ["LAYOUT", "RUN_INDEX_PREFIX", "ScheduleDefinition", "ScheduleProcessor"]

log = logging.getLogger("tenure.schedules")
PROCESSOR = "schedules"
LAYOUT = StoreLayout(state_prefix="schedule/")
RUN_INDEX_PREFIX = "schedrun/"


class ScheduleDefinition(AggregateDefinition[ScheduleState, ScheduleCommand, ScheduleEvent, None]):
    """The Schedule aggregate (services/schedules/domain) on schedules.commands."""

    name = "schedule"
    processor_name = PROCESSOR
    log = log
    events_topic = SCHEDULES_EVENTS.name
    rejections_topic = SCHEDULES_REJECTIONS.name
    command_types = SCHEDULE_COMMAND_TYPES
    event_types = SCHEDULE_EVENT_TYPES
    command_kind = "schedule command"
    layout = LAYOUT
    state_codec = StateCodec(encode_state, decode_state)
    has_timers = True

    def decide(
        self, state: ScheduleState | None, command: ScheduleCommand, now_ms: int, context: None
    ) -> Sequence[ScheduleEvent] | Refused:
        decision = decide(state, command, now_ms)
        if isinstance(decision, Rejection):
            return self.refused(command, decision.code.value, decision.detail, decision.state, now_ms)
        return decision

    def evolve(self, state: ScheduleState | None, event: ScheduleEvent) -> ScheduleState:
        return evolve(state, event)

    def expected_partition(self, aggregate_id: str) -> int:
        return partition_for_schedule(aggregate_id, SCHEDULES_COMMANDS.partitions)

    def next_timer_at(self, state: ScheduleState | None) -> int | None:
        return next_timer_at(state)

    def decide_timers(self, state: ScheduleState, now_ms: int) -> Sequence[ScheduleEvent]:
        return decide_timers(state, now_ms)

    def index_entries(
        self, partition: int, aggregate_id: str, state: ScheduleState | None
    ) -> Mapping[str, bytes]:
        if state is None:
            return {}
        return {f"{RUN_INDEX_PREFIX}{run_id}": aggregate_id.encode() for run_id in state.active_runs}

    def transaction_outputs(
        self, event: ScheduleEvent, codec: MessageCodec, state: ScheduleState | None = None
    ) -> Sequence[OutboundRecord]:
        if isinstance(event, FiringDecided) and state is not None:
            return [command_record(codec, submission(state, event))]
        return ()


class ScheduleProcessor(AggregateProcessor[ScheduleState, ScheduleCommand, ScheduleEvent, None]):
    """The schedules' single writer: `handle` batches of schedules.commands, `tick` the firings."""

    def __init__(
        self,
        event_log: EventLog,
        store: KeyValueStore,
        codec: MessageCodec,
        clock: Clock,
        metrics: ProcessorMetrics | None = None,
    ) -> None:
        super().__init__(
            ScheduleDefinition(),
            event_log,
            store,
            codec,
            clock,
            metrics=metrics or ProcessorMetrics("schedule"),
        )
        ScheduleMetrics(self.metrics)  # counts what each committed transaction holds
