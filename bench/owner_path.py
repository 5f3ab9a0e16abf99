"""What the owner-per-partition design's core costs on this machine (issue 11), measured.

docs/architecture.md ("Where a workflow's CPU goes, and what closing the gap would take") says
that beating DBOS's 144 1-step workflows/s on two cores needs under ~14 ms of CPU per workflow,
broker included, and that only one design gets there: the process that answers a request owns
the run's partition, decides in memory, appends a batch's events in one transaction and answers
when it is durable. This script measures that design's core before anyone builds it:
bench/_owner_server.py serves the benchmark's workflow (submit, claim, open the trajectory, k
steps, finish, report) with both aggregates in one process, through Tenure's one aggregate
runtime and its group committer over joint units (services/common/aggregate/group_commit.py:
`RunCommandProcessor` and `TrajectoryProcessor` on one real Kafka transaction per unit, real
RocksDB), and no command topics or followers. A step is one request: the step's intent with the
fenced effect intent on the Run (one unit), the trivial effect, its outcome with the step's
commit (one unit), answered once the commit is durable. --clients aiohttp clients run workflows
back to back, as bench/durable_steps.py's clients do.

It prints workflows/s, latency, transactions per workflow and the CPU per workflow of the owner,
the broker and the clients for each case, against DBOS's published figures. The cases: "joint
units" (the above), "separate units" (each of a step's commands a request of its own: three
serial units per step instead of two), "one transaction per command" (no group commit) and
"combined calls" (joint units; the claim also opens the trajectory and the finish also reports
the attempt succeeded, each in one unit: two requests fewer per workflow). "no changelog" is
"combined calls" with the Run's state changelog off: the bound of a changelog written less often
than in every transaction (a measurement only: a restore of that owner folds every event).

    PYTHONPATH=. .venv/bin/python -m bench.owner_path [--seconds 20] [--clients 8] [--steps 1,5]
        [--cases "joint units,separate units"] [--group-only] [--tenants 1] [--per-partition]

`--tenants N` spreads the clients' runs over N tenants on distinct partitions (all of a tenant's
runs share one partition); `--per-partition` gives the owner one producer, processor and store
per partition and aggregate instead of one for all, so that commits of different partitions
overlap.

A script, not a test: it measures and reports, it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench._foundation_toolkit import cpu_seconds, percentile
from bench.foundation import say
from bench.step_floor import CORES, DBOS_1STEP_PER_S
from services.common.broker import free_port, start_broker
from services.common.ids import tenant_shard
from services.common.kafka import create_topics
from services.common.topics import RUNS_COMMANDS, TOPICS

__all__ = ["OwnerRun", "main"]

TOOL = "cache.warm"  # bench/durable_steps.py's trivial class-I tool
DBOS_5STEP_PER_S = 45.4
DBOS_P99_MS = {1: 90.0, 5: 241.0}
# The cases, by name, with the server's options (bench/_owner_server.py).
CASES: dict[str, tuple[str, ...]] = {
    "joint units": (),
    "combined calls": (),
    "no changelog": ("--no-changelog",),
    "changelog every second": ("--changelog-every-second",),
    "separate units": ("--separate",),
    "one transaction per command": ("--separate", "--no-group"),
}
# Joint units, with a runner's two calls that always follow each other made as one: the claim
# opens the trajectory, the finish reports the attempt succeeded (5 requests for a 1-step
# workflow instead of 7, 13 for a 5-step one instead of 15).
COMBINED = {"combined calls", "no changelog", "changelog every second"}


@dataclass(frozen=True)
class OwnerRun:
    case: str
    steps: int
    workflows: int
    seconds: float
    p50_ms: float
    p99_ms: float
    owner_ms: float  # CPU per workflow (the Run's share)
    broker_ms: float
    client_ms: float
    commands_per_batch: float
    transactions_per_workflow: float
    records_per_transaction: float
    partitions_per_transaction: float
    handle_p50_ms: float  # one batch through the runtime: decide, the transaction, the store
    handle_p99_ms: float
    commit_p50_ms: float  # of which the Kafka transaction: begin, produce, flush, commit
    commit_p99_ms: float

    @property
    def per_s(self) -> float:
        return self.workflows / self.seconds

    @property
    def tenure_ms(self) -> float:
        return self.owner_ms + self.broker_ms


def tenants_over_partitions(count: int) -> list[str]:
    """`count` tenant names whose runs land on distinct partitions (as many as there are): a
    tenant's runs all live on one partition (services.common.ids.run_id_for)."""
    partitions = RUNS_COMMANDS.partitions
    chosen: dict[int, str] = {}
    index = 0
    while len(chosen) < min(count, partitions):
        name = f"bench-owner-{index}"
        chosen.setdefault(int(tenant_shard(name), 16) % partitions, name)
        index += 1
    names = [chosen[p] for p in sorted(chosen)]
    return [names[i % len(names)] for i in range(count)]


