"""The saga unwind benchmark's physical limit (bench/saga_unwind.py, phase (a)): raw
confluent-kafka on the same broker, transactional commits of one and of two small records, one
command -> event hop end to end, and an fsync of a small append on this machine's disk. The
durable-steps bench (bench/durable_steps.py) measures its raw limit with it too."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.foundation import say
from services.common.kafka import create_topics
from services.common.topics import TopicSpec

__all__ = ["RAW_VALUE_BYTES", "RAW_WARMUP_S", "RawLimits", "raw_limits"]

RAW_VALUE_BYTES = 400  # about one Avro-encoded trajectory event
RAW_WARMUP_S = 3.0


@dataclass
class RawLimits:
    commit1_ms: list[float]
    commit2_ms: list[float]
    hop_ms: list[float]
    fsync_ms: list[float]


def _consumer(bootstrap: str, topic: str) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"tenure-bench-saga-{topic}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])  # concrete offset: no deferred ListOffsets round
    return consumer


def _await_one(consumer: Consumer) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        message = consumer.poll(0.1)
        if message is not None and message.error() is None:
            return
    raise TimeoutError("a raw record did not come back within 10 s")


def raw_limits(bootstrap: str, tag: str, samples: int, workdir: Path) -> RawLimits:
    commands, events = f"bench.saga.{tag}.commands", f"bench.saga.{tag}.events"
    create_topics(bootstrap, [TopicSpec(commands, 1), TopicSpec(events, 1)])
    # The settings of services.common.kafka's TransactionalWriter and CommandPublisher (minus linger).
    writer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"tenure-bench-saga-{tag}",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 1,
        }
    )
    writer.init_transactions(30)
    sender = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 0}
    )
    value = os.urandom(RAW_VALUE_BYTES)

    def commit(records: int) -> float:
        began = time.perf_counter()
        writer.begin_transaction()
        for i in range(records):
            writer.produce(events, value=value, key=f"run-{i}".encode(), partition=0)
        writer.flush()
        writer.commit_transaction()
        return (time.perf_counter() - began) * 1000

    # A just-started broker is cold (JIT, transaction coordinator, page cache): the first tens of
    # commits take several times longer, so warm it for a while, not a number of commits.
    warm_until = time.monotonic() + RAW_WARMUP_S
    while time.monotonic() < warm_until:
        commit(1 + int(time.monotonic() * 10) % 2)
    say(f"(a) {samples} transactional commits of 1 record and {samples} of 2 records, interleaved")
    limits = RawLimits([], [], [], [])
    for _ in range(samples):
        limits.commit1_ms.append(commit(1))
        limits.commit2_ms.append(commit(2))
    command_reader, event_reader = _consumer(bootstrap, commands), _consumer(bootstrap, events)
    while event_reader.poll(0.2) is not None:  # skip what the commit rounds wrote
        pass

    def hop() -> float:
        began = time.perf_counter()
        sender.produce(commands, value=value, key=b"run", partition=0)
        sender.flush()
        _await_one(command_reader)
        commit(1)
        _await_one(event_reader)
        return (time.perf_counter() - began) * 1000

    for _ in range(50):
        hop()
    say(f"(a) {samples} command -> transactional event hops; {samples} fsyncs of {RAW_VALUE_BYTES} B")
    limits.hop_ms = [hop() for _ in range(samples)]
    command_reader.close()
    event_reader.close()
    with open(workdir / "fsync.probe", "ab") as probe:
        for _ in range(samples + 20):
            began = time.perf_counter()
            probe.write(value)
            probe.flush()
            os.fsync(probe.fileno())
            limits.fsync_ms.append((time.perf_counter() - began) * 1000)
    limits.fsync_ms = limits.fsync_ms[20:]
    return limits
