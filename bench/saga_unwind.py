"""Saga unwind overhead (DUR-2): log writes and wall time of the unwind versus the forward path.

The seed's worked example: a 5-step deploy (VM 120 ms, IP 350 ms, sandbox compile 4200 ms,
firewall 80 ms, DNS publish 450 ms) fails at step 5 with a 409; the compensators C4..C1 (10, 15,
220, 45 ms) unwind it. The seed counts 10 log writes forward and 4 on the unwind, 16.8 ms of log
I/O (< 0.3% of 5.2 s) and an unwind of 294.8 ms. One invocation, one broker, phases in order:
  (a) the physical limit, raw confluent-kafka on the same broker: transactional commits of one
      and of two small records (the processors' unit of a log write), one command -> event hop
      (produce, consume, commit a transaction, consume it: what every Tenure log write costs
      end to end), and an fsync of a small append on this machine's disk (the seed's unit);
  (s) the lease coordinator, effect gateway, simulated environment and saga orchestrator as
      subprocesses; the environment at TENURE_SIM_TIME_SCALE=0 (tools answer at once: what is
      left is Tenure's own overhead) and then 1 (the seed's nominal durations). At each scale, a
      warm-up deploy and then N deploys, one after another: claim a run, StartTrajectory with the
      seed's re-run cost, propose T1..T4 (each awaited until COMMITTED), arm the environment's
      409 on dns.publish, propose T5, await TrajectoryRolledBack.
Times come from the log (occurredAt, the orchestrator's clock; the forward path starts at the
issuedAt of T1's ProposeStep, the bench's clock on the same host); log writes are the run's
records on trajectories.events and runs.events, transactions counted from their offsets.

    python -m bench.saga_unwind [--runs 20] [--nominal-runs 12] [--out FILE]

A script, not a test: it measures and reports, it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bench._saga_raw_limits import RAW_VALUE_BYTES, RawLimits, raw_limits
from bench._saga_system import Lease, Logged, SagaDriver, SagaProcesses, WaitFailed
from bench.foundation import percentile, say, section_body
from services.common.broker import BrokerHandle, start_broker
from services.common.kafka import create_topics
from services.common.topics import RUNS_EVENTS, TOPICS, TRAJECTORIES_EVENTS
from services.sim_environment import OPERATIONS

# main, and raw_limits (now in bench/_saga_raw_limits.py), which bench/durable_steps.py imports from here.
__all__ = ["main", "raw_limits"]

# The seed's re-run cost (46 s, $0.162 of forward work) and its figures for DUR-2.
RERUN = {"rerun_cost_ms": 46_000, "rerun_cost_money": 0.162}
SEED = {"fwd_writes": 10, "unwind_writes": 4, "fsync_ms": 1.2, "unwind_ms": 294.8, "fwd_ms": 5200}
FORWARD_TOOLS = ("vm.provision", "ip.reserve", "sandbox.compile", "firewall.write", "dns.publish")
COMPENSATORS = ("firewall.unbind", "sandbox.clean", "ip.release", "vm.terminate")  # C4..C1
WARMUP_TIMEOUT_S = 180.0  # the first deploy waits for faust workers and consumer groups to start
RUN_TIMEOUT_S = 60.0
KEY = re.compile(r"/s(\d+)/([dc])(\d+)$")  # the saga's idempotency keys: dispatch d, compensation c


# --- (s) the seed's deploy through Tenure ----------------------------------------------------


@dataclass
class Deploy:
    """One deploy's figures, from its records on the log."""

    forward_ms: float  # RecoveryDecided.occurredAt - issuedAt of T1's ProposeStep
    unwind_ms: float  # TrajectoryRolledBack.occurredAt - RecoveryDecided.occurredAt
    unwind_seen_ms: float  # the same interval as the bench's follower saw the two records
    compensator_ms: list[float]  # RecoveryDecided -> C4 logged -> C3 -> C2 -> C1
    records: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (phase, topic, type)
    commits: Counter[str] = field(default_factory=Counter)  # phase -> transactions

    @property
    def ratio(self) -> float:
        return self.unwind_ms / self.forward_ms

    def writes(self, phase: str) -> int:
        return sum(n for (p, _, _), n in self.records.items() if p == phase)


