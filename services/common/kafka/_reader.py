"""Readers over committed records: one partition up to its current end, or whole topics live.

Both read with isolation.level=read_committed, so an aborted or still-open transaction is never
seen, and neither joins a consumer group: the caller keeps its own offsets next to its state.
"""

from __future__ import annotations

import operator
import time
import weakref
from typing import Any, Iterator, Literal, Mapping

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from services.common.kafka._config import base_config, normalise_headers
from services.common.kafka._errors import AuthenticationWatch
from services.common.kafka._records import InboundRecord

__all__ = ["PartitionReader", "TopicFollower", "follower_lags"]

StartAt = Literal["beginning", "end"] | Mapping[int, int]
# How often a follower measures its own lag for the metrics (a few µs per partition).
_LAG_EVERY_S = 1.0
# Records a PartitionReader takes per consume call.
_READ_BATCH = 5000


def _consumer(
    bootstrap_servers: str,
    client_id: str,
    eof: bool,
    isolation: str = "read_committed",
    watch: AuthenticationWatch | None = None,
    bulk: bool = False,
) -> Consumer:
    config = base_config(bootstrap_servers, client_id)
    if watch is not None:
        config["error_cb"] = watch
    config.pop("partitioner")
    config.update(
        {
            # Never used for commits (we assign partitions by hand); librdkafka just wants one.
            "group.id": f"{client_id}-unused",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": isolation,
            "enable.partition.eof": eof,
            "auto.offset.reset": "earliest",
        }
    )
    if not bulk:
        # Latency over idle cost: a decision should reach its waiter within a few ms. A bulk
        # read of a whole log (a rebuild) keeps librdkafka's default: it read a log of 200,000
        # records in half the time (issue 16).
        config["fetch.wait.max.ms"] = 100
    return Consumer(config)


_VALUE = operator.itemgetter(1)


def _headers(raw: list[tuple[str, bytes | None]] | None) -> tuple[tuple[str, bytes], ...]:
    # confluent-kafka gives (str, bytes | None) pairs: when no value is None (or empty) they are
    # already normal, and the check runs in C, not per header in Python (a seventh of a
    # restore's time went to normalising three headers per record, issue 16).
    if raw and all(map(_VALUE, raw)):
        return tuple(raw)  # type: ignore[arg-type]
    return normalise_headers(raw)


def _to_record(msg: object) -> InboundRecord:
    m = msg  # confluent_kafka.Message has no public constructor; keep the translation here
    return InboundRecord(
        topic=str(m.topic()),  # type: ignore[attr-defined]
        partition=int(m.partition()),  # type: ignore[attr-defined]
        offset=int(m.offset()),  # type: ignore[attr-defined]
        key=m.key(),  # type: ignore[attr-defined]
        value=m.value() or b"",  # type: ignore[attr-defined]
        headers=_headers(m.headers()),  # type: ignore[attr-defined]
        timestamp_ms=int(m.timestamp()[1]),  # type: ignore[attr-defined]
    )


