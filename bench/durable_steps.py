"""A durable step at the peers' speed (issue 11): the DBOS / Restate workload through Tenure's API.

The workload of ../shared/peers/ (DBOS Transact, Restate), through Tenure's public HTTP API as a
user's service drives it (bench/_steps_workload.py): per workflow, submit a run, claim it, open
its trajectory, propose k trivial class-I steps (`cache.warm`; the simulated environment at
TENURE_SIM_TIME_SCALE=0 answers at once) one after another, each awaited until COMMITTED by
polling GET /runs/{id}/trajectory as the runner SDK does, finish the trajectory and report the
attempt succeeded. One invocation, one broker, phases in this order:
  (a) the raw limit on the same broker (bench.saga_unwind.raw_limits): transactional commits,
      command -> event hops, fsync;
  (t) per k in --steps: a warm-up of --warmup workflows, then N workflows from --clients (8)
      concurrent clients back to back (one connection pool each): workflows/s, steps/s, p50/p99
      per workflow from the submit call to the report's answer; then --seq-n workflows from ONE
      client, with a follower on the event topics for the per-leg timing (propose ->
      StepIntentRecorded -> the gateway's EffectIntentRecorded -> EffectOutcomeRecorded ->
      StepCommitted -> visible to the client, from the records' occurredAt) and the Kafka
      transactions per workflow (times the raw commit: the floor);
  (r) per scenario in --recovery: --rec-n in-flight 5-step workflows whose step 3 takes 2 s, one
      SIGKILL once all are inside step 3 (bench/_steps_recovery.py): time from the kill until all
      are done, duplicate effects from the simulated environment's audit.
The table puts Tenure's row beside the peers' published figures, with the ratios.

    make bench-steps            # the full run (N=2000, warm-up 200, 8 clients, every scenario)
    .venv/bin/python -m bench.durable_steps --quick [--out FILE]

A benchmark, not a test: it measures and reports, it asserts nothing about speed. Every process
it starts is stopped at the end, on Ctrl-C and on an error too.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import datetime as dt
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from bench._steps_recovery import RecoveryResult, recovery
from bench._steps_report import Cpu, Legs, Raw, legs_of, render, summarise, transactions_per_workflow
from bench._steps_system import StepsSystem
from bench._steps_workload import CaseResult, LegProbe, Poll, closed_loop
from bench.foundation import cpu_seconds, say, section_body
from bench.saga_unwind import raw_limits
from services.common.kafka import CommittedEnds
from services.common.topics import TOPICS

__all__ = ["main"]

T = TypeVar("T")
TXN_LOG = "__transaction_state"  # the broker's own log of transactions
SCENARIOS = ("none", "orchestrator", "coordinator", "broker")
QUICK = {"n": 40, "warmup": 10, "seq_n": 10, "rec_n": 20, "recovery": "orchestrator", "raw_samples": 50}
DEFAULTS = {"n": 2000, "warmup": 200, "seq_n": 300, "rec_n": 200, "recovery": ",".join(SCENARIOS)}
DEFAULTS["raw_samples"] = 200
BEGIN, END = "<!-- bench:durable-steps BEGIN -->", "<!-- bench:durable-steps END -->"


# --- CPU over a phase ----------------------------------------------------------------------------


def _machine_busy_s() -> float:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


class CpuWindow:
    """Cores used from start() to stop(): Tenure's processes, the broker, this bench, the rest.

    A process restarted within the window counts only its new incarnation (the old one's CPU
    is gone with it): the recovery windows under-count Tenure a little."""

    def __init__(self, system: StepsSystem) -> None:
        self.system = system
        self.began = time.monotonic()
        self.pids = system.pids()
        self.cpu = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.busy = _machine_busy_s()
        self.own = sum(os.times()[:2])

    def stop(self) -> Cpu:
        wall = max(1e-6, time.monotonic() - self.began)
        per: dict[str, float] = {}
        for name, pid in self.system.pids().items():
            before = self.cpu.get(name, 0.0) if self.pids.get(name) == pid else 0.0
            per[name] = (cpu_seconds(pid) - before) / wall
        client = (sum(os.times()[:2]) - self.own) / wall
        busy = (_machine_busy_s() - self.busy) / wall
        broker = per.get("kafka", 0.0)
        tenure = sum(v for k, v in per.items() if k != "kafka")
        return Cpu(wall, tenure, broker, client, max(0.0, busy - tenure - broker - client), per)


def log_ends(bootstrap: str) -> dict[str, int]:
    """Every Tenure topic's end and the broker's transaction log's, summed over partitions:
    what a phase wrote is the difference (records and commit markers)."""
    ends = CommittedEnds(bootstrap)
    return {name: sum(ends.ends(name).values()) for name in [t.name for t in TOPICS] + [TXN_LOG]}


# --- the workload's thread; the main thread supervises ----------------------------------------------


def run_phase(system: StepsSystem, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the coroutine on an event loop of its own thread while this (main) thread supervises:
    every process start stays on the main thread, where its lifeline belongs."""
    result: concurrent.futures.Future[T] = concurrent.futures.Future()

    def target() -> None:
        try:
            result.set_result(asyncio.run(make()))
        except BaseException as exc:  # handed to the main thread, which raises it
            result.set_exception(exc)

    threading.Thread(target=target, name="workload", daemon=True).start()
    while not result.done():
        system.supervise()
        time.sleep(0.02)
    return result.result()


