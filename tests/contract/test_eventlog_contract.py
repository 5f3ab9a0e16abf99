"""One contract for the event-log port, run against the in-memory twin and against real Kafka.

The processors' crash-safety argument (services/common/aggregate/processor.py) rests on these
properties: a commit is atomic and reports the offsets it wrote; a read returns exactly the
committed records of one partition from an offset on; and (Kafka only) a transaction left open
by a killed writer is aborted and invisible once a writer with the same transactional id starts.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator

import pytest

from services.common.eventlog import EventLog, KafkaEventLog, MemoryEventLog
from services.common.kafka import OutboundRecord, create_topics
from services.common.topics import TopicSpec


class EventLogContract:
    topic = "contract.events"

    @pytest.fixture
    def log(self) -> Iterator[EventLog]:
        raise NotImplementedError

    def test_commit_reports_the_last_offset_written_per_partition(self, log: EventLog) -> None:
        written = log.commit(
            [OutboundRecord(self.topic, b"k", f"v{i}".encode(), partition=1) for i in range(3)]
        )
        assert list(written) == [(self.topic, 1)]
        records = list(log.read(self.topic, 1, 0))
        assert [r.value for r in records][-3:] == [b"v0", b"v1", b"v2"]
        assert written[(self.topic, 1)] == records[-1].offset

    def test_read_starts_at_the_given_offset_and_stays_in_its_partition(self, log: EventLog) -> None:
        log.commit([OutboundRecord(self.topic, b"a", b"p0", partition=0)])
        last = log.commit([OutboundRecord(self.topic, b"b", b"p2-1", partition=2)])[(self.topic, 2)]
        log.commit([OutboundRecord(self.topic, b"b", b"p2-2", partition=2)])
        values = [r.value for r in log.read(self.topic, 2, last + 1)]
        assert values == [b"p2-2"]
        assert all(r.partition == 0 for r in log.read(self.topic, 0, 0))

    def test_reading_past_the_end_returns_nothing(self, log: EventLog) -> None:
        last = log.commit([OutboundRecord(self.topic, b"c", b"x", partition=3)])[(self.topic, 3)]
        assert list(log.read(self.topic, 3, last + 10)) == []

    def test_end_offset_is_where_a_reader_that_read_everything_resumes_dur_1(self, log: EventLog) -> None:
        """Restore moves its checkpoint to end_offset: nothing below it may still be unread."""
        before = log.end_offset(self.topic, 0)
        log.commit([OutboundRecord(self.topic, b"k", v, partition=0) for v in (b"v1", b"v2")])
        end = log.end_offset(self.topic, 0)
        values = [r.value for r in log.read(self.topic, 0, before)]
        assert values == [b"v1", b"v2"]
        assert end > before + 1
        assert list(log.read(self.topic, 0, end)) == []

    def test_records_keep_their_key_and_headers(self, log: EventLog) -> None:
        log.commit([OutboundRecord(self.topic, b"key-1", b"v", (("h", b"1"),), partition=0)])
        record = list(log.read(self.topic, 0, 0))[-1]
        assert record.key == b"key-1" and ("h", b"1") in record.headers


class TestMemoryEventLog(EventLogContract):
    @pytest.fixture
    def log(self) -> Iterator[EventLog]:
        yield MemoryEventLog(partitions=4)

    def test_a_failed_commit_leaves_nothing(self) -> None:
        log = MemoryEventLog()
        log.fail_next_commit = True
        with pytest.raises(ConnectionError):
            log.commit([OutboundRecord(self.topic, b"k", b"v", partition=0)])
        assert list(log.read(self.topic, 0, 0)) == []


@pytest.mark.integration
class TestKafkaEventLog(EventLogContract):
    @pytest.fixture
    def log(self, kafka_bootstrap: str) -> Iterator[EventLog]:
        self.topic = f"contract.events.{uuid.uuid4().hex[:8]}"
        create_topics(kafka_bootstrap, [TopicSpec(self.topic, 4)])
        log = KafkaEventLog(kafka_bootstrap, transactional_id=f"contract-{uuid.uuid4().hex[:8]}")
        yield log
        log.close()

    @pytest.mark.timeout(90)
    def test_a_killed_writers_open_transaction_is_aborted_by_its_successor_DUR_1(
        self, kafka_bootstrap: str
    ) -> None:
        topic = f"contract.zombie.{uuid.uuid4().hex[:8]}"
        create_topics(kafka_bootstrap, [TopicSpec(topic, 1)])
        transactional_id = f"zombie-{uuid.uuid4().hex[:8]}"
        writer = textwrap.dedent(
            f"""
            import os
            from confluent_kafka import Producer
            p = Producer({{"bootstrap.servers": "{kafka_bootstrap}", "transactional.id": "{transactional_id}",
                          "transaction.timeout.ms": 60000}})
            p.init_transactions(30)
            p.begin_transaction()
            p.produce("{topic}", value=b"never committed", partition=0)
            p.flush(10)
            os._exit(0)  # dies with the transaction open, like a SIGKILL after the produce
            """
        )
        subprocess.run([sys.executable, "-c", writer], check=True, timeout=60)
        successor = KafkaEventLog(kafka_bootstrap, transactional_id=transactional_id)
        try:
            assert list(successor.read(topic, 0, 0)) == []
            successor.commit([OutboundRecord(topic, b"k", b"committed", partition=0)])
            assert [r.value for r in successor.read(topic, 0, 0)] == [b"committed"]
        finally:
            successor.close()