def _first(records: list[Logged], type_name: str, **fields: Any) -> Logged | None:
    for r in records:
        if r.type_name == type_name and all(getattr(r.message, k) == v for k, v in fields.items()):
            return r
    return None


def _phase_of(record: Logged, forward_from: int, forward_to: int, key_phase: dict[str, str]) -> str:
    """'forward', 'unwind' or 'setup' (the claim and TrajectoryStarted, counted nowhere)."""
    message = record.message
    if record.topic == TRAJECTORIES_EVENTS.name:
        if message.version < forward_from:
            return "setup"
        return "forward" if message.version <= forward_to else "unwind"
    if record.type_name == "EffectIntentRecorded":
        match = KEY.search(message.idempotency_key)
        phase = "unwind" if match and match.group(2) == "c" else "forward"
        key_phase[message.effect_id] = phase
        return phase
    return key_phase.get(getattr(message, "effect_id", ""), "setup")


def _count(deploy: Deploy, records: list[Logged], forward_from: int, forward_to: int) -> None:
    """Records per (phase, topic, type), and transactions per phase: the records of one
    transaction have consecutive offsets; a commit marker (or another writer's record) sits
    between two transactions."""
    key_phase: dict[str, str] = {}
    for topic in (TRAJECTORIES_EVENTS.name, RUNS_EVENTS.name):
        mine = sorted((r for r in records if r.topic == topic), key=lambda r: (r.partition, r.offset))
        previous: Logged | None = None
        transaction = 0
        seen: set[tuple[str, int]] = set()
        for record in mine:
            same = previous is not None and (record.partition, record.offset - 1) == (
                previous.partition,
                previous.offset,
            )
            transaction += 0 if same else 1
            previous = record
            phase = _phase_of(record, forward_from, forward_to, key_phase)
            deploy.records[(phase, topic, record.type_name)] += 1
            if (phase, transaction) not in seen:
                seen.add((phase, transaction))
                deploy.commits[phase] += 1


def deploy_once(driver: SagaDriver, procs: SagaProcesses, key: str, timeout_s: float) -> Deploy:
    ticks = [time.monotonic()]

    def alive() -> None:  # a crashed service should end the bench, not time it out
        if time.monotonic() - ticks[0] > 1.0:
            procs.check_alive()
            ticks[0] = time.monotonic()

    procs.clear_faults()
    lease = driver.claim_new_run(key, timeout_s, alive)
    driver.start_trajectory(lease, timeout_s, **RERUN)
    procs.arm("dns.publish", status=409, problem="conflict", detail="the domain is owned by another tenant")
    first_issued = _forward(driver, lease, key, timeout_s, alive)
    decided = driver.wait_for(
        lease.run_id,
        lambda rs: _first(rs, "RecoveryDecided", step_index=4),
        "the recovery decision",
        timeout_s,
    )
    if decided.message.action != "BACKWARD_ROLLBACK":
        raise WaitFailed(
            f"T5's 409 led to {decided.message.action} ({decided.message.reason}), not a rollback"
        )

    def rolled_back(records: list[Logged]) -> Logged | None:
        if (frozen := _first(records, "TrajectoryFrozen")) is not None:
            raise WaitFailed(
                f"the unwind froze: {frozen.message.failure_mode} {frozen.message.error_context}"
            )
        return _first(records, "TrajectoryRolledBack")

    done = driver.wait_for(lease.run_id, rolled_back, "TrajectoryRolledBack", timeout_s, on_tick=alive)

    def settled(records: list[Logged]) -> list[Logged] | None:
        # The gateway's outcome records land on runs.events before the executor reports, but the
        # follower may read that topic a moment later than trajectories.events.
        intents = {r.message.effect_id for r in records if r.type_name == "EffectIntentRecorded"}
        outcomes = {r.message.effect_id for r in records if r.type_name == "EffectOutcomeRecorded"}
        compensations = sum(
            1 for r in records if r.type_name == "EffectIntentRecorded" and "/c" in r.message.idempotency_key
        )
        completed = sum(1 for r in records if r.type_name == "CompensationCompleted")
        return records if intents == outcomes and compensations == completed else None

    records = driver.wait_for(lease.run_id, settled, "the gateway's outcome records", 10.0)
    completions = sorted(
        (r for r in records if r.type_name == "CompensationCompleted"), key=lambda r: r.message.version
    )
    marks = [decided.message.occurred_at, *(c.message.occurred_at for c in completions)]
    first_intent = _first(records, "StepIntentRecorded", step_index=0)
    assert first_intent is not None
    deploy = Deploy(
        forward_ms=decided.message.occurred_at - first_issued,
        unwind_ms=done.message.occurred_at - decided.message.occurred_at,
        unwind_seen_ms=(done.seen - decided.seen) * 1000,
        compensator_ms=[b - a for a, b in itertools.pairwise(marks)],
    )
    _count(deploy, records, first_intent.message.version, decided.message.version)
    return deploy


