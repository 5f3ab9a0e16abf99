"""The quarantine processor: a run's quarantine and a tenant's provenance graph on the one runtime.

The commit path and its crash-safety argument are the runtime's (services/common/aggregate/
processor.py): commands from quarantine.commands, events to quarantine.events, refusals to
quarantine.rejections, state in RocksDB restored from the log. What is the quarantine's own:

* intent before effect, in one transaction. QuarantineStarted is committed in the same Kafka
  transaction as the commands that carry out the control plane's stages: the lease takeover on
  runs.commands (stage 2, the epoch bump the lease coordinator decides; its command id is
  derived from the event, so a redelivery is the same takeover), the trajectory's freeze without
  compensation on trajectories.commands (a level-3 intervention with code RUN_QUARANTINED), and
  TaintRun to the tenant's graph (stage 4). Either the trigger and all of them are on the log, or
  none is: a SIGKILL of this process (or of the lease coordinator) leaves no stage half done,
  only stages that a restart decides again from the same commands;
* TaintPropagated records stage 4 back on the run (RecordQuarantineStage, same transaction), and
  QuarantineCleared lifts the taint in the graph (ClearArtifacts, same transaction);
* the executor's hook: stage 2 is recorded once the takeover shows in the gateway's fencing
  and the recipients were fenced (services/quarantine/executor.py); every quarantine that owes
  it is indexed, handed to the executor after each commit, after a restore and on every tick.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from services.common.aggregate import (
    AggregateDefinition,
    AggregateProcessor,
    Refused,
    StateCodec,
    StoreLayout,
)
from services.common.clock import Clock
from services.common.contracts import RecordWatchdogIntervention, TakeOverLease
from services.common.contracts.quarantine import (
    QUARANTINE_COMMAND_TYPES,
    QUARANTINE_EVENT_TYPES,
    ClearArtifacts,
    QuarantineCleared,
    QuarantineCommand,
    QuarantineEvent,
    QuarantineStarted,
    RecordQuarantineStage,
    TaintPropagated,
    TaintRun,
    graph_id,
)
from services.common.eventlog import EventLog
from services.common.health import ProcessorMetrics
from services.common.ids import canonical_json, derived_id
from services.common.kafka import OutboundRecord
from services.common.messages import MessageCodec
from services.common.routing import command_record, trajectory_command_record
from services.common.store import KeyValueStore
from services.common.topics import QUARANTINE_EVENTS, QUARANTINE_REJECTIONS
from services.quarantine.domain import AnyState, QuarantineState, Rejection, decide, evolve
from services.quarantine.routing import partition_for_aggregate, quarantine_command_record
from services.quarantine.state_codec import decode_state, encode_state

__all__ = [
    "ACTOR",
    "FREEZE_CODE",
    "LAYOUT",
    "QuarantineDefinition",
    "QuarantineProcessor",
    "owing_key",
    "takeover_command_id",
]

log = logging.getLogger("tenure.quarantine")
ACTOR = "tenure-quarantine"
# The code of the level-3 intervention that freezes a quarantined trajectory whatever its pivot
# state (services/saga_orchestrator/domain/interventions.py): no compensator runs.
FREEZE_CODE = "RUN_QUARANTINED"
LAYOUT = StoreLayout(state_prefix="quarantine/")
_OWING_PREFIX = "owing/"


def owing_key(partition: int, run_id: str) -> str:
    """Index entry of a quarantine whose stage 2 is not recorded yet (the executor's work)."""
    return f"{_OWING_PREFIX}{partition}/{run_id}"


def takeover_command_id(quarantine_event_id: str) -> str:
    return derived_id("cmd", quarantine_event_id, "revoke")


class QuarantineDefinition(AggregateDefinition[AnyState, QuarantineCommand, QuarantineEvent, None]):
    """Both aggregates of quarantine.commands (services/quarantine/domain)."""

    name = "quarantine"
    processor_name = "quarantine"
    log = log
    events_topic = QUARANTINE_EVENTS.name
    rejections_topic = QUARANTINE_REJECTIONS.name
    command_types = QUARANTINE_COMMAND_TYPES
    event_types = QUARANTINE_EVENT_TYPES
    command_kind = "quarantine command"
    layout = LAYOUT
    state_codec = StateCodec(encode_state, decode_state)

    def decide(
        self, state: AnyState | None, command: QuarantineCommand, now_ms: int, context: None
    ) -> Sequence[QuarantineEvent] | Refused:
        decision = decide(state, command, now_ms)
        if isinstance(decision, Rejection):
            return self.refused(command, decision.code.value, decision.detail, state, now_ms)
        return decision

    def evolve(self, state: AnyState | None, event: QuarantineEvent) -> AnyState:
        return evolve(state, event)

    def expected_partition(self, aggregate_id: str) -> int:
        return partition_for_aggregate(aggregate_id)

    def index_entries(self, partition: int, aggregate_id: str, state: AnyState | None) -> Mapping[str, bytes]:
        if isinstance(state, QuarantineState) and state.owes_revocation:
            return {owing_key(partition, aggregate_id): b""}
        return {}

    def transaction_outputs(
        self, event: QuarantineEvent, codec: MessageCodec, state: AnyState | None = None
    ) -> Sequence[OutboundRecord]:
        if isinstance(event, QuarantineStarted):
            return self._stages_of(event, codec)
        if isinstance(event, TaintPropagated):
            done = RecordQuarantineStage(
                **_header(event.tainted_run_id, derived_id("cmd", event.event_id, "stage"), event),
                stage="taint-propagated",
                mechanism="provenance-graph",
                completed_at=event.occurred_at,
                host_id=ACTOR,
                detail=canonical_json(
                    {
                        "graph": event.run_id,
                        "tainted": list(event.tainted),
                        "suspect": list(event.suspect),
                        "suspectRuns": list(event.suspect_runs),
                        "quarantineEventId": event.quarantine_event_id,
                    }
                ),
            )
            return (quarantine_command_record(codec, done),)
        if isinstance(event, QuarantineCleared) and isinstance(state, QuarantineState):
            lift = ClearArtifacts(
                # The clearer is the actor of record on the artifacts too (who cleared what).
                **_header(
                    graph_id(state.tenant), derived_id("cmd", event.event_id, "clear"), event, event.actor
                ),
                cleared_run_id=event.run_id,
                artifact_ids=event.artifact_ids,
                reason=event.reason,
                evidence=event.evidence,
                role=event.role,
            )
            return (quarantine_command_record(codec, lift),)
        return ()

    def _stages_of(self, event: QuarantineStarted, codec: MessageCodec) -> Sequence[OutboundRecord]:
        why = f"quarantine ({event.trigger}): {event.reason}"[:1000]
        takeover = TakeOverLease(
            **_header(event.run_id, takeover_command_id(event.event_id), event),
            reason=why,
            new_holder=ACTOR,
            holder_kind="runner",
        )
        freeze = RecordWatchdogIntervention(
            **_header(event.run_id, derived_id("cmd", event.event_id, "freeze"), event),
            intervention_id=derived_id("itv", event.event_id),
            level=3,
            code=FREEZE_CODE,
            action_hash="",
            period=0,
            checkpoint_step=-1,
            detector="quarantine",
            detail=why,
            message="[SYSTEM] RUN_QUARANTINED: this run is quarantined; stop.",
        )
        taint = TaintRun(
            **_header(graph_id(event.tenant), derived_id("cmd", event.event_id, "taint"), event),
            tainted_run_id=event.run_id,
            since_step=event.taint_from_step,
            since_at=event.taint_from_at,
            quarantine_event_id=event.event_id,
        )
        return (
            command_record(codec, takeover),
            trajectory_command_record(codec, freeze),
            quarantine_command_record(codec, taint),
        )


def _header(aggregate_id: str, command_id: str, event: QuarantineEvent, actor: str = ACTOR) -> dict[str, Any]:
    return {
        "command_id": command_id,
        "run_id": aggregate_id,
        "issued_at": event.occurred_at,
        "correlation_id": event.correlation_id,
        "actor": actor,
    }


class QuarantineProcessor(AggregateProcessor[AnyState, QuarantineCommand, QuarantineEvent, None]):
    """The single writer of quarantine.events; hands quarantines owing stage 2 to the executor."""

    def __init__(
        self,
        event_log: EventLog,
        store: KeyValueStore,
        codec: MessageCodec,
        clock: Clock,
        on_changed: Callable[[Sequence[AnyState]], None] = lambda states: None,
        metrics: ProcessorMetrics | None = None,
    ) -> None:
        super().__init__(
            QuarantineDefinition(),
            event_log,
            store,
            codec,
            clock,
            metrics=metrics or ProcessorMetrics("quarantine"),
            on_changed=on_changed,
        )

    def restore_partitions(self, partitions: set[int]) -> dict[int, int]:
        restored = super().restore_partitions(partitions)
        self.notify_changed(self.owing(partitions))
        return restored

    def rescan(self) -> int:
        """Every quarantine owing stage 2 to the executor again (a report that was lost)."""
        with self._lock:
            self._restore_missing()
            states = self.owing(self._assigned)
        self.notify_changed(states)
        return len(states)

    def owing(self, partitions: set[int]) -> list[AnyState]:
        states: list[AnyState] = []
        for partition in sorted(partitions):
            for key, _ in self._store.scan(f"{_OWING_PREFIX}{partition}/"):
                state = self.load(key.rsplit("/", 1)[-1])
                if state is not None:
                    states.append(state)
        return states