# --- phases -----------------------------------------------------------------------------------------


def throughput(
    system: StepsSystem,
    args: argparse.Namespace,
    steps: int,
    tag: str,
    cases: dict[str, CaseResult],
    cpu: dict[str, Cpu],
    legs: list[Legs],
    txns: dict[int, list[int]],
    seq: dict[int, CaseResult],
    records: dict[int, dict[str, float]],
) -> None:
    poll = Poll(args.poll_ms / 1000, args.max_poll_ms / 1000)

    def loop(n: int, clients: int, label: str) -> CaseResult:
        say(f"(t) {label}: {n} x {steps}-step workflows from {clients} client(s)")
        return run_phase(
            system,
            lambda: closed_loop(
                system.api_url,
                steps,
                n,
                clients,
                poll,
                f"{tag}-{label.replace(' ', '-')}",
                args.workflow_timeout_s,
                args.case_deadline_s,
            ),
        )

    if args.warmup:
        warm = loop(args.warmup, args.clients, f"warm-up {steps}")
        say(f"(t) warm-up: {len(warm.flows)} ok in {warm.wall_s:.1f}s, errors {dict(warm.errors) or 'none'}")
    window = CpuWindow(system)
    case = loop(args.n, args.clients, f"tp{steps}")
    cases[f"tp{steps}"], cpu[f"tp{steps}"] = case, window.stop()
    errors = dict(case.errors) or "none"
    say(f"(t) tp{steps}: {case.workflows_per_s:.1f} wf/s, {len(case.flows)} ok, errors {errors}")
    per = ", ".join(f"{name} {cores:.2f}" for name, cores in sorted(cpu[f"tp{steps}"].per_process.items()))
    say(f"(t) tp{steps}: CPU cores per process: {per}")
    if args.seq_n:
        probe = LegProbe(system.bootstrap)
        try:
            window = CpuWindow(system)
            before = log_ends(system.bootstrap)
            one = loop(args.seq_n, 1, f"seq{steps}")
            cases[f"seq{steps}"], cpu[f"seq{steps}"] = one, window.stop()
            time.sleep(1.0)  # the follower may read the last records a moment later
            if one.flows:
                after = log_ends(system.bootstrap)
                records[steps] = {t: (n - before.get(t, 0)) / len(one.flows) for t, n in after.items()}
            legs.append(legs_of(one.flows, probe, steps))
            txns[steps] = transactions_per_workflow(one.flows, probe)
            seq[steps] = one
            if probe.error is not None:
                say(f"(t) the leg probe failed: {probe.error!r}")
        finally:
            probe.close()
        errors = dict(one.errors) or "none"
        say(f"(t) seq{steps}: {one.workflows_per_s:.1f} wf/s at one client, errors {errors}")
        for kind, took in sorted(one.stats.seconds.items()):
            ordered = sorted(took)
            say(f"(t) seq{steps}: {kind}: p50 {1000 * ordered[len(ordered) // 2]:.1f} ms over {len(took)}")


def recoveries(
    system: StepsSystem, args: argparse.Namespace, tag: str, cpu: dict[str, Cpu]
) -> list[RecoveryResult]:
    poll = Poll(args.rec_poll_ms / 1000, args.rec_max_poll_ms / 1000)
    results = []
    for scenario in args.scenarios:
        if scenario == "broker" and (system.broker is None or not system.broker.owned):
            say("(r) broker: skipped, the broker is not this bench's own (KAFKA_BOOTSTRAP_SERVERS is set)")
            continue
        say(f"(r) {scenario}: waiting until every process is ready")
        system.wait_ready()
        say(f"(r) {scenario}: {args.rec_n} x 5-step workflows, step 3 takes {args.rec_sleep:g} s")
        window = CpuWindow(system)
        result = run_phase(
            system,
            lambda scenario=scenario: recovery(
                system, scenario, args.rec_n, args.rec_sleep, poll, tag, args.workflow_timeout_s
            ),
        )
        cpu[f"recovery {scenario}"] = window.stop()
        results.append(result)
        took = result.kill_to_all_done_s if scenario != "none" else result.mark_to_all_done_s
        say(
            f"(r) {scenario}: {result.done}/{result.n} done, {'kill' if scenario != 'none' else 'mark'} -> "
            f"all done {'-' if took is None else f'{took:.2f}s'}, world {result.world}, "
            f"restarts {result.restarts or 'none'}, errors {dict(result.errors) or 'none'}"
        )
    system.wait_ready()
    return results


