"""The trajectory command processor: the saga's single writer, restored from its own log.

Commit order for one batch (each step can be cut by SIGKILL; the argument of the Run processor,
services/lease_coordinator/processor.py, applies unchanged):
  1. Before the first command of a partition, restore: fold trajectories.events and
     trajectories.rejections of that partition from the stored checkpoints to their end (the
     transactional writer was initialised first, fencing any previous incarnation). Every
     TrajectoryFrozen folded here has its incident published again (step 4 may not have run).
  2. Decide every command against the restored state (pure `decide`).
  3. Commit the events, rejections and dead letters in ONE Kafka transaction.
  4. Publish an IncidentOpened for every TrajectoryFrozen of the batch, naming its exact offset
     (tenure.incidents is at-least-once; consumers drop repeats by incidentId).
  5. Write states, the active-trajectory index, refused ids, repair statistics and checkpoints in
     ONE RocksDB write; then hand the changed trajectories to the executor; then acknowledge.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from services.common.clock import Clock
from services.common.contracts import (
    TRAJECTORY_COMMAND_TYPES,
    TRAJECTORY_EVENT_TYPES,
    CommandRejected,
    IncidentOpened,
    IncidentResolved,
    StepCommitted,
    StepFailed,
    TrajectoryCommand,
    TrajectoryEvent,
    TrajectoryFrozen,
)
from services.common.eventlog import EventLog
from services.common.ids import derived_id
from services.common.kafka import InboundRecord, OutboundRecord
from services.common.messages import MessageCodec, UndecodableRecord, command_or_deadletter
from services.common.sequencing import Sequencing, sequence
from services.common.store import KeyValueStore
from services.common.topics import DEADLETTER, INCIDENTS, TRAJECTORIES_EVENTS, TRAJECTORIES_REJECTIONS
from services.saga_orchestrator.domain import (
    RecoveryPolicy,
    Rejection,
    RepairStats,
    SagaContext,
    ToolCatalog,
    TrajectoryState,
    decide,
    evolve,
)
from services.saga_orchestrator.state_codec import decode_state, encode_state

__all__ = ["BatchOutcome", "TrajectoryProcessor", "repair_observation"]

log = logging.getLogger("tenure.saga_orchestrator")
_PROCESS_STARTED = time.time()
_STATS_KEY = "stats/repairs"


def repair_observation(before: TrajectoryState | None, event: TrajectoryEvent) -> tuple[str, bool] | None:
    """(error kind, succeeded) when `event` ends a repair dispatch: the data P(success) is made of."""
    if before is None or not isinstance(event, (StepCommitted, StepFailed)):
        return None
    step = before.step(event.step_index)
    if step is None or not step.repairing_kind or step.dispatch != event.dispatch:
        return None
    return step.repairing_kind, isinstance(event, StepCommitted)


@dataclass
class BatchOutcome:
    commands: int = 0
    events: int = 0
    rejections: int = 0
    deadlettered: int = 0
    duplicates: int = 0
    incidents: int = 0


@dataclass
class _Changes:
    partition_of: dict[str, int] = field(default_factory=dict)
    after: dict[str, TrajectoryState] = field(default_factory=dict)
    rejected: set[str] = field(default_factory=set)
    checkpoints: dict[str, int] = field(default_factory=dict)
    stats: RepairStats | None = None


def _checkpoint_key(topic: str, partition: int) -> str:
    return f"checkpoint/{topic}/{partition}"


class TrajectoryProcessor:
    def __init__(
        self,
        event_log: EventLog,
        store: KeyValueStore,
        codec: MessageCodec,
        clock: Clock,
        catalog: ToolCatalog,
        policy: RecoveryPolicy | None = None,
        on_changed: Callable[[Sequence[TrajectoryState]], None] = lambda states: None,
    ) -> None:
        self._log = event_log
        self._store = store
        self._codec = codec
        self._clock = clock
        self._catalog = catalog
        self._policy = policy or RecoveryPolicy()
        self._on_changed = on_changed
        self._restored: set[int] = set()
        self._assigned: set[int] = set()
        self._lock = threading.Lock()
        # Read once, then kept in step with every write: a batch must not re-read and re-decode it.
        self._stats = self._load_stats()

    # --- assignment and restore ---------------------------------------------------------------

    def forget_assignment(self) -> None:
        with self._lock:
            self._restored.clear()
            self._assigned.clear()

    def restore_partitions(self, partitions: set[int]) -> dict[int, int]:
        started = time.monotonic()
        with self._lock:
            self._assigned |= partitions
            restored = {p: self._restore(p) for p in sorted(partitions)}
        log.info(
            "partitions %s assigned and restored in %.3f s (%.3f s after the process started)",
            sorted(partitions),
            time.monotonic() - started,
            time.time() - _PROCESS_STARTED,
        )
        self._on_changed(self.active_states(partitions))
        return restored

    def _checkpoint(self, topic: str, partition: int) -> int:
        raw = self._store.get(_checkpoint_key(topic, partition))
        return int(raw) if raw is not None else 0

    def _restore(self, partition: int) -> int:
        changes = _Changes(stats=self._stats)
        frozen: list[tuple[TrajectoryFrozen, int]] = []
        next_offset = self._checkpoint(TRAJECTORIES_EVENTS.name, partition)
        # Where the log ends before reading: everything below it is read (records) or skipped
        # (transaction markers), so the checkpoint may move there. Resuming at the last record
        # + 1 instead would leave its commit marker to be fetched again on every restart.
        events_end = self._log.end_offset(TRAJECTORIES_EVENTS.name, partition)
        rejections_end = self._log.end_offset(TRAJECTORIES_REJECTIONS.name, partition)
        applied = 0
        for record in self._log.read(TRAJECTORIES_EVENTS.name, partition, next_offset):
            next_offset = record.offset + 1
            event = self._decode_logged(record)
            if not isinstance(event, TRAJECTORY_EVENT_TYPES):
                continue
            state = changes.after.get(event.run_id) or self.load(event.run_id)
            if sequence(event.run_id, state.version if state else 0, event.version) is Sequencing.DUPLICATE:
                continue
            self._apply(changes, partition, state, event)
            applied += 1
            if isinstance(event, TrajectoryFrozen):
                frozen.append((event, record.offset))
        next_rejection = self._checkpoint(TRAJECTORIES_REJECTIONS.name, partition)
        for record in self._log.read(TRAJECTORIES_REJECTIONS.name, partition, next_rejection):
            next_rejection = record.offset + 1
            rejection = self._decode_logged(record)
            if isinstance(rejection, CommandRejected):
                changes.rejected.add(rejection.causation_id)
        if frozen:
            self._log.commit([self._incident(event, partition, offset) for event, offset in frozen])
        changes.checkpoints[_checkpoint_key(TRAJECTORIES_EVENTS.name, partition)] = max(
            next_offset, events_end
        )
        changes.checkpoints[_checkpoint_key(TRAJECTORIES_REJECTIONS.name, partition)] = max(
            next_rejection, rejections_end
        )
        self._persist(changes)
        self._restored.add(partition)
        if applied:
            log.info("restored trajectories partition %d: %d events folded", partition, applied)
        return applied

    def _decode_logged(self, record: InboundRecord) -> object:
        try:
            return self._codec.decode(record.value)
        except UndecodableRecord as exc:
            log.error(
                "undecodable record in %s[%d]@%d: %s", record.topic, record.partition, record.offset, exc
            )
            return None

    def rescan(self) -> int:
        """Hand every live trajectory of the owned partitions to the executor again.

        Work whose report was lost (a publish that failed, a crash of the executor's thread) is
        picked up here; work already in flight or just finished is skipped by the executor."""
        with self._lock:
            for partition in sorted(self._assigned - self._restored):
                self._restore(partition)
            states = self.active_states(self._assigned)
        self._on_changed(states)
        return len(states)

    # --- commands -----------------------------------------------------------------------------

    def handle(self, records: Sequence[InboundRecord]) -> BatchOutcome:
        with self._lock:
            try:
                outcome, changed = self._handle(records)
            except BaseException:
                self._restored.clear()  # the commit may have landed: trust the log, not memory
                raise
        if changed:
            self._on_changed(changed)
        return outcome

    def _handle(self, records: Sequence[InboundRecord]) -> tuple[BatchOutcome, list[TrajectoryState]]:
        outcome = BatchOutcome()
        for partition in sorted({r.partition for r in records} - self._restored):
            self._restore(partition)
        now = self._clock.now_ms()
        changes = _Changes(stats=self._stats)
        out: list[OutboundRecord] = []
        for record in records:
            outcome.commands += 1
            command = self._command_of(record, out)
            if command is None:
                outcome.deadlettered += 1
                continue
            if command.command_id in changes.rejected or self._store.get(f"rejected/{command.command_id}"):
                outcome.duplicates += 1
                continue
            state = changes.after.get(command.run_id) or self.load(command.run_id)
            assert changes.stats is not None
            context = SagaContext(self._catalog, self._policy, changes.stats)
            decision = decide(state, command, now, context)
            if isinstance(decision, Rejection):
                out.append(self._rejection(record, command, decision, now))
                changes.rejected.add(command.command_id)
                outcome.rejections += 1
                continue
            if not decision:
                outcome.duplicates += 1
                continue
            for event in decision:
                state = self._apply(changes, record.partition, state, event)
                out.append(
                    self._codec.outbound(TRAJECTORIES_EVENTS.name, event.run_id, event, record.partition)
                )
                if isinstance(event, IncidentResolved):
                    out.append(self._codec.outbound(INCIDENTS.name, event.run_id, event))
            outcome.events += len(decision)
        written = self._log.commit(out)
        outcome.incidents = self._publish_incidents(out, written)
        for (topic, partition), offset in written.items():
            if topic in (TRAJECTORIES_EVENTS.name, TRAJECTORIES_REJECTIONS.name):
                changes.checkpoints[_checkpoint_key(topic, partition)] = offset + 1
        self._persist(changes)
        return outcome, list(changes.after.values())

    def _apply(
        self, changes: _Changes, partition: int, state: TrajectoryState | None, event: TrajectoryEvent
    ) -> TrajectoryState:
        observed = repair_observation(state, event)
        if observed is not None and changes.stats is not None:
            changes.stats = changes.stats.observe(*observed)
        after = evolve(state, event)
        changes.after[event.run_id] = after
        changes.partition_of[event.run_id] = partition
        return after

    def _rejection(
        self, record: InboundRecord, command: TrajectoryCommand, rejection: Rejection, now: int
    ) -> OutboundRecord:
        state = rejection.state
        refusal = CommandRejected(
            event_id=derived_id("rej", command.command_id),
            run_id=command.run_id,
            occurred_at=now,
            causation_id=command.command_id,
            correlation_id=command.correlation_id,
            actor=command.actor,
            command_type=type(command).__name__,
            code=rejection.code,
            detail=rejection.detail,
            current_status=state.status.value if state is not None else None,
            current_version=state.version if state is not None else 0,
        )
        return self._codec.outbound(TRAJECTORIES_REJECTIONS.name, command.run_id, refusal, record.partition)

    def _command_of(self, record: InboundRecord, out: list[OutboundRecord]) -> TrajectoryCommand | None:
        command: TrajectoryCommand | None = command_or_deadletter(
            self._codec, record, TRAJECTORY_COMMAND_TYPES, "trajectory command", out, DEADLETTER.name, log
        )
        return command

    # --- incidents (REC-7) --------------------------------------------------------------------

    def _incident(self, event: TrajectoryFrozen, partition: int, offset: int) -> OutboundRecord:
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
        return self._codec.outbound(INCIDENTS.name, event.run_id, incident)

    def _publish_incidents(self, out: list[OutboundRecord], written: dict[tuple[str, int], int]) -> int:
        # One writer per partition and one transaction per batch: the records of a partition got
        # consecutive offsets ending at the last one written, so each record's offset is exact.
        events = [r for r in out if r.topic == TRAJECTORIES_EVENTS.name]
        incidents: list[OutboundRecord] = []
        for position, record in enumerate(events):
            if not any(
                h == ("tenure-schema", b"tenure.trajectories.events.TrajectoryFrozen") for h in record.headers
            ):
                continue
            partition = record.partition if record.partition is not None else 0
            later = sum(1 for r in events[position + 1 :] if r.partition == record.partition)
            offset = written[(TRAJECTORIES_EVENTS.name, partition)] - later
            event = self._codec.decode(record.value)
            incidents.append(self._incident(event, partition, offset))
        if incidents:
            self._log.commit(incidents)
        return len(incidents)

    # --- store --------------------------------------------------------------------------------

    def load(self, run_id: str) -> TrajectoryState | None:
        raw = self._store.get(f"trajectory/{run_id}")
        return decode_state(raw) if raw is not None else None

    def stats(self) -> RepairStats:
        return self._stats

    def _load_stats(self) -> RepairStats:
        raw = self._store.get(_STATS_KEY)
        return RepairStats.from_json(json.loads(raw)) if raw is not None else RepairStats()

    def active_states(self, partitions: set[int]) -> list[TrajectoryState]:
        states = []
        for partition in sorted(partitions):
            for key, _ in self._store.scan(f"active/{partition}/"):
                state = self.load(key.rsplit("/", 1)[-1])
                if state is not None:
                    states.append(state)
        return states

    def _persist(self, changes: _Changes) -> None:
        puts = {f"trajectory/{run_id}": encode_state(s) for run_id, s in changes.after.items()}
        deletes = []
        for run_id, state in changes.after.items():
            key = f"active/{changes.partition_of[run_id]}/{run_id}"
            if state.status.is_terminal:
                deletes.append(key)
            else:
                puts[key] = b""
        stats_changed = changes.stats is not None and changes.stats != self._stats
        if stats_changed:
            assert changes.stats is not None
            puts[_STATS_KEY] = json.dumps(changes.stats.to_json()).encode()
        puts.update({key: str(offset).encode() for key, offset in changes.checkpoints.items()})
        puts.update({f"rejected/{command_id}": b"1" for command_id in changes.rejected})
        if puts or deletes:
            self._store.write(puts, tuple(deletes))
        if stats_changed and changes.stats is not None:
            self._stats = changes.stats
