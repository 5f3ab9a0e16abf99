"""A state changelog written less often than every unit: its lag behind the store, per partition.

Every unit that changes an aggregate with a `changelog_topic` used to put its states and a
checkpoint on that topic in its own transaction (changelog.py). That is one more partition in
every transaction, and a transaction's cost grows with its partitions: the owner prototype's
durable steps ran 6-49% faster without it (docs/benchmarks.md, "The Run's state changelog in
every transaction"). With `every_ms` > 0, a unit defers its states, and the first unit of a
partition after `every_ms` (or once `max_states` aggregates wait) writes them all.

The invariant a restore relies on stays that of changelog.py: **every event below the
changelog's checkpoint has its aggregate's state in the changelog.** So:

  * A partition whose units deferred is *lagging*. `since` is the events checkpoint of its first
    deferred unit. It is kept in the store, with the unit's own store write, as a checkpoint of
    the pseudo-topic `<changelog_topic>.lag` (no key: not lagging). The ids of the aggregates
    changed since are kept in memory.
  * A flush writes the state of every aggregate changed since, with the checkpoint `since`, not
    the current one. After it commits, the partition is no longer lagging.
  * A restore cannot trust memory. Before it stores any fold, it lowers the stored `since` to the
    events checkpoint it folds from (restore.py): a crash between a deferring unit's transaction
    and its store write left no `since`, and those events are folded now. After it, the
    aggregates changed since `since` are those the fold changed, and, for a `since` from before
    the restore, the keys of the events between it and the fold, read again. Marking an
    aggregate whose state the changelog already holds is harmless; a lower `since` than needed
    only makes a later restore fold more.
  * A restore that wrote the whole changelog again (restore.py) leaves the partition not lagging.

The lag is bounded by what deferred units wrote: a restore from the changelog folds at most
those events on top of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from services.common.aggregate.changes import Changes
from services.common.aggregate.definition import AggregateDefinition
from services.common.clock import Clock
from services.common.eventlog import EventLog
from services.common.store import KeyValueStore

__all__ = ["ChangelogLag"]


class ChangelogLag:
    """Which partitions' changelog lags the store, since when, and by which aggregates."""

    def __init__(
        self,
        definition: AggregateDefinition[Any, Any, Any, Any],
        store: KeyValueStore,
        clock: Clock,
        every_ms: int,
        max_states: int,
    ) -> None:
        self._definition = definition
        self._store = store
        self._clock = clock
        self._pseudo_topic = f"{definition.changelog_topic}.lag"  # where `since` is stored
        self.every_ms = every_ms
        self.max_states = max_states
        self.since: dict[int, int] = {}  # partition -> the events checkpoint of its first deferred unit
        self.started: dict[int, int] = {}  # partition -> when its first deferred unit was decided (ms)
        self.changed: dict[int, set[str]] = {}  # partition -> aggregates changed since `since`

    def key(self, partition: int) -> str:
        return self._definition.layout.checkpoint_key(self._pseudo_topic, partition)

    def flushing(self, partitions: Iterable[int]) -> set[int]:
        """Of the partitions a unit writes events to, those whose states it writes now."""
        if self.every_ms <= 0:
            return set(partitions)
        now = self._clock.now_ms()
        return {
            p
            for p in partitions
            if p in self.since
            and (now - self.started[p] >= self.every_ms or len(self.changed[p]) >= self.max_states)
        }

    def committed(self, changes: Changes[Any, Any]) -> None:
        """A unit's transaction committed with the changelog records `changes.changelog` names:
        its flushed partitions are current, its deferred ones (partition -> its events
        checkpoint before it) lag. The unit's store write records `since` or drops it."""
        if changes.changelog is None:
            return
        flushed, deferred = changes.changelog
        for partition in flushed:
            if self.since.pop(partition, None) is not None:
                changes.dropped.append(self.key(partition))
            self.started.pop(partition, None)
            self.changed.pop(partition, None)
        for partition, checkpoint in deferred.items():
            if partition not in self.since:
                self.since[partition] = checkpoint
                self.started[partition] = self._clock.now_ms()
                self.changed[partition] = set()
                changes.checkpoints[self.key(partition)] = checkpoint
        for aggregate_id in changes.after:
            partition = changes.partition_of[aggregate_id]
            if partition in deferred:
                self.changed[partition].add(aggregate_id)

    def restored(self, partition: int, folded_from: int, folded: set[str], log: EventLog) -> None:
        """After a restore of `partition` that folded from the events checkpoint `folded_from`
        and changed the aggregates `folded` (it stored, with the first of them, `since` lowered
        to `folded_from`: restore.py). A `since` below `folded_from` is a lag from before the
        restore: the aggregates changed then are read again from the log, up to `folded_from`.
        If none changed, nothing lags and the stored `since` goes."""
        self.forget(partition)
        stored = self._store.get(self.key(partition))
        if stored is None:
            return
        since = int(stored)
        changed = set(folded)
        if since < folded_from:
            changed.update(
                record.key.decode()
                for record in log.read(self._definition.events_topic, partition, since)
                if record.offset < folded_from and record.key is not None
            )
        if not changed:
            self._store.write({}, (self.key(partition),))
            return
        self.since[partition] = since
        self.started[partition] = self._clock.now_ms()
        self.changed[partition] = changed

    def forget(self, partition: int) -> None:
        self.since.pop(partition, None)
        self.started.pop(partition, None)
        self.changed.pop(partition, None)

    def clear(self) -> None:
        self.since.clear()
        self.started.clear()
        self.changed.clear()

    def waiting_states(self, partition: int) -> list[tuple[str, bytes]]:
        """The stored states of the aggregates changed since `since` (for a flush)."""
        state_key = self._definition.layout.state_key
        states = []
        for aggregate_id in sorted(self.changed.get(partition, ())):
            raw = self._store.get(state_key(aggregate_id))
            if raw is not None:
                states.append((aggregate_id, raw))
        return states
