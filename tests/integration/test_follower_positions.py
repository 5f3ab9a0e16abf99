"""`TopicFollower.positions` and `lag` on the real broker: past a transaction's commit marker,
without ever asking librdkafka for the consumer's assignment.

Why it matters: `Consumer.assignment()` is a request to librdkafka's main thread that the caller
waits for while holding the GIL (0.2-0.5 ms on average, up to 36 ms under load, measured in the
API). The API's followers asked it after every poll, and every thread of the API stood still
meanwhile (issue 16: docs/benchmarks.md, "The followers stop asking for their assignment").
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from services.common.kafka import TopicFollower
from services.common.kafka._reader import _LAG_EVERY_S

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class _CountingConsumer:
    """The follower's consumer, with its calls to `assignment` counted."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self.assignment_calls = 0

    def assignment(self) -> Any:
        self.assignment_calls += 1
        return self._consumer.assignment()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def test_positions_pass_the_commit_marker_and_the_assignment_is_never_asked_for(kafka_bootstrap: str) -> None:
    topic = f"positions-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    txn = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"positions-{topic}"})
    txn.init_transactions(30)
    txn.begin_transaction()
    for i in range(3):
        txn.produce(topic, value=f"r{i}".encode(), partition=1)
    txn.commit_transaction(30)  # records at 0..2 of partition 1, the commit marker at 3

    follower = TopicFollower(kafka_bootstrap, [topic], "beginning", client_id="positions-test")
    counting = _CountingConsumer(follower._consumer)
    follower._consumer = counting
    try:
        seen: list[tuple[int, int]] = []
        deadline = time.monotonic() + 20
        positions: dict[int, int] = {}
        while time.monotonic() < deadline:
            seen += [(r.partition, r.offset) for r in follower.poll(max_records=100, timeout_s=0.2)]
            positions = follower.positions(topic)
            if positions.get(1) == 4:
                break
        assert seen == [(1, 0), (1, 1), (1, 2)]
        assert positions[1] == 4  # past the marker: a barrier at the log's end is met
        assert set(positions) == {0, 1}
        time.sleep(_LAG_EVERY_S)
        follower.poll(max_records=100, timeout_s=0.2)  # a poll after the interval measures the lags
        assert follower.lag() == 0
        assert follower.partition_lags() == {(topic, 0): 0, (topic, 1): 0}
        assert counting.assignment_calls == 0
    finally:
        follower.close()
