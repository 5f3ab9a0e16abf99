"""The records a unit of work writes beside its decisions: the state changelog's, in its
transaction, and the outputs published after it that name each event's offset."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from services.common.aggregate import changelog
from services.common.aggregate.changelog_lag import ChangelogLag
from services.common.aggregate.changes import Changes
from services.common.aggregate.definition import AggregateDefinition
from services.common.kafka import OutboundRecord
from services.common.messages import MessageCodec
from services.common.tracing import traced_as

__all__ = ["changelog_records", "published_after"]

S = TypeVar("S")
E = TypeVar("E")


def changelog_records(
    definition: AggregateDefinition[S, Any, E, Any],
    events: list[tuple[E, int]],
    changes: Changes[S, E],
    checkpoint: Callable[[int], int],
    lag: ChangelogLag,
) -> list[OutboundRecord]:
    """The unit's states (encoded once: the store write reuses the bytes) and the events offset
    the store had folded to before it, on each partition it writes events to and flushes now
    (changelog_lag.py); with them, the states of a lagging partition's aggregates changed since,
    and its older checkpoint. `changes.changelog` records what was flushed and deferred."""
    assert definition.changelog_topic is not None
    # One store read per partition the unit writes to, not per event.
    before = {partition: checkpoint(partition) for partition in {p for _, p in events}}
    flushing = lag.flushing(before)
    changes.changelog = (flushing, {p: c for p, c in before.items() if p not in flushing})
    encode, encoded = definition.state_codec.encode, changes.encoded
    states = []
    for aggregate_id, state in changes.after.items():
        partition = changes.partition_of[aggregate_id]
        if partition in flushing:
            raw = encoded[aggregate_id] = encode(state)
            states.append((aggregate_id, partition, raw))
    folded_to = {}
    for partition in flushing:
        folded_to[partition] = lag.since.get(partition, before[partition])
        waiting = lag.waiting_states(partition)
        states += [(i, partition, raw) for i, raw in waiting if i not in changes.after]
    return changelog.unit_records(definition.changelog_topic, states, folded_to, definition.state_format)


def published_after(
    definition: AggregateDefinition[Any, Any, E, Any],
    codec: MessageCodec,
    events: list[tuple[E, int]],
    written: Mapping[tuple[str, int], int],
) -> Iterable[OutboundRecord]:
    # One writer per partition and one transaction per unit: the events of a partition got
    # consecutive offsets ending at the last one written, so each event's offset is exact.
    topic = definition.events_topic
    later = Counter(partition for _, partition in events)
    for event, partition in events:
        later[partition] -= 1
        offset = written[(topic, partition)] - later[partition]
        published = definition.published_outputs(event, partition, offset, codec)
        yield from traced_as(definition.aggregate_id(event), published)
