"""`CommittedEnds`: where a topic ends for a read_committed reader, in one ListOffsets request
(issue 16: the API's read barrier asks it before every full read).

On the real broker: the answer equals what a read_committed consumer's watermark query says
after committed writes, stops at the first record of a still-open transaction (the last stable
offset) rather than at the high watermark, and moves past the transaction once it commits.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from services.common.kafka import CommittedEnds

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _topic(bootstrap: str, partitions: int) -> str:
    name = f"ends-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held: a collected client cancels its calls
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def _watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "ends-probe", "isolation.level": "read_committed"}
    )
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def test_committed_ends_match_a_read_committed_consumers_and_stop_at_an_open_transaction(
    kafka_bootstrap: str,
) -> None:
    topic = _topic(kafka_bootstrap, 3)
    plain = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(30):
        plain.produce(topic, key=f"k{i}".encode(), value=b"x")
    plain.flush(30)
    ends = CommittedEnds(kafka_bootstrap)
    before = ends.ends(topic)
    assert before == _watermarks(kafka_bootstrap, topic, 3) and sum(before.values()) == 30

    txn = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"ends-{topic}"})
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(topic, value=b"open", partition=1)
    txn.flush(30)
    assert ends.ends(topic) == before  # the open transaction's record is not yet committed

    txn.commit_transaction(30)
    # The broker writes the commit marker just after answering the commit, so the stable offset
    # moves a moment later: by two (the record and its marker) on partition 1, nowhere else.
    deadline = time.monotonic() + 10
    while (after := ends.ends(topic)) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert after == {**before, 1: before[1] + 2}
