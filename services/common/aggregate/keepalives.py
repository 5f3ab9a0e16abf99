"""Keepalives: decisions the runtime keeps off the events topic (issue 16's lease renewals).

A lease renewal every few seconds was, before this, an event of the Run like any other: a
forever-retained record on runs.events, a state write, a changelog record, and a fold in the
projector and in every API instance. etcd keeps lease keepalives out of its Raft log; this is
the same idea with Kafka's guarantees instead of a leader lease.

A definition with a `keepalive_topic` says, through `is_keepalive(durable, events)`, which
decisions may stay off its events topic (the Run: a bare renewal of an active lease whose last
renewal on the log is less than half a lease old). Such a decision's one event is committed in
the batch's transaction to the keepalive topic instead (co-partitioned, a retention of its own:
the renewal history), and the runtime keeps it in memory as a `Kept`:

  * `durable`: the state the store holds, the fold of the events topic (version v); the next
    command for the aggregate is decided against it without reading the store back;
  * `event`: the latest kept event, decided against the durable state with its own version
    (v + 1), whatever was kept before it;
  * `effective`: the state after it, which the next decisions and the timers see.

Why the safety rules hold:
  1. Committed before it is answered. The kept event is in the batch's transaction, and the API
     answers a renewal only once it reads the event, read-committed: an instance fenced by a
     rebalance or a restart cannot answer one.
  2. Never forgotten by a restore. After the events are folded, the restore reads the keepalive
     topic to its end (restore.py, `restore_kept`) and keeps, for each aggregate, the chain of
     events whose version is the durable one + 1. It reads from a low-water mark, at or below
     the offset of every kept event the store knew to be live (written with each unit that
     changes what is kept, to the store and to the state changelog), and from the topic's end as
     the store last knew it when the topic grew since (`restore_from`: another owner kept events
     after a rebalance, or a crash cut this process's store write after its commit). An empty
     store takes the changelog's mark, the last owner's. Later decisions and timers (the expiry)
     see exactly the state the previous owner answered from, so an expiry is never decided
     earlier than the holder may believe its lease valid.
  3. The log stays the fold. Any other decision for the aggregate, and any timer with work,
     first puts the kept event on the events topic (its version is the durable one + 1, its id
     deterministic), then decides against the state after it: the store's state is always the
     fold of the events topic, versions stay gapless, and the kept event is on the log once.
A kept event has no transaction or published outputs, and changes nothing a batch context tracks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from services.common.aggregate import changelog
from services.common.aggregate.definition import AggregateDefinition, Refused, StoreLayout
from services.common.kafka import OutboundRecord

if TYPE_CHECKING:
    from services.common.aggregate.changes import Changes

__all__ = [
    "NONE_LIVE",
    "Kept",
    "KeptDecisions",
    "KeptOutcome",
    "decide_with_kept",
    "end_key",
    "low_water",
    "read_kept",
    "restore_from",
]

# A low-water mark that says no kept event is live: a restore reads nothing of the topic.
NONE_LIVE = -1

S = TypeVar("S")
C = TypeVar("C")
E = TypeVar("E")
X = TypeVar("X")


@dataclass(frozen=True)
class Kept(Generic[S, E]):
    """An aggregate's latest kept event, with the states around it (see the module docstring).
    `offset`: at or below the offset of its record on the keepalive topic."""

    event: E
    durable: S
    effective: S
    partition: int
    offset: int


@dataclass(frozen=True)
class KeptOutcome(Generic[S, E]):
    """How one command was decided. `keep`: the decision's one event stays off the events topic
    (its state after is `effective`); `materialise`: the kept event that goes on the events topic
    before `decision`'s events; `replaces`: `decision` goes on the events topic instead of it."""

    decision: Sequence[E] | Refused
    keep: E | None = None
    effective: S | None = None
    materialise: E | None = None
    replaces: bool = False  # `decision` follows the durable state directly; the kept event goes


