"""How long a SIGKILLed bundled broker takes to answer again (issue 10).

One broker per configuration, on a temporary state dir: Tenure's topics, N records written
transactionally across every partition (so the restart has logs, producer state and transaction
markers to recover) and a committed consumer group. Then, per trial: SIGKILL the JVM, start it
again on the same port and data dir (what `tenure up` does), and time from the kill until
  - ready:     the launcher's own readiness ("Kafka Server started" logged, ApiVersions answers);
  - leaders:   a metadata request shows a live leader for every partition of every topic;
  - round trip: an acks=all record is produced and consumed back.
The broker log's "Performing controller activation" line splits ready into JVM + log/metadata
load (kill -> activation) and what comes after it (activation -> started).

Configurations: "before" runs Kafka's default broker session settings (9000/2000 ms, what the
launcher used until issue 10), "after" the launcher's FAST_RESTART_PROPERTIES.

    .venv/bin/python -m bench.broker_restart [--trials 3] [--records 20000] [--only before|after]

A script, not a test: it measures and reports, it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from services.common import broker
from services.common.kafka import create_topics
from services.common.topics import RUNS_EVENTS, TOPICS

__all__ = ["main"]

CONFIGURATIONS: dict[str, Mapping[str, str]] = {
    "before": broker.KAFKA_DEFAULT_SESSION_PROPERTIES,
    "after": broker.FAST_RESTART_PROPERTIES,
}
STAMP = r"^\[([\d-]+ [\d:,]+)\] "
ACTIVATION = re.compile(STAMP + r"WARN \[QuorumController id=1\] Performing controller activation")
STARTED = re.compile(STAMP + r"INFO \[KafkaRaftServer nodeId=1\] Kafka Server started")


@dataclass
class Trial:
    ready_s: float
    leaders_s: float
    round_trip_s: float
    activation_s: float | None  # kill -> controller activation (broker log clock)
    after_activation_s: float | None  # activation -> "Kafka Server started"


def _quiet(bootstrap: str, **extra: object) -> dict[str, object]:
    return {"bootstrap.servers": bootstrap, "log_level": 0, "logger": lambda *_: None, **extra}


def _load(bootstrap: str, records: int) -> None:
    producer = Producer(_quiet(bootstrap, **{"transactional.id": "bench-broker-restart", "linger.ms": 5}))
    producer.init_transactions()
    partitions = [(t.name, p) for t in TOPICS for p in range(t.partitions)]
    value = b"x" * 400  # about one Avro-encoded event
    for start in range(0, records, 1000):
        producer.begin_transaction()
        for i in range(start, min(records, start + 1000)):
            topic, partition = partitions[i % len(partitions)]
            producer.produce(topic, value, key=f"k{i}".encode(), partition=partition)
        producer.commit_transaction(30)
    group = {"group.id": "bench-broker-restart", "enable.auto.commit": False}
    consumer = Consumer(_quiet(bootstrap, **group))
    consumer.commit(offsets=[TopicPartition(RUNS_EVENTS.name, 0, 1)], asynchronous=False)
    consumer.close()


def _all_leaders(admin: AdminClient) -> bool:
    metadata = admin.list_topics(timeout=1.0)
    if len(metadata.topics) < len(TOPICS) or not metadata.brokers:
        return False
    return all(
        p.leader >= 0 and p.error is None and t.error is None
        for t in metadata.topics.values()
        for p in t.partitions.values()
    )


def _round_trip(bootstrap: str) -> bool:
    producer = Producer(_quiet(bootstrap, acks="all", **{"message.timeout.ms": 1500}))
    delivered: list[tuple[object, int]] = []
    producer.produce(
        RUNS_EVENTS.name, b"probe", partition=0, on_delivery=lambda e, m: delivered.append((e, m.offset()))
    )
    producer.flush(2.0)
    if not delivered or delivered[0][0] is not None:
        return False
    offset = delivered[0][1]
    consumer = Consumer(_quiet(bootstrap, **{"group.id": f"bench-probe-{time.time_ns()}"}))
    consumer.assign([TopicPartition(RUNS_EVENTS.name, 0, offset)])
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            message = consumer.poll(0.1)
            if message is not None and message.error() is None and message.offset() == offset:
                return True
        return False
    finally:
        consumer.close()


def _until(check: object, began: float, timeout_s: float = 60.0) -> float:
    assert callable(check)
    while time.monotonic() - began < timeout_s:
        try:
            if check():
                return time.monotonic() - began
        except KafkaException:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"not ready {timeout_s:g}s after the kill")


def _log_time(pattern: re.Pattern[str], log_file: Path) -> float | None:
    for line in log_file.read_text(errors="replace").splitlines():
        found = pattern.match(line)
        if found:
            stamp = dt.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()  # the broker logs local wall-clock time
    return None


def measure(name: str, properties: Mapping[str, str], trials: int, records: int) -> list[Trial]:
    work = Path(tempfile.mkdtemp(prefix=f"tenure-broker-restart-{name}-"))
    state_dir, port = work / "kafka", broker.free_port()

    def start() -> broker.BrokerHandle:
        return broker.start_broker(
            port=port, state_dir=state_dir, data_dir=state_dir / "data", timeout=120, properties=properties
        )

    handle = start()
    results: list[Trial] = []
    try:
        create_topics(handle.bootstrap_servers, TOPICS)
        _load(handle.bootstrap_servers, records)
        for number in range(1, trials + 1):
            time.sleep(2.0)  # steady state: coordinators loaded, recent writes not yet flushed
            assert handle.pid is not None
            killed_wall = time.time()
            began = time.monotonic()
            os.kill(handle.pid, signal.SIGKILL)
            handle.stop(grace_seconds=1.0)  # reaps the child and forgets broker.json
            handle = start()
            ready = time.monotonic() - began
            bootstrap = handle.bootstrap_servers
            admin = AdminClient(_quiet(bootstrap))
            leaders = _until(lambda: _all_leaders(admin), began)  # noqa: B023 - called right here
            round_trip = _until(lambda: _round_trip(bootstrap), began)  # noqa: B023 - called right here
            log_file = state_dir / "broker.log"
            activated, started = _log_time(ACTIVATION, log_file), _log_time(STARTED, log_file)
            trial = Trial(
                ready,
                leaders,
                round_trip,
                activated - killed_wall if activated else None,
                started - activated if started and activated else None,
            )
            results.append(trial)
            print(
                f"{name} trial {number}: ready {trial.ready_s:.2f}s  leaders {trial.leaders_s:.2f}s  "
                f"round trip {trial.round_trip_s:.2f}s  (kill->activation {_fmt(trial.activation_s)}, "
                f"activation->started {_fmt(trial.after_activation_s)})",
                file=sys.stderr,
                flush=True,
            )
    finally:
        handle.stop()
        shutil.rmtree(work, ignore_errors=True)
    return results


def _fmt(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds:.2f}s"


def _table(results: dict[str, list[Trial]]) -> str:
    rows = [
        "| configuration | trial | ready | all leaders | produce+consume "
        "| kill→activation | activation→started |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, trials in results.items():
        settings = ", ".join(f"{k}={v}" for k, v in CONFIGURATIONS[name].items())
        for number, t in enumerate(trials, 1):
            rows.append(
                f"| {name} ({settings}) | {number} | {t.ready_s:.2f} s | {t.leaders_s:.2f} s | "
                f"{t.round_trip_s:.2f} s | {_fmt(t.activation_s)} | {_fmt(t.after_activation_s)} |"
            )
        median = statistics.median(t.round_trip_s for t in trials)
        rows.append(f"| {name} | median | | | **{median:.2f} s** | | |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.broker_restart",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--records", type=int, default=20_000, help="records written before the kills")
    parser.add_argument("--only", choices=sorted(CONFIGURATIONS), default=None)
    args = parser.parse_args(argv)
    names = [args.only] if args.only else list(CONFIGURATIONS)
    results = {name: measure(name, CONFIGURATIONS[name], args.trials, args.records) for name in names}
    print(_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