def _forward(driver: SagaDriver, lease: Lease, key: str, timeout_s: float, alive: Callable[[], None]) -> int:
    """T1..T4, each awaited until COMMITTED, then T5; the issuedAt (ms) of T1's proposal."""
    name = f"d{key[-20:]}".replace(".", "-")
    vm_id = ""
    first_issued = 0
    for index, tool in enumerate(FORWARD_TOOLS):
        catalogue: dict[str, dict[str, Any]] = {
            "vm.provision": {"name": name},
            "ip.reserve": {"region": "eu-west"},
            "sandbox.compile": {"vmId": vm_id, "source": "fn main() {}"},
            "firewall.write": {"vmId": vm_id, "port": 443},
            "dns.publish": {"name": f"{name}.example.org", "address": "203.0.113.7"},
        }
        params = catalogue[tool]
        proposal = driver.propose(lease, tool, params)
        first_issued = first_issued or proposal.issued_at
        if tool == "dns.publish":
            break

        def settled(records: list[Logged], index: int = index) -> Logged | None:
            if (failed := _first(records, "StepFailed", step_index=index)) is not None:
                raise WaitFailed(f"{failed.message.error_kind}: {failed.message.error_message}")
            return _first(records, "StepCommitted", step_index=index)

        committed = driver.wait_for(
            lease.run_id, settled, f"{tool} to commit", timeout_s, proposal.command_id, alive
        )
        if tool == "vm.provision":
            vm_id = json.loads(committed.message.output)["vmId"]
    return first_issued


@dataclass
class ScaleResult:
    scale: float
    deploys: list[Deploy]
    world: dict[str, Any]  # the environment's audit after the last deploy

    def values(self, pick: Callable[[Deploy], float]) -> list[float]:
        return [pick(d) for d in self.deploys]


def run_scale(driver: SagaDriver, procs: SagaProcesses, scale: float, runs: int, tag: str) -> ScaleResult:
    if procs.time_scale != scale:
        procs.restart_environment(scale)
    say(f"(s) time scale {scale:g}: warm-up deploy (not counted)")
    deploy_once(driver, procs, f"{tag}-x{scale:g}-warmup", WARMUP_TIMEOUT_S)
    deploys = []
    for i in range(runs):
        d = deploy_once(driver, procs, f"{tag}-x{scale:g}-{i:03d}", RUN_TIMEOUT_S)
        deploys.append(d)
        say(
            f"(s) time scale {scale:g}: deploy {i + 1}/{runs}: forward {d.forward_ms:,.0f} ms, unwind "
            f"{d.unwind_ms:,.0f} ms, log records {d.writes('forward')} forward / {d.writes('unwind')} unwind"
        )
    audit = procs.audit()
    world = {
        "backToStart": audit["backToStart"],
        "live": len(audit["live"]),
        "released": len(audit["released"]),
        "permanent": len(audit["permanent"]),
        "duplicates": len(audit["duplicates"]),
    }
    return ScaleResult(scale, deploys, world)


# --- report -----------------------------------------------------------------------------------