# --- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.durable_steps",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--quick", action="store_true", help=f"a smoke run: {QUICK} unless given")
    add("--n", type=int, help=f"workflows per measured case (default {DEFAULTS['n']})")
    add("--warmup", type=int, help=f"warm-up workflows before each case (default {DEFAULTS['warmup']})")
    add("--clients", type=int, default=8, help="concurrent clients (default 8, like the peers)")
    add(
        "--seq-n",
        type=int,
        help=f"workflows from ONE client, timed per leg (default {DEFAULTS['seq_n']}; 0 skips)",
    )
    add("--steps", default="1,5", help="workflow sizes, comma-separated (default 1,5)")
    add(
        "--recovery",
        help="scenarios: comma list of none,orchestrator,coordinator,broker, or 'skip' "
        f"(default {DEFAULTS['recovery']})",
    )
    add("--rec-n", type=int, help=f"in-flight workflows in a recovery scenario (default {DEFAULTS['rec_n']})")
    add("--rec-sleep", type=float, default=2.0, help="seconds step 3 takes (default 2)")
    add("--poll-ms", type=float, default=10.0, help="first GET backoff ceiling while a step is in flight")
    add("--max-poll-ms", type=float, default=100.0, help="largest GET backoff ceiling (throughput)")
    add("--rec-poll-ms", type=float, default=50.0, help="the same in recovery (R clients poll at once)")
    add("--rec-max-poll-ms", type=float, default=500.0, help="largest GET backoff ceiling in recovery")
    add("--saga-workers", type=int, default=256, help="TENURE_SAGA_WORKERS (>= --rec-n, or step 3 queues)")
    add("--tool-timeout-s", type=float, default=15.0, help="TENURE_TOOL_TIMEOUT_S (well above --rec-sleep)")
    add(
        "--raw-samples",
        type=int,
        help=f"samples of each raw Kafka operation (default {DEFAULTS['raw_samples']})",
    )
    add("--workflow-timeout-s", type=float, default=300.0, help="a workflow's deadline")
    add("--case-deadline-s", type=float, default=3600.0, help="no new workflow starts after this")
    add(
        "--out",
        help="write the tables (with the run's context) to this markdown file, between "
        f"{BEGIN} / END markers if it has them",
    )
    add("--keep-temp", action="store_true", help="keep the temp dir (service logs, stores)")
    args = parser.parse_args(argv)
    for name, default in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, QUICK[name] if args.quick else default)
    args.step_sizes = [int(s) for s in args.steps.split(",") if s.strip()]
    args.scenarios = [] if args.recovery in ("skip", "") else [s.strip() for s in args.recovery.split(",")]
    if any(s not in SCENARIOS for s in args.scenarios):
        parser.error(f"--recovery: each of {','.join(SCENARIOS)}, or skip")
    if any(k < 1 for k in args.step_sizes) or args.n < 1 or args.clients < 1 or not 1 <= args.rec_n <= 1000:
        parser.error("--steps, --n, --clients >= 1; 1 <= --rec-n <= 1000")
    return args


def write_out(path: Path, body: str) -> None:
    """The run's section between the markers if the file has them, else the whole file."""
    section = f"{BEGIN}\n{body}\n{END}"
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.DOTALL)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else section + "\n"
    path.write_text(text)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # cleaned up like Ctrl-C
    load, started_at, tag = os.getloadavg(), dt.datetime.now(dt.UTC), uuid.uuid4().hex[:8]
    began = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="tenure-bench-steps-"))
    system = StepsSystem(workdir, tag, saga_workers=args.saga_workers, tool_timeout_s=args.tool_timeout_s)
    ok = False
    try:
        say(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; temp dir {workdir}")
        system.start_broker()
        limits = raw_limits(system.bootstrap, tag, args.raw_samples, workdir)
        raw = Raw(limits.commit1_ms, limits.hop_ms, limits.fsync_ms)
        system.start_services()
        system.supervising = True
        cases: dict[str, CaseResult] = {}
        cpu: dict[str, Cpu] = {}
        legs: list[Legs] = []
        txns: dict[int, list[int]] = {}
        seq: dict[int, CaseResult] = {}
        records: dict[int, dict[str, float]] = {}
        for steps in args.step_sizes:
            throughput(system, args, steps, tag, cases, cpu, legs, txns, seq, records)
        results = recoveries(system, args, tag, cpu)
        n_label = f"N={args.n} after {args.warmup} warm-up"
        tables = render(
            summarise(cases, results),
            args.clients,
            n_label,
            cases,
            legs,
            results,
            raw,
            txns,
            seq,
            cpu,
            records,
        )
        print(tables, flush=True)
        say(f"done in {time.monotonic() - began:.0f}s; load average now {os.getloadavg()[0]:.2f}")
        if args.out:
            key = f"n={args.n} warmup={args.warmup} clients={args.clients} rec-n={args.rec_n}"
            assert system.broker is not None
            body = section_body(key, started_at, load, system.broker, tables)
            write_out(Path(args.out), body.replace("### Foundation run:", "#### Durable steps run:", 1))
            say(f"wrote {args.out}")
        ok = not any(c.errors for c in cases.values()) and all(r.done == r.n for r in results)
        return 0 if ok else 1
    finally:
        system.stop()
        if ok and not args.keep_temp:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            say(f"temp dir kept: {workdir}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        say("interrupted: every process this bench started has been stopped")
        sys.exit(130)
