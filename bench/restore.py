"""Restore and rebuild at the speed of the log (issue 16): events/s against raw consume, one run.

One invocation, one bundled broker (started as bench/foundation.py does, in a temporary dir):

  1. Produce `--events` realistic Run events to runs.events: runs driven through the pure
     aggregate (tests/unit/run_walks.py, the coordinator's own decide/evolve, the same workload
     as bench/run_views_fold.py: claims, 20 s heartbeats, effect intents and outcomes, takeovers,
     requeues, a grant and a report), encoded with the processors' codec and committed in
     transactions of `--per-transaction` records, as the coordinator writes them (so the log
     holds commit markers too), spread over the partitions by a hash of the run id as many
     tenants' runs would be. Each transaction also carries, as the coordinator's does, the
     latest state of every run it changed and its checkpoint on the state changelog
     (runs.states, compacted).
  2. Measure, in this order, each from offset 0 of every partition:
     (a) raw consume: a read_committed confluent-kafka consumer iterating the messages;
     (a2) the restore's own reader (PartitionReader.read: records as InboundRecords), partition
         after partition;
     (b) raw consume + Avro decode: the same, plus MessageCodec.decode of every value;
     (c) processor restore: RunCommandProcessor.restore_partitions of every partition into an
         empty RocksDB store (what the coordinator does on assignment), with the changelog
         ignored: every event folded; then a check that the stored states equal the in-memory
         fold of the produced events;
     (c2) the same restore from the state changelog (what compaction has left of it by then,
         plus the events after its checkpoints), checked the same way;
     (d) projection rebuild, every event decoded and folded: services.projections.service.rebuild
         (seeded=False) into an empty view store;
     (d2) the seeded rebuild (services/projections/seeded_rebuild.py, the default): states from
         the changelog, the events stored as their own bytes; then every brief, index, held and
         offset entry and every rendered view checked equal to (d)'s.
  Each prints events/s and its ratio to (a), by wall time and by this process's CPU time (the
  steadier figure on a shared machine: other work slows the wall clock, not the CPU seconds).

    PYTHONPATH=. .venv/bin/python -m bench.restore [--events 1000000] [--repeat 1]

A script, not a test: it measures and prints, it asserts nothing about speed (it does fail if
the restored states differ from the fold). Other work on the machine makes the figures noisy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from bench.run_views_fold import workload
from services.common.aggregate.changelog import unit_records
from services.common.broker import BrokerHandle, start_broker
from services.common.clock import SystemClock
from services.common.contracts import RunEvent
from services.common.eventlog import KafkaEventLog
from services.common.kafka import OutboundRecord, PartitionReader, TransactionalWriter, create_topics
from services.common.messages import MessageCodec
from services.common.store import RocksStore
from services.common.topics import RUNS_EVENTS, RUNS_REJECTIONS, RUNS_RENEWALS, RUNS_STATES
from services.lease_coordinator.domain import RunState, evolve
from services.lease_coordinator.processor import RunCommandProcessor
from services.lease_coordinator.state_codec import STATE_FORMAT, decode_state, encode_state
from services.projections.service import rebuild
from services.projections.store import RunViewStore

__all__ = ["main"]

# Events of one run in the workload below (claim, 40 heartbeats, effects, grant, report, ...).
_RENEWALS = 40


def say(text: str) -> None:
    print(text, flush=True)


def produce(bootstrap: str, events: list[RunEvent], per_transaction: int, tag: str) -> dict[int, int]:
    """Commit `events` to runs.events in transactions, each with the states it changed on the
    state changelog as the coordinator writes them (services/common/aggregate/changelog.py);
    {partition: events written}."""
    codec = MessageCodec()
    writer = TransactionalWriter(bootstrap, f"tenure-bench-restore-produce-{tag}")
    counts: dict[int, int] = {}
    states: dict[str, RunState] = {}
    folded_to = dict.fromkeys(range(RUNS_EVENTS.partitions), 0)  # what the coordinator's store holds

    def commit(batch: list[OutboundRecord], touched: dict[str, int]) -> None:
        changelog = unit_records(
            RUNS_STATES.name,
            [(run_id, partition, encode_state(states[run_id])) for run_id, partition in touched.items()],
            {partition: folded_to[partition] for partition in set(touched.values())},
            STATE_FORMAT,
        )
        written = writer.commit(batch + changelog)
        for (written_topic, partition), offset in written.items():
            if written_topic == RUNS_EVENTS.name:
                folded_to[partition] = offset + 1

    try:
        batch: list[OutboundRecord] = []
        touched: dict[str, int] = {}
        for event in events:
            # Spread like many tenants' runs (one tenant's runs all route to its shard's partition).
            partition = zlib.crc32(event.run_id.encode()) % RUNS_EVENTS.partitions
            batch.append(codec.outbound(RUNS_EVENTS.name, event.run_id, event, partition))
            states[event.run_id] = evolve(states.get(event.run_id), event)
            touched[event.run_id] = partition
            counts[partition] = counts.get(partition, 0) + 1
            if len(batch) >= per_transaction:
                commit(batch, touched)
                batch, touched = [], {}
        if batch:
            commit(batch, touched)
    finally:
        writer.close()
    return counts


class Timer:
    """Wall seconds and this process's CPU seconds (all its threads, librdkafka's included)."""

    def __init__(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def stop(self) -> tuple[float, float]:
        return time.perf_counter() - self._wall, time.process_time() - self._cpu


def consume_all(
    bootstrap: str, total: int, on_value: Callable[[bytes], object] | None
) -> tuple[float, float]:
    """(wall, CPU) seconds to read `total` committed records of runs.events from offset 0."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"tenure-bench-raw-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(RUNS_EVENTS.name, p, 0) for p in range(RUNS_EVENTS.partitions)])
    seen, started, timer = 0, time.perf_counter(), Timer()
    try:
        while seen < total:
            # What is fetched already, else wait for one: a consume for more than is there
            # would wait out its timeout and understate the raw rate.
            for msg in consumer.consume(10_000, 0) or consumer.consume(1, 1.0):
                if msg.error() is not None:
                    continue
                seen += 1
                if on_value is not None:
                    on_value(msg.value())
            if time.perf_counter() - started > 600:
                raise TimeoutError(f"read {seen} of {total} records in 600 s")
        return timer.stop()
    finally:
        consumer.close()


