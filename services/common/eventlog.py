"""The event-log port processors write through, its Kafka implementation and an in-memory twin.

`commit` is atomic: every record of the call is visible to readers or none is. `read` returns
only committed records of one partition, from an offset to the end as of the call.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Iterator, Protocol, Sequence

from services.common.kafka import (
    GroupFence,
    InboundRecord,
    OutboundRecord,
    PartitionReader,
    TransactionalWriter,
)

__all__ = ["EventLog", "KafkaEventLog", "MemoryEventLog"]


class EventLog(Protocol):
    def commit(self, records: Sequence[OutboundRecord]) -> dict[tuple[str, int], int]: ...

    def read(self, topic: str, partition: int, start_offset: int) -> Iterator[InboundRecord]: ...

    def end_offset(self, topic: str, partition: int) -> int:
        """Where a reader that read everything committed so far may resume (past the markers)."""
        ...


class KafkaEventLog:
    # A committed transaction ends, on each partition it wrote, with one control record: the end
    # of a partition right after a commit is its last record's offset + 1 + this.
    markers_per_commit = 1

    def __init__(self, bootstrap_servers: str, transactional_id: str) -> None:
        self._writer = TransactionalWriter(bootstrap_servers, transactional_id)
        self._reader = PartitionReader(bootstrap_servers, client_id=f"{transactional_id}-restore")
        # The consumer-group generation the calling thread decides under (set by the process
        # once its stream exists, services/common/process.py): every transaction carries it, so
        # an instance that lost its partitions in a rebalance cannot commit (issue 16).
        self.fence: Callable[[], GroupFence | None] | None = None

    def commit(self, records: Sequence[OutboundRecord]) -> dict[tuple[str, int], int]:
        fence = self.fence() if self.fence is not None else None
        return self._writer.commit(records, fence=fence)

    def read(self, topic: str, partition: int, start_offset: int) -> Iterator[InboundRecord]:
        return self._reader.read(topic, partition, start_offset)

    def end_offset(self, topic: str, partition: int) -> int:
        return self._reader.end_offset(topic, partition)

    def close(self) -> None:
        self._writer.close()
        self._reader.close()


class MemoryEventLog:
    """A twin for unit tests: partitions are lists; a failing commit leaves nothing behind."""

    markers_per_commit = 0  # no control records: the end after a commit is the last record + 1

    def __init__(self, partitions: int = 4) -> None:
        self._partitions = partitions
        self.topics: dict[tuple[str, int], list[InboundRecord]] = {}
        self.fail_next_commit = False

    def commit(self, records: Sequence[OutboundRecord]) -> dict[tuple[str, int], int]:
        if self.fail_next_commit:
            self.fail_next_commit = False
            raise ConnectionError("simulated broker failure during commit")
        last: dict[tuple[str, int], int] = {}
        for record in records:
            partition = (
                record.partition
                if record.partition is not None
                else zlib.crc32(record.key) % self._partitions
            )
            log = self.topics.setdefault((record.topic, partition), [])
            offset = len(log)
            log.append(
                InboundRecord(record.topic, partition, offset, record.key, record.value, record.headers)
            )
            last[(record.topic, partition)] = offset
        return last

    def read(self, topic: str, partition: int, start_offset: int) -> Iterator[InboundRecord]:
        yield from list(self.topics.get((topic, partition), []))[start_offset:]

    def end_offset(self, topic: str, partition: int) -> int:
        return len(self.topics.get((topic, partition), []))

    def without(self, topic: str | None) -> MemoryEventLog:
        """A copy of this log in which `topic` was never written (None: a plain copy)."""
        copy = MemoryEventLog(self._partitions)
        copy.topics = {key: list(records) for key, records in self.topics.items() if key[0] != topic}
        return copy
