"""Step 1 of the commit path (services/common/aggregate/processor.py): restore one partition.

Before the first command of a partition, its events and rejections are folded from the stored
checkpoints to their end into the store: states, indexes, refused command ids, the batch
context, and the `published_outputs` of every folded event, published again. A long restore is
persisted in chunks (bounded memory; progress survives a crash), each through the processor's
own store write, so a restore writes exactly what steps 3 and 4 would have.

An empty store first takes the state changelog, if the definition has one and it can be trusted
(services/common/aggregate/changelog.py), and folds only the events after its checkpoint; a
changelog it cannot trust is ignored, and every state the fold made is written to it again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

from services.common.aggregate import changelog
from services.common.aggregate.changelog_lag import ChangelogLag
from services.common.aggregate.changes import Changes
from services.common.aggregate.definition import AggregateDefinition, Transition
from services.common.aggregate.keepalives import KeptDecisions, end_key, low_water, read_kept, restore_from
from services.common.contracts import CommandRejected
from services.common.eventlog import EventLog
from services.common.health import ProcessorMetrics
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.sequencing import Sequencing, sequence
from services.common.store import KeyValueStore

__all__ = ["PartitionRestorer"]

S = TypeVar("S")
C = TypeVar("C")
E = TypeVar("E")
X = TypeVar("X")

# A long restore is persisted in chunks: memory stays bounded, and progress survives a crash.
_RESTORE_FLUSH_EVERY = 1000


class PartitionRestorer(Generic[S, C, E, X]):
    """Restores partitions of one aggregate definition; the processor calls it under its lock.

    `load` and `checkpoint` are the processor's reads of the store, `begin` starts a unit of
    changes and `persist` is the processor's one store write (step 4)."""

    def __init__(
        self,
        definition: AggregateDefinition[S, C, E, X],
        event_log: EventLog,
        store: KeyValueStore,
        codec: MessageCodec,
        metrics: ProcessorMetrics,
        *,
        load: Callable[[str], S | None],
        checkpoint: Callable[..., int],
        begin: Callable[[], Changes[S, E]],
        persist: Callable[[Changes[S, E]], None],
        lag: ChangelogLag | None = None,
    ) -> None:
        self._definition = definition
        self._log = event_log
        self._store = store
        self._codec = codec
        self.metrics = metrics
        self._layout = definition.layout
        self._load = load
        self._checkpoint = checkpoint
        self._begin = begin
        self._persist = persist
        # A changelog written less often than every unit: its lag (changelog_lag.py).
        self._lag = lag

    def restore(self, partition: int) -> int:
        """Fold the committed events and refusals of `partition` after the checkpoints.

        Refusals are restored too: a command refused before a crash must stay refused when it is
        redelivered, even if a later command of the same batch has since changed the aggregate."""
        d = self._definition
        started = time.monotonic()
        applied = 0
        changes = self._begin()
        next_offset = self._checkpoint(partition)
        # An empty store takes the changelog's states, then folds only the events after its
        # checkpoint (services/common/aggregate/changelog.py); a changelog it cannot trust is
        # written again from the fold. `folded` collects the aggregates the fold changes: what
        # to write again, or what the changelog may lack (changelog_lag.py).
        seeded, represented, reseed = False, 0, False
        if next_offset == 0 and d.changelog_topic is not None:
            seeded, next_offset, represented = self._seed(partition)
            reseed = not seeded
        folded: set[str] | None = set() if reseed or self._lag is not None else None
        # Where the log ends before reading: everything below it is read (records) or skipped
        # (transaction markers), so the checkpoint may move there. Resuming at the last record
        # + 1 instead would leave its commit marker to be fetched again on every restart.
        events_end = self._log.end_offset(d.events_topic, partition)
        rejections_end = self._log.end_offset(d.rejections_topic, partition)
        # With the first event the fold applies (its state is stored with it), the changelog's
        # lag goes down to where the fold began: the changelog may lack what is folded now
        # (changelog_lag.py). Duplicates are events whose states it already holds.
        lag_key = self._lag.key(partition) if self._lag is not None else None
        lag_from = next_offset
        # The loop runs once per event of the log: its lookups are bound once (issue 16). The
        # working states stay in `changes.after`; each is encoded once per chunk, at `_persist`.
        event_types, decode, evolve = d.event_types, self.decode_logged, d.evolve
        aggregate_of, version_of, event_version = d.aggregate_id, d.version, d.event_version
        published_of, codec = d.published_outputs, self._codec
        for record in self._log.read(d.events_topic, partition, next_offset):
            next_offset = record.offset + 1
            event = decode(record)
            if not isinstance(event, event_types):
                continue
            aggregate_id = aggregate_of(event)
            working = changes.after
            state = working[aggregate_id] if aggregate_id in working else self._load(aggregate_id)
            current = version_of(state) if state is not None else 0
            if sequence(aggregate_id, current, event_version(event)) is Sequencing.DUPLICATE:
                if seeded:  # the changelog's last unit: its outputs may not have been published
                    changes.published.extend(published_of(event, partition, record.offset, codec))
                continue
            if folded is not None:
                folded.add(aggregate_id)
            if lag_key is not None:
                stored = self._store.get(lag_key)
                since = int(stored) if stored is not None and int(stored) >= 0 else lag_from
                changes.checkpoints[lag_key] = min(since, lag_from)
                lag_key = None
            after = evolve(state, event)
            changes.context.accept(partition, (Transition(state, event, after),))
            changes.settle(partition, aggregate_id, state, after)
            outputs = published_of(event, partition, record.offset, codec)
            if outputs:
                changes.published.extend(outputs)
            applied += 1
            if len(working) >= _RESTORE_FLUSH_EVERY:
                changes.checkpoints[self._layout.checkpoint_key(d.events_topic, partition)] = next_offset
                self._persist(changes)
                changes = self._begin()
        next_rejection = self._checkpoint(partition, d.rejections_topic)
        for record in self._log.read(d.rejections_topic, partition, next_rejection):
            next_rejection = record.offset + 1
            rejection = self.decode_logged(record)
            if isinstance(rejection, CommandRejected):
                changes.rejected.add(rejection.causation_id)
        checkpoint = self._layout.checkpoint_key
        changes.checkpoints[checkpoint(d.events_topic, partition)] = max(next_offset, events_end)
        changes.checkpoints[checkpoint(d.rejections_topic, partition)] = max(next_rejection, rejections_end)
        self._persist(changes)
        if reseed and folded:
            self._write_changelog_again(
                partition, folded, changes.checkpoints[checkpoint(d.events_topic, partition)]
            )
            if self._lag is not None:  # whole again: nothing lags
                self._store.write({}, (self._lag.key(partition),))
                self._lag.forget(partition)
        elif self._lag is not None:
            self._lag.restored(partition, lag_from, folded or set(), self._log)
        self.metrics.restored(represented + applied, time.monotonic() - started)
        if applied or changes.rejected:
            d.log.info(
                "restored %s partition %d: %d events and %d refusals folded, checkpoint %d",
                d.name,
                partition,
                applied,
                len(changes.rejected),
                next_offset,
            )
        return represented + applied

    def restore_kept(self, partition: int, topic: str, decisions: KeptDecisions[S, E]) -> None:
        """After the fold: the kept events still live, from the keepalive topic's low-water mark
        to its end (keepalives.py), with their timer index entries. The store's mark may be stale:
        another owner may have kept events since (a rebalance), or this process's last commit
        landed without its store write (a crash between steps 3 and 4). Both show as a topic that
        grew past the end this store last knew, and everything written since is read too."""
        end = self._log.end_offset(topic, partition)
        raw_end = self._store.get(end_key(self._layout, topic, partition))
        start = restore_from(self._checkpoint(partition, topic), int(raw_end) if raw_end else None, end)
        records = self._log.read(topic, partition, start) if 0 <= start < end else ()
        kept = read_kept(self._definition, records, self.decode_logged, self._load, partition)
        changes = self._begin()
        changes.kept = kept
        changes.indexed_before = {i: k.durable for i, k in kept.items()}
        changes.checkpoints[self._layout.checkpoint_key(topic, partition)] = low_water(kept)
        changes.checkpoints[end_key(self._layout, topic, partition)] = end
        self._persist(changes)
        decisions.apply(kept, ())
        decisions.ends[partition] = end

    def _seed(self, partition: int) -> tuple[bool, int, int]:
        """Take a trustworthy changelog's states into the store, in ONE write with the events
        checkpoint it names (a crash before it leaves the partition empty, so the seed is
        simply taken again); (taken, the events offset to fold from, the number of events the
        states are the fold of: their versions)."""
        d = self._definition
        assert d.changelog_topic is not None
        seed = changelog.read_seed(self._log, d.changelog_topic, partition, d.state_format)
        if not seed.usable:
            if not seed.empty:
                d.log.warning(
                    "%s partition %d: the state changelog (%d records) is not whole or not in format %s;"
                    " folding the events and writing it again",
                    d.name,
                    partition,
                    seed.records,
                    d.state_format,
                )
            return False, 0, 0
        changes = self._begin()
        represented = 0
        decode, accept_state = d.state_codec.decode, changes.context.accept_state
        for aggregate_id, raw in seed.states.items():
            state = decode(raw)
            changes.settle(partition, aggregate_id, None, state)
            changes.encoded[aggregate_id] = raw
            accept_state(partition, state)
            represented += d.version(state)
        changes.checkpoints[self._layout.checkpoint_key(d.events_topic, partition)] = seed.checkpoint
        if d.keepalive_topic is not None:
            keepalive_mark = self._layout.checkpoint_key(d.keepalive_topic, partition)
            changes.checkpoints[keepalive_mark] = seed.keepalive_from
        self._persist(changes)
        self.metrics.restored_from_changelog(len(seed.states), seed.records)
        return True, seed.checkpoint, represented

    def _write_changelog_again(self, partition: int, aggregate_ids: set[str], events_offset: int) -> None:
        """After a fold from the start: every state of the partition, then the checkpoint and the
        mark that the changelog is whole (in the last transaction)."""
        d = self._definition
        assert d.changelog_topic is not None
        states = [
            (i, raw) for i in sorted(aggregate_ids) if (raw := self._store.get(self._layout.state_key(i)))
        ]
        records = changelog.reseed_records(
            d.changelog_topic, states, partition, events_offset, d.state_format
        )
        for start in range(0, len(records), _RESTORE_FLUSH_EVERY):
            self._log.commit(records[start : start + _RESTORE_FLUSH_EVERY])
        d.log.info("%s partition %d: wrote %d states to the changelog again", d.name, partition, len(states))

    def decode_logged(self, record: InboundRecord) -> object:
        try:
            return self._codec.decode(record.value)
        except UndecodableRecord as exc:
            # Only this processor writes these topics; garbage there is an incident, but one bad
            # record must not stop every aggregate of the partition from being served.
            self._definition.log.error(
                "undecodable record in %s[%d]@%d: %s", record.topic, record.partition, record.offset, exc
            )
            return None
