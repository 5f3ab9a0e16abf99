"""The Run command processor: commands in, decisions out, state always equal to the log's fold.

Commit order for one batch (the crash-safety argument; every step can be cut by SIGKILL):
  1. Before the first command of a partition, restore: fold runs.events and runs.rejections of
     that partition from the stored checkpoints to their end into the store. The transactional
     writer was initialised before, which fenced and aborted any half-written transaction of a
     previous incarnation, so the fold sees exactly what was committed.
  2. Decide every command of the batch against the restored state (pure `decide`), or, for a
     timer tick, every run whose timer is due (pure `decide_timers`).
  3. Commit all resulting events, rejections and dead letters in ONE Kafka transaction.
  4. Write the new states, their timer index entries, the refused command ids and the
     checkpoints of runs.events and runs.rejections in ONE RocksDB write batch.
  5. Only then is the batch acknowledged to the command stream (the stream runtime commits the
     command offsets after the handler returns).
A crash before 3 leaves no trace; between 3 and 4 the next restore (step 1) folds the committed
events and rejections; between 4 and 5 the commands are redelivered and dropped, because their
ids are in the state (accepted) or in the refused set (rejected): a redelivered command never
gets a second, different answer. Batches and timer ticks never overlap (one lock).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Callable, Sequence

from services.common.clock import Clock
from services.common.contracts import (
    COMMAND_TYPES,
    EVENT_TYPES,
    ClaimRun,
    CommandRejected,
    RunCommand,
    RunEvent,
    SubmitRun,
)
from services.common.eventlog import EventLog
from services.common.kafka import InboundRecord, OutboundRecord
from services.common.messages import MessageCodec, UndecodableRecord, command_or_deadletter
from services.common.routing import partition_for_run
from services.common.sequencing import Sequencing, sequence
from services.common.store import KeyValueStore
from services.common.topics import DEADLETTER, RUNS_COMMANDS, RUNS_EVENTS, RUNS_REJECTIONS
from services.lease_coordinator.domain import (
    DEFAULT_POLICY,
    LeasePolicy,
    Rejection,
    RunState,
    TenantLoad,
    decide,
    decide_timers,
    evolve,
    next_timer_at,
    rejection_event,
    reservations,
)
from services.lease_coordinator.state_codec import decode_state, encode_state

__all__ = [
    "BatchOutcome",
    "RunCommandProcessor",
    "checkpoint_key",
    "rejected_key",
    "state_key",
    "timer_key",
]

log = logging.getLogger("tenure.lease_coordinator")

_RESTORE_FLUSH_EVERY = 1000
# tenant/<tenant>/<partition> = "queued,active": the tenant's reservations held in that partition.
_TENANT_PREFIX = "tenant/"


def state_key(run_id: str) -> str:
    return f"run/{run_id}"


def checkpoint_key(partition: int, topic: str = RUNS_EVENTS.name) -> str:
    return f"checkpoint/{topic}/{partition}"


def rejected_key(command_id: str) -> str:
    return f"rejected/{command_id}"


def timer_key(partition: int, due_ms: int, run_id: str) -> str:
    return f"timer/{partition}/{due_ms:013d}/{run_id}"


@dataclass
class BatchOutcome:
    commands: int = 0
    events: int = 0
    rejections: int = 0
    deadlettered: int = 0
    duplicates: int = 0
    restored_events: dict[int, int] = field(default_factory=dict)


@dataclass
class _Changes:
    """What one batch, tick or restore changed, persisted in one write."""

    partition_of: dict[str, int] = field(default_factory=dict)
    before: dict[str, RunState | None] = field(default_factory=dict)
    after: dict[str, RunState] = field(default_factory=dict)
    rejected: set[str] = field(default_factory=set)
    checkpoints: dict[str, int] = field(default_factory=dict)
    # (tenant, partition) -> [queued, active] change made by this batch (EXE-2 reservations)
    load_delta: dict[tuple[str, int], list[int]] = field(default_factory=dict)

    def apply(self, partition: int, before: RunState | None, event: RunEvent) -> RunState:
        run_id = event.run_id
        if run_id not in self.before:
            self.before[run_id] = before
            self.partition_of[run_id] = partition
        previous = self.after.get(run_id, before)
        state = evolve(previous, event)
        self.after[run_id] = state
        old, new = reservations(previous), reservations(state)
        if old != new:
            delta = self.load_delta.setdefault((state.tenant, self.partition_of[run_id]), [0, 0])
            delta[0] += new.queued - old.queued
            delta[1] += new.active - old.active
        return state

    def pending_load(self, tenant: str) -> TenantLoad:
        queued = sum(d[0] for (t, _), d in self.load_delta.items() if t == tenant)
        active = sum(d[1] for (t, _), d in self.load_delta.items() if t == tenant)
        return TenantLoad(queued, active)


class RunCommandProcessor:
    def __init__(
        self,
        event_log: EventLog,
        store: KeyValueStore,
        codec: MessageCodec,
        clock: Clock,
        policy: LeasePolicy = DEFAULT_POLICY,
        blocked: Callable[[], frozenset[str]] = frozenset,
    ) -> None:
        self._log = event_log
        self._store = store
        self._codec = codec
        self._clock = clock
        self._policy = policy
        self._blocked = blocked
        self._assigned: set[int] = set()
        self._restored: set[int] = set()
        self._lock = threading.Lock()
        self.misrouted = 0

    # --- assignment and restore ---------------------------------------------------------------

    def forget_assignment(self) -> None:
        """Partitions were revoked: whoever owned them meanwhile may have written events."""
        with self._lock:
            self._assigned.clear()
            self._restored.clear()

    def restore_partitions(self, partitions: set[int]) -> dict[int, int]:
        with self._lock:
            self._assigned |= partitions
            return {p: self._restore(p) for p in sorted(partitions)}

    def restore(self, partition: int) -> int:
        with self._lock:
            return self._restore(partition)

    def checkpoint(self, partition: int, topic: str = RUNS_EVENTS.name) -> int:
        raw = self._store.get(checkpoint_key(partition, topic))
        return int(raw) if raw is not None else 0

    def _restore(self, partition: int) -> int:
        """Fold the committed events and rejections of `partition` after the checkpoints.

        Rejections are restored too: a command refused before a crash must stay refused when it
        is redelivered, even if a later command of the same batch has since changed the run.
        """
        applied = 0
        changes = _Changes()
        next_offset = self.checkpoint(partition)
        # Where the log ends before reading: everything below it is read (records) or skipped
        # (transaction markers), so the checkpoint may move there. Resuming at the last record
        # + 1 instead would leave its commit marker to be fetched again on every restart.
        events_end = self._log.end_offset(RUNS_EVENTS.name, partition)
        rejections_end = self._log.end_offset(RUNS_REJECTIONS.name, partition)
        for record in self._log.read(RUNS_EVENTS.name, partition, next_offset):
            next_offset = record.offset + 1
            event = self._decode_logged(record)
            if not isinstance(event, EVENT_TYPES):
                continue
            state = changes.after.get(event.run_id) or self._load(event.run_id)
            if sequence(event.run_id, state.version if state else 0, event.version) is Sequencing.DUPLICATE:
                continue
            changes.apply(partition, state, event)
            applied += 1
            if len(changes.after) >= _RESTORE_FLUSH_EVERY:
                changes.checkpoints[checkpoint_key(partition)] = next_offset
                self._persist(changes)
                changes = _Changes()
        next_rejection = self.checkpoint(partition, RUNS_REJECTIONS.name)
        for record in self._log.read(RUNS_REJECTIONS.name, partition, next_rejection):
            next_rejection = record.offset + 1
            rejection = self._decode_logged(record)
            if isinstance(rejection, CommandRejected):
                changes.rejected.add(rejection.causation_id)
        changes.checkpoints[checkpoint_key(partition)] = max(next_offset, events_end)
        changes.checkpoints[checkpoint_key(partition, RUNS_REJECTIONS.name)] = max(
            next_rejection, rejections_end
        )
        self._persist(changes)
        self._restored.add(partition)
        if applied or changes.rejected:
            log.info(
                "restored partition %d: %d events and %d rejections folded, checkpoint %d",
                partition,
                applied,
                len(changes.rejected),
                next_offset,
            )
        return applied

    def _decode_logged(self, record: InboundRecord) -> object:
        try:
            return self._codec.decode(record.value)
        except UndecodableRecord as exc:
            # Only this processor writes these topics; garbage there is an incident, but one bad
            # record must not stop every run of the partition from being served.
            log.error(
                "undecodable record in %s[%d]@%d: %s", record.topic, record.partition, record.offset, exc
            )
            return None

    # --- commands -----------------------------------------------------------------------------

    def handle(self, records: Sequence[InboundRecord]) -> BatchOutcome:
        with self._lock:
            try:
                return self._handle(records)
            except BaseException:
                # The commit may have landed before the failure: restore from the log before
                # any retry instead of trusting what this process believes it wrote.
                self._restored.clear()
                raise

    def _handle(self, records: Sequence[InboundRecord]) -> BatchOutcome:
        outcome = BatchOutcome()
        for partition in sorted({r.partition for r in records} - self._restored):
            outcome.restored_events[partition] = self._restore(partition)
        now = self._clock.now_ms()
        changes = _Changes()
        out: list[OutboundRecord] = []
        for record in records:
            outcome.commands += 1
            command = self._command_of(record, out)
            if command is None:
                outcome.deadlettered += 1
                continue
            if command.command_id in changes.rejected or self._store.get(rejected_key(command.command_id)):
                outcome.duplicates += 1  # refused once, refused for good: the caller has its answer
                continue
            state = changes.after.get(command.run_id) or self._load(command.run_id)
            decision = decide(
                state, command, now, self._policy, self._tenant_load(command, state, changes), self._blocked()
            )
            if isinstance(decision, Rejection):
                refusal = rejection_event(state, command, decision, now)
                out.append(
                    self._codec.outbound(RUNS_REJECTIONS.name, command.run_id, refusal, record.partition)
                )
                changes.rejected.add(command.command_id)
                outcome.rejections += 1
                continue
            if not decision:
                outcome.duplicates += 1
                continue
            for event in decision:
                state = changes.apply(record.partition, state, event)
                out.append(self._codec.outbound(RUNS_EVENTS.name, event.run_id, event, record.partition))
            outcome.events += len(decision)
        self._commit(out, changes)
        return outcome

    def _tenant_load(
        self, command: RunCommand, state: RunState | None, changes: _Changes
    ) -> TenantLoad | None:
        """The tenant's reservations, for the two commands that take one (EXE-2)."""
        if isinstance(command, SubmitRun):
            tenant = command.tenant
        elif isinstance(command, ClaimRun) and state is not None:
            tenant = state.tenant
        else:
            return None
        stored = [0, 0]
        for _, raw in self._store.scan(f"{_TENANT_PREFIX}{tenant}/"):
            queued, active = (int(x) for x in raw.decode().split(","))
            stored[0] += queued
            stored[1] += active
        pending = changes.pending_load(tenant)
        return TenantLoad(stored[0] + pending.queued, stored[1] + pending.active)

    def _command_of(self, record: InboundRecord, out: list[OutboundRecord]) -> RunCommand | None:
        command: RunCommand | None = command_or_deadletter(
            self._codec, record, COMMAND_TYPES, "Run command", out, DEADLETTER.name, log
        )
        if command is not None:
            self._check_route(record, command.run_id)
        return command

    def _check_route(self, record: InboundRecord, run_id: str) -> None:
        # A run's commands must all reach the partition of its tenant shard (services.common.
        # routing); otherwise two processors could own one tenant's load. Counted and logged
        # rather than refused, so a misconfigured producer degrades admission, not the runs.
        try:
            expected = partition_for_run(run_id, RUNS_COMMANDS.partitions)
        except ValueError:
            expected = None
        if expected != record.partition:
            self.misrouted += 1
            if self.misrouted in (1, 10, 100) or self.misrouted % 1000 == 0:
                log.warning(
                    "%d command(s) arrived on a partition their run does not route to (last: %s on %d)",
                    self.misrouted,
                    run_id,
                    record.partition,
                )

    # --- timers -------------------------------------------------------------------------------

    def tick(self) -> int:
        """Decide every due timer of the owned partitions (lease at-risk and expiry, LEASE-5)."""
        with self._lock:
            try:
                for partition in sorted(self._assigned - self._restored):
                    self._restore(partition)
                return self._tick(self._clock.now_ms())
            except BaseException:
                self._restored.clear()
                raise

    def _tick(self, now: int) -> int:
        changes = _Changes()
        out: list[OutboundRecord] = []
        for partition in sorted(self._restored):
            for key, _ in self._store.scan(f"timer/{partition}/"):
                _, _, due, run_id = key.split("/")
                if int(due) > now:
                    break
                state = changes.after.get(run_id) or self._load(run_id)
                if state is None:
                    continue
                for event in decide_timers(state, now, self._policy):
                    state = changes.apply(partition, state, event)
                    out.append(self._codec.outbound(RUNS_EVENTS.name, run_id, event, partition))
        if out:
            self._commit(out, changes)
        return len(out)

    # --- store --------------------------------------------------------------------------------

    def _commit(self, out: list[OutboundRecord], changes: _Changes) -> None:
        written = self._log.commit(out)
        for (topic, partition), offset in written.items():
            if topic in (RUNS_EVENTS.name, RUNS_REJECTIONS.name):
                changes.checkpoints[checkpoint_key(partition, topic)] = offset + 1
        self._persist(changes)

    def _load(self, run_id: str) -> RunState | None:
        raw = self._store.get(state_key(run_id))
        return decode_state(raw) if raw is not None else None

    def load(self, run_id: str) -> RunState | None:
        return self._load(run_id)

    def _persist(self, changes: _Changes) -> None:
        """States, timer index, refused command ids and the offsets they reflect: one write."""
        puts = {state_key(run_id): encode_state(s) for run_id, s in changes.after.items()}
        deletes: list[str] = []
        for run_id, after in changes.after.items():
            partition = changes.partition_of[run_id]
            old_due, new_due = next_timer_at(changes.before[run_id]), next_timer_at(after)
            if old_due == new_due:
                continue
            if old_due is not None:
                deletes.append(timer_key(partition, old_due, run_id))
            if new_due is not None:
                puts[timer_key(partition, new_due, run_id)] = b""
        for (tenant, partition), (dq, da) in changes.load_delta.items():
            key = f"{_TENANT_PREFIX}{tenant}/{partition}"
            raw = self._store.get(key)
            queued, active = (int(x) for x in raw.decode().split(",")) if raw else (0, 0)
            puts[key] = f"{queued + dq},{active + da}".encode()
        puts.update({key: str(offset).encode() for key, offset in changes.checkpoints.items()})
        puts.update({rejected_key(command_id): b"1" for command_id in changes.rejected})
        if puts or deletes:
            self._store.write(puts, tuple(k for k in deletes if k not in puts))