class PartitionReader:
    """Reads one partition from an offset up to its high watermark as of the call.

    Everything written before the call is returned once its transaction is decided: a
    read_committed consumer waits for the commit or abort marker, so a record whose transaction
    was committed a moment ago (markers are written asynchronously) is not missed. A transaction
    that never ends (a zombie writer nobody fenced) makes the read time out loudly.
    """

    def __init__(self, bootstrap_servers: str, client_id: str = "tenure-partition-reader") -> None:
        self._consumer = _consumer(bootstrap_servers, client_id, eof=True)
        # A read_committed client is told the last *stable* offset, which lags a transaction
        # committed a moment ago until its markers land; the true end needs read_uncommitted.
        self._watermarks = _consumer(
            bootstrap_servers, f"{client_id}-watermarks", eof=False, isolation="read_uncommitted"
        )

    def read(
        self, topic: str, partition: int, start_offset: int, timeout_s: float = 60.0
    ) -> Iterator[InboundRecord]:
        for msg in self._messages(topic, partition, start_offset, timeout_s):
            yield _to_record(msg)

    def read_raw(
        self, topic: str, partition: int, start_offset: int, timeout_s: float = 60.0
    ) -> Iterator[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]]:
        """`read` as (key, value, headers as librdkafka gives them) only: no record objects, for
        a reader of a whole topic that looks at few of its records (a rebuild's changelog)."""
        for msg in self._messages(topic, partition, start_offset, timeout_s):
            yield msg.key(), msg.value(), msg.headers()

    def _messages(self, topic: str, partition: int, start_offset: int, timeout_s: float) -> Iterator[Any]:
        tp = TopicPartition(topic, partition)
        high = self._high_watermark(tp)
        if start_offset >= high:
            return
        self._consumer.assign([TopicPartition(topic, partition, start_offset)])
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                # Many records per call: a restore reads at the log's speed, not one poll per
                # record (issue 16). What librdkafka has fetched already, without waiting (a
                # consume for more than is there waits its whole timeout); else wait for one.
                messages = self._consumer.consume(_READ_BATCH, 0)
                if not messages:
                    # A partition that ends on a transaction marker delivers nothing more: the
                    # consume that found nothing may have stepped past it, so look before
                    # waiting (a wait here cost every such partition 0.2 s of every restore).
                    if self._consumer.position([tp])[0].offset >= high:
                        return
                    messages = self._consumer.consume(1, 0.05)
                for msg in messages:
                    error = msg.error()
                    if error is None:
                        yield msg
                        if msg.offset() + 1 >= high:  # type: ignore[operator]
                            return
                        continue
                    if error.code() != KafkaError._PARTITION_EOF:
                        # The cause tells the stream runtime a broker away from a real fault.
                        cause = KafkaException(error)
                        raise RuntimeError(f"reading {topic}[{partition}] failed: {error}") from cause
                if messages and messages[-1].error() is None:
                    continue
                # Control records and aborted data advance the position without being delivered.
                position = self._consumer.position([tp])[0].offset
                if position >= high:
                    return
            raise TimeoutError(
                f"{topic}[{partition}] was not readable up to offset {high} in {timeout_s}s "
                "(a transaction still open?)"
            )
        finally:
            self._consumer.unassign()

    def end_offset(self, topic: str, partition: int) -> int:
        """The offset after the last record or transaction marker of the partition, right now.

        A reader that has read everything up to here can resume here: what lies below it is
        either delivered or a control record, never a record still to come."""
        return self._high_watermark(TopicPartition(topic, partition))

    def _high_watermark(self, tp: TopicPartition, timeout_s: float = 10.0) -> int:
        # Right after a topic is created this client's metadata may not know the partition yet
        # and the answer is OFFSET_INVALID; ask again rather than read nothing.
        deadline = time.monotonic() + timeout_s
        while True:
            _, high = self._watermarks.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
            if high >= 0:
                return int(high)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no high watermark for {tp.topic}[{tp.partition}]")
            time.sleep(0.05)

    def close(self) -> None:
        self._consumer.close()
        self._watermarks.close()


