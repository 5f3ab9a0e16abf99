"""The trajectory command processor: the saga as a definition of the one aggregate runtime.

The commit path and its crash-safety argument are the runtime's (services/common/aggregate/
processor.py). What is the Trajectory's own:
  * its pure core: `decide` with the tool catalog, the recovery policy and the repair
    statistics (REC-4), and `evolve`;
  * the active-trajectory index `active/<partition>/<runId>` (one entry per live saga), from
    which a restore or a rescan hands the live trajectories to the executor;
  * the repair statistics: a batch context that accumulates what each repair dispatch taught
    (P(success | error kind)) across the batch and persists it under `stats/repairs`;
  * side outputs (REC-7): an IncidentResolved is copied to tenure.incidents inside the batch's
    transaction; an IncidentOpened naming the exact offset of each TrajectoryFrozen is published
    after the commit and again when a restore folds it (consumers drop repeats by incidentId);
  * the executor's hook: the changed trajectories are handed to it after the store write;
  * the semantic watchdog's input (WD-1): an ObserveStep for every step outcome it records
    (StepCommitted, StepFailed), on progress.observations in the same transaction;
  * provenance (QUA-2): a committed step's output is registered as an artifact of the run's
    tenant's graph (services/saga_orchestrator/step_artifacts.py), RegisterArtifact on
    quarantine.commands in the same transaction as StepCommitted: the commit and its envelope
    are on the log together or not at all, and a quarantine's taint window reaches the step.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence

from services.common.aggregate import (
    AggregateDefinition,
    AggregateProcessor,
    BatchContext,
    Refused,
    StateCodec,
    StoreLayout,
    Transition,
)
from services.common.aggregate import BatchOutcome as _BatchOutcome
from services.common.clock import Clock
from services.common.contracts import (
    MAX_SUMMARY_CHARS,
    TRAJECTORY_COMMAND_TYPES,
    TRAJECTORY_EVENT_TYPES,
    IncidentOpened,
    IncidentResolved,
    ObserveStep,
    StepCommitted,
    StepFailed,
    TrajectoryCommand,
    TrajectoryEvent,
    TrajectoryFrozen,
)
from services.common.eventlog import EventLog
from services.common.health import ProcessorMetrics
from services.common.ids import STATE_HASH_PATTERN, action_hash, derived_id
from services.common.kafka import OutboundRecord
from services.common.messages import MessageCodec
from services.common.routing import observation_record
from services.common.store import KeyValueStore
from services.common.topics import INCIDENTS, TRAJECTORIES_EVENTS, TRAJECTORIES_REJECTIONS
from services.quarantine.routing import quarantine_command_record
from services.saga_orchestrator.domain import (
    RecoveryPolicy,
    Rejection,
    RepairStats,
    SagaContext,
    ToolCatalog,
    TrajectoryState,
    decide,
    evolve,
    pending_work,
)
from services.saga_orchestrator.metrics import RecoveryMetrics
from services.saga_orchestrator.state_codec import decode_state, encode_state
from services.saga_orchestrator.step_artifacts import step_artifact

__all__ = [
    "BatchOutcome",
    "RepairStatistics",
    "TrajectoryDefinition",
    "TrajectoryProcessor",
    "active_key",
    "repair_observation",
    "step_observation",
]

log = logging.getLogger("tenure.saga_orchestrator")
PROCESSOR = "saga orchestrator"
LAYOUT = StoreLayout(state_prefix="trajectory/")
_PROCESS_STARTED = time.time()
_STATS_KEY = "stats/repairs"
_ACTIVE_PREFIX = "active/"
_STATE_HASH = re.compile(STATE_HASH_PATTERN)
# Who the saga's observations are from (the executor signs its commands the same way).
ACTOR = "tenure-saga-orchestrator"


def active_key(partition: int, run_id: str) -> str:
    return f"{_ACTIVE_PREFIX}{partition}/{run_id}"


def repair_observation(before: TrajectoryState | None, event: TrajectoryEvent) -> tuple[str, bool] | None:
    """(error kind, succeeded) when `event` ends a repair dispatch: the data P(success) is made of."""
    if before is None or not isinstance(event, (StepCommitted, StepFailed)):
        return None
    step = before.step(event.step_index)
    if step is None or not step.repairing_kind or step.dispatch != event.dispatch:
        return None
    return step.repairing_kind, isinstance(event, StepCommitted)


def _reported_state_hash(output: str) -> str:
    """The state hash a tool put in its output ("stateHash", WD-1), else "" (unknown)."""
    if '"stateHash"' not in output:
        return ""
    try:
        value = json.loads(output)
    except ValueError:
        return ""
    found = value.get("stateHash") if isinstance(value, dict) else None
    return found if isinstance(found, str) and _STATE_HASH.fullmatch(found) else ""


def step_observation(event: TrajectoryEvent, state: TrajectoryState | None) -> ObserveStep | None:
    """The watchdog's observation of a dispatched step whose outcome `event` records (WD-1).

    The step number is the outcome event's trajectory version (strictly increasing per run); the
    action hash is the one the saga refuses proposals by (tool + canonical params, WD-4); a
    failure the recovery policy classified transient (REC-2) is reported as such, so the
    watchdog leaves it to the breakers."""
    if state is None or not isinstance(event, (StepCommitted, StepFailed)):
        return None
    step = state.step(event.step_index)
    if step is None:
        return None
    if isinstance(event, StepCommitted):
        error_kind, summary, state_hash = "none", event.output, _reported_state_hash(event.output)
    else:
        error_kind = "transient" if event.error_class == "transient" else "application"
        summary = f"{event.error_kind} ({event.error_status}): {event.error_message}"
        state_hash = ""
    return ObserveStep(
        command_id=derived_id("obs", event.event_id),
        run_id=event.run_id,
        issued_at=event.occurred_at,
        correlation_id=event.correlation_id,
        actor=ACTOR,
        source="saga",
        step_seq=event.version,
        tool=step.tool,
        action_hash=action_hash(step.tool, json.loads(step.params or "{}")),
        state_hash=state_hash,
        summary=summary[:MAX_SUMMARY_CHARS],
        error_kind=error_kind,
        mutating=True,
    )


class BatchOutcome(_BatchOutcome):
    """The runtime's counts; `incidents`: the IncidentOpened records published after the commit."""

    @property
    def incidents(self) -> int:
        return self.published


