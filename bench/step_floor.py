"""The floors under a durable workflow on this machine: a Kafka transaction and an HTTP request.

Issue 11's bar is DBOS's 144 1-step workflows/s at 8 clients. On two cores that leaves
2 / 144 = 13.9 ms of CPU per workflow for everything: the broker, every Tenure process and the
clients. This script measures, in one run, the two costs no design on Tenure's stack can go
below, so that a design's arithmetic can be checked against them (docs/architecture.md, "Where a
workflow's CPU goes, and what closing the gap would take"):

  (k) the broker's CPU per Kafka transaction: Tenure's own `TransactionalWriter` (acks=all,
      idempotent, transactional) commits at a fixed rate to a topic shaped like runs.events,
      with --readers `TopicFollower`s (read_committed) following it, as the API's decision
      follower, its projection, the projector and the gateway follow runs.events. Measured
      after a warm-up, with one record per transaction and then --group records per
      transaction (a group commit across workflows) at the same record rate;
  (h) the HTTP stack's CPU per request: bench/_floor_app.py (FastAPI and uvicorn as Tenure
      serves them, one route with a pydantic body, no middleware, no work), driven by
      --clients aiohttp clients; the server's and the clients' CPU per request.

  (l) the latency of one record made durable, one at a time: Tenure's command publisher (an
      idempotent acks=all append) against its transactional writer (a transaction of one
      record): what the transaction protocol adds to every serial commit of a workflow.

It then prints what a 1-step workflow of the benchmark's shape (7 requests: submit, claim, open,
propose, one long-poll, finish, report) would cost at these floors with 11 transactions (today's
count, bench/durable_steps.py) and with one transaction per workflow, against the 13.9 ms.

    PYTHONPATH=. .venv/bin/python -m bench.step_floor [--seconds 10] [--rate 100] [--readers 4]

A script, not a test: it measures and reports, it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench._foundation_toolkit import cpu_seconds, percentile
from bench.foundation import say
from services.common.broker import free_port, start_broker
from services.common.kafka import (
    CommandPublisher,
    OutboundRecord,
    TopicFollower,
    TransactionalWriter,
    create_topics,
)
from services.common.topics import RUNS_EVENTS, TopicSpec

__all__ = ["main"]

DBOS_1STEP_PER_S = 144.0  # DBOS 3.4 + PostgreSQL 15, 8 clients, this machine (issue 11)
CORES = 2
REQUESTS_PER_1STEP = 7
TRANSACTIONS_TODAY = 11
RECORD = b"v" * 600  # about a LeaseRenewed or a StepIntentRecorded with its headers


@dataclass(frozen=True)
class TxnFloor:
    case: str
    records_per_txn: int
    txn_per_s: float
    broker_ms_per_txn: float  # the broker's CPU in the phase, less its idle CPU, per transaction
    read: int

    @property
    def broker_ms_per_record(self) -> float:
        return self.broker_ms_per_txn / self.records_per_txn


def _follow(
    bootstrap: str, topic: str, readers: int, stop: threading.Event, read: list[int]
) -> list[threading.Thread]:
    def loop(index: int) -> None:
        follower = TopicFollower(bootstrap, [topic], "end", client_id=f"tenure-floor-{index}")
        try:
            while not stop.is_set():
                read[index] += len(follower.poll(max_records=2000, timeout_s=0.5))
                follower.positions(topic)  # as every Tenure follower does after a poll
        finally:
            follower.close()

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(readers)]
    for thread in threads:
        thread.start()
    return threads


def _commit_at(
    writer: TransactionalWriter, spec: TopicSpec, per_txn: int, txn_per_s: float, seconds: float, spread: bool
) -> int:
    """Transactions of `per_txn` records at `txn_per_s` for `seconds`: all on partition 0 (one
    owner's group commit), or `spread` over every partition (a batch of many runs' commands)."""
    began, sent = time.monotonic(), 0
    while time.monotonic() - began < seconds:
        writer.commit(
            [
                OutboundRecord(
                    spec.name, b"run-%d" % i, RECORD, (), (sent + i) % spec.partitions if spread else 0
                )
                for i in range(per_txn)
            ]
        )
        sent += 1
        pause = began + sent / txn_per_s - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    return sent


def transaction_floor(bootstrap: str, broker_pid: int, args: argparse.Namespace) -> list[TxnFloor]:
    spec = TopicSpec(name="tenure.floor.events", partitions=RUNS_EVENTS.partitions)
    create_topics(bootstrap, [spec])
    writer = TransactionalWriter(bootstrap, "tenure-floor-writer")
    stop, read = threading.Event(), [0] * args.readers
    threads = _follow(bootstrap, spec.name, args.readers, stop, read)
    time.sleep(2.0)  # the followers are assigned and fetching
    say(f"(k) warm-up: {args.seconds:.0f} s at {args.rate:.0f} transactions/s")
    _commit_at(writer, spec, 1, args.rate, args.seconds, spread=True)
    cpu0, began = cpu_seconds(broker_pid), time.monotonic()
    time.sleep(args.seconds)
    idle_cores = (cpu_seconds(broker_pid) - cpu0) / (time.monotonic() - began)
    say(f"(k) idle with {args.readers} readers: the broker uses {idle_cores:.3f} cores (subtracted below)")
    floors = []
    cases = [
        ("1 record", 1, True),
        (f"{args.group} records on one partition", args.group, False),
        (f"{args.group} records over {spec.partitions} partitions", args.group, True),
    ]
    for case, per_txn, spread in cases:
        before_read, cpu0, began = sum(read), cpu_seconds(broker_pid), time.monotonic()
        sent = _commit_at(writer, spec, per_txn, args.rate / per_txn, args.seconds, spread)
        time.sleep(0.5)  # the followers read the last ones
        elapsed = time.monotonic() - began
        cpu = cpu_seconds(broker_pid) - cpu0 - idle_cores * elapsed
        floor = TxnFloor(case, per_txn, sent / elapsed, 1000 * cpu / sent, sum(read) - before_read)
        say(
            f"(k) {case} per transaction, {floor.txn_per_s:.1f}/s: broker {floor.broker_ms_per_txn:.2f} ms "
            f"per transaction, {floor.broker_ms_per_record:.2f} ms per record; {floor.read:,} records read"
        )
        floors.append(floor)
    stop.set()
    for thread in threads:
        thread.join(5.0)
    return floors


@dataclass(frozen=True)
class AppendLatency:
    """One record made durable, at one at a time: how long a serial commit waits at least."""

    append_p50_ms: float  # an idempotent, acks=all produce acknowledged (CommandPublisher)
    append_p99_ms: float
    transaction_p50_ms: float  # a transaction of one record (TransactionalWriter.commit)
    transaction_p99_ms: float


def append_latency(bootstrap: str, samples: int) -> AppendLatency:
    """(l) Latency, one record at a time on a topic of its own: Tenure's command publisher (what
    the API waits for before a command is on the log) against Tenure's transactional writer
    (what every decision batch waits for). The difference is what the transaction protocol adds
    to each serial commit of a workflow."""
    spec = TopicSpec(name="tenure.floor.latency", partitions=1)
    create_topics(bootstrap, [spec])
    publisher = CommandPublisher(bootstrap, client_id="tenure-floor-publisher")
    writer = TransactionalWriter(bootstrap, "tenure-floor-latency")
    appends: list[float] = []
    transactions: list[float] = []
    try:
        for index in range(samples + 20):  # the first 20 of each are a warm-up
            record = OutboundRecord(spec.name, b"run-%d" % index, RECORD, (), 0)
            began = time.perf_counter()
            publisher.publish(record).result(timeout=30)
            appends.append(1000 * (time.perf_counter() - began))
            began = time.perf_counter()
            writer.commit([record])
            transactions.append(1000 * (time.perf_counter() - began))
    finally:
        publisher.close()
        writer.close()
    appends, transactions = appends[20:], transactions[20:]
    latency = AppendLatency(
        percentile(appends, 50),
        percentile(appends, 99),
        percentile(transactions, 50),
        percentile(transactions, 99),
    )
    say(
        f"(l) one record durable, {samples} samples: an idempotent append p50 {latency.append_p50_ms:.2f} / "
        f"p99 {latency.append_p99_ms:.2f} ms, a transaction p50 {latency.transaction_p50_ms:.2f} / "
        f"p99 {latency.transaction_p99_ms:.2f} ms"
    )
    return latency


@dataclass(frozen=True)
class HttpFloor:
    requests_per_s: float
    server_ms: float
    client_ms: float


async def _drive(port: int, clients: int, seconds: float) -> int:
    done = 0
    body = {"attemptId": "a-1", "leaseEpoch": 1, "tool": "bench-tool", "params": {"name": "step-1"}}

    async def client() -> None:
        nonlocal done
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                async with session.post("/runs/r-1/trajectory/steps", json=body) as answer:
                    await answer.read()
                done += 1

    await asyncio.gather(*(client() for _ in range(clients)))
    return done


def http_floor(args: argparse.Namespace) -> HttpFloor:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    server = subprocess.Popen([sys.executable, "-m", "bench._floor_app", str(port)], env=env)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                asyncio.run(_drive(port, 1, 0.05))
                break
            except aiohttp.ClientError:
                time.sleep(0.2)
        asyncio.run(_drive(port, args.clients, 2.0))  # warm-up
        server0, client0, began = cpu_seconds(server.pid), time.process_time(), time.monotonic()
        done = asyncio.run(_drive(port, args.clients, args.seconds))
        elapsed = time.monotonic() - began
        floor = HttpFloor(
            done / elapsed,
            1000 * (cpu_seconds(server.pid) - server0) / done,
            1000 * (time.process_time() - client0) / done,
        )
    finally:
        server.terminate()
        server.wait(10)
    say(
        f"(h) {floor.requests_per_s:,.0f} requests/s: server {floor.server_ms:.3f} ms, "
        f"client {floor.client_ms:.3f} ms each"
    )
    return floor


def report(
    floors: list[TxnFloor], http: HttpFloor, args: argparse.Namespace, latency: AppendLatency | None = None
) -> str:
    budget = 1000 * CORES / DBOS_1STEP_PER_S
    single, owner = floors[0], floors[1]
    requests = REQUESTS_PER_1STEP * (http.server_ms + http.client_ms)
    lines = [
        f"Floors on this machine ({args.readers} read_committed readers of the topic, "
        f"{args.clients} HTTP clients;",
        "the broker's CPU is net of what it spends idle with those readers):",
        "",
        "| Floor | CPU |",
        "|---|---:|",
    ]
    lines += [
        f"| broker, one transaction of {f.case} | {f.broker_ms_per_txn:.2f} ms "
        f"({f.broker_ms_per_record:.2f} a record) |"
        for f in floors
    ]
    lines += [
        f"| HTTP request, server (FastAPI + uvicorn, no work) | {http.server_ms:.3f} ms |",
        f"| HTTP request, client (aiohttp) | {http.client_ms:.3f} ms |",
        "",
        f"A 1-step workflow ({REQUESTS_PER_1STEP} requests) at these floors, on {CORES} cores, against "
        f"DBOS's {DBOS_1STEP_PER_S:.0f}/s ({budget:.1f} ms of CPU each):",
        "",
        "| Design | transactions per workflow | floor CPU per workflow | ceiling (workflows/s) | x DBOS |",
        "|---|---:|---:|---:|---:|",
    ]
    designs = [
        (
            "today's step path (a transaction per decision batch, ~1 decision each)",
            TRANSACTIONS_TODAY,
            single.broker_ms_per_txn,
        ),
        (
            f"one owner per partition, group commit of {owner.records_per_txn} decisions",
            REQUESTS_PER_1STEP / owner.records_per_txn,
            owner.broker_ms_per_txn,
        ),
    ]
    for name, transactions, per_txn in designs:
        cost = transactions * per_txn + requests
        ceiling = 1000 * CORES / cost
        lines.append(
            f"| {name} | {transactions:.3g} | {cost:.1f} ms | {ceiling:.0f} | "
            f"{ceiling / DBOS_1STEP_PER_S:.2f} |"
        )
    lines += [
        "",
        "Floors only: no Tenure process's own work (deciding, encoding, folding, storing) is in them.",
    ]
    if latency is not None:
        lines += [
            "",
            "| One record made durable, one at a time (latency) | p50 | p99 |",
            "|---|---:|---:|",
            f"| an idempotent acks=all append (the API's command publisher) | "
            f"{latency.append_p50_ms:.2f} ms | "
            f"{latency.append_p99_ms:.2f} ms |",
            f"| a transaction of one record (a processor's commit) | {latency.transaction_p50_ms:.2f} ms | "
            f"{latency.transaction_p99_ms:.2f} ms |",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="each measured phase")
    parser.add_argument("--rate", type=float, default=100.0, help="records per second in (k)")
    parser.add_argument("--readers", type=int, default=4, help="read_committed followers of the topic in (k)")
    parser.add_argument("--group", type=int, default=8, help="records per transaction in (k)'s group commit")
    parser.add_argument("--clients", type=int, default=8, help="concurrent HTTP clients in (h)")
    parser.add_argument("--latency-samples", type=int, default=300, help="records made durable in (l)")
    args = parser.parse_args(argv)
    if not (
        1 <= args.seconds <= 600
        and 1 <= args.rate <= 5000
        and 0 <= args.readers <= 32
        and 2 <= args.group <= 500
        and 1 <= args.clients <= 64
        and 10 <= args.latency_samples <= 100_000
    ):
        parser.error(
            "--seconds 1-600, --rate 1-5000, --readers 0-32, --group 2-500, --clients 1-64, "
            "--latency-samples 10-100,000"
        )
    with tempfile.TemporaryDirectory(prefix="tenure-floor-") as workdir:
        broker = start_broker(
            data_dir=Path(workdir) / "data", state_dir=Path(workdir), timeout=180, die_with_parent=True
        )
        try:
            assert broker.pid is not None, (
                "the floor needs a broker this script starts (no KAFKA_BOOTSTRAP_SERVERS)"
            )
            floors = transaction_floor(broker.bootstrap_servers, broker.pid, args)
            latency = append_latency(broker.bootstrap_servers, args.latency_samples)
        finally:
            broker.stop()
    http = http_floor(args)
    print(report(floors, http, args, latency), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