class TopicFollower:
    """Follows every partition of some topics from given offsets, the start, or the end."""

    def __init__(
        self,
        bootstrap_servers: str,
        topics: list[str],
        start_at: StartAt = "beginning",
        client_id: str = "tenure-follower",
        *,
        bulk: bool = False,
    ) -> None:
        """`bulk`: a reader of a whole log at once (a rebuild), not a follower waiting for what
        comes next: librdkafka's default fetch wait, and no error callback, which cost ~1.5 us
        of the reading thread per record (issue 16); refused credentials then surface as the
        metadata request's timeout instead of at once."""
        watch = AuthenticationWatch(bootstrap_servers)
        self._consumer = _consumer(
            bootstrap_servers, client_id, eof=False, watch=None if bulk else watch, bulk=bulk
        )
        self.client_id = client_id
        self._lags: dict[tuple[str, int], int] = {}
        self._lags_at = 0.0
        metadata = self._metadata(watch)
        assignment: list[TopicPartition] = []
        for topic in topics:
            if topic not in metadata or metadata[topic].error is not None:
                raise RuntimeError(f"topic {topic} does not exist; create the topics first")
            for partition in sorted(metadata[topic].partitions):
                assignment.append(TopicPartition(topic, partition, self._start(topic, partition, start_at)))
        self._consumer.assign(assignment)
        # The assignment never changes. Kept here because `Consumer.assignment()` is a request
        # to librdkafka's main thread that the caller waits for, holding the GIL: 0.2-0.5 ms
        # on average and up to 36 ms under load, where `position()` takes ~12 us. The API asks
        # after every poll of each followed topic (a tenth of its GIL-holding samples in py-spy;
        # no measurable change in the benches once removed, but no thread waits on it now).
        self._partitions = [TopicPartition(tp.topic, tp.partition) for tp in assignment]
        self._partitions_of = {t: [tp for tp in self._partitions if tp.topic == t] for t in topics}
        # Until a partition yields a record its position is unknown: it is where it was assigned.
        self._assigned = {(tp.topic, tp.partition): tp.offset for tp in assignment if tp.offset >= 0}
        _LIVE_FOLLOWERS.add(self)

    def _metadata(self, watch: AuthenticationWatch, timeout_s: float = 10.0) -> Any:
        # Short attempts, so refused credentials surface in about a second, not after 10.
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._consumer.list_topics(timeout=1.0).topics
            except KafkaException:
                watch.check(self._consumer)
                if time.monotonic() > deadline:
                    raise

    def _start(self, topic: str, partition: int, start_at: StartAt) -> int:
        # Concrete offsets, not OFFSET_BEGINNING/OFFSET_END: librdkafka resolves the logical ones
        # lazily (after ~0.5 s), and records written meanwhile would be skipped by "end".
        if start_at == "beginning":
            return 0
        if start_at == "end":
            _, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=10.0, cached=False
            )
            return OFFSET_END if high < 0 else int(high)
        assert not isinstance(start_at, str)
        return start_at.get(partition, 0)

    def poll(self, max_records: int = 500, timeout_s: float = 0.2) -> list[InboundRecord]:
        """Wait up to `timeout_s` for the first record, then take what is already there."""
        messages = self._delivered(max_records, timeout_s)
        if time.monotonic() - self._lags_at >= _LAG_EVERY_S:  # after this poll's records
            self._lags, self._lags_at = self._measure_lags(), time.monotonic()
        return [_to_record(msg) for msg in messages]

    def poll_values(
        self, max_records: int = 10_000, timeout_s: float = 0.2
    ) -> list[tuple[int, int, bytes | None]]:
        """`poll` for a reader that needs only (partition, offset, value): no record objects, no
        headers, no lag probe. A projection rebuild reads a whole log this way (issue 16), where
        building an InboundRecord cost more than librdkafka's whole consume."""
        return [(m.partition(), m.offset(), m.value()) for m in self._delivered(max_records, timeout_s)]

    def _delivered(self, max_records: int, timeout_s: float) -> list[Any]:
        """The messages of one poll (see `poll`), end-of-partition events left out."""
        first = self._consumer.poll(timeout_s)
        if first is None:
            return []
        messages = [first]
        if max_records > 1:
            messages += self._consumer.consume(max_records - 1, 0)
        delivered = []
        for msg in messages:
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(f"consuming failed: {error}")
            delivered.append(msg)
        return delivered

    def end_offsets(self, topic: str) -> dict[int, int]:
        """{partition: offset of the next record to be written} right now."""
        metadata = self._consumer.list_topics(topic, timeout=10.0).topics[topic]
        return {
            p: self._consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10.0)[1]
            for p in metadata.partitions
        }

    def positions(self, topic: str) -> dict[int, int]:
        """{partition: next offset this follower will return} (negative when not yet known)."""
        return {tp.partition: tp.offset for tp in self._consumer.position(self._partitions_of.get(topic, []))}

    def lag(self) -> int | None:
        """Records between this follower's positions and the partitions' ends as it last heard
        them from its fetches (no broker call, so cheap enough for a readiness probe); None
        while some partition's end or position is not known yet."""
        lags = self._measure_lags()
        if len(lags) < len(self._partitions):
            return None
        return sum(lags.values())

    def offsets_for_time(self, topic: str, timestamp_ms: int) -> dict[int, int]:
        metadata = self._consumer.list_topics(topic, timeout=10.0).topics[topic]
        query = [TopicPartition(topic, p, timestamp_ms) for p in metadata.partitions]
        found = self._consumer.offsets_for_times(query, timeout=10.0)
        return {tp.partition: tp.offset for tp in found}

    def _measure_lags(self) -> dict[tuple[str, int], int]:
        lags: dict[tuple[str, int], int] = {}
        for tp in self._consumer.position(self._partitions):
            _, high = self._consumer.get_watermark_offsets(tp, cached=True)
            at = tp.offset if tp.offset >= 0 else self._assigned.get((tp.topic, tp.partition), -1)
            if high >= 0 and at >= 0:
                lags[(tp.topic, tp.partition)] = max(0, int(high) - int(at))
        return lags

    def partition_lags(self) -> dict[tuple[str, int], int]:
        """{(topic, partition): records between this follower's position and the partition's end
        as its last fetch heard it}, as measured by the follower's own thread after a poll (at
        most every `_LAG_EVERY_S`). A scrape reads that and never calls into the consumer:
        from another thread a call waits for the follower's poll to return. Partitions whose
        position or end is not known yet are left out."""
        return dict(self._lags)

    def close(self) -> None:
        _LIVE_FOLLOWERS.discard(self)
        self._consumer.close()


# Every open follower of this process, for the metrics scrape (services/common/metrics.py).
_LIVE_FOLLOWERS: weakref.WeakSet[TopicFollower] = weakref.WeakSet()


def follower_lags() -> list[tuple[str, str, int, int]]:
    """(follower client id, topic, partition, lag) of every open follower of this process."""
    rows: list[tuple[str, str, int, int]] = []
    for follower in list(_LIVE_FOLLOWERS):
        try:
            lags = follower.partition_lags()
        except Exception:  # a follower closing or between assignments: it reports next scrape
            continue
        rows += [(follower.client_id, topic, partition, lag) for (topic, partition), lag in lags.items()]
    return rows