class RepairStatistics(BatchContext[TrajectoryState, TrajectoryCommand, TrajectoryEvent, SagaContext]):
    """The repair statistics as one batch sees them: those stored, plus what its repairs taught."""

    def __init__(self, definition: TrajectoryDefinition) -> None:
        self._definition = definition
        self.stats = definition.repair_stats

    def decide_context(self, command: TrajectoryCommand, state: TrajectoryState | None) -> SagaContext:
        return SagaContext(self._definition.catalog, self._definition.policy, self.stats)

    def accept(
        self, partition: int, transitions: Sequence[Transition[TrajectoryState, TrajectoryEvent]]
    ) -> None:
        stats = self.stats
        for transition in transitions:
            observed = repair_observation(transition.before, transition.event)
            if observed is not None:
                stats = stats.observe(*observed)
        self.stats = stats

    def writes(self) -> tuple[Mapping[str, bytes], Sequence[str]]:
        if self.stats == self._definition.repair_stats:
            return {}, ()
        return {_STATS_KEY: json.dumps(self.stats.to_json()).encode()}, ()

    def committed(self) -> None:
        # Kept in memory from here on: a batch must not re-read and re-decode it.
        self._definition.repair_stats = self.stats


def load_repair_stats(store: KeyValueStore) -> RepairStats:
    raw = store.get(_STATS_KEY)
    return RepairStats.from_json(json.loads(raw)) if raw is not None else RepairStats()