WRITERS = {
    TRAJECTORIES_EVENTS.name: "saga orchestrator",
    RUNS_EVENTS.name: "lease coordinator, for the gateway",
}
WHY = {
    "StepIntentRecorded": "intent before action (SAGA-1): step, parameters, idempotency key, durable "
    "before anything may be dispatched",
    "PivotGateEvaluated": "the deterministic pre-pivot gate's verdict (lease, verifiers) before the pivot T5",
    "EffectIntentRecorded": "the gateway's intent, checked against the run's lease and epoch (fencing), "
    "before it calls the tool; for every step AND every compensator",
    "EffectOutcomeRecorded": "the gateway's outcome of that call (committed / failed)",
    "StepCommitted": "COMMITTED with the bound compensator pushed on the stack: the seed's 2 writes "
    "per step in 1",
    "StepFailed": "T5's 409, classified, with its error signature",
    "RecoveryDecided": "D's BACKWARD_ROLLBACK with its inputs and deciding gate (REC-1); same transaction "
    "as StepFailed",
    "CompensationCompleted": "COMPENSATED, logged before the pop (SAGA-3): the seed's 1 write per "
    "compensator",
    "TrajectoryRolledBack": "terminal; same transaction as C1's CompensationCompleted",
}


def _ms(value: float) -> str:
    return "-" if value != value else f"{value:,.0f} ms" if abs(value) >= 100 else f"{value:.1f} ms"


Fmt = Callable[[float], str]


def _p(values: list[float], fmt: Fmt = _ms) -> str:
    return f"{fmt(percentile(values, 50))} / {fmt(percentile(values, 95))}"


def _spread(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:g}" if low == high else f"{sum(values) / len(values):.1f} ({low:g}-{high:g})"


def _x(value: float) -> str:
    return f"{value:.2g}x"


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%" if value >= 0.01 else f"{value * 100:.2f}%"


def _gap(i: int) -> Callable[[Deploy, float], float]:
    return lambda d, _: d.compensator_ms[i]


