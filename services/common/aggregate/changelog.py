"""An aggregate's state changelog: the latest state of each aggregate on a compacted topic.

Without it, a processor that restores a partition into an empty store (a new instance, a moved
partition, a lost disk) folds every event the partition ever held: 1M Run events took 41 s
(issue 16, docs/benchmarks.md). With it, the restore reads what compaction left of the
changelog, one record per aggregate plus the records written since the last cleaning, decodes
only the last state of each, and folds the events after the checkpoint the changelog names.
This is Kafka Streams' changelog restore; the events stay the system of record.

What is written, in the unit's one transaction with its events (so a reader sees both or
neither):
  * `<aggregateId>` -> the encoded state after the unit, for every aggregate it changed;
  * `CHECKPOINT_KEY` -> the events offset the store had folded up to when the unit began, on each
    partition the unit wrote events to. Every event below it belongs to an earlier unit, whose
    states are in the changelog already; the unit's own events are at or above it, and their
    states are in this transaction. A restore that takes the changelog folds the events from
    there: it meets only the unit's own events, as duplicates (their versions are not above the
    changelog's), and publishes their `published_outputs` again, which may not have been sent.

Every record carries the definition's `state_format`. A restore that meets another format (a
state layout changed by an upgrade), or a changelog not known to be whole (`COMPLETE_KEY`),
does not trust it: it folds the events, then writes every state it folded to the changelog
again, so the next restore can.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from services.common.kafka import InboundRecord, OutboundRecord

__all__ = [
    "CHECKPOINT_KEY",
    "COMPLETE_KEY",
    "FORMAT_HEADER",
    "KEEPALIVE_KEY",
    "ChangelogSeed",
    "PartitionLog",
    "RawRecord",
    "checkpoint_record",
    "complete_record",
    "keepalive_record",
    "read_seed",
    "reseed_records",
    "seed_of",
    "state_record",
    "unit_records",
]

# Keys no aggregate id can be (ids are printable; services/common/ids.py).
CHECKPOINT_KEY = b"\x00checkpoint"
# Written once the changelog holds every aggregate of the partition: by the first unit of a
# partition whose events were empty, or by a restore that wrote the changelog again. A changelog
# without it (records written since an upgrade that introduced it) is never trusted.
COMPLETE_KEY = b"\x00complete"
# The keepalive topic's low-water mark (services/common/aggregate/keepalives.py): a restore into
# an empty store reads the kept events from there instead of from the topic's start.
KEEPALIVE_KEY = b"\x00keepalive"
FORMAT_HEADER = "tenure-state-format"


def state_record(
    topic: str, aggregate_id: str, partition: int, encoded: bytes, state_format: str
) -> OutboundRecord:
    return OutboundRecord(
        topic, aggregate_id.encode(), encoded, ((FORMAT_HEADER, state_format.encode()),), partition
    )


def checkpoint_record(topic: str, partition: int, events_offset: int, state_format: str) -> OutboundRecord:
    return _mark(topic, CHECKPOINT_KEY, partition, str(events_offset).encode(), state_format)


def complete_record(topic: str, partition: int, state_format: str) -> OutboundRecord:
    return _mark(topic, COMPLETE_KEY, partition, b"1", state_format)


def keepalive_record(topic: str, partition: int, keepalive_offset: int, state_format: str) -> OutboundRecord:
    return _mark(topic, KEEPALIVE_KEY, partition, str(keepalive_offset).encode(), state_format)


def _mark(topic: str, key: bytes, partition: int, value: bytes, state_format: str) -> OutboundRecord:
    return OutboundRecord(topic, key, value, ((FORMAT_HEADER, state_format.encode()),), partition)


@dataclass
class ChangelogSeed:
    """What a changelog partition holds. `usable`: every record is in the current format and a
    checkpoint was found; then `states` (aggregateId -> encoded state) and `checkpoint` (the
    events offset to fold from) are exact. `records`: how many were read."""

    usable: bool = False
    checkpoint: int = 0
    keepalive_from: int = 0  # the keepalive topic's low-water mark (0: none written yet)
    states: dict[str, bytes] = field(default_factory=dict)
    records: int = 0

    @property
    def empty(self) -> bool:
        return self.records == 0


class PartitionLog(Protocol):
    """What reading a changelog needs of a log (an EventLog, or a bare PartitionReader)."""

    def read(self, topic: str, partition: int, start_offset: int) -> Iterator[InboundRecord]: ...


def read_seed(log: PartitionLog, topic: str, partition: int, state_format: str) -> ChangelogSeed:
    """Read a changelog partition to its end, keeping the last value of each key undecoded."""
    return seed_of(((r.key, r.value, r.headers) for r in log.read(topic, partition, 0)), state_format)


RawRecord = tuple[bytes | None, bytes | None, Iterable[tuple[str, bytes | None]] | None]


def seed_of(records: Iterable[RawRecord], state_format: str) -> ChangelogSeed:
    """What a changelog partition's records (key, value, headers), read in order, seed."""
    seed = ChangelogSeed()
    latest: dict[bytes, tuple[bytes, bytes | None]] = {}
    count = 0
    for key, value, headers in records:
        count += 1
        if key is not None:  # a tombstone (no value) carries no format: the seed is then not used
            latest[key] = (value or b"", _format_of(headers or ()))
    seed.records = count
    wanted = state_format.encode()
    # The keepalive mark is an offset of another topic, whatever the states' format: a changelog
    # written again after a format change (which writes no mark) is not distrusted for it.
    keepalive = latest.pop(KEEPALIVE_KEY, None)
    # Only the last record of a key counts: what compaction has not removed yet was superseded.
    if any(written_format != wanted for _, written_format in latest.values()):
        return seed
    checkpoint, complete = latest.pop(CHECKPOINT_KEY, None), latest.pop(COMPLETE_KEY, None)
    if checkpoint is None or complete is None:
        return seed  # written since an upgrade only, or cut while being written again: not whole
    seed.usable = True
    seed.checkpoint = int(checkpoint[0])
    seed.keepalive_from = int(keepalive[0]) if keepalive is not None else 0
    seed.states = {key.decode(): value for key, (value, _) in latest.items()}
    return seed


def _format_of(headers: Iterable[tuple[str, bytes | None]]) -> bytes | None:
    for name, value in headers:
        if name == FORMAT_HEADER:
            return value
    return None


def unit_records(
    topic: str,
    states: Iterable[tuple[str, int, bytes]],
    folded_to: Mapping[int, int],
    state_format: str,
) -> list[OutboundRecord]:
    """What one unit adds to its transaction: each state it changed (aggregateId, partition,
    encoded state) and, on each partition it wrote events to, the events offset the store had
    folded to before it (`folded_to`); the mark that the changelog is whole goes with a
    partition's first events (folded to 0)."""
    records = [
        state_record(topic, aggregate_id, partition, encoded, state_format)
        for aggregate_id, partition, encoded in states
    ]
    for partition, offset in sorted(folded_to.items()):
        records.append(checkpoint_record(topic, partition, offset, state_format))
        if offset == 0:
            records.append(complete_record(topic, partition, state_format))
    return records


def reseed_records(
    topic: str, states: Iterable[tuple[str, bytes]], partition: int, events_offset: int, state_format: str
) -> list[OutboundRecord]:
    """Every state of a partition and its checkpoint, to write the changelog again."""
    records = [
        state_record(topic, aggregate_id, partition, encoded, state_format)
        for aggregate_id, encoded in states
    ]
    records.append(checkpoint_record(topic, partition, events_offset, state_format))
    records.append(complete_record(topic, partition, state_format))
    return records
