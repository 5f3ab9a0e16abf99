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
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import httpx
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from services.common.broker import KAFKA_VERSION, BrokerHandle, free_port, start_broker, stop_process
from services.common.clock import SystemClock
from services.common.contracts import SubmitRun
from services.common.eventlog import KafkaEventLog, MemoryEventLog
from services.common.ids import canonical_json, command_id_for, run_id_for
from services.common.kafka import InboundRecord, OutboundRecord, TopicFollower, create_topics
from services.common.messages import MessageCodec
from services.common.routing import command_record
from services.common.settings import repo_root
from services.common.store import RocksStore
from services.common.topics import RUNS_COMMANDS, RUNS_EVENTS, TopicSpec
from services.lease_coordinator.processor import RunCommandProcessor
from services.projections.service import rebuild, views_path
from services.projections.store import RunViewStore

__all__ = ["main"]

RAW_VALUE_BYTES = 300
RAW_WARMUP = 1000
RAW_REPEATS = 3
WARMUP_COMMANDS = 16
BATCH = 200  # services.common.streams.StreamSettings.batch_size: commands per processor transaction
RUN_SUBMITTED = b"tenure.runs.events.RunSubmitted"
# How often the tracker asks the views' secondary RocksDB to catch up: the API's poll interval.
VIEW_POLL_S = 0.01
PROBE_JITTER_S = 0.25  # longer than any poll timeout in the services, so probes arrive at random phases
# (topic, key, value, headers, partition) as confluent-kafka's produce() takes them; -1 = by key.
Wire = tuple[str, bytes, bytes, list[tuple[str, str | bytes | None]], int]
SPEC = {"image": "ghcr.io/tenure/bench-agent:1", "entrypoint": ["python", "-m", "agent"]}


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, q in 0..100; NaN when there are no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5))) - 1]


def send_all(producer: Producer, records: Iterable[Wire]) -> None:
    """Produce (topic, key, value, headers) records as fast as librdkafka takes them, then flush."""
    failures: list[str] = []

    def on_delivery(err: KafkaError | None, _: Message) -> None:
        if err is not None:
            failures.append(str(err))

    for topic, key, value, headers, partition in records:
        while True:
            try:
                producer.produce(
                    topic, value=value, key=key, headers=headers, partition=partition, on_delivery=on_delivery
                )
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(120.0) != 0 or failures:
        raise RuntimeError(f"producing failed: {len(failures)} errors, e.g. {failures[:1]}")


def events_end(bootstrap: str) -> int:
    """Sum of runs.events end offsets: events plus one transaction marker per partition per commit."""
    probe = TopicFollower(bootstrap, [RUNS_EVENTS.name], "end", client_id="tenure-bench-probe")
    try:
        return sum(probe.end_offsets(RUNS_EVENTS.name).values())
    finally:
        probe.close()


# --- CPU accounting and services as subprocesses ----------------------------------------------


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@dataclass
class CpuMeter:
    """CPU seconds each process used per phase: where the machine's two cores went."""

    pids: dict[str, int] = field(default_factory=dict)
    phases: list[tuple[str, float, dict[str, float]]] = field(default_factory=list)

    def snapshot(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def measure(self, phase: str, before: dict[str, float], wall_s: float) -> None:
        after = self.snapshot()
        self.phases.append((phase, wall_s, {n: after[n] - before[n] for n in after if n in before}))


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    log_file: Path

    def check_alive(self) -> None:
        if (code := self.process.poll()) is not None:
            raise RuntimeError(f"{self.name} exited with {code}; log tail:\n{self.log_tail()}")

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def service_env(bootstrap: str, state_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TENURE_API_KEYS", None)  # the bench talks to its own API in development mode
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo_root()), env.get("PYTHONPATH", "")) if p)
    env.update(KAFKA_BOOTSTRAP_SERVERS=bootstrap, TENURE_STATE_DIR=str(state_dir), **extra)
    return env