def render(results: list[ScaleResult], raw: RawLimits) -> str:
    commit = percentile(raw.commit1_ms, 50)
    hop = percentile(raw.hop_ms, 50)
    fwd_tools = sum(OPERATIONS[t].nominal_ms for t in FORWARD_TOOLS)
    comp_tools = sum(OPERATIONS[c].nominal_ms for c in COMPENSATORS)
    head = "| Measure (p50 / p95 over the deploys) | " + " | ".join(
        f"Tenure, time scale {r.scale:g} ({len(r.deploys)} deploys)" for r in results
    )
    lines = [head + " | Seed (DUR-2) |", "|---|" + "---:|" * len(results) + "---:|"]

    def row(label: str, cell: Callable[[ScaleResult], str], seed: str) -> None:
        lines.append(f"| {label} | " + " | ".join(cell(r) for r in results) + f" | {seed} |")

    def records(phase: str) -> Callable[[ScaleResult], str]:
        def cell(r: ScaleResult) -> str:
            per_topic = [
                _spread(
                    [
                        sum(n for (p, t, _), n in d.records.items() if p == phase and t == topic)
                        for d in r.deploys
                    ]
                )
                for topic in (TRAJECTORIES_EVENTS.name, RUNS_EVENTS.name)
            ]
            return f"{_spread(r.values(lambda d: d.writes(phase)))} ({' + '.join(per_topic)})"

        return cell

    def commits(phase: str) -> Callable[[ScaleResult], str]:
        return lambda r: _spread(r.values(lambda d: d.commits[phase]))

    def stat(label: str, pick: Callable[[Deploy, float], float], seed: str, fmt: Fmt = _ms) -> None:
        """A row of p50 / p95 over the deploys of each scale; `pick` gets a deploy and its scale."""
        row(label, lambda r: _p([pick(d, r.scale) for d in r.deploys], fmt), seed)

    def p50(pick: Callable[[Deploy, float], float]) -> Callable[[ScaleResult], str]:
        return lambda r: _ms(percentile([pick(d, r.scale) for d in r.deploys], 50))

    def floor(d: Deploy, scale: float) -> float:
        return d.commits["unwind"] * hop + comp_tools * scale

    seed_fsync, seed_ratio = f"{SEED['fsync_ms']} ms", _pct(SEED["unwind_ms"] / SEED["fwd_ms"])
    stat("Forward: T1 proposed .. T5's failure decided", lambda d, _: d.forward_ms, f"{SEED['fwd_ms']:,} ms")
    row("... of which the tools' nominal time (sim)", lambda r: _ms(fwd_tools * r.scale), f"{fwd_tools:,} ms")
    stat("... the rest: Tenure's overhead, forward", lambda d, x: d.forward_ms - fwd_tools * x, "12 ms")
    stat(
        "Unwind: RecoveryDecided .. TrajectoryRolledBack", lambda d, _: d.unwind_ms, f"{SEED['unwind_ms']} ms"
    )
    row(
        "... of which the compensators' nominal time", lambda r: _ms(comp_tools * r.scale), f"{comp_tools} ms"
    )
    stat("... the rest: Tenure's overhead, unwind", lambda d, x: d.unwind_ms - comp_tools * x, "4.8 ms")
    stat(
        "... per unwind log write (overhead / unwind writes)",
        lambda d, x: (d.unwind_ms - comp_tools * x) / d.commits["unwind"],
        f"{seed_fsync} (fsync)",
    )
    stat("Unwind as the bench's follower saw it", lambda d, _: d.unwind_seen_ms, "-")
    stat("**Unwind / forward**", lambda d, _: d.ratio, seed_ratio, _pct)
    for i, name in enumerate(COMPENSATORS):
        nominal = OPERATIONS[name].nominal_ms
        stat(
            f"C{4 - i} {name} (nominal {nominal} ms x scale): previous record .. its CompensationCompleted",
            _gap(i),
            f"{nominal} ms + {seed_fsync}",
        )
    row(
        "Log records forward (trajectories.events + runs.events)", records("forward"), str(SEED["fwd_writes"])
    )
    row(
        "Log records unwind (trajectories.events + runs.events)",
        records("unwind"),
        str(SEED["unwind_writes"]),
    )
    row("Log writes = Kafka transactions, forward", commits("forward"), f"{SEED['fwd_writes']} fsyncs")
    row("Log writes = Kafka transactions, unwind", commits("unwind"), f"{SEED['unwind_writes']} fsyncs")
    row(
        f"Log I/O per unwind = unwind writes x raw commit p50 ({_ms(commit)})",
        p50(lambda d, _: d.commits["unwind"] * commit),
        f"4 x {seed_fsync} = 4.8 ms",
    )

    def all_writes(d: Deploy) -> int:
        return d.commits["forward"] + d.commits["unwind"]

    row(
        "Log I/O per deploy = all writes x raw commit p50",
        p50(lambda d, _: all_writes(d) * commit),
        "16.8 ms",
    )
    stat(
        "... share of the deploy's wall time (forward + unwind)",
        lambda d, _: all_writes(d) * commit / (d.forward_ms + d.unwind_ms),
        "< 0.3% of 5.2 s",
        _pct,
    )
    row(f"Unwind floor = unwind writes x raw hop p50 ({_ms(hop)}) + compensators' time", p50(floor), "-")
    stat("**Unwind / its floor**", lambda d, x: d.unwind_ms / floor(d, x), "-", _x)
    row(
        "World back at its start (environment audit)",
        lambda r: (
            f"{'yes' if r.world['backToStart'] else 'NO'}: {r.world['live']} live, "
            f"{r.world['released']} released, {r.world['permanent']} DNS, "
            f"{r.world['duplicates']} duplicate effects"
        ),
        "-",
    )

    everything = [d for r in results for d in r.deploys]
    kinds = sorted(
        {(t, k) for d in everything for (p, t, k) in d.records if p != "setup"},
        key=lambda tk: (list(WHY).index(tk[1]) if tk[1] in WHY else len(WHY), tk),
    )
    lines += [
        "",
        "Records per deploy by type (every deploy at both scales; a range where deploys differ):",
        "",
        "| Record | Topic (writer) | Forward | Unwind | What it is |",
        "|---|---|---:|---:|---|",
    ]
    for topic, kind in kinds:
        counts = {
            p: _spread([d.records[(p, topic, kind)] for d in everything]) for p in ("forward", "unwind")
        }
        lines.append(
            f"| {kind} | {topic} ({WRITERS[topic]}) | {counts['forward']} | {counts['unwind']} "
            f"| {WHY.get(kind, '-')} |"
        )
    lines += [
        "",
        "The physical limit, raw confluent-kafka on the same broker (TransactionalWriter's settings), "
        "and the seed's unit, an fsync:",
        "",
        "| Raw operation | Samples | p50 | p99 |",
        "|---|---:|---:|---:|",
    ]
    for label, values in (
        (
            f"transactional commit of 1 x {RAW_VALUE_BYTES} B record (begin, produce, flush, commit)",
            raw.commit1_ms,
        ),
        (f"transactional commit of 2 x {RAW_VALUE_BYTES} B records", raw.commit2_ms),
        (
            "command -> event hop: produce (acks=all), consume, commit 1 record, consume it (read_committed)",
            raw.hop_ms,
        ),
        (f"write + fsync of {RAW_VALUE_BYTES} B appended to a file on the bench's temp dir", raw.fsync_ms),
    ):
        lines.append(
            f"| {label} | {len(values)} | {_ms(percentile(values, 50))} | {_ms(percentile(values, 99))} |"
        )
    return "\n".join(lines)