def decide_with_kept(
    definition: AggregateDefinition[S, C, E, X],
    durable: S | None,
    kept: Kept[S, E] | None,
    command: C,
    now_ms: int,
    context: X,
) -> KeptOutcome[S, E]:
    """`decide` of a definition with keepalives, against the durable state and its kept event."""
    d = definition
    if kept is None:
        decision = d.decide(durable, command, now_ms, context)
        if durable is not None and _is_kept(d, durable, decision):
            assert not isinstance(decision, Refused)
            return KeptOutcome(decision, decision[0], d.evolve(durable, decision[0]))
        return KeptOutcome(decision)
    assert durable is not None
    # Decided with the durable version, so that a kept event always carries version v + 1.
    base = d.at_version(kept.effective, d.version(durable))
    decision = d.decide(base, command, now_ms, context)
    if isinstance(decision, Refused) or not decision:
        return KeptOutcome(decision)  # refused, or decided before: nothing is written for it
    if _is_kept(d, durable, decision):
        return KeptOutcome(decision, decision[0], d.evolve(base, decision[0]))
    if d.replaces_kept(decision):
        # Decided at the durable version, it may follow the durable state on the log directly.
        return KeptOutcome(decision, replaces=True)
    # Anything else: the kept event goes on the log first, and the command is decided after it.
    decision = d.decide(d.evolve(durable, kept.event), command, now_ms, context)
    if isinstance(decision, Refused) or not decision:
        return KeptOutcome(decision)
    return KeptOutcome(decision, materialise=kept.event)


def _is_kept(definition: AggregateDefinition[Any, Any, Any, Any], durable: Any, decision: Any) -> bool:
    return (
        definition.keepalive_topic is not None
        and not isinstance(decision, Refused)
        and len(decision) == 1
        and definition.is_keepalive(durable, decision)
    )


class KeptDecisions(Generic[S, E]):
    """The kept events of the owned partitions, oldest first per partition, and each partition's
    keepalive-topic end as this processor last wrote or read it."""

    def __init__(self) -> None:
        self._by_partition: dict[int, OrderedDict[str, Kept[S, E]]] = {}
        self._partition_of: dict[str, int] = {}
        self.ends: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._partition_of)

    def get(self, aggregate_id: str) -> Kept[S, E] | None:
        partition = self._partition_of.get(aggregate_id)
        return None if partition is None else self._by_partition[partition].get(aggregate_id)

    def clear(self) -> None:
        self._by_partition.clear()
        self._partition_of.clear()
        self.ends.clear()

    def drop_partition(self, partition: int) -> None:
        for aggregate_id in self._by_partition.pop(partition, {}):
            self._partition_of.pop(aggregate_id, None)
        self.ends.pop(partition, None)

    def of(self, changes: Changes[S, E], aggregate_id: str) -> Kept[S, E] | None:
        """The aggregate's kept event as a unit of work sees it: its own, or none since it put it
        on the events topic, or the one kept before the unit."""
        if aggregate_id in changes.kept:
            return changes.kept[aggregate_id]
        return None if aggregate_id in changes.unkept else self.get(aggregate_id)

    @staticmethod
    def settle(changes: Changes[S, E], aggregate_id: str, unkept: bool) -> None:
        """A decision went on the events topic; `unkept`: it put the kept event there first."""
        if unkept:
            changes.kept.pop(aggregate_id, None)
            changes.unkept.add(aggregate_id)

    def low_waters(self, kept: Mapping[str, Kept[S, E]], unkept: Iterable[str]) -> dict[int, int]:
        """Per partition a unit touches, an offset at or below every kept event that is live once
        the unit is applied: the oldest survivor's, or this unit's start (the partition's end
        before it) when the unit keeps new ones; NONE_LIVE when none is live then, so that a
        restore reads nothing (the common case once a partition's leases all ended)."""
        changed = set(kept) | set(unkept)
        partitions = {k.partition for k in kept.values()}
        partitions |= {p for i in unkept if (p := self._partition_of.get(i)) is not None}
        marks: dict[int, int] = {}
        for partition in partitions:
            end = self.ends.get(partition, 0)
            oldest = next(
                (k.offset for i, k in self._by_partition.get(partition, {}).items() if i not in changed),
                None,
            )
            if oldest is None and not any(k.partition == partition for k in kept.values()):
                marks[partition] = NONE_LIVE
            else:
                marks[partition] = end if oldest is None else min(oldest, end)
        return marks

    def marks(
        self, changes: Changes[S, E], definition: AggregateDefinition[S, Any, E, Any]
    ) -> list[OutboundRecord]:
        """Before a unit's commit: the state each aggregate it touches had its index entries made
        from, and each touched partition's new low-water mark (`mark_prefix` + partition) for the
        store, and as a changelog record for a restore into an empty store."""
        for aggregate_id in changes.kept.keys() | changes.unkept:
            old = self.get(aggregate_id)
            if old is not None:
                changes.indexed_before[aggregate_id] = old.effective
            elif aggregate_id in changes.before:
                changes.indexed_before[aggregate_id] = changes.before[aggregate_id]
            else:
                changes.indexed_before[aggregate_id] = changes.kept[aggregate_id].durable
        records = []
        topic, state_format = definition.changelog_topic, definition.state_format
        assert definition.keepalive_topic is not None
        for partition, mark in self.low_waters(changes.kept, changes.unkept).items():
            changes.checkpoints[definition.layout.checkpoint_key(definition.keepalive_topic, partition)] = (
                mark
            )
            if topic is not None:
                records.append(changelog.keepalive_record(topic, partition, mark, state_format))
        return records

    def counted(self, changes: Changes[S, E], events: Sequence[tuple[E, int]]) -> list[tuple[E, int]]:
        """What a unit decided, for the meters: its events but those kept before it (counted
        then), and the events it kept."""
        before = {id(k.event) for i in changes.unkept if (k := self.get(i)) is not None}
        fresh = [(e, p) for e, p in events if id(e) not in before]
        return fresh + [(k.event, k.partition) for k in changes.kept.values()]

    def committed(
        self,
        changes: Changes[S, E],
        written: Mapping[tuple[str, int], int],
        topic: str,
        layout: StoreLayout,
        markers: int,
    ) -> None:
        """A unit's transaction committed: apply it, move the ends of what it wrote, and have the
        unit's store write remember each end, its commit marker included (`markers`: the log's
        control records per commit), so that a restore can tell whether the topic grew since
        (`restore_from`) without reading it when it did not."""
        self.apply(changes.kept, changes.unkept)
        for (written_topic, partition), offset in written.items():
            if written_topic == topic:
                self.ends[partition] = offset + 1
                changes.checkpoints[end_key(layout, topic, partition)] = offset + 1 + markers

    def apply(self, kept: Mapping[str, Kept[S, E]], unkept: Iterable[str]) -> None:
        """A committed unit: what it put on the events topic goes, what it kept comes (newest)."""
        for aggregate_id in unkept:
            partition = self._partition_of.pop(aggregate_id, None)
            if partition is not None:
                self._by_partition[partition].pop(aggregate_id, None)
        for aggregate_id, entry in kept.items():
            old = self._partition_of.get(aggregate_id)
            if old is not None:
                self._by_partition[old].pop(aggregate_id, None)
            self._by_partition.setdefault(entry.partition, OrderedDict())[aggregate_id] = entry
            self._partition_of[aggregate_id] = entry.partition