def spawn(name: str, module: str, workdir: Path, env: dict[str, str]) -> Service:
    workdir.mkdir(parents=True, exist_ok=True)
    log_file = workdir / f"{name}.log"
    with log_file.open("wb") as out:
        # cwd is the service's temp dir, so faust's <app>-data folder never lands in the repo.
        process = subprocess.Popen(
            [sys.executable, "-m", module],
            env=env,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    say(f"started {name} pid {process.pid} (log {log_file})")
    return Service(name, process, log_file)


# --- (a) the physical limit -------------------------------------------------------------------


@dataclass
class RawResult:
    """Best of RAW_REPEATS rounds (the limit is what the setup can do, not its worst moment)."""

    messages: int
    produce_runs: list[float]
    consume_runs: list[float]

    @property
    def produce_s(self) -> float:
        return min(self.produce_runs)

    @property
    def consume_s(self) -> float:
        return min(self.consume_runs)


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


def submit_command(codec: MessageCodec, tenant: str, key: str) -> tuple[str, OutboundRecord]:
    run_id = run_id_for(tenant, key)
    command = SubmitRun(
        command_id=command_id_for(run_id, "SubmitRun", key),
        run_id=run_id,
        issued_at=SystemClock().now_ms(),
        correlation_id=run_id,
        actor="bench",
        tenant=tenant,
        idempotency_key=key,
        execution_spec=canonical_json({**SPEC, "args": [key]}),
        timeout_seconds=600,
    )
    return run_id, command_record(codec, command)


class ViewTracker:
    """Times, per run, when its RunSubmitted became readable and when its Run view existed.

    Decided: a read_committed consumer of runs.events returned the RunSubmitted (the processor's
    transaction committed). Viewed: the projector's stored offset for the partition passed the
    event's offset, read from its RocksDB opened as a read-only secondary; views and offsets
    change in one atomic write, so that is when the view exists. Resolution: ~VIEW_POLL_S.
    """

    def __init__(self, bootstrap: str, views_dir: Path, link_dir: Path) -> None:
        probe = TopicFollower(bootstrap, [RUNS_EVENTS.name], "end", client_id="tenure-bench-probe")
        ends = probe.end_offsets(RUNS_EVENTS.name)
        probe.close()
        self._follower = TopicFollower(bootstrap, [RUNS_EVENTS.name], ends, client_id="tenure-bench-tracker")
        # RocksStore puts a secondary's folder next to the path; a symlinked path keeps ours apart
        # from the API's, which opens the same views as a secondary too.
        link_dir.mkdir(parents=True, exist_ok=True)
        (link_dir / views_dir.name).symlink_to(views_dir, target_is_directory=True)
        self._rocks = RocksStore(link_dir / views_dir.name, secondary=True)
        self._views = RunViewStore(self._rocks, MessageCodec())
        self.sent: dict[str, float] = {}
        self.decided: dict[str, float] = {}
        self.viewed: dict[str, float] = {}
        self._pending: dict[int, deque[tuple[int, str]]] = {}
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="view-tracker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            last_refresh = 0.0
            while not self._stop.is_set():
                records = self._follower.poll(max_records=5000, timeout_s=0.005)
                now = time.monotonic()
                for r in records:
                    run_id = r.key.decode() if r.key else ""
                    schema = next((v for k, v in r.headers if k == "tenure-schema"), b"")
                    if schema == RUN_SUBMITTED and run_id in self.sent and run_id not in self.decided:
                        self.decided[run_id] = now
                        self._pending.setdefault(r.partition, deque()).append((r.offset, run_id))
                if any(self._pending.values()) and now - last_refresh >= VIEW_POLL_S:
                    self._views.refresh()
                    offsets = self._views.offsets()
                    last_refresh = time.monotonic()
                    for partition, queue in self._pending.items():
                        while queue and queue[0][0] < offsets.get(partition, 0):
                            self.viewed[queue.popleft()[1]] = last_refresh
        except BaseException as exc:  # raised by wait(): a silently dead tracker would hang the bench
            self._error = exc

    def wait(self, run_ids: list[str], timeout_s: float, label: str, services: list[Service]) -> None:
        deadline, next_report = time.monotonic() + timeout_s, time.monotonic() + 2.0
        while True:
            if self._error is not None:
                raise RuntimeError(f"view tracker failed: {self._error!r}") from self._error
            missing = sum(1 for r in run_ids if r not in self.viewed)
            if missing == 0:
                return
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"{label}: {missing}/{len(run_ids)} views missing after {timeout_s:.0f}s")
            if now >= next_report:
                total, decided = len(run_ids), sum(1 for r in run_ids if r in self.decided)
                say(f"{label}: decided {decided}/{total}, viewed {total - missing}/{total}")
                for service in services:
                    service.check_alive()
                next_report = now + 2.0
            time.sleep(0.002 if len(run_ids) == 1 else 0.05)

    def verify(self, run_ids: list[str]) -> int:
        """How many of `run_ids` have a queued Run view, read back rather than inferred."""
        self._views.refresh()
        return sum(1 for r in run_ids if (v := self._views.get(r)) is not None and v["status"] == "queued")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10.0)
        self._follower.close()
        self._rocks.close()


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


