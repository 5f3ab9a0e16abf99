"""Tenure's lease-renewal benchmark: sustained heartbeats and expiry detection next to raw Kafka.

One invocation, one broker, phases in this order (see bench/README.md, docs/benchmarks.md):
  (a) raw confluent-kafka produce + consume of N small records (bench.foundation's raw phase);
  (l) RenewLease through RunCommandProcessor.handle with Kafka replaced by memory, and the cost
      of a timer tick as renewals accumulate: the processor's own ceiling;
  (b) coordinator, projector and API as subprocesses; runs submitted by producing SubmitRun
      straight to runs.commands, until every view exists;
  (e) expiry detection, idle: K runs claimed over HTTP with leaseSeconds=2 and never renewed;
      per run, the view's lease.endedAt (when the coordinator's timer recorded LeaseExpired)
      minus lease.expiresAt (the rule's deadline), both on the coordinator's clock;
  (i) five idle seconds: what the processes cost doing nothing;
  (r) per heartbeat interval H: R runs claimed (POST /runs/{id}/attempts, heartbeatSeconds=H,
      90 s leases or --lease-seconds, each renewed once a third of its TTL while the claims go
      on: bench/_leases_keeper.py; the coordinator at its default keepalive fraction, which puts
      one renewal an hour on runs.events, or, with --logged-every N, one in N at the shortest H:
      3 is what the defaults before 2026-12-06's evening gave at a 20 s heartbeat), then S
      simulated runners (one aiohttp pool each, --client httpx to compare) heartbeat them,
      each run every H seconds, phases spread evenly over H (R/H renewals/s offered): a warm-up
      of 3 H (at least 10 s; each run's first heartbeat starts it) on a row of its own, then D
      measured seconds
      (bench/_leases_windows.py); K more runs are claimed with a 2 s lease a third of the way
      in, to measure expiry detection under that load; every step but the last ends by
      reporting its attempts as succeeded so no lease timer of it outlives the step.

    PYTHONPATH=. python -m bench.leases [--runs 2000] [--heartbeat-seconds 8,4,2] [--duration 30]
        [--batch 250]   (renew through POST /leases:renew, 250 leases a request: issue 16)
    The issue's own load, 100,000 runs at a 20 s heartbeat (about 25 minutes, 10 of them claims):
        --runs 100000 --heartbeat-seconds 20 --duration 40 --expiry-runs 0 --runners 4
        --batch 250 --concurrency 128 --lease-seconds 1800

A script, not a test: it measures and reports, it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._leases_io import (
    EXPIRY_LEASE_SECONDS,
    Calls,
    Held,
    MachineCpuMeter,
    Pool,
    TransportError,
    claim_all,
    decision_wait,
    end_offsets,
    fan_out,
    open_pool,
    parse,
    release_all,
)
from bench._leases_keeper import keep_alive
from bench._leases_options import parse_args
from bench._leases_report import render, write_section
from bench._leases_system import (
    LEASE_SECONDS,
    TENANT,
    EventWatch,
    coordinator_partitions,
    gc_pauses,
    gc_summary,
    keepalive_fraction,
    start_services,
    submit_runs,
)
from bench._leases_windows import StepResult, batch_window, heartbeat_window
from bench.foundation import (
    BATCH,
    Service,
    bench_raw,
    say,
    section_body,
    service_env,
    submit_command,
    wait_for_api,
)
from services.common.broker import BrokerHandle, start_broker, stop_process
from services.common.clock import SystemClock
from services.common.contracts import ClaimRun, RenewLease
from services.common.eventlog import MemoryEventLog
from services.common.heap import no_cycle_collection
from services.common.ids import command_id_for
from services.common.kafka import InboundRecord, OutboundRecord
from services.common.messages import MessageCodec
from services.common.routing import partition_for_run
from services.common.settings import repo_root
from services.common.store import RocksStore
from services.common.topics import RUNS_COMMANDS
from services.lease_coordinator.domain import LeasePolicy, attempt_id_for
from services.lease_coordinator.processor import RunCommandProcessor

__all__ = ["main"]

IDLE_S = 5.0
LOGIC_ROUNDS = 10


# --- expiry detection -------------------------------------------------------------------------


@dataclass
class ExpiryResult:
    label: str
    claims: Calls
    decided_lag_ms: list[float]  # view lease.endedAt - lease.expiresAt, coordinator clock
    readable_lag_ms: list[float]  # LeaseExpired readable on runs.events - expiresAt, host clock
    missing: int  # claimed runs whose view never showed the lease expired


async def expiry_probe(
    http: Pool, run_ids: list[str], watch: EventWatch, label: str, concurrency: int
) -> ExpiryResult:
    held, claims = await claim_all(
        http, run_ids, f"bench-expiry-{label}", EXPIRY_LEASE_SECONDS, None, concurrency
    )
    ids = [h.run_id for h in held]
    deadline = time.monotonic() + EXPIRY_LEASE_SECONDS + 30
    while time.monotonic() < deadline and any(r not in watch.expired_seen_ms for r in ids):
        watch.check()
        await asyncio.sleep(0.2)
    leases: dict[str, dict[str, Any]] = {}

    async def read(run_id: str) -> None:
        until = time.monotonic() + 10  # the projector may be a moment behind the event
        while time.monotonic() < until:
            try:
                view = parse((await http.call("GET", f"/runs/{run_id}"))[1])
            except TransportError:
                view = None
            lease = (view.get("lease") if isinstance(view, dict) else None) or {}
            if lease.get("certainty") == "expired" and lease.get("endedAt") is not None:
                leases[run_id] = lease
                return
            await asyncio.sleep(0.2)

    await fan_out(ids, concurrency, read)
    decided = [float(v["endedAt"] - v["expiresAt"]) for v in leases.values()]
    readable = [
        float(watch.expired_seen_ms[r] - v["expiresAt"])
        for r, v in leases.items()
        if r in watch.expired_seen_ms
    ]
    return ExpiryResult(label, claims, decided, readable, len(ids) - len(leases))


# --- the processor's own ceiling -------------------------------------------------------------


@dataclass
class LogicResult:
    renewals: int
    seconds: float
    tick_ms: list[tuple[int, float]]  # (renewals handled so far, ms of one tick with no timer due)


def bench_logic(runs: int, workdir: Path) -> LogicResult:
    """RenewLease through RunCommandProcessor.handle with Kafka replaced by memory (RocksDB real):
    `runs` runs submitted and claimed, then LOGIC_ROUNDS heartbeats each; after every round one
    timer tick with nothing due, because every renewal moves the run's timer key."""
    codec, clock, partitions = MessageCodec(), SystemClock(), RUNS_COMMANDS.partitions
    offsets = [0] * partitions
    store = RocksStore(workdir / "logic" / "runs")
    processor = RunCommandProcessor(MemoryEventLog(partitions), store, codec, clock)

    def handle(records: list[OutboundRecord]) -> float:
        inbound = []
        for record in records:
            p = partition_for_run(record.key.decode(), partitions)  # where the API would route it
            inbound.append(
                InboundRecord(RUNS_COMMANDS.name, p, offsets[p], record.key, record.value, record.headers)
            )
            offsets[p] += 1
        started = time.perf_counter()
        for i in range(0, len(inbound), BATCH):
            processor.handle(inbound[i : i + BATCH])
        return time.perf_counter() - started

    def claim(run_id: str) -> OutboundRecord:
        return codec.outbound(
            RUNS_COMMANDS.name,
            run_id,
            ClaimRun(
                command_id=command_id_for(run_id, "ClaimRun", "logic"),
                run_id=run_id,
                issued_at=clock.now_ms(),
                correlation_id=run_id,
                actor="bench",
                runner_id="bench-logic",
                lease_seconds=LEASE_SECONDS,
            ),
        )

    def renew(run_id: str, sequence: int) -> OutboundRecord:
        return codec.outbound(
            RUNS_COMMANDS.name,
            run_id,
            RenewLease(
                command_id=f"cmd_logic_{sequence}_{run_id}",
                run_id=run_id,
                issued_at=clock.now_ms(),
                correlation_id=run_id,
                actor="bench",
                attempt_id=attempt_id_for(run_id, 1),
                lease_epoch=1,
                sequence=sequence,
            ),
        )

    submitted = [submit_command(codec, TENANT, f"logic-{i:07d}") for i in range(runs)]
    run_ids = [r for r, _ in submitted]
    handle([r for _, r in submitted])
    handle([claim(r) for r in run_ids])
    seconds, tick_ms = 0.0, []
    for sequence in range(1, LOGIC_ROUNDS + 1):
        seconds += handle([renew(r, sequence) for r in run_ids])
        started = time.perf_counter()
        if processor.tick():
            raise RuntimeError("a timer fired in the logic phase; the figures would not be renewals")
        tick_ms.append((sequence * runs, (time.perf_counter() - started) * 1000))
    store.close()
    return LogicResult(runs * LOGIC_ROUNDS, seconds, tick_ms)


