"""The one aggregate runtime: commands in, decisions out, state always equal to the log's fold.

`AggregateProcessor(definition, ...)` runs any aggregate (services/common/aggregate/definition.py);
the Run (services/lease_coordinator/processor.py) and the Trajectory (services/saga_orchestrator/
processor.py) are two definitions of it. The commit path of one batch, the crash-safety argument
of every aggregate (each step can be cut by SIGKILL):

  1. Restore (services/common/aggregate/restore.py). Before the first command of a partition,
     fold the events topic and the rejections topic of that partition from the stored
     checkpoints to their end into the store (states, indexes, refused command ids, context;
     `published_outputs` of every folded event are published again). The checkpoints move to
     the end offsets read before folding, past the transaction markers. The transactional
     writer was initialised before anything is read, which fenced and aborted any half-written
     transaction of a previous incarnation, so the fold sees exactly what was committed.
  2. Decide. Every command of the batch is decided against a copy: `decide`, `evolve` of its
     events, their encoding and `accept` of the batch context run on values only, and the
     batch's working set changes only when all of that succeeded. A command whose handling
     raises is set aside (services/common/poison.py): dead-lettered and refused in the batch's
     transaction, and the batch goes on. A timer tick decides every due timer the same way; a
     timer whose work raises is dead-lettered and skipped until its aggregate changes.
     A definition with a `keepalive_topic` may keep a decision off its events topic (a lease
     renewal): its one event goes to that topic in step 3 and is kept in memory, and the next
     other decision or timer work puts it on the events topic first (keepalives.py, with the
     argument why a restore loses none of them).
  3. One Kafka transaction: the events, the refusals, the dead letters and the transaction
     outputs of the batch (`transaction_outputs`) land together or not at all. Then the
     `published_outputs` of its events, naming each event's exact offset, are published
     (at-least-once: step 1 publishes them again after a crash).
  4. One RocksDB write: the new states, their index entries (secondary indexes and the timer
     index), the refused command ids, the context's writes, the timer skips and the
     checkpoints of the events and rejections topics (their last offsets written + 1).
  5. Acknowledge. Only when `handle` returns does the stream runtime commit the command offsets.
     The changed states are then handed to the `on_changed` hook (outside the lock).

A crash before 3 leaves no trace; between 3 and 4 the next restore (step 1) folds the committed
events and refusals; between 4 and 5 the commands are redelivered and dropped, because their ids
are in the state (accepted: `decide` answers no events) or in the refused set (rejected or set
aside): a redelivered command never gets a second, different answer. Anything `handle` or `tick`
raises is the infrastructure's (the log, the store): the processor forgets what it restored, so
that a retry restores from the log (the commit may have landed) instead of trusting memory, and
the stream runtime retries it or ends the process. Batches, ticks and restores never overlap
(one lock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeVar

from services.common.aggregate.changelog_lag import ChangelogLag
from services.common.aggregate.changes import BatchOutcome, Changes, Decided, Unit, Verdict
from services.common.aggregate.decoded import DecodedStates
from services.common.aggregate.definition import AggregateDefinition, Refused, Transition
from services.common.aggregate.intake import Intake
from services.common.aggregate.keepalives import Kept, KeptDecisions, decide_with_kept
from services.common.aggregate.restore import PartitionRestorer
from services.common.aggregate.unit_outputs import changelog_records, published_after
from services.common.avro import SchemaRegistryError
from services.common.clock import Clock
from services.common.eventlog import EventLog
from services.common.health import ProcessorMetrics
from services.common.kafka import InboundRecord, OutboundRecord
from services.common.messages import MessageCodec
from services.common.poison import ensure_writable
from services.common.store import KeyValueStore
from services.common.tracing import commit_span, decide_span, remember, traced_records

__all__ = ["AggregateProcessor"]

S = TypeVar("S")
C = TypeVar("C")
E = TypeVar("E")
X = TypeVar("X")


class AggregateProcessor(Generic[S, C, E, X]):
    """Runs one aggregate definition over an event log, a store, a codec and a clock."""

    outcome_type: type[BatchOutcome] = BatchOutcome
    # Events per transaction of a tick with many timers due at once.
    _TICK_CHUNK = 500

    def __init__(
        self,
        definition: AggregateDefinition[S, C, E, X],
        event_log: EventLog,
        store: KeyValueStore,
        codec: MessageCodec,
        clock: Clock,
        *,
        metrics: ProcessorMetrics | None = None,
        on_changed: Callable[[Sequence[S]], None] | None = None,
        changelog_every_ms: int = 0,
        changelog_max_states: int = 10_000,
    ) -> None:
        self.definition = definition
        self.metrics = metrics or ProcessorMetrics(definition.name)
        self.event_log = event_log  # the writer a joint unit shares (joint.py)
        self._log = self.metrics.watch(event_log)  # counts the transactions that did not commit
        self._store = store
        self._codec = codec
        self._clock = clock
        self._on_changed = on_changed
        self._layout = definition.layout
        self._assigned: set[int] = set()
        self._restored: set[int] = set()
        # partition -> a due time below which its timer index holds no live entry. A tick scans
        # from there up to now, not from the start: every renewal deletes a timer, and a scan
        # from the start steps over each of those deletes until compaction removes it, so the
        # tick's cost grew with the renewals (issue 16). Only this processor writes the index
        # (every entry goes through `_index_entries`, which lowers the floor), and a restore
        # forgets the floor, so it is never above a live entry.
        self._timer_floor: dict[int, int] = {}
        self._tick_indexed: dict[int, int] = {}
        self._lock = threading.Lock()
        self.decoded: DecodedStates[S] = DecodedStates(definition.state_codec.decode)  # decoded.py
        self._kept: KeptDecisions[S, E] = KeptDecisions()  # keepalives.py
        self._lag = ChangelogLag(definition, store, clock, changelog_every_ms, changelog_max_states)
        self._markers = int(getattr(event_log, "markers_per_commit", 0))
        self._intake: Intake[S, C] = Intake(definition, codec, self.metrics.deadlettered)
        # aggregateId -> the version whose timer work failed. Read once, then kept in step with
        # every write (like the refused ids, a store fact).
        self._failed_timers: dict[str, int] = {}
        if definition.has_timers:
            prefix = self._layout.timer_failed_prefix
            self._failed_timers = {key.removeprefix(prefix): int(raw) for key, raw in store.scan(prefix)}
        self._restorer = PartitionRestorer(
            definition,
            self._log,
            store,
            codec,
            self.metrics,
            load=self.load,
            checkpoint=self.checkpoint,
            begin=self._changes,
            persist=self._persist,
            lag=self._lag if definition.changelog_topic is not None else None,
        )

    # --- assignment and restore (step 1) --------------------------------------------------------

    def forget_assignment(self) -> None:
        """Partitions were revoked: whoever owned them meanwhile may have written events."""
        with self._lock:
            self._assigned.clear()
            self._timer_floor.clear()
            self.forget_restored()

    def restore_partitions(self, partitions: set[int]) -> dict[int, int]:
        with self._lock:
            self._assigned |= partitions
            return {p: self._restore(p) for p in sorted(partitions)}

    def restore(self, partition: int) -> int:
        with self._lock:
            return self._restore(partition)

    @property
    def misrouted(self) -> int:
        """Commands that arrived on a partition their aggregate does not route to."""
        return self._intake.misrouted

    def restored_partitions(self) -> frozenset[int]:
        """The partitions whose state is current, for readiness (read without the lock: a batch
        may hold it for long; copying a set is one step under the GIL)."""
        return frozenset(self._restored)

    def checkpoint(self, partition: int, topic: str | None = None) -> int:
        """The next offset of `topic` (default: the events topic) the store has not folded."""
        raw = self._store.get(self._layout.checkpoint_key(topic or self.definition.events_topic, partition))
        return int(raw) if raw is not None else 0

    def load(self, aggregate_id: str) -> S | None:
        raw = self._store.get(self._layout.state_key(aggregate_id))
        return None if raw is None else self.decoded.of(aggregate_id, raw)

    def _restore_missing(self) -> None:
        for partition in sorted(self._assigned - self._restored):
            self._restore(partition)

    def _restore(self, partition: int) -> int:
        self._kept.drop_partition(partition)
        restored = self._restorer.restore(partition)
        if self.definition.keepalive_topic is not None:
            self._restorer.restore_kept(partition, self.definition.keepalive_topic, self._kept)
        self._timer_floor.pop(partition, None)
        self._restored.add(partition)
        return restored

    # --- commands (steps 2 to 5) ----------------------------------------------------------------

    def handle(self, records: Sequence[InboundRecord]) -> BatchOutcome:
        with self._lock:
            try:
                outcome, changed = self._handle(records)
            except BaseException:
                # The commit may have landed before the failure: restore from the log before
                # any retry instead of trusting what this process believes it wrote.
                self.forget_restored()
                raise
        if changed:
            self.notify_changed(changed)
        return outcome

    def notify_changed(self, states: Sequence[S]) -> None:
        if self._on_changed is not None:
            self._on_changed(states)

    def _handle(self, records: Sequence[InboundRecord]) -> tuple[BatchOutcome, list[S]]:
        unit = self.open_unit({r.partition for r in records})
        self.decide_into(unit, records)
        unit.outcome.published = self._commit(unit.out, unit.events, unit.changes)
        return self._closed(unit)

    # --- a unit of work driven from outside (a joint unit across aggregates: joint.py) ----------
    # The caller holds `lock` from `open_unit` to `unit_committed` (or `forget_restored`).

    @property
    def lock(self) -> threading.Lock:
        return self._lock

    def open_unit(self, partitions: set[int]) -> Unit[S, E]:
        """Step 1 for `partitions` not restored yet, then an empty unit of work (step 2 follows)."""
        started, outcome = time.monotonic(), self.outcome_type()
        for partition in sorted(partitions - self._restored):
            outcome.restored_events[partition] = self._restore(partition)
        return Unit(self._changes(), self._clock.now_ms(), started, outcome)

    def decide_into(self, unit: Unit[S, E], records: Sequence[InboundRecord]) -> list[Verdict]:
        """Step 2 for `records`, on the unit's working set; what each command came to."""
        if missing := {r.partition for r in records} - self._restored:
            raise ValueError(f"{self.definition.name}: partitions {sorted(missing)} are not restored")
        verdicts: list[Verdict] = []
        for record in records:
            commands = self._intake.commands_of(record, unit.out)
            if not commands:
                unit.outcome.commands += 1
                unit.outcome.deadlettered += 1
                verdicts.append(Verdict(Verdict.DEADLETTERED, None))
                continue
            for command in commands:  # one, or the commands of an envelope, each as if alone
                unit.outcome.commands += 1
                verdicts.append(self._decide_in_batch(record, command, unit))
        return verdicts

    def unit_state(self, unit: Unit[S, E], aggregate_id: str) -> S | None:
        """The state the unit's decisions leave (with a kept renewal, the one after it)."""
        kept = self._kept.of(unit.changes, aggregate_id)
        return kept.effective if kept is not None else self._state(unit.changes, aggregate_id)

    def unit_records(self, unit: Unit[S, E]) -> list[OutboundRecord]:
        """Step 3's records: what the unit's transaction must carry."""
        return self._to_write(unit.out, unit.events, unit.changes)

    def unit_committed(
        self,
        unit: Unit[S, E],
        records: Sequence[OutboundRecord],
        written: Mapping[tuple[str, int], int],
        committing_since: float,
    ) -> tuple[BatchOutcome, list[S]]:
        """Steps 3 (the transaction that began at `committing_since` committed `records`) and 4;
        the unit's counts and states."""
        unit.outcome.published = self._committed(
            records, unit.events, unit.changes, written, committing_since
        )
        return self._closed(unit)

    def forget_restored(self) -> None:
        """A unit failed, and its commit may have landed: restore from the log before the next."""
        self._restored.clear()
        self._kept.clear()
        self._lag.clear()

    def _closed(self, unit: Unit[S, E]) -> tuple[BatchOutcome, list[S]]:
        self.metrics.batch(unit.outcome.by_outcome(), unit.outcome.events)
        self.metrics.batch_took(time.monotonic() - unit.started)
        return unit.outcome, list(unit.changes.after.values())

    def _decide_in_batch(self, record: InboundRecord, command: C, unit: Unit[S, E]) -> Verdict:
        """Step 2 for one command: decided against the unit's working set, which changes only
        if nothing raised; a command whose handling raises is set aside and the unit goes on."""
        d, changes, outcome = self.definition, unit.changes, unit.outcome
        command_id = d.command_id(command)
        aggregate_id = d.aggregate_id(command)
        if command_id in changes.rejected or self._store.get(self._layout.rejected_key(command_id)):
            outcome.duplicates += 1  # refused once, refused for good: the caller has its answer
            return Verdict(Verdict.REFUSED_BEFORE, aggregate_id)
        # Reads of the store stay outside the guard: their failure is the infrastructure's.
        kept = self._kept.of(changes, aggregate_id)
        # A kept event's durable state is the store's (keepalives.py), so it is not read back:
        # beyond the decoded-state cache (issue 16: 100,000 runs) that read was also a decode.
        state = kept.durable if kept is not None else self._state(changes, aggregate_id)
        context = changes.context.decide_context(command, state)
        partition = changes.partition(aggregate_id, record.partition)
        try:
            # Tracing (issue 17): the decision continues the trace the command's headers
            # carry, and its records (events, refusal) carry the decision's own context.
            with decide_span(record, command):
                now = unit.now
                decided = self._decide_one(record, command, state, kept, now, context, partition, changes)
                decided.written[:] = traced_records(decided.written)
                remember(aggregate_id)
        except SchemaRegistryError:
            raise  # the registry's outage, not the command's fault: retry the batch
        except Exception as exc:
            unit.out += self._intake.set_aside(record, command, state, exc, unit.now)
            changes.rejected.add(command_id)
            outcome.failed += 1
            return Verdict(Verdict.FAILED, aggregate_id, error=exc)
        unit.out.extend(decided.written)
        if decided.refused:
            changes.rejected.add(command_id)
            outcome.rejections += 1
            return Verdict(Verdict.REFUSED, aggregate_id, refusal=decided.refusal)
        if decided.kept is not None:
            changes.kept[aggregate_id] = decided.kept
            outcome.accepted += 1
            outcome.kept += 1
            return Verdict(Verdict.ACCEPTED, aggregate_id)
        if not decided.events or decided.after is None:
            outcome.duplicates += 1  # decided before: nothing new happens
            return Verdict(Verdict.DUPLICATE, aggregate_id)
        changes.settle(partition, aggregate_id, state, decided.after)
        self._kept.settle(changes, aggregate_id, decided.unkept)
        unit.events.extend(decided.events)
        outcome.events += len(decided.events)
        outcome.accepted += 1
        return Verdict(Verdict.ACCEPTED, aggregate_id)

    def _decide_one(
        self,
        record: InboundRecord,
        command: C,
        state: S | None,
        kept: Kept[S, E] | None,
        now: int,
        context: X,
        partition: int,
        changes: Changes[S, E],
    ) -> Decided[S, E]:
        """One command on values only: nothing of the batch changes until this returns, so a
        command that raises leaves no trace."""
        d = self.definition
        key = d.aggregate_id(command)
        if d.keepalive_topic is None:
            decision, materialise = d.decide(state, command, now, context), None
        else:
            outcome = decide_with_kept(d, state, kept, command, now, context)
            decision, materialise = outcome.decision, outcome.materialise
            if outcome.replaces:
                decided = self._evolve(key, partition, state, outcome.decision, changes)  # type: ignore[arg-type]
                decided.unkept = True
                return decided
            if outcome.keep is not None:
                assert state is not None and outcome.effective is not None
                written = [self._codec.outbound(d.keepalive_topic, key, outcome.keep, partition)]
                ensure_writable(written)
                offset = self._kept.ends.get(partition, 0)
                entry = Kept(outcome.keep, state, outcome.effective, partition, offset)
                return Decided(written, [], None, kept=entry)
        if isinstance(decision, Refused):
            written = [self._codec.outbound(d.rejections_topic, key, decision.record, record.partition)]
            ensure_writable(written)
            return Decided(written, [], state, refused=True, refusal=decision.record)
        if materialise is not None:
            decided = self._evolve(key, partition, state, (materialise, *decision), changes)
            decided.unkept = True
            return decided
        return self._evolve(key, partition, state, decision, changes)

    def _evolve(
        self, aggregate_id: str, partition: int, state: S | None, events: Sequence[E], changes: Changes[S, E]
    ) -> Decided[S, E]:
        """Apply and encode the events one command or timer decided; the context accepts them
        last, once nothing else can raise."""
        d = self.definition
        applied: list[Transition[S, E]] = []
        written: list[OutboundRecord] = []
        after = state
        for event in events:
            if d.aggregate_id(event) != aggregate_id:
                raise ValueError(f"{aggregate_id} decided an event of {d.aggregate_id(event)}")
            before, after = after, d.evolve(after, event)
            applied.append(Transition(before, event, after))
            written.append(self._codec.outbound(d.events_topic, aggregate_id, event, partition))
            written.extend(d.transaction_outputs(event, self._codec, after))
        ensure_writable(written)
        if applied:
            changes.context.accept(partition, applied)
        return Decided(written, [(t.event, partition) for t in applied], after)

    # --- timers ---------------------------------------------------------------------------------

    def tick(self) -> int:
        """Decide every due timer of the owned partitions; the number of events written."""
        with self._lock:
            try:
                self._restore_missing()
                return self._tick(self._clock.now_ms()) if self.definition.has_timers else 0
            except BaseException:
                self.forget_restored()
                raise

    def _tick(self, now: int) -> int:
        d, layout = self.definition, self._layout
        changes = self._changes()
        out: list[OutboundRecord] = []
        events: list[tuple[E, int]] = []
        written = 0
        # The lowest due each partition's chunk commits indexed during its own scan: the floor
        # set at the scan's end must not rise above them.
        self._tick_indexed = {}
        for partition in sorted(self._restored):
            floor = self._timer_floor.get(partition)
            # The lowest due of an entry this tick leaves in place (skipped, set aside, or
            # decided without an event); entries it changes are re-indexed by the commit.
            kept = now + 1
            for key, _ in self._store.scan(
                layout.timers_of(partition),
                start_after=None if floor is None else layout.timer_key(partition, floor, ""),
                before=layout.timer_key(partition, now + 1, ""),
            ):
                due, aggregate_id = layout.parse_timer_key(key)
                if due > now:
                    break
                state = self._state(changes, aggregate_id)
                if state is None or self._failed_timers.get(aggregate_id) == d.version(state):
                    kept = min(kept, due)
                    continue  # gone, or its timer work failed at this very version: wait for a change
                try:
                    decided = self._decide_timers(aggregate_id, partition, state, now, changes)
                except SchemaRegistryError:
                    raise  # the registry's outage, not the timer's fault: retry the tick
                except Exception as exc:
                    out.append(self._intake.set_timer_aside(partition, aggregate_id, state, due, exc))
                    changes.timer_failures[aggregate_id] = d.version(state)
                    kept = min(kept, due)
                    continue
                if decided.events and decided.after is not None:
                    changes.settle(partition, aggregate_id, state, decided.after)
                    self._kept.settle(changes, aggregate_id, decided.unkept)
                    out.extend(decided.written)
                    events.extend(decided.events)
                elif (current := self._timer_due_of(aggregate_id, state, changes)) != due:
                    changes.stale_timers[key] = (partition, aggregate_id, current)  # re-indexed
                else:
                    kept = min(kept, due)
                if len(events) >= self._TICK_CHUNK:
                    # Many timers due at once (10,000 schedules on the minute): commit in chunks,
                    # so the first are on the log while the rest are decided. The scan reads a
                    # snapshot, so what a chunk re-indexes is not met again in this tick.
                    self._commit(out, events, changes)
                    written += len(events)
                    changes, out, events = self._changes(), [], []
            # Set before the commit, whose re-indexed entries lower it again; a commit that fails
            # ends in a restore, which forgets it.
            floor = kept if floor is None else max(floor, kept)
            self._timer_floor[partition] = min(floor, self._tick_indexed.get(partition, floor))
        if out:
            self._commit(out, events, changes)
        elif changes.stale_timers:
            self._persist(changes)  # only the timer index changes: a store write, no transaction
        return written + len(events)

    def _timer_due_of(self, aggregate_id: str, state: S, changes: Changes[S, E]) -> int | None:
        """When the aggregate's decisions call for its timer now: its kept event's state's, if any."""
        kept = self._kept.of(changes, aggregate_id)
        return self.definition.next_timer_at(kept.effective if kept is not None else state)

    def _decide_timers(
        self, aggregate_id: str, partition: int, state: S, now: int, changes: Changes[S, E]
    ) -> Decided[S, E]:
        """The due timers of the state the aggregate's decisions see: with a kept event, the state
        after it, which then goes on the events topic first (keepalives.py)."""
        d = self.definition
        kept = self._kept.of(changes, aggregate_id)
        if kept is None:
            return self._evolve(aggregate_id, partition, state, d.decide_timers(state, now), changes)
        due = d.decide_timers(d.evolve(state, kept.event), now)
        decided = self._evolve(aggregate_id, partition, state, (kept.event, *due) if due else (), changes)
        decided.unkept = bool(due)
        return decided

    # --- the transaction and the store write (steps 3 and 4) ------------------------------------

    def _changes(self) -> Changes[S, E]:
        return Changes(self.definition.begin(self._store))

    def _state(self, changes: Changes[S, E], aggregate_id: str) -> S | None:
        if aggregate_id in changes.after:
            return changes.after[aggregate_id]
        return self.load(aggregate_id)

    def _commit(self, out: list[OutboundRecord], events: list[tuple[E, int]], changes: Changes[S, E]) -> int:
        """Step 3 then step 4; the number of records published after the commit."""
        started = time.monotonic()
        records = self._to_write(out, events, changes)
        with commit_span(self.definition.name, len(records)):  # tracing (issue 17): linked to the decisions
            written = self._log.commit(records)
        return self._committed(records, events, changes, written, started)

    def _to_write(
        self, out: list[OutboundRecord], events: list[tuple[E, int]], changes: Changes[S, E]
    ) -> list[OutboundRecord]:
        d = self.definition
        if d.changelog_topic is not None and changes.after:
            out = out + changelog_records(d, events, changes, self.checkpoint, self._lag)
        if d.keepalive_topic is not None and (changes.kept or changes.unkept):
            out = out + self._kept.marks(changes, d)
        return out

    def _committed(
        self,
        out: Sequence[OutboundRecord],
        events: list[tuple[E, int]],
        changes: Changes[S, E],
        written: Mapping[tuple[str, int], int],
        started: float,
    ) -> int:
        d = self.definition
        counted = events
        if d.keepalive_topic is not None:
            # A kept event is counted when it is kept, not again when it goes on the events topic.
            counted = self._kept.counted(changes, events)
            self._kept.committed(changes, written, d.keepalive_topic, self._layout, self._markers)
        self._lag.committed(changes)  # what the changelog lags by now: recorded by the store write
        if out:
            self.metrics.transaction(time.monotonic() - started)
        self.metrics.committed(counted)  # the areas' meters count what was committed (services/*/metrics.py)
        changes.published.extend(published_after(d, self._codec, events, written))
        for (topic, partition), offset in written.items():
            if topic in (d.events_topic, d.rejections_topic):
                changes.checkpoints[self._layout.checkpoint_key(topic, partition)] = offset + 1
        published = len(changes.published)
        self._persist(changes)
        return published

    def _persist(self, changes: Changes[S, E]) -> None:
        """Publish what must precede the checkpoints, then states, index entries, refused ids,
        the context's writes, timer skips and checkpoints: one write."""
        if changes.published:
            self._log.commit(changes.published)
        d, layout = self.definition, self._layout
        encode, encoded = d.state_codec.encode, changes.encoded
        puts = {
            layout.state_key(i): encoded[i] if i in encoded else encode(s) for i, s in changes.after.items()
        }
        deletes: list[str] = []
        kept, indexed_before = changes.kept, changes.indexed_before
        for aggregate_id in changes.after.keys() | kept.keys() if kept else changes.after:
            # Index entries follow the state decisions see: with a kept event, the one after it.
            entry = kept.get(aggregate_id)
            after = changes.after[aggregate_id] if entry is None else entry.effective
            partition = changes.partition_of.get(aggregate_id) if entry is None else entry.partition
            assert partition is not None
            before = (
                indexed_before[aggregate_id]
                if aggregate_id in indexed_before
                else changes.before[aggregate_id]
            )
            old = self._index_entries(partition, aggregate_id, before)
            new = self._index_entries(partition, aggregate_id, after)
            self._lower_timer_floor(partition, after)
            deletes.extend(key for key in old if key not in new)
            puts.update({key: value for key, value in new.items() if old.get(key) != value})
        for stale, (partition, aggregate_id, due) in changes.stale_timers.items():
            deletes.append(stale)
            if due is not None:
                puts[layout.timer_key(partition, due, aggregate_id)] = b""
                self._lower_floor(partition, due)
        context_puts, context_deletes = changes.context.writes()
        puts.update(context_puts)
        deletes.extend(context_deletes)
        puts.update({key: str(offset).encode() for key, offset in changes.checkpoints.items()})
        deletes.extend(changes.dropped)
        puts.update({layout.rejected_key(command_id): b"1" for command_id in changes.rejected})
        failures = changes.timer_failures
        puts.update({layout.timer_failed_key(i): str(v).encode() for i, v in failures.items()})
        # An aggregate that changed gets its timer tried again: its skip marker goes.
        cleared = [i for i in changes.after if i in self._failed_timers and i not in failures]
        deletes.extend(layout.timer_failed_key(i) for i in cleared)
        if puts or deletes:
            self._store.write(puts, tuple(key for key in deletes if key not in puts))
        self.decoded.keep(
            (i, puts[layout.state_key(i)], s) for i, s in changes.after.items() if s is not None
        )
        for aggregate_id in cleared:
            self._failed_timers.pop(aggregate_id, None)
        self._failed_timers.update(failures)
        changes.context.committed()

    def _lower_timer_floor(self, partition: int, state: S | None) -> None:
        if not self.definition.has_timers:
            return
        due = self.definition.next_timer_at(state)
        if due is not None:
            self._lower_floor(partition, due)

    def _lower_floor(self, partition: int, due: int) -> None:
        if partition in self._timer_floor:
            self._timer_floor[partition] = min(self._timer_floor[partition], due)
        self._tick_indexed[partition] = min(self._tick_indexed.get(partition, due), due)

    def _index_entries(self, partition: int, aggregate_id: str, state: S | None) -> dict[str, bytes]:
        entries = dict(self.definition.index_entries(partition, aggregate_id, state))
        if self.definition.has_timers:
            due = self.definition.next_timer_at(state)
            if due is not None:
                entries[self._layout.timer_key(partition, due, aggregate_id)] = b""
        return entries