@dataclass
class ProcessorResult:
    commands: int
    publish_s: float
    decided_s: float
    viewed_s: float
    decided_ms: list[float]
    viewed_ms: list[float]
    probe_decided_ms: list[float]
    probe_viewed_ms: list[float]
    verified: int
    burst_markers: int
    logic_s: float = float("nan")


def publish_all(producer: Producer, tracker: ViewTracker, prepared: list[tuple[str, OutboundRecord]]) -> None:
    def stamped() -> Iterator[Wire]:
        for run_id, record in prepared:
            tracker.sent[run_id] = time.monotonic()
            yield (
                record.topic,
                record.key,
                record.value,
                list(record.headers),
                (-1 if record.partition is None else record.partition),
            )

    send_all(producer, stamped())


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


@dataclass
class RebuildResult:
    restore_events: int
    restore_s: float
    projection_events: int
    projection_runs: int
    projection_s: float
    projection_first_batch_s: float
    log_offsets: int


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


@dataclass
class ApiResult:
    requests: int
    seconds: float
    statuses: dict[int, int]
    created_ms: list[float]


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


def wait_for_api(base_url: str, service: Service, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        service.check_alive()
        try:
            if httpx.get(f"{base_url}/healthz", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the API at {base_url} was not healthy after {timeout_s:.0f}s")


# --- report -----------------------------------------------------------------------------------


def _lat(values: list[float]) -> str:
    def ms(v: float) -> str:
        return "-" if v != v else f"{v:,.0f} ms" if v >= 100 else f"{v:.1f} ms"

    return f"{ms(percentile(values, 50))} / {ms(percentile(values, 99))}"


def render_tables(
    raw: RawResult,
    proc: ProcessorResult,
    reb: RebuildResult,
    api: ApiResult | str,
    cpu: CpuMeter,
    clients: int,
    runs: int,
) -> str:
    """The results table, the notes that make it readable, and the CPU table."""
    produce_rate, consume_rate = raw.messages / raw.produce_s, raw.messages / raw.consume_s
    lines = [
        "| Phase | What | Count | Seconds | Rate | p50 / p99 | Tenure/raw |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]

    def row(phase: str, what: str, count: int, seconds: float, latency: str, base: float | None) -> None:
        rate = count / seconds
        ratio = "baseline" if base is None else f"{rate / base:.2g} (1/{base / rate:,.0f})"
        cells = (phase, what, f"{count:,}", f"{seconds:.2f}", f"{rate:,.0f}/s", latency, ratio)
        lines.append("| " + " | ".join(cells) + " |")

    row(
        "(a) raw",
        f"produce {RAW_VALUE_BYTES} B records, acks=all, idempotent (best of {RAW_REPEATS})",
        raw.messages,
        raw.produce_s,
        "-",
        None,
    )
    row(
        "(a) raw",
        f"consume them back, read_committed (best of {RAW_REPEATS})",
        raw.messages,
        raw.consume_s,
        "-",
        None,
    )
    row(
        "(b) processor logic",
        f"RunCommandProcessor.handle, batches of {BATCH}, Kafka replaced by memory",
        proc.commands,
        proc.logic_s,
        "-",
        produce_rate,
    )
    row(
        "(b) processor",
        "SubmitRun -> RunSubmitted committed",
        proc.commands,
        proc.decided_s,
        _lat(proc.decided_ms),
        produce_rate,
    )
    row(
        "(b) processor + projector",
        "SubmitRun -> Run view exists",
        proc.commands,
        proc.viewed_s,
        _lat(proc.viewed_ms),
        produce_rate,
    )
    probes = len(proc.probe_viewed_ms)
    for what, values in (("committed", proc.probe_decided_ms), ("view exists", proc.probe_viewed_ms)):
        lines.append(
            f"| (b) closed loop | one command at a time ({probes} samples): {what} "
            f"| - | - | - | {_lat(values)} | - |"
        )
    if isinstance(api, ApiResult):
        row(
            "(c) HTTP API",
            f"POST /runs, {clients} clients x {runs} runs (latency of 201s)",
            api.requests,
            api.seconds,
            _lat(api.created_ms),
            produce_rate,
        )
        others = {k: v for k, v in sorted(api.statuses.items()) if k != 201} or "none"
        api_note = f"(c) answers: {api.statuses.get(201, 0):,} x 201; others {others} (0: timeout)."
    else:
        lines.append(f"| (c) HTTP API | POST /runs, {clients} clients x {runs} runs | FAILED | | | {api} | |")
        api_note = f"(c) failed: {api}."
    row(
        "(d) restore",
        "RunCommandProcessor.restore, direct call",
        reb.restore_events,
        reb.restore_s,
        "-",
        consume_rate,
    )
    row(
        "(d) projection",
        "services.projections.service.rebuild",
        reb.projection_events,
        reb.projection_s,
        "-",
        consume_rate,
    )
    names = list(cpu.pids)
    lines += [
        "",
        "Tenure/raw: (b) and (c) against the raw produce rate, (d) against the raw consume rate. "
        f"Raw rounds took {', '.join(f'{s:.2f}' for s in raw.produce_runs)}s to produce and "
        f"{', '.join(f'{s:.2f}' for s in raw.consume_runs)}s to consume: sub-second timings, so the "
        "ratios move with any other load on the machine. "
        f"The (b) burst was produced in {proc.publish_s:.2f}s and its latencies count from each "
        "produce call, so they include queueing behind the whole burst; the closed-loop rows are "
        f"the unloaded latency, each probe sent after a random 0-{PROBE_JITTER_S:g}s pause. "
        f"{proc.verified:,}/{proc.commands:,} burst views were read back and "
        f"found queued. The burst left {proc.burst_markers:,} commit markers on runs.events, one per "
        f"partition per transaction: {proc.commands / max(proc.burst_markers, 1):.0f} events per "
        "partition per commit. "
        f"{api_note} (d) folded runs.events holding {reb.log_offsets:,} offsets (events plus "
        f"markers) into {reb.projection_runs:,} views; the projection rebuild applied its first "
        f"batch {reb.projection_first_batch_s:.2f}s after it started.",
        "",
        "CPU seconds per process in each phase (two cores give 2 CPU-seconds per wall second):",
        "",
        "| Phase | Wall s | " + " | ".join(names) + " |",
        "|---|---:|" + "---:|" * len(names),
    ]
    for phase, wall, used in cpu.phases:
        cells = " | ".join(f"{used[n]:.1f}" if n in used else "-" for n in names)
        lines.append(f"| {phase} | {wall:.1f} | {cells} |")
    return "\n".join(lines)


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=repo_root(), capture_output=True, text=True, timeout=10)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def section_body(
    key: str, started_at: dt.datetime, load: tuple[float, ...], broker: BrokerHandle, tables: str
) -> str:
    command = shlex.join(sys.orig_argv)
    if os.environ.get("PYTHONPATH"):
        command = f"PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])} {command}"
    commit = _git("rev-parse", "--short", "HEAD")
    if commit and _git("status", "--porcelain"):
        commit += " (plus uncommitted changes)"
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((x.split(":", 1)[1].strip() for x in cpuinfo if x.startswith("model name")), "?")
    kafka = (
        f"Kafka {KAFKA_VERSION}, one node started by services.common.broker for this run"
        if broker.owned
        else f"Kafka at {broker.bootstrap_servers} (KAFKA_BOOTSTRAP_SERVERS)"
    )
    return "\n".join(
        [
            f"### Foundation run: {key}",
            "",
            f"- Date: {started_at:%Y-%m-%d %H:%M} UTC",
            f"- Git commit: {commit or 'none (the repository has no commits yet)'}",
            f"- Command: `{command}`",
            f"- Machine: `nproc` = {nproc} ({model}), Python {sys.version.split()[0]}; 1-minute load "
            f"average {load[0]:.2f} at the start and {os.getloadavg()[0]:.2f} at the end (the bench's "
            "own processes included)",
            f"- Broker: {kafka}; Tenure topics have {RUNS_COMMANDS.partitions} partitions, replication 1",
            "",
            tables,
        ]
    )


def write_section(
    output: Path, key: str, body: str, bench: str = "foundation", anchor: str | None = None
) -> None:
    """Replace this configuration's section between its markers (`<!-- bench:<bench> <key>
    BEGIN -->`), else add it after `anchor` when the file has it, else append it."""
    begin, end = f"<!-- bench:{bench} {key} BEGIN -->", f"<!-- bench:{bench} {key} END -->"
    section = f"{begin}\n{body}\n{end}"
    text = output.read_text() if output.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    elif anchor is not None and anchor in text:
        text = text.replace(anchor, f"{anchor}\n\n{section}", 1)
    else:
        text = text.rstrip("\n") + f"\n\n{section}\n"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)


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
        path, deadline = views_path(workdir / "views"), time.monotonic() + 60
        while not (path / "CURRENT").exists():  # the projector creates the views store
            services[1].check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the projector did not create {path} within 60s")
            time.sleep(0.1)
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