class TrajectoryDefinition(
    AggregateDefinition[TrajectoryState, TrajectoryCommand, TrajectoryEvent, SagaContext]
):
    """The Trajectory aggregate (services/saga_orchestrator/domain) on trajectories.commands."""

    name = "trajectory"
    processor_name = PROCESSOR
    log = log
    events_topic = TRAJECTORIES_EVENTS.name
    rejections_topic = TRAJECTORIES_REJECTIONS.name
    command_types = TRAJECTORY_COMMAND_TYPES
    event_types = TRAJECTORY_EVENT_TYPES
    command_kind = "trajectory command"
    layout = LAYOUT
    state_codec = StateCodec(encode_state, decode_state)

    def __init__(self, catalog: ToolCatalog, policy: RecoveryPolicy, repair_stats: RepairStats) -> None:
        self.catalog = catalog
        self.policy = policy
        self.repair_stats = repair_stats

    # The domain functions are looked up when called, so a test can replace them in this module.
    def decide(
        self, state: TrajectoryState | None, command: TrajectoryCommand, now_ms: int, context: SagaContext
    ) -> Sequence[TrajectoryEvent] | Refused:
        decision = decide(state, command, now_ms, context)
        if isinstance(decision, Rejection):
            return self.refused(command, decision.code.value, decision.detail, decision.state, now_ms)
        return decision

    def evolve(self, state: TrajectoryState | None, event: TrajectoryEvent) -> TrajectoryState:
        return evolve(state, event)

    def index_entries(
        self, partition: int, aggregate_id: str, state: TrajectoryState | None
    ) -> Mapping[str, bytes]:
        if state is None or (state.status.is_terminal and pending_work(state) is None):
            return {}  # an ended trajectory stays live while it owes work (WD-5: a lease revocation)
        return {active_key(partition, aggregate_id): b""}

    def begin(self, store: KeyValueStore) -> RepairStatistics:
        return RepairStatistics(self)

    def transaction_outputs(
        self, event: TrajectoryEvent, codec: MessageCodec, state: TrajectoryState | None = None
    ) -> Sequence[OutboundRecord]:
        if isinstance(event, IncidentResolved):
            return (codec.outbound(INCIDENTS.name, event.run_id, event),)
        outputs: list[OutboundRecord] = []
        observed = step_observation(event, state)
        if observed is not None:
            # WD-1: the semantic watchdog sees every step the saga dispatched, in the same
            # transaction as its outcome, on the run's partition of progress.observations.
            outputs.append(observation_record(codec, observed))
        if isinstance(event, StepCommitted):
            artifact = step_artifact(event, state, ACTOR)
            if artifact is not None:
                outputs.append(quarantine_command_record(codec, artifact))
        return tuple(outputs)

    def published_outputs(
        self, event: TrajectoryEvent, partition: int, offset: int, codec: MessageCodec
    ) -> Sequence[OutboundRecord]:
        if not isinstance(event, TrajectoryFrozen):
            return ()
        incident = IncidentOpened(
            incident_id=event.incident_id,
            run_id=event.run_id,
            occurred_at=event.occurred_at,
            failure_mode=event.failure_mode,
            failed_step=event.failed_step,
            failed_tool=event.failed_tool,
            error_context=event.error_context,
            uncompensated=event.uncompensated,
            snapshot_ref=event.snapshot_ref,
            log_topic=TRAJECTORIES_EVENTS.name,
            log_partition=partition,
            log_offset=offset,
        )
        return (codec.outbound(INCIDENTS.name, event.run_id, incident),)


class TrajectoryProcessor(
    AggregateProcessor[TrajectoryState, TrajectoryCommand, TrajectoryEvent, SagaContext]
):
    """The saga's single writer; hands live trajectories to the executor (`on_changed`)."""

    outcome_type = BatchOutcome
    definition: TrajectoryDefinition

    def __init__(
        self,
        event_log: EventLog,
        store: KeyValueStore,
        codec: MessageCodec,
        clock: Clock,
        catalog: ToolCatalog,
        policy: RecoveryPolicy | None = None,
        on_changed: Callable[[Sequence[TrajectoryState]], None] = lambda states: None,
        metrics: ProcessorMetrics | None = None,
    ) -> None:
        definition = TrajectoryDefinition(catalog, policy or RecoveryPolicy(), load_repair_stats(store))
        super().__init__(
            definition,
            event_log,
            store,
            codec,
            clock,
            metrics=metrics or ProcessorMetrics("trajectory"),
            on_changed=on_changed,
        )
        RecoveryMetrics(self.metrics)  # counts what each committed transaction holds

    def restore_partitions(self, partitions: set[int]) -> dict[int, int]:
        """Restore, then hand every live trajectory of `partitions` to the executor."""
        started = time.monotonic()
        restored = super().restore_partitions(partitions)
        log.info(
            "partitions %s assigned and restored in %.3f s (%.3f s after the process started)",
            sorted(partitions),
            time.monotonic() - started,
            time.time() - _PROCESS_STARTED,
        )
        self.notify_changed(self.active_states(partitions))
        return restored

    def rescan(self) -> int:
        """Hand every live trajectory of the owned partitions to the executor again.

        Work whose report was lost (a publish that failed, a crash of the executor's thread) is
        picked up here; work already in flight or just finished is skipped by the executor."""
        with self._lock:
            self._restore_missing()
            states = self.active_states(self._assigned)
        self.notify_changed(states)
        return len(states)

    def stats(self) -> RepairStats:
        return self.definition.repair_stats

    def active_states(self, partitions: set[int]) -> list[TrajectoryState]:
        states = []
        for partition in sorted(partitions):
            for key, _ in self._store.scan(f"{_ACTIVE_PREFIX}{partition}/"):
                state = self.load(key.rsplit("/", 1)[-1])
                if state is not None:
                    states.append(state)
        return states
