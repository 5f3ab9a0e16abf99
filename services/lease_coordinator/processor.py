"""The Run command processor: commands in, decisions out, state always equal to the log's fold.

Commit order for one batch (the crash-safety argument; every step can be cut by SIGKILL):
  1. Before the first command of a partition, restore: fold runs.events of that partition from
     the stored checkpoint to its end into the store. The transactional writer was initialised
     before, which fenced and aborted any half-written transaction of a previous incarnation, so
     the fold sees exactly what was committed.
  2. Decide every command of the batch against the restored state (pure `decide`).
  3. Commit all resulting events, rejections and dead letters in ONE Kafka transaction.
  4. Write the new states, the refused command ids and the checkpoints of runs.events and
     runs.rejections in ONE RocksDB write batch.
  5. Only then is the batch acknowledged to the command stream (the stream runtime commits the
     command offsets after the handler returns).
A crash before 3 leaves no trace; between 3 and 4 the next restore (step 1) folds the committed
events and rejections; between 4 and 5 the commands are redelivered and dropped, because their
ids are in the state (accepted) or in the refused set (rejected): a redelivered command never
gets a second, different answer. The state never claims a command whose events are not durably on the log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from services.common.clock import Clock
from services.common.contracts import COMMAND_TYPES, EVENT_TYPES, CommandRejected, RunCommand
from services.common.eventlog import EventLog
from services.common.kafka import InboundRecord, OutboundRecord
from services.common.messages import MessageCodec, UndecodableRecord, deadletter_record
from services.common.sequencing import Sequencing, sequence
from services.common.store import KeyValueStore
from services.common.topics import DEADLETTER, RUNS_EVENTS, RUNS_REJECTIONS
from services.lease_coordinator.domain import Rejection, RunState, decide, evolve
from services.lease_coordinator.domain.run import rejection_event
from services.lease_coordinator.state_codec import decode_state, encode_state

__all__ = ["BatchOutcome", "RunCommandProcessor", "checkpoint_key", "rejected_key", "state_key"]

log = logging.getLogger("tenure.lease_coordinator")

_RESTORE_FLUSH_EVERY = 1000


def state_key(run_id: str) -> str:
    return f"run/{run_id}"


def checkpoint_key(partition: int, topic: str = RUNS_EVENTS.name) -> str:
    return f"checkpoint/{topic}/{partition}"


def rejected_key(command_id: str) -> str:
    return f"rejected/{command_id}"


@dataclass
class BatchOutcome:
    commands: int = 0
    events: int = 0
    rejections: int = 0
    deadlettered: int = 0
    duplicates: int = 0
    restored_events: dict[int, int] = field(default_factory=dict)


class RunCommandProcessor:
    def __init__(self, event_log: EventLog, store: KeyValueStore, codec: MessageCodec, clock: Clock) -> None:
        self._log = event_log
        self._store = store
        self._codec = codec
        self._clock = clock
        self._restored: set[int] = set()

    # --- assignment -------------------------------------------------------------------------

    def forget_assignment(self) -> None:
        """Partitions were revoked: whoever owned them meanwhile may have written events."""
        self._restored.clear()

    def restore_partitions(self, partitions: set[int]) -> dict[int, int]:
        return {p: self.restore(p) for p in sorted(partitions)}

    def checkpoint(self, partition: int, topic: str = RUNS_EVENTS.name) -> int:
        raw = self._store.get(checkpoint_key(partition, topic))
        return int(raw) if raw is not None else 0

    def restore(self, partition: int) -> int:
        """Fold the committed events of `partition` after the checkpoint into the store.

        Rejections are restored too: a command refused before a crash must stay refused when it
        is redelivered, even if a later command of the same batch has since changed the run.
        """
        applied = 0
        pending: dict[str, RunState] = {}
        next_offset = self.checkpoint(partition)
        for record in self._log.read(RUNS_EVENTS.name, partition, next_offset):
            next_offset = record.offset + 1
            event = self._decode_logged(record)
            if not isinstance(event, EVENT_TYPES):
                continue
            state = pending.get(event.run_id) or self._load(event.run_id)
            if sequence(event.run_id, state.version if state else 0, event.version) is Sequencing.DUPLICATE:
                continue
            pending[event.run_id] = evolve(state, event)
            applied += 1
            if len(pending) >= _RESTORE_FLUSH_EVERY:
                self._persist(pending, {checkpoint_key(partition): next_offset})
                pending = {}
        rejected: set[str] = set()
        next_rejection = self.checkpoint(partition, RUNS_REJECTIONS.name)
        for record in self._log.read(RUNS_REJECTIONS.name, partition, next_rejection):
            next_rejection = record.offset + 1
            rejection = self._decode_logged(record)
            if isinstance(rejection, CommandRejected):
                rejected.add(rejection.causation_id)
        checkpoints = {
            checkpoint_key(partition): next_offset,
            checkpoint_key(partition, RUNS_REJECTIONS.name): next_rejection,
        }
        self._persist(pending, checkpoints, rejected)
        self._restored.add(partition)
        if applied or rejected:
            log.info(
                "restored partition %d: %d events and %d rejections folded, checkpoint %d",
                partition,
                applied,
                len(rejected),
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

    # --- commands ---------------------------------------------------------------------------

    def handle(self, records: Sequence[InboundRecord]) -> BatchOutcome:
        try:
            return self._handle(records)
        except BaseException:
            # The commit may have landed before the failure: restore from the log before any
            # retry instead of trusting what this process believes it wrote.
            self._restored.clear()
            raise

    def _handle(self, records: Sequence[InboundRecord]) -> BatchOutcome:
        outcome = BatchOutcome()
        for partition in sorted({r.partition for r in records} - self._restored):
            outcome.restored_events[partition] = self.restore(partition)
        now = self._clock.now_ms()
        pending: dict[str, RunState] = {}
        rejected: set[str] = set()
        out: list[OutboundRecord] = []
        for record in records:
            outcome.commands += 1
            command = self._command_of(record, out)
            if command is None:
                outcome.deadlettered += 1
                continue
            if command.command_id in rejected or self._store.get(rejected_key(command.command_id)):
                outcome.duplicates += 1  # refused once, refused for good: the caller has its answer
                continue
            state = pending.get(command.run_id) or self._load(command.run_id)
            decision = decide(state, command, now)
            if isinstance(decision, Rejection):
                refusal = rejection_event(state, command, decision, now)
                out.append(
                    self._codec.outbound(RUNS_REJECTIONS.name, command.run_id, refusal, record.partition)
                )
                rejected.add(command.command_id)
                outcome.rejections += 1
                continue
            if not decision:
                outcome.duplicates += 1
                continue
            for event in decision:
                state = evolve(state, event)
                out.append(self._codec.outbound(RUNS_EVENTS.name, event.run_id, event, record.partition))
            assert state is not None
            pending[state.run_id] = state
            outcome.events += len(decision)
        written = self._log.commit(out)
        checkpoints = {
            checkpoint_key(partition, topic): offset + 1
            for (topic, partition), offset in written.items()
            if topic in (RUNS_EVENTS.name, RUNS_REJECTIONS.name)
        }
        self._persist(pending, checkpoints, rejected)
        return outcome

    def _command_of(self, record: InboundRecord, out: list[OutboundRecord]) -> RunCommand | None:
        def dead(code: str, detail: str) -> None:
            log.warning(
                "dead-lettering %s[%d]@%d: %s %s", record.topic, record.partition, record.offset, code, detail
            )
            out.append(
                deadletter_record(
                    DEADLETTER.name,
                    record.topic,
                    record.partition,
                    record.offset,
                    record.key,
                    record.value,
                    code,
                    detail,
                )
            )

        try:
            message = self._codec.decode(record.value)
        except UndecodableRecord as exc:
            dead(exc.reason_code, str(exc))
            return None
        if not isinstance(message, COMMAND_TYPES):
            dead("NOT_A_COMMAND", f"{type(message).__name__} is not a Run command")
            return None
        if record.key is None or record.key.decode("utf-8", "replace") != message.run_id:
            dead("KEY_MISMATCH", f"record key {record.key!r} is not the runId {message.run_id!r}")
            return None
        return message  # type: ignore[no-any-return]

    # --- store ------------------------------------------------------------------------------

    def _load(self, run_id: str) -> RunState | None:
        raw = self._store.get(state_key(run_id))
        return decode_state(raw) if raw is not None else None

    def load(self, run_id: str) -> RunState | None:
        return self._load(run_id)

    def _persist(
        self, states: dict[str, RunState], checkpoints: dict[str, int], rejected: Iterable[str] = ()
    ) -> None:
        """States, refused command ids and the offsets they reflect: one atomic write."""
        puts = {state_key(run_id): encode_state(s) for run_id, s in states.items()}
        puts.update({key: str(offset).encode() for key, offset in checkpoints.items()})
        puts.update({rejected_key(command_id): b"1" for command_id in rejected})
        if puts:
            self._store.write(puts)
