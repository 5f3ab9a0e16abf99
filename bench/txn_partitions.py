"""What one more partition costs a Kafka transaction on this machine (issue 11).

A unit of the aggregate runtime commits its records in one transaction; the broker's work per
transaction grows with the partitions it touches. A durable step's unit touches the Run's and the
Trajectory's events, and, when it writes the Run's state changelog in that transaction, a third
(services/common/aggregate/changelog_lag.py defers it). This script commits transactions of 9
records of 400 bytes through the runtime's `KafkaEventLog`, on 2 partitions (runs.events,
trajectories.events) and on 3 (and runs.states), in alternating blocks, on its own broker, and
prints the latency of each and the ratio. The limit is the same broker and client: only the
partition count differs.

    PYTHONPATH=. .venv/bin/python -m bench.txn_partitions [--blocks 12] [--per-block 150]

A script, not a test: it measures and reports, it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from services.common.broker import start_broker
from services.common.eventlog import KafkaEventLog
from services.common.kafka import OutboundRecord, create_topics
from services.common.topics import RUNS_EVENTS, RUNS_STATES, TOPICS, TRAJECTORIES_EVENTS

__all__ = ["main"]

TOPIC_ORDER = (RUNS_EVENTS.name, TRAJECTORIES_EVENTS.name, RUNS_STATES.name)


def records(partitions: int) -> list[OutboundRecord]:
    """9 records spread over the first `partitions` topics of TOPIC_ORDER, partition 0 each."""
    topics = TOPIC_ORDER[:partitions]
    return [OutboundRecord(topics[i % partitions], b"k", b"x" * 400, (), 0) for i in range(9)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=12, help="alternating blocks (default 12)")
    parser.add_argument("--per-block", type=int, default=150, help="transactions per block")
    args = parser.parse_args()
    took: dict[int, list[float]] = {2: [], 3: []}
    with tempfile.TemporaryDirectory(prefix="tenure-txn-") as workdir:
        broker = start_broker(data_dir=Path(workdir) / "data", state_dir=Path(workdir), timeout=180)
        try:
            create_topics(broker.bootstrap_servers, TOPICS)
            log = KafkaEventLog(broker.bootstrap_servers, "tenure-bench-txn-partitions")
            for _ in range(200):  # the broker's and the client's warm-up
                log.commit(records(3))
            for block in range(args.blocks):
                for partitions in (2, 3) if block % 2 == 0 else (3, 2):
                    batch = records(partitions)
                    for _ in range(args.per_block):
                        began = time.perf_counter()
                        log.commit(batch)
                        took[partitions].append(1000 * (time.perf_counter() - began))
            log.close()
        finally:
            broker.stop()
    print("| partitions per transaction | transactions | mean ms | p50 ms | p90 ms | p99 ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for partitions, samples in took.items():
        samples.sort()
        n = len(samples)
        print(
            f"| {partitions} | {n} | {statistics.mean(samples):.2f} | {samples[n // 2]:.2f} | "
            f"{samples[int(n * 0.9)]:.2f} | {samples[int(n * 0.99)]:.2f} |"
        )
    two, three = (sorted(took[p])[len(took[p]) // 2] for p in (2, 3))
    print(f"\np50 with 3 partitions / with 2: {three / two:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
