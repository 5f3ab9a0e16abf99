"""The consumer-group generation a processor decides under, as the broker checks it (KIP-447).

Partitions move between the instances of one processor on every rebalance, and the instance
that lost one may not know yet (a long pause, a network partition: the group evicted it after
its session timeout). Each instance has a transactional id of its own, so the new owner's
`init_transactions` does not fence the old one. What does: the command offsets of every
transaction are committed inside it (`send_offsets_to_transaction`) with the group metadata of
the assignment it decided under (group, generation, member id, group.instance.id). The group
coordinator refuses a transactional offset commit from an older generation or an evicted member
(ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID), and the transaction is aborted: a
lost owner's decisions never become visible, and it stops (WriterFenced).

The consumer is faust's (aiokafka), the producer confluent-kafka's, so the metadata is handed
over in librdkafka's own serialised form (rd_kafka_consumer_group_metadata_write, "CGMDv2"),
which is what confluent-kafka's `consumer_group_metadata()` returns and
`send_offsets_to_transaction` reads.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition

from services.common.kafka._config import base_config

__all__ = ["GroupFence", "committed_offsets"]

_MAGIC = b"CGMDv2:"
# Codes of a transactional offset commit whose member is no longer the partitions' owner.
GROUP_FENCED_CODES = frozenset({"ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID", "FENCED_INSTANCE_ID"})


@dataclass(frozen=True)
class GroupFence:
    """The assignment a transaction is decided under, and the command offsets it consumes."""

    group_id: str
    generation: int
    member_id: str
    group_instance_id: str | None
    topic: str
    offsets: Mapping[int, int]  # partition -> next offset to consume

    def metadata(self) -> bytes:
        """librdkafka's serialised consumer group metadata (native-endian int32 generation)."""
        parts = [_MAGIC, struct.pack("=i", self.generation)]
        parts += [self.group_id.encode() + b"\0", self.member_id.encode() + b"\0"]
        if self.group_instance_id is None:
            parts.append(b"\x01")
        else:
            parts += [b"\x00", self.group_instance_id.encode() + b"\0"]
        return b"".join(parts)

    def positions(self) -> list[TopicPartition]:
        return [TopicPartition(self.topic, p, o) for p, o in sorted(self.offsets.items())]


def committed_offsets(
    bootstrap_servers: str, group_id: str, topic: str, partitions: set[int], timeout_s: float = 10.0
) -> dict[int, int]:
    """The group's committed offsets of `topic`; for a partition with none (a new group, or
    offsets expired while the group sat empty), its log start, where the group's consumer starts
    (`auto.offset.reset` earliest), so that timer work of such a partition can still be fenced
    (issue 16). Reads only: this consumer never subscribes, so it never joins the group."""
    config = base_config(bootstrap_servers, f"{group_id}-offsets")
    config.pop("partitioner", None)
    config.update({"group.id": group_id, "enable.auto.commit": False})
    consumer = Consumer(config)
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in sorted(partitions)], timeout=timeout_s)
        offsets = {tp.partition: tp.offset for tp in found if tp.error is None and tp.offset >= 0}
        for partition in sorted(partitions - offsets.keys()):
            low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s)
            if low >= 0:
                offsets[partition] = low
    finally:
        consumer.close()
    return offsets