async def _workflow(
    session: aiohttp.ClientSession, key: str, steps: int, tenant: str, combined: bool = False
) -> None:
    """One workflow; `combined`: the claim opens the trajectory and the finish reports the
    attempt succeeded (two requests, and units, fewer)."""

    async def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        async with session.post(path, json=body) as answer:
            if answer.status >= 300:
                raise RuntimeError(f"{path}: {answer.status} {await answer.text()}")
            result: dict[str, Any] = await answer.json()
            return result

    run = await post("/runs", {"key": key, "tenant": tenant})
    run_id = run["runId"]
    grant = await post(
        f"/runs/{run_id}/attempts",
        {"runnerId": "bench-runner", "leaseSeconds": 3600, "openTrajectory": combined},
    )
    lease = {"attemptId": grant["attemptId"], "leaseEpoch": grant["epoch"]}
    if not combined:
        await post(f"/runs/{run_id}/trajectory", lease)
    for index in range(steps):
        step = await post(
            f"/runs/{run_id}/trajectory/steps",
            {**lease, "tool": TOOL, "params": {"name": f"step-{index + 1}"}},
        )
        if step["status"] != "committed":
            raise RuntimeError(f"{run_id}: step {index} is {step['status']}")
    if combined:
        finished = await post(f"/runs/{run_id}/trajectory/finish", {**lease, "reportSucceeded": True})
        if finished["run"]["status"] != "succeeded":
            raise RuntimeError(f"{run_id}: {finished}")
        return
    await post(f"/runs/{run_id}/trajectory/finish", lease)
    await post(f"/runs/{run_id}/report", lease)


async def _drive(
    port: int, clients: int, seconds: float, prefix: str, steps: int, tenants: int = 1, combined: bool = False
) -> list[float]:
    latencies: list[float] = []
    names = tenants_over_partitions(tenants)

    async def client(index: int) -> None:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:
            until, n = time.monotonic() + seconds, 0
            while time.monotonic() < until:
                began = time.monotonic()
                await _workflow(session, f"{prefix}-{index}-{n}", steps, names[index % len(names)], combined)
                latencies.append(time.monotonic() - began)
                n += 1

    await asyncio.gather(*(client(i) for i in range(clients)))
    return latencies


async def _stats(port: int) -> dict[str, Any]:
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session, session.get("/stats") as answer:
        stats: dict[str, Any] = await answer.json()
        return stats