# --- main -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.saga_unwind",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=20, help="deploys at time scale 0 (no tool latency)")
    parser.add_argument(
        "--nominal-runs",
        type=int,
        default=12,
        help="deploys at time scale 1 (the seed's durations, ~6 s each; 0 skips the scale)",
    )
    parser.add_argument("--raw-samples", type=int, default=200, help="samples of each raw operation")
    parser.add_argument("--out", help="also write the tables (with the run's context) to this markdown file")
    parser.add_argument("--keep-temp", action="store_true", help="keep the temp dir (service logs, stores)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.nominal_runs < 0 or args.raw_samples < 10:
        parser.error("--runs >= 1, --nominal-runs >= 0, --raw-samples >= 10")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load, started_at, tag = os.getloadavg(), dt.datetime.now(dt.UTC), uuid.uuid4().hex[:8]
    began = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="tenure-bench-saga-"))
    broker: BrokerHandle | None = None
    procs: SagaProcesses | None = None
    driver: SagaDriver | None = None
    ok = False
    try:
        broker = start_broker(port=None, data_dir=workdir / "kafka" / "data", state_dir=workdir / "kafka")
        bootstrap = broker.bootstrap_servers
        create_topics(bootstrap, TOPICS)
        raw = raw_limits(bootstrap, tag, args.raw_samples, workdir)
        procs = SagaProcesses(bootstrap, workdir, tag, time_scale=0.0).start()
        driver = SagaDriver(bootstrap)
        results = [run_scale(driver, procs, 0.0, args.runs, tag)]
        if args.nominal_runs:
            results.append(run_scale(driver, procs, 1.0, args.nominal_runs, tag))
        procs.check_alive()
        tables = render(results, raw)
        print(tables)
        ok = True
        say(f"done in {time.monotonic() - began:.0f}s")
        if args.out:
            key = f"runs={args.runs} nominal-runs={args.nominal_runs} raw-samples={args.raw_samples}"
            body = section_body(key, started_at, load, broker, tables)
            Path(args.out).write_text(body.replace("### Foundation run:", "#### Saga unwind run:", 1) + "\n")
            say(f"wrote {args.out}")
        return 0
    finally:
        if driver is not None:
            driver.close()
        if procs is not None:
            procs.stop()
        if broker is not None and broker.owned:
            say(f"stopped broker: {broker.stop()}")
        if ok and not args.keep_temp:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            say(f"temp dir kept: {workdir}")


if __name__ == "__main__":
    sys.exit(main())