# --- sustained renewals -----------------------------------------------------------------------


async def renewal_step(
    base_url: str,
    run_ids: list[str],
    expiry_ids: list[str],
    heartbeat_s: int,
    args: argparse.Namespace,
    watch: EventWatch,
    bootstrap: str,
    cpu: MachineCpuMeter,
    release: bool,
) -> StepResult:
    label = f"H={heartbeat_s}s"
    api_port = int(base_url.rsplit(":", 1)[1])
    async with open_pool(args.client, base_url, args.concurrency) as http:
        say(f"(r) {label}: claiming {len(run_ids)} runs, {args.concurrency} at a time")
        before, t0 = cpu.snapshot(), time.monotonic()
        held: list[Held] = []
        stop_keeper = asyncio.Event()
        keeper = asyncio.create_task(  # why: bench/_leases_keeper.py
            keep_alive(
                args.client,
                base_url,
                held,
                max(heartbeat_s, args.lease_seconds // 3),
                args.batch or 250,
                stop_keeper,
            )
        )
        try:
            _, claims = await claim_all(
                http,
                run_ids,
                "bench-runner",
                args.lease_seconds,
                heartbeat_s,
                args.concurrency,
                start=args.start_at_claim,
                into=held,
            )
        finally:
            stop_keeper.set()
            kept = await keeper
        cpu.measure(f"(r) {label}: claim {len(run_ids)}", before, time.monotonic() - t0)
        if kept.count:
            say(f"(r) {label}: renewed while claiming: {dict(kept.answers)}")
        step = StepResult(heartbeat_s, len(held), args.runners, args.duration, claims)
        step.started_at_claim = args.start_at_claim
        step.kept_alive = kept
        if not held:
            raise RuntimeError(f"{label}: no claim succeeded: {dict(claims.answers)}")

        warm_s = max(10.0, 3.0 * heartbeat_s) if args.warm_up_seconds is None else args.warm_up_seconds
        if warm_s > 0:  # why: bench/_leases_windows.py
            step.warm_up = StepResult(heartbeat_s, len(held), args.runners, warm_s, claims)
        say(
            f"(r) {label}: {args.runners} runners heartbeat {len(held)} runs for "
            f"{warm_s:g} s of warm-up, then {args.duration:g} s measured "
            f"({step.offered:,.0f}/s offered)"
            + (f"; {len(expiry_ids)} 2 s leases claimed at {args.duration / 3:.0f}s" if expiry_ids else "")
        )
        marks: dict[str, Any] = {}

        async def window_marks() -> None:
            # The log's ends first (the events and markers of the window count from them), the
            # API's metrics beside them: an HTTP call to an API under load can take a while.
            marks["ends"], marks["metrics"], marks["gc"] = await asyncio.gather(
                asyncio.to_thread(end_offsets, bootstrap),
                decision_wait(http, "RenewLease"),
                asyncio.to_thread(gc_pauses, api_port),
            )

        def at_window() -> None:  # the measured window begins: the CPU meters and the log's ends
            marks.update(cpu=cpu.snapshot(), threads=cpu.threads.snapshot(), t0=time.monotonic())
            marks["task"] = asyncio.create_task(window_marks())

        async def expiry_under_load() -> ExpiryResult | None:
            if not expiry_ids:
                return None
            await asyncio.sleep(0.5 + warm_s + args.duration / 3)
            return await expiry_probe(http, expiry_ids, watch, label, min(args.concurrency, 16))

        before, t0 = cpu.snapshot(), time.monotonic()
        expiry_task = asyncio.create_task(expiry_under_load())
        # The bench's own cyclic collections stay out of the latencies it measures (as timeit
        # does): a full pass of this process, which holds every latency so far, took 536 ms in
        # one window (2026-12-06 13:08), and every answer in flight then waited for it.
        gc.collect()
        with no_cycle_collection():
            if args.batch:
                await batch_window(args.client, base_url, held, step, args.runners, args.batch, at_window)
            else:
                await heartbeat_window(args.client, base_url, held, step, args.runners, at_window)
        wall = time.monotonic() - marks["t0"]
        if step.warm_up is not None:
            cpu.measure(f"(r) {label}: warm-up", before, marks["t0"] - t0, until=marks["cpu"])
        cpu.measure(f"(r) {label}: renewals", marks["cpu"], wall)
        cpu.threads.measure(f"(r) {label}: renewals", marks["threads"], wall)
        await marks["task"]
        metrics_before, ends_before = marks["metrics"], marks["ends"]
        step.expiry = await expiry_task
        metrics_after, ends_after = await decision_wait(http, "RenewLease"), end_offsets(bootstrap)
        step.gc = gc_summary(marks["gc"], await asyncio.to_thread(gc_pauses, api_port))
        if (count := metrics_after[1] - metrics_before[1]) > 0:
            step.decision_ms = (metrics_after[0] - metrics_before[0]) / count * 1000
        step.events, step.markers = watch.markers(ends_before, ends_after)
        if step.events:
            types = dict(watch.types(ends_before, ends_after))
            say(f"(r) {label}: events on runs.events in the window: {types}")

        if release:
            say(f"(r) {label}: reporting {len(held)} attempts succeeded")
            before, t0 = cpu.snapshot(), time.monotonic()
            step.release = await release_all(http, held, args.concurrency)
            cpu.measure(f"(r) {label}: release {len(held)}", before, time.monotonic() - t0)
    return step


# --- main -------------------------------------------------------------------------------------


async def lease_phases(
    base_url: str,
    run_ids: list[str],
    args: argparse.Namespace,
    watch: EventWatch,
    bootstrap: str,
    cpu: MachineCpuMeter,
    services: list[Service],
) -> tuple[ExpiryResult | None, list[StepResult]]:
    k, idle = args.expiry_runs, None
    if k:
        say(f"(e) idle: {k} runs claimed with {EXPIRY_LEASE_SECONDS} s leases, left to expire")
        async with open_pool(args.client, base_url, args.concurrency) as http:
            before, t0 = cpu.snapshot(), time.monotonic()
            idle = await expiry_probe(http, run_ids[:k], watch, "idle", min(args.concurrency, 16))
            cpu.measure("(e) idle expiry: claim, wait, read", before, time.monotonic() - t0)
    # What the services and the broker cost doing nothing: the floor under every per-renewal figure.
    before, t0 = cpu.snapshot(), time.monotonic()
    await asyncio.sleep(IDLE_S)
    cpu.measure(f"(i) idle, services up, no requests ({IDLE_S:g} s)", before, time.monotonic() - t0)
    steps, rest = [], run_ids[k:]
    for i, heartbeat_s in enumerate(args.steps):
        mine, rest = rest[: args.runs + k], rest[args.runs + k :]
        steps.append(
            await renewal_step(
                base_url,
                mine[: args.runs],
                mine[args.runs :],
                heartbeat_s,
                args,
                watch,
                bootstrap,
                cpu,
                release=i < len(args.steps) - 1,
            )
        )
        for service in services:
            service.check_alive()
        say(f"(r) partitions owned after the H={heartbeat_s}s step: {coordinator_partitions()}")
    return idle, steps


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__)
    load, started_at, tag = os.getloadavg(), dt.datetime.now(dt.UTC), uuid.uuid4().hex[:8]
    workdir = Path(tempfile.mkdtemp(prefix="tenure-bench-leases-"))
    broker: BrokerHandle | None = None
    services: list[Service] = []
    cpu = MachineCpuMeter({"bench client": os.getpid()})
    ok = False
    try:
        broker = start_broker(port=None, data_dir=workdir / "kafka" / "data", state_dir=workdir / "kafka")
        bootstrap = broker.bootstrap_servers
        if broker.owned and broker.pid is not None:
            cpu.pids = {"kafka broker": broker.pid, **cpu.pids}
        else:
            say(f"using KAFKA_BOOTSTRAP_SERVERS={bootstrap}: its CPU is not measured")
        created = subprocess.run(
            [sys.executable, "-m", "services.tenure_cli", "topics", "create"],
            env=service_env(bootstrap, workdir),
            capture_output=True,
            text=True,
        )
        if created.returncode != 0:
            raise RuntimeError(f"topics create failed: {created.stdout}{created.stderr}")

        before, t0 = cpu.snapshot(), time.monotonic()
        raw = bench_raw(bootstrap, args.raw_n, tag)
        cpu.measure("(a) raw produce + consume", before, time.monotonic() - t0)
        say(
            f"(l) processor logic alone: {args.runs} runs x {LOGIC_ROUNDS} renewals, Kafka replaced by memory"
        )
        before, t0 = cpu.snapshot(), time.monotonic()
        logic = bench_logic(args.runs, workdir)
        cpu.measure("(l) processor logic, in the bench process", before, time.monotonic() - t0)

        keepalive = (
            keepalive_fraction(args.logged_every, min(args.steps), args.lease_seconds)
            if args.logged_every
            else None
        )
        services, port = start_services(bootstrap, workdir, tag, args.coordinators, keepalive)
        cpu.pids.update({s.name: s.process.pid for s in services})
        cpu.threads.pids = {s.name: s.process.pid for s in services}
        total = args.expiry_runs + len(args.steps) * (args.runs + args.expiry_runs)
        before, t0 = cpu.snapshot(), time.monotonic()
        run_ids, submit_s = submit_runs(bootstrap, workdir, total, tag, services, args.tenants)
        cpu.measure(f"(b) submit {total} runs (+ warm-up)", before, time.monotonic() - t0)

        base_url = f"http://127.0.0.1:{port}"
        wait_for_api(base_url, services[2])
        watch = EventWatch(bootstrap)
        try:
            idle, steps = asyncio.run(lease_phases(base_url, run_ids, args, watch, bootstrap, cpu, services))
            watch.check()
        finally:
            watch.close()

        tables = render(raw, logic, idle, steps, cpu, total, submit_s, args.batch)
        print(tables)
        ok = True
        key = (
            f"runs={args.runs} heartbeat-seconds={','.join(map(str, args.steps))} "
            f"duration={args.duration:g} runners={args.runners} expiry-runs={args.expiry_runs} "
            f"client={args.client}"
            + (f" batch={args.batch}" if args.batch else "")
            + (f" coordinators={args.coordinators}" if args.coordinators > 1 else "")
            + (f" tenants={args.tenants}" if args.tenants > 1 else "")
            + (f" lease-seconds={args.lease_seconds}" if args.lease_seconds != LEASE_SECONDS else "")
            + (
                f" logged-every={args.logged_every}"
                if args.logged_every
                else f" keepalive-ttls={LeasePolicy().keepalive_fraction:g}"
            )
            + (" warm-up=10s|3H" if args.warm_up_seconds is None else f" warm-up={args.warm_up_seconds:g}")
            + (" starts=at-claim" if args.start_at_claim else "")
        )
        if args.output != "-":
            output = Path(args.output) if Path(args.output).is_absolute() else repo_root() / args.output
            body = section_body(key, started_at, load, broker, tables)
            write_section(output, key, body.replace("### Foundation run:", "#### Lease renewals run:", 1))
            say(f"wrote section '{key}' to {output}")
        return 0
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