def read_partitions(bootstrap: str, tag: str) -> tuple[tuple[float, float], int]:
    """((wall, CPU) seconds, records) of the restore's own reader over every partition."""
    reader = PartitionReader(bootstrap, client_id=f"tenure-bench-reader-{tag}")
    try:
        timer = Timer()
        count = sum(1 for p in range(RUNS_EVENTS.partitions) for _ in reader.read(RUNS_EVENTS.name, p, 0))
        return timer.stop(), count
    finally:
        reader.close()


def expected_states(events: list[RunEvent]) -> dict[str, RunState]:
    states: dict[str, RunState] = {}
    for event in events:
        states[event.run_id] = evolve(states.get(event.run_id), event)
    return states


def restore(
    bootstrap: str, workdir: Path, tag: str, expected: dict[str, RunState], *, changelog: bool
) -> tuple[tuple[float, float], int, int]:
    """((wall, CPU) seconds, events restored, changelog records read) of a restore of every
    partition into an empty store, checked against the fold; `changelog=False` folds every
    event, as every restore did before the state changelog."""
    event_log = KafkaEventLog(bootstrap, transactional_id=f"tenure-bench-restore-{tag}")
    store = RocksStore(workdir)
    try:
        processor = RunCommandProcessor(event_log, store, MessageCodec(), SystemClock())
        if not changelog:
            processor.definition.changelog_topic = None  # this instance only: fold the events
        timer = Timer()
        folded = processor.restore_partitions(set(range(RUNS_EVENTS.partitions)))
        seconds = timer.stop()
        stored = {key.removeprefix("run/"): decode_state(raw) for key, raw in store.scan("run/")}
        if stored != expected:
            differ = sorted(k for k in expected.keys() | stored.keys() if stored.get(k) != expected.get(k))
            raise AssertionError(f"{len(differ)} restored states differ from the fold, e.g. {differ[:3]}")
        records = processor.metrics.registry.get_sample_value(
            "tenure_processor_changelog_records_total", {"aggregate": "run"}
        )
        return seconds, sum(folded.values()), int(records or 0)
    finally:
        event_log.close()
        store.close()


def rebuild_views(bootstrap: str, workdir: Path, runs: int, seeded: bool) -> tuple[tuple[float, float], int]:
    store = RocksStore(workdir)
    try:
        timer = Timer()
        report = rebuild(bootstrap, RunViewStore(store, MessageCodec()), seeded=seeded)
        seconds = timer.stop()
        if report.runs != runs:
            raise AssertionError(f"rebuild made {report.runs} views of {runs} runs")
        if seeded:
            say(
                f"  (d2) {report.seeded:,} of {report.runs:,} runs seeded, from "
                f"{report.changelog_records:,} state changelog records"
            )
        return seconds, report.events
    finally:
        store.close()