def end_key(layout: StoreLayout, topic: str, partition: int) -> str:
    """The store key of the keepalive topic's end as this store last knew it."""
    return layout.checkpoint_key(f"{topic}@end", partition)


def restore_from(mark: int, stored_end: int | None, end: int) -> int:
    """Where a restore reads the keepalive topic from: the store's low-water mark, unless the
    topic grew past the end the store last knew (`stored_end`). Then someone wrote kept events
    the mark does not cover (another owner after a rebalance, or this process's own commit whose
    store write a crash cut), all at or above that end: read from there too. No stored end (an
    empty store seeded from the changelog, whose mark is the last owner's): the mark as it is."""
    if stored_end is None or end <= stored_end:
        return mark
    return stored_end if mark == NONE_LIVE else min(mark, stored_end)


def low_water(kept: Mapping[str, Kept[Any, Any]]) -> int:
    """A restore's new mark: the oldest live kept event's offset, or NONE_LIVE with none live."""
    return min((k.offset for k in kept.values()), default=NONE_LIVE)


def read_kept(
    definition: AggregateDefinition[S, C, E, X],
    records: Iterable[Any],
    decode: Any,
    load: Any,
    partition: int,
) -> dict[str, Kept[S, E]]:
    """A restore's kept events: of the keepalive records from the low-water mark to the end (in
    order), the chain of each aggregate whose version is its durable state's + 1."""
    d = definition
    kept: dict[str, Kept[S, E]] = {}
    for record in records:
        event = decode(record)
        if not isinstance(event, d.event_types):
            continue
        aggregate_id = d.aggregate_id(event)
        durable = load(aggregate_id)
        if durable is None or d.event_version(event) != d.version(durable) + 1:
            continue  # on the events topic since, or superseded by a later event there
        before = kept.pop(aggregate_id, None)  # re-inserted: oldest first
        base = durable if before is None else d.at_version(before.effective, d.version(durable))
        kept[aggregate_id] = Kept(event, durable, d.evolve(base, event), partition, record.offset)
    return kept