def measure(
    case: str, steps: int, bootstrap: str, broker_pid: int, workdir: Path, args: argparse.Namespace
) -> OwnerRun:
    port = free_port()
    # Unique per measurement: a case measured twice in one invocation (an interleaved A/B) must
    # not submit the keys of the first (its workflows would all be duplicates, decided before).
    label = f"{case[:3]}{steps}-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    extra = list(CASES[case]) + (["--per-partition"] if args.per_partition else [])
    state = workdir / label
    command = [sys.executable, "-m", "bench._owner_server", str(port), bootstrap, str(state), *extra]
    server = subprocess.Popen(command, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                asyncio.run(_stats(port))
                break
            except aiohttp.ClientError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the owner prototype did not start") from None
                time.sleep(0.2)
        combined = case in COMBINED
        asyncio.run(_drive(port, args.clients, 3.0, f"{label}-warm", steps, args.tenants, combined))
        before = asyncio.run(_stats(port))
        owner0, broker0, client0 = cpu_seconds(server.pid), cpu_seconds(broker_pid), time.process_time()
        began = time.monotonic()
        latencies = asyncio.run(
            _drive(port, args.clients, args.seconds, f"{label}-run", steps, args.tenants, combined)
        )
        elapsed = time.monotonic() - began
        owner, broker, client = (
            cpu_seconds(server.pid) - owner0,
            cpu_seconds(broker_pid) - broker0,
            time.process_time() - client0,
        )
        after = asyncio.run(_stats(port))
    finally:
        server.terminate()
        server.wait(10)
    n = len(latencies)
    batches = max(1, after["batches"] - before["batches"])
    txns = max(1, after["transactions"] - before["transactions"])
    result = OwnerRun(
        case,
        steps,
        n,
        elapsed,
        1000 * percentile(latencies, 50),
        1000 * percentile(latencies, 99),
        1000 * owner / n,
        1000 * broker / n,
        1000 * client / n,
        (after["commands"] - before["commands"]) / batches,
        (after["transactions"] - before["transactions"]) / n,
        (after["records"] - before["records"]) / txns,
        (after["partitions"] - before["partitions"]) / txns,
        after["handle_p50_ms"],
        after["handle_p99_ms"],
        after["commit_p50_ms"],
        after["commit_p99_ms"],
    )
    say(
        f"{case}, {steps}-step: {result.per_s:.1f} workflows/s, "
        f"p50 {result.p50_ms:.1f} / p99 {result.p99_ms:.1f} ms, "
        f"{result.commands_per_batch:.1f} requests per unit, {result.transactions_per_workflow:.2f} "
        f"transactions per workflow ({result.records_per_transaction:.1f} records on "
        f"{result.partitions_per_transaction:.1f} partitions each), a unit decided and stored in p50 "
        f"{result.handle_p50_ms:.1f} / p99 {result.handle_p99_ms:.1f} ms (its Kafka transaction p50 "
        f"{result.commit_p50_ms:.1f} / p99 {result.commit_p99_ms:.1f} ms); CPU per workflow: owner "
        f"{result.owner_ms:.2f} ms, broker {result.broker_ms:.2f} ms, clients {result.client_ms:.2f} ms"
    )
    return result


def report(runs: list[OwnerRun], args: argparse.Namespace) -> str:
    dbos = {1: DBOS_1STEP_PER_S, 5: DBOS_5STEP_PER_S}
    lines = [
        f"A durable workflow through an owner of both aggregates (the design's core, not Tenure's "
        f"services), {args.clients} clients, {args.seconds:.0f} s per case; DBOS 3.4's published "
        "figures on this machine's shape for the limit:",
        "",
        "| case | steps | workflows/s | DBOS wf/s | ratio | p50 / p99 ms | DBOS p99 | transactions per "
        "workflow | requests per unit | unit p50 / p99 ms (its transaction) | CPU ms per workflow: "
        "owner / broker / clients | owner + broker | DBOS's CPU budget |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for run in runs:
        peer = dbos.get(run.steps)
        budget = f"{1000 * CORES / peer:.1f}" if peer else "-"
        lines.append(
            f"| {run.case} | {run.steps} | {run.per_s:.1f} | {peer or '-'} | "
            f"{run.per_s / peer if peer else float('nan'):.2f}x | {run.p50_ms:.1f} / {run.p99_ms:.1f} | "
            f"{DBOS_P99_MS.get(run.steps, '-')} | {run.transactions_per_workflow:.2f} | "
            f"{run.commands_per_batch:.1f} | {run.handle_p50_ms:.1f} / {run.handle_p99_ms:.1f} "
            f"({run.commit_p50_ms:.1f} / {run.commit_p99_ms:.1f}) | "
            f"{run.owner_ms:.2f} / {run.broker_ms:.2f} / {run.client_ms:.2f} | "
            f"{run.tenure_ms:.2f} | {budget} |"
        )
    lines += [
        "",
        f"DBOS's CPU budget: {CORES} cores / its workflows/s, for everything (here the owner, the "
        "broker and the clients). Not in the owner: the watchdog's and the breakers' observations "
        "(their records are written, no process reads them), the Run and trajectory views, "
        "authentication, the gateway's HTTP hop to a tool.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="each measured phase")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--steps", default="1,5", help="workflow sizes, comma-separated (default 1,5)")
    parser.add_argument(
        "--cases",
        default="joint units,separate units",
        help=f"comma-separated, of: {', '.join(CASES)} (default: the first two)",
    )
    parser.add_argument("--group-only", action="store_true", help="joint units only")
    parser.add_argument(
        "--tenants",
        type=int,
        default=1,
        help="tenants the clients submit as, over distinct partitions (default 1)",
    )
    parser.add_argument(
        "--per-partition",
        action="store_true",
        help="one producer, processor and store per partition and aggregate (default: one for all)",
    )
    args = parser.parse_args(argv)
    args.step_sizes = [int(part) for part in args.steps.split(",") if part.strip()]
    args.cases = (
        ["joint units"] if args.group_only else [c.strip() for c in args.cases.split(",") if c.strip()]
    )
    if not args.cases or any(case not in CASES for case in args.cases):
        parser.error(f"--cases: comma-separated, of: {', '.join(CASES)}")
    if not (1 <= args.seconds <= 600 and 1 <= args.clients <= 256 and 1 <= args.tenants <= 64) or not all(
        1 <= k <= 50 for k in args.step_sizes
    ):
        parser.error("--seconds 1-600, --clients 1-256, --tenants 1-64, --steps 1-50 each")
    runs = []
    with tempfile.TemporaryDirectory(prefix="tenure-owner-") as workdir:
        broker = start_broker(
            data_dir=Path(workdir) / "data", state_dir=Path(workdir), timeout=180, die_with_parent=True
        )
        try:
            assert broker.pid is not None, "the bench needs a broker it starts (no KAFKA_BOOTSTRAP_SERVERS)"
            create_topics(broker.bootstrap_servers, TOPICS)
            for steps in args.step_sizes:
                for case in args.cases:
                    runs.append(
                        measure(case, steps, broker.bootstrap_servers, broker.pid, Path(workdir), args)
                    )
        finally:
            broker.stop()
    print(report(runs, args), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