def same_views(folded_dir: Path, seeded_dir: Path) -> tuple[int, float, float]:
    """Check that the seeded rebuild's store shows what the full fold's does: every brief, index
    and held entry byte for byte, offsets no lower, and every run's rendered view. Returns the
    runs compared and the seconds each store took to render all their views (a seeded run's
    view is folded from its history when read, until its next event)."""
    folded, seeded = RocksStore(folded_dir), RocksStore(seeded_dir)
    try:
        for prefix in ("brief/", "idx/", "held/"):
            if dict(folded.scan(prefix)) != dict(seeded.scan(prefix)):
                raise AssertionError(f"the seeded rebuild's {prefix} entries differ from the full fold's")
        # The full fold stores the offset after its last record; the seeded one may be past the
        # commit markers after it too. Either resumes the follower where nothing is unread.
        ends = {k: int(v) for k, v in folded.scan("offset/")}
        if {k: int(v) for k, v in seeded.scan("offset/")}.keys() != ends.keys() or any(
            int(v) < ends[k] for k, v in seeded.scan("offset/")
        ):
            raise AssertionError("the seeded rebuild stored offsets behind the full fold's")
        began = time.perf_counter()
        expected = RunViewStore(folded, MessageCodec()).all_views()
        folded_s, began = time.perf_counter() - began, time.perf_counter()
        got = RunViewStore(seeded, MessageCodec()).all_views()
        seeded_s = time.perf_counter() - began
        if got != expected:
            differ = sorted(k for k in expected.keys() | got.keys() if got.get(k) != expected.get(k))
            raise AssertionError(f"{len(differ)} seeded views differ from the full fold's, e.g. {differ[:3]}")
        return len(expected), folded_s, seeded_s
    finally:
        folded.close()
        seeded.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000, help="about this many events")
    parser.add_argument("--in-flight", type=int, default=200)
    parser.add_argument("--per-transaction", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the four measurements")
    parser.add_argument("--skip", default="", help="comma-separated phases to skip: restore,rebuild")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    tag = uuid.uuid4().hex[:8]
    workdir = Path(tempfile.mkdtemp(prefix="tenure-bench-restore-"))
    broker: BrokerHandle | None = None
    try:
        say(f"load average at start: {os.getloadavg()}")
        started = time.perf_counter()
        probe = workload(1, _RENEWALS, 1)
        runs = max(1, round(args.events / len(probe)))
        events = workload(runs, _RENEWALS, args.in_flight)
        say(f"workload: {len(events):,} events of {runs:,} runs in {time.perf_counter() - started:.1f}s")
        expected = expected_states(events)

        broker = start_broker(port=None, data_dir=workdir / "kafka" / "data", state_dir=workdir / "kafka")
        bootstrap = broker.bootstrap_servers
        # runs.renewals too: the Run restores its kept renewals after the fold (keepalives.py).
        create_topics(bootstrap, [RUNS_EVENTS, RUNS_REJECTIONS, RUNS_STATES, RUNS_RENEWALS])
        started = time.perf_counter()
        counts = produce(bootstrap, events, args.per_transaction, tag)
        say(
            f"produced {len(events):,} events in {time.perf_counter() - started:.1f}s, "
            f"per partition {dict(sorted(counts.items()))}, {args.per_transaction} per transaction"
        )
        del events
        total = sum(counts.values())
        codec = MessageCodec()
        for round_ in range(1, args.repeat + 1):
            rows: list[tuple[str, tuple[float, float], int]] = []
            raw_s = consume_all(bootstrap, total, None)
            rows.append(("(a) raw consume (read_committed)", raw_s, total))
            seconds, read = read_partitions(bootstrap, tag)
            rows.append(("(a2) PartitionReader.read", seconds, read))
            rows.append(("(b) raw consume + Avro decode", consume_all(bootstrap, total, codec.decode), total))
            if "restore" not in skip:
                seconds, folded, _ = restore(
                    bootstrap, workdir / f"restore-{round_}", tag, expected, changelog=False
                )
                rows.append(("(c) restore, every event folded", seconds, folded))
                seconds, folded, records = restore(
                    bootstrap, workdir / f"changelog-{round_}", tag, expected, changelog=True
                )
                rows.append(("(c2) restore from the state changelog", seconds, folded))
                say(f"  (c2) read {records:,} changelog records for {len(expected):,} runs")
            if "rebuild" not in skip:
                folded_dir, seeded_dir = workdir / f"rebuild-{round_}", workdir / f"seeded-{round_}"
                seconds, folded = rebuild_views(bootstrap, folded_dir, len(expected), seeded=False)
                rows.append(("(d) rebuild, every event folded", seconds, folded))
                seconds, folded = rebuild_views(bootstrap, seeded_dir, len(expected), seeded=True)
                rows.append(("(d2) rebuild seeded from runs.states", seconds, folded))
                views, folded_s, seeded_s = same_views(folded_dir, seeded_dir)
                say(
                    f"  (d2) checked equal to (d): {views:,} views; every view read once: "
                    f"{folded_s * 1e3 / views:.2f} ms a run from (d)'s store, "
                    f"{seeded_s * 1e3 / views:.2f} ms from (d2)'s ({total / views:.0f} events a run)"
                )
            raw_rate, raw_cpu_rate = total / raw_s[0], total / raw_s[1]
            say(f"round {round_} of {args.repeat}, load average {os.getloadavg()}:")
            say(
                f"  {'phase':<36} {'events':>10} {'wall s':>8} {'events/s':>10} {'of raw':>7}"
                f" {'CPU s':>8} {'ev/CPU-s':>10} {'of raw':>7}"
            )
            for name, (wall, cpu), count in rows:
                rate, cpu_rate = count / wall, count / cpu
                say(
                    f"  {name:<36} {count:>10,} {wall:>8.2f} {rate:>10,.0f} {rate / raw_rate:>7.3f}"
                    f" {cpu:>8.2f} {cpu_rate:>10,.0f} {cpu_rate / raw_cpu_rate:>7.3f}"
                )
        return 0
    finally:
        if broker is not None and broker.owned:
            say(f"stopped broker: {broker.stop()}")
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
