"""Tenure's foundation benchmark: the raw Kafka limit next to what Tenure makes of it.

One invocation, one broker, phases in this order (see bench/README.md, docs/benchmarks.md):
  (a) raw confluent-kafka: produce N ~300-byte records (acks=all, idempotent), consume them back;
  (b) RunCommandProcessor.handle alone with Kafka replaced by memory; then N SubmitRun commands
      produced straight to runs.commands, through the Run processor and the projector until every
      Run view exists, then a closed-loop probe of single-command latency;
  (d) RunCommandProcessor.restore (direct call) and services.projections.service.rebuild, each
      into an empty store, over the log (b) wrote;
  (c) the HTTP API: M concurrent httpx clients, each POSTing K runs one after another.

    PYTHONPATH=. python -m bench.foundation [--n 20000] [--api-clients 16] [--api-runs 100]

A script, not a test: it measures and reports, it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Consumer, Producer, TopicPartition

from bench._foundation_commands import SPEC, ViewTracker, publish_all, send_all, submit_command
from bench._foundation_report import render_tables, section_body, write_section
from bench._foundation_results import (
    BATCH,
    PROBE_JITTER_S,
    RAW_REPEATS,
    RAW_VALUE_BYTES,
    ApiResult,
    ProcessorResult,
    RawResult,
    RebuildResult,
)
from bench._foundation_toolkit import (
    CpuMeter,
    Service,
    cpu_seconds,
    percentile,
    say,
    service_env,
    spawn,
    wait_for_api,
    wait_for_views,
)
from services.common.broker import BrokerHandle, free_port, start_broker, stop_process
from services.common.clock import SystemClock
from services.common.eventlog import KafkaEventLog, MemoryEventLog
from services.common.ids import run_id_for
from services.common.kafka import InboundRecord, TopicFollower, create_topics
from services.common.messages import MessageCodec
from services.common.settings import repo_root
from services.common.store import RocksStore
from services.common.topics import RUNS_COMMANDS, RUNS_EVENTS, TopicSpec
from services.lease_coordinator.processor import RunCommandProcessor
from services.projections.service import rebuild
from services.projections.store import RunViewStore

# main, and what the other benches import from here (their helpers moved to bench/_foundation_*.py).
__all__ = [
    "BATCH",
    "CpuMeter",
    "RawResult",
    "Service",
    "ViewTracker",
    "bench_raw",
    "cpu_seconds",
    "main",
    "percentile",
    "publish_all",
    "say",
    "section_body",
    "service_env",
    "spawn",
    "submit_command",
    "wait_for_api",
    "write_section",
]

RAW_WARMUP = 1000
WARMUP_COMMANDS = 16


def events_end(bootstrap: str) -> int:
    """Sum of runs.events end offsets: events plus one transaction marker per partition per commit."""
    probe = TopicFollower(bootstrap, [RUNS_EVENTS.name], "end", client_id="tenure-bench-probe")
    try:
        return sum(probe.end_offsets(RUNS_EVENTS.name).values())
    finally:
        probe.close()


# --- (a) the physical limit -------------------------------------------------------------------


def bench_raw(bootstrap: str, n: int, tag: str) -> RawResult:
    topics = [f"bench.raw.{tag}.{r}" for r in range(RAW_REPEATS)]
    warmup = f"bench.raw.{tag}.warmup"
    create_topics(bootstrap, [TopicSpec(t, RUNS_COMMANDS.partitions) for t in [warmup, *topics]])
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "tenure-bench-raw",
            "partitioner": "murmur2_random",
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
        }
    )
    value = os.urandom(RAW_VALUE_BYTES)

    def produce(target: str, count: int) -> float:
        started = time.monotonic()
        send_all(producer, [(target, f"run_{i:032d}".encode(), value, [], -1) for i in range(count)])
        return time.monotonic() - started

    def consume(source: str, count: int) -> float:
        # A fresh consumer per topic: reassigning a used one stalled ~0.5 s before fetching.
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"tenure-bench-raw-{tag}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 50,
            }
        )
        started = time.monotonic()
        # Offset 0, not OFFSET_BEGINNING: librdkafka resolves a logical offset with a ListOffsets
        # round it first defers by a 500 ms timer, which would dwarf the transfer measured here.
        consumer.assign([TopicPartition(source, p, 0) for p in range(RUNS_COMMANDS.partitions)])
        seen = 0
        while seen < count:
            if time.monotonic() - started > 120:
                raise TimeoutError(f"raw consume saw only {seen}/{count} records of {source} in 120s")
            # consume() waits for a full batch or the timeout: never ask for more than is left.
            seen += sum(1 for m in consumer.consume(min(count - seen, 1000), 0.5) if m.error() is None)
        elapsed = time.monotonic() - started
        consumer.close()
        return elapsed

    # A just-started broker is still loading coordinators and its JVM is cold: the producer id
    # and first fetches are paid on a warm-up topic, outside the timings.
    produce(warmup, RAW_WARMUP)
    consume(warmup, RAW_WARMUP)
    say(f"(a) {RAW_REPEATS} rounds: produce {n} x {RAW_VALUE_BYTES}-byte records to a fresh topic, consume")
    result = RawResult(n, [], [])
    for topic in topics:
        result.produce_runs.append(produce(topic, n))
        result.consume_runs.append(consume(topic, n))
    return result


# --- (b) commands through the processor and the projector -------------------------------------


def bench_logic(n: int, workdir: Path) -> float:
    """Seconds RunCommandProcessor.handle takes for n commands with Kafka replaced by memory.

    Decoding, deciding, encoding and the RocksDB writes are all still there: this is the ceiling
    the processor's own Python sets, before any broker round trip.
    """
    codec = MessageCodec()
    commands = [submit_command(codec, "bench-logic", f"logic-{i:07d}")[1] for i in range(n)]
    records = [
        InboundRecord(
            RUNS_COMMANDS.name,
            i % RUNS_COMMANDS.partitions,
            i // RUNS_COMMANDS.partitions,
            c.key,
            c.value,
            c.headers,
        )
        for i, c in enumerate(commands)
    ]
    store = RocksStore(workdir / "logic" / "runs")
    processor = RunCommandProcessor(MemoryEventLog(RUNS_COMMANDS.partitions), store, codec, SystemClock())
    started = time.monotonic()
    for i in range(0, n, BATCH):
        processor.handle(records[i : i + BATCH])
    elapsed = time.monotonic() - started
    store.close()
    return elapsed


def bench_processor(
    bootstrap: str, n: int, probes: int, tag: str, tracker: ViewTracker, services: list[Service]
) -> ProcessorResult:
    codec, tenant = MessageCodec(), f"bench-{tag}"
    # The settings of services.common.kafka.CommandPublisher, the API's publisher.
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "tenure-bench-commands",
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
        }
    )
    warmup = [submit_command(codec, tenant, f"warmup-{i}") for i in range(WARMUP_COMMANDS)]
    say(f"(b) warm-up: {WARMUP_COMMANDS} commands until their views exist (faust joins its group)")
    publish_all(producer, tracker, warmup)
    tracker.wait([r for r, _ in warmup], 120.0, "(b) warm-up", services)

    prepared = [submit_command(codec, tenant, f"burst-{i:07d}") for i in range(n)]
    run_ids = [r for r, _ in prepared]
    end_before = events_end(bootstrap)
    say(f"(b) producing {n} SubmitRun commands to {RUNS_COMMANDS.name}")
    started = time.monotonic()
    publish_all(producer, tracker, prepared)
    publish_s = time.monotonic() - started
    tracker.wait(run_ids, max(120.0, n / 50), "(b) burst", services)
    burst_markers = events_end(bootstrap) - end_before - n

    say(f"(b) closed-loop probe: {probes} commands, each sent once the previous view exists")
    for i in range(probes):
        probe = submit_command(codec, tenant, f"probe-{i:05d}")
        # A random pause first: sent right after the previous view appeared, a probe would land at
        # the same point of the projector's poll cycle every time and measure only that point.
        time.sleep(random.uniform(0.0, PROBE_JITTER_S))
        publish_all(producer, tracker, [probe])
        tracker.wait([probe[0]], 30.0, "(b) probe", services)
    probe_ids = [run_id_for(tenant, f"probe-{i:05d}") for i in range(probes)]

    def ms(stamps: dict[str, float], ids: list[str]) -> list[float]:
        return [(stamps[r] - tracker.sent[r]) * 1000 for r in ids]

    return ProcessorResult(
        n,
        publish_s,
        max(tracker.decided[r] for r in run_ids) - started,
        max(tracker.viewed[r] for r in run_ids) - started,
        ms(tracker.decided, run_ids),
        ms(tracker.viewed, run_ids),
        ms(tracker.decided, probe_ids),
        ms(tracker.viewed, probe_ids),
        tracker.verify(run_ids),
        burst_markers,
    )


# --- (d) rebuilds -----------------------------------------------------------------------------


def bench_rebuild(bootstrap: str, workdir: Path, tag: str) -> RebuildResult:
    log_offsets = events_end(bootstrap)
    # A transactional id of its own: the coordinator's would fence the running worker.
    event_log = KafkaEventLog(bootstrap, transactional_id=f"tenure-bench-restore-{tag}")
    store = RocksStore(workdir / "restore" / "runs")
    processor = RunCommandProcessor(event_log, store, MessageCodec(), SystemClock())
    say("(d) RunCommandProcessor.restore of every partition into an empty store")
    started = time.monotonic()
    restored = sum(processor.restore(p) for p in range(RUNS_EVENTS.partitions))
    restore_s = time.monotonic() - started
    event_log.close()
    store.close()

    say("(d) services.projections.service.rebuild into an empty view store")
    views = RunViewStore(RocksStore(workdir / "rebuild" / "run_views"), MessageCodec())
    first_batch: list[float] = []

    def progress(_seen: int, _total: int) -> None:
        if not first_batch:
            first_batch.append(time.monotonic())

    started = time.monotonic()
    report = rebuild(bootstrap, views, progress)
    return RebuildResult(
        restored,
        restore_s,
        report.events,
        report.runs,
        report.seconds,
        (first_batch[0] if first_batch else started) - started,
        log_offsets,
    )


# --- (c) the HTTP API -------------------------------------------------------------------------


async def bench_api(base_url: str, clients: int, runs: int, tag: str) -> ApiResult:
    tenant, statuses, created_ms = f"bench-api-{tag}", dict[int, int](), list[float]()

    def body(key: str) -> dict[str, Any]:
        return {"tenant": tenant, "executionSpec": {**SPEC, "args": [key]}, "timeoutSeconds": 600}

    async def client(index: int) -> None:
        async with httpx.AsyncClient(base_url=base_url, timeout=60.0) as http:
            for i in range(runs):
                key = f"{tag}-c{index:03d}-{i:06d}"
                began = time.perf_counter()
                try:
                    response = await http.post("/runs", json=body(key), headers={"Idempotency-Key": key})
                    status = response.status_code
                except httpx.HTTPError:
                    status = 0  # a transport error or timeout: counted, not fatal
                statuses[status] = statuses.get(status, 0) + 1
                if status == 201:
                    created_ms.append((time.perf_counter() - began) * 1000)

    async def progress() -> None:
        while True:
            await asyncio.sleep(2.0)
            say(f"(c) {sum(statuses.values())}/{clients * runs} answered {dict(sorted(statuses.items()))}")

    async with httpx.AsyncClient(base_url=base_url, timeout=30.0) as http:
        try:
            warm = await http.post("/runs", json=body("warmup"), headers={"Idempotency-Key": f"{tag}-warmup"})
        except httpx.TimeoutException as exc:
            raise RuntimeError("the API did not answer the warm-up POST /runs within 30s") from exc
        if warm.status_code != 201:
            raise RuntimeError(f"the API answered the warm-up with {warm.status_code}: {warm.text[:300]}")
    reporter = asyncio.create_task(progress())
    started = time.monotonic()
    await asyncio.gather(*(client(i) for i in range(clients)))
    seconds = time.monotonic() - started
    reporter.cancel()
    return ApiResult(clients * runs, seconds, statuses, created_ms)


# --- main -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.foundation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--n", type=int, default=20_000, help="records in (a), commands in (b)")
    parser.add_argument("--api-clients", type=int, default=16, help="concurrent HTTP clients in (c)")
    parser.add_argument("--api-runs", type=int, default=100, help="runs each HTTP client submits in (c)")
    parser.add_argument("--probes", type=int, default=100, help="closed-loop single commands in (b)")
    parser.add_argument(
        "--output",
        default="docs/benchmarks.md",
        help="markdown file whose section for this configuration is replaced or appended "
        "('-' writes nothing)",
    )
    parser.add_argument("--keep-temp", action="store_true", help="keep the temp dir (service logs, stores)")
    return parser.parse_args(argv)


def start_services(bootstrap: str, workdir: Path, tag: str) -> tuple[list[Service], int]:
    """Coordinator, projector and API; the API shares the projector's state dir to read its views."""
    port, views_dir = free_port(), workdir / "views"
    coordinator_dir = workdir / "coordinator"
    return [
        spawn(
            "lease_coordinator",
            "services.lease_coordinator",
            coordinator_dir,
            service_env(bootstrap, coordinator_dir, TENURE_INSTANCE_ID=f"bench-{tag}"),
        ),
        spawn("projections", "services.projections", views_dir, service_env(bootstrap, views_dir)),
        spawn(
            "command_api",
            "services.command_api",
            workdir / "api",
            service_env(bootstrap, views_dir, TENURE_API_PORT=str(port)),
        ),
    ], port


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load, started_at, tag = os.getloadavg(), dt.datetime.now(dt.UTC), uuid.uuid4().hex[:8]
    workdir = Path(tempfile.mkdtemp(prefix="tenure-bench-"))
    broker: BrokerHandle | None = None
    services: list[Service] = []
    cpu = CpuMeter({"bench client": os.getpid()})
    ok = False
    try:
        broker = start_broker(port=None, data_dir=workdir / "kafka" / "data", state_dir=workdir / "kafka")
        bootstrap = broker.bootstrap_servers
        if broker.owned and broker.pid is not None:
            cpu.pids = {"kafka broker": broker.pid, **cpu.pids}
        else:
            say(
                f"using KAFKA_BOOTSTRAP_SERVERS={bootstrap}: its CPU is not measured, and a coordinator "
                "already running against it would share the consumer group"
            )
        created = subprocess.run(
            [sys.executable, "-m", "services.tenure_cli", "topics", "create"],
            env=service_env(bootstrap, workdir),
            capture_output=True,
            text=True,
        )
        if created.returncode != 0:
            raise RuntimeError(f"topics create failed: {created.stdout}{created.stderr}")

        before, t0 = cpu.snapshot(), time.monotonic()
        raw = bench_raw(bootstrap, args.n, tag)
        cpu.measure("(a) raw produce + consume", before, time.monotonic() - t0)
        say(f"(b) processor logic alone: {args.n} commands through RunCommandProcessor.handle in memory")
        logic_s = bench_logic(args.n, workdir)

        services, port = start_services(bootstrap, workdir, tag)
        cpu.pids.update({s.name: s.process.pid for s in services})
        path = wait_for_views(workdir / "views", services[1])
        tracker = ViewTracker(bootstrap, path, workdir / "tracker")
        try:
            before, t0 = cpu.snapshot(), time.monotonic()
            proc = bench_processor(bootstrap, args.n, args.probes, tag, tracker, services)
            cpu.measure("(b) warm-up, burst, closed loop", before, time.monotonic() - t0)
            proc.logic_s = logic_s
        finally:
            tracker.close()

        before, t0 = cpu.snapshot(), time.monotonic()
        reb = bench_rebuild(bootstrap, workdir, tag)
        cpu.measure("(d) restore + projection rebuild", before, time.monotonic() - t0)

        base_url = f"http://127.0.0.1:{port}"
        api: ApiResult | str
        try:
            wait_for_api(base_url, services[2])
            say(f"(c) {args.api_clients} clients x {args.api_runs} runs against {base_url}")
            before, t0 = cpu.snapshot(), time.monotonic()
            api = asyncio.run(bench_api(base_url, args.api_clients, args.api_runs, tag))
            cpu.measure("(c) HTTP API incl. warm-up", before, time.monotonic() - t0)
        except (RuntimeError, TimeoutError) as exc:
            # The other phases' figures are still worth printing; the run as a whole fails.
            api = str(exc)
            say(f"(c) failed: {exc}\ncommand_api log tail:\n{services[2].log_tail()}")
        for service in services:
            service.check_alive()

        tables = render_tables(raw, proc, reb, api, cpu, args.api_clients, args.api_runs)
        print(tables)
        ok = isinstance(api, ApiResult)
        key = f"n={args.n} api-clients={args.api_clients} api-runs={args.api_runs}"
        if ok and args.output != "-":
            output = Path(args.output) if Path(args.output).is_absolute() else repo_root() / args.output
            write_section(output, key, section_body(key, started_at, load, broker, tables))
            say(f"wrote section '{key}' to {output}")
        return 0 if ok else 1
    finally:
        for service in reversed(services):
            outcome = stop_process(service.process.pid, 15.0, service.process)
            say(f"stopped {service.name}: {outcome} (exit code {service.process.returncode})")
        if broker is not None and broker.owned:
            say(f"stopped broker: {broker.stop()}")
        if ok and not args.keep_temp:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            say(f"temp dir kept: {workdir}")


if __name__ == "__main__":
    sys.exit(main())
