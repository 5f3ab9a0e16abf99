"""Figures and tables of bench/durable_steps.py: Tenure's row beside the peers', and the ratios.

Percentiles are computed as each peer computes them, so that a ratio compares like with like:
DBOS's bench_dbos.py takes the nearest rank (ceil(p * n) - 1 of the sorted values), Restate's
bench.py interpolates linearly between the two closest ranks. Tenure's table shows the nearest
rank; its ratios to Restate use the interpolated value.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bench._steps_recovery import RecoveryResult
from bench._steps_workload import CaseResult, LegProbe, Logged, Workflow

__all__ = [
    "PEERS",
    "Cpu",
    "Legs",
    "Peer",
    "Raw",
    "Summary",
    "cpu_per_workflow_rows",
    "legs_of",
    "log_rows",
    "pct_interpolated",
    "pct_nearest",
    "render",
    "summarise",
    "transactions_per_workflow",
]


def pct_nearest(values: Sequence[float], p: float) -> float:
    """DBOS's: nearest rank, p in 0..1."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(p * len(ordered)) - 1))]


def pct_interpolated(values: Sequence[float], p: float) -> float:
    """Restate's: linear interpolation between the closest ranks, p in 0..1."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * p
    low, high = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


@dataclass(frozen=True)
class Peer:
    """A peer's published figures (../shared/peers/README.md; 2 vCPU, quiet machine)."""

    name: str
    wf1: float
    p50_1: float
    p99_1: float
    wf5: float
    steps5: float
    p50_5: float
    p99_5: float
    worker_kill_s: tuple[float, float]  # all 200 done after a SIGKILL of the worker/service
    server_kill_s: float | None  # ... of the server (Restate); DBOS has none
    nearest_rank: bool  # its percentile definition


PEERS = (
    Peer("DBOS 3.4 + PostgreSQL 15", 144, 55, 90, 45.4, 227, 174, 241, (5.6, 7.2), None, True),
    Peer("Restate 1.7.12", 315, 25, 36, 144, 719, 55, 77, (3.0, 3.0), 18.0, False),
)


@dataclass
class Cpu:
    """Cores used over a phase: Tenure's processes, the broker, this client, everything else."""

    wall_s: float
    tenure: float
    broker: float
    client: float
    other: float
    per_process: dict[str, float] = field(default_factory=dict)

    def cell(self) -> str:
        return f"{self.tenure:.2f} / {self.broker:.2f} / {self.client:.2f} / {self.other:.2f}"


@dataclass
class Raw:
    """saga_unwind's raw confluent-kafka limit on the same broker (ms)."""

    commit1_ms: list[float]
    hop_ms: list[float]
    fsync_ms: list[float]


# --- the per-leg timing at one client --------------------------------------------------------

LEGS = (
    ("propose sent -> StepIntentRecorded", "proposed", "StepIntentRecorded"),
    ("-> the gateway's EffectIntentRecorded", "StepIntentRecorded", "EffectIntentRecorded"),
    ("-> EffectOutcomeRecorded", "EffectIntentRecorded", "EffectOutcomeRecorded"),
    ("-> StepCommitted", "EffectOutcomeRecorded", "StepCommitted"),
    ("-> the commit visible to the client (GET)", "StepCommitted", "visible"),
)


@dataclass
class Legs:
    steps: int  # workflow size
    per_leg_ms: dict[str, list[float]] = field(default_factory=dict)
    step_total_ms: list[float] = field(default_factory=list)  # propose sent -> visible
    rest_ms: list[float] = field(default_factory=list)  # per workflow: the latency minus its steps
    answered_ms: list[float] = field(default_factory=list)  # StepIntentRecorded -> 202 received
    polls_per_step: list[int] = field(default_factory=list)
    missing: int = 0  # steps whose records the probe did not see


def legs_of(flows: Sequence[Workflow], probe: LegProbe, steps: int) -> Legs:
    legs = Legs(steps, {name: [] for name, _, _ in LEGS})
    for flow in flows:
        records = probe.of_run(flow.run_id)
        for mark in flow.steps:
            at: dict[str, float] = {"proposed": mark.proposed_ms, "visible": mark.visible_ms}
            for r in records:
                if r.step == mark.index and r.kind not in at:
                    at[r.kind] = float(r.occurred_at)
            if not all(k in at for _, k, _ in LEGS):
                legs.missing += 1
                continue
            for name, start, end in LEGS:
                legs.per_leg_ms[name].append(at[end] - at[start])
            legs.step_total_ms.append(mark.visible_ms - mark.proposed_ms)
            legs.answered_ms.append(mark.accepted_ms - at["StepIntentRecorded"])
            legs.polls_per_step.append(mark.polls)
        inside = sum(m.visible_ms - m.proposed_ms for m in flow.steps)
        legs.rest_ms.append(flow.latency_s * 1000 - inside)
    return legs


def transactions_per_workflow(flows: Sequence[Workflow], probe: LegProbe) -> list[int]:
    """Kafka transactions that wrote each run's records on trajectories.events and runs.events:
    the records of one transaction have consecutive offsets, and a commit marker takes an offset
    between two transactions (at one client no other run's records interleave)."""
    counts = []
    for flow in flows:
        records: list[Logged] = sorted(
            probe.of_run(flow.run_id), key=lambda r: (r.topic, r.partition, r.offset)
        )
        count, previous = 0, None
        for r in records:
            if previous is None or (r.topic, r.partition, r.offset - 1) != previous:
                count += 1
            previous = (r.topic, r.partition, r.offset)
        if records:
            counts.append(count)
    return counts


# --- tables ----------------------------------------------------------------------------------


def _n(value: float | None, digits: int = 1) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:,.{digits}f}" if abs(value) < 100 or digits == 0 else f"{value:,.0f}"


def _x(tenure: float | None, peer: float | None) -> str:
    if tenure is None or peer is None or tenure != tenure or not peer:
        return "-"
    ratio = tenure / peer
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.1f}x"


@dataclass
class Summary:
    """Tenure's figures in the peers' columns; None where the bench did not run that case."""

    wf1: float | None = None
    lat1: dict[str, tuple[float, float]] = field(default_factory=dict)  # rank|interp -> (p50, p99) ms
    wf5: float | None = None
    steps5: float | None = None
    lat5: dict[str, tuple[float, float]] = field(default_factory=dict)
    kills: dict[str, float | None] = field(default_factory=dict)  # scenario -> kill .. all done (s)


def summarise(cases: dict[str, CaseResult], recoveries: Sequence[RecoveryResult]) -> Summary:
    s = Summary()
    for steps, case in ((1, cases.get("tp1")), (5, cases.get("tp5"))):
        if case is None or not case.flows:
            continue
        lat = case.latencies_s
        ms: dict[str, tuple[float, float]] = {
            "rank": (pct_nearest(lat, 0.5) * 1000, pct_nearest(lat, 0.99) * 1000),
            "interp": (pct_interpolated(lat, 0.5) * 1000, pct_interpolated(lat, 0.99) * 1000),
        }
        if steps == 1:
            s.wf1, s.lat1 = case.workflows_per_s, ms
        else:
            s.wf5, s.steps5, s.lat5 = case.workflows_per_s, case.workflows_per_s * 5, ms
    for r in recoveries:
        s.kills[r.scenario] = r.kill_to_all_done_s if r.scenario != "none" else r.mark_to_all_done_s
    return s


def headline(s: Summary, clients: int, n_label: str) -> list[str]:
    def lat(d: dict[str, tuple[float, float]], kind: str) -> tuple[float | None, float | None]:
        return d.get(kind, (None, None))

    def kill(name: str) -> str:
        value = s.kills.get(name)
        return "-" if name not in s.kills else "not all done" if value is None else f"{value:.1f} s ({name})"

    processor_kills = ", ".join(k for k in (kill("orchestrator"), kill("coordinator")) if k != "-") or "-"
    rows = [
        "| system | 1-step wf/s | p50 / p99 ms | 5-step wf/s (steps/s) | p50 / p99 ms "
        "| all done after a SIGKILL of a worker process | after a SIGKILL of the broker / server | no kill |",
        "|---|---:|---:|---:|---:|---|---|---|",
    ]
    p1, p5 = lat(s.lat1, "rank"), lat(s.lat5, "rank")
    rows.append(
        f"| **Tenure** ({clients} clients, {n_label}) | {_n(s.wf1)} | {_n(p1[0], 0)} / {_n(p1[1], 0)} "
        f"| {_n(s.wf5)} ({_n(s.steps5)}) | {_n(p5[0], 0)} / {_n(p5[1], 0)} | {processor_kills} "
        f"| {kill('broker')} | {kill('none')} |"
    )
    for peer in PEERS:
        low, high = peer.worker_kill_s
        worker = f"{low:.1f} s" if low == high else f"{low:.1f}-{high:.1f} s"
        server = "-" if peer.server_kill_s is None else f"{peer.server_kill_s:.1f} s"
        rows.append(
            f"| {peer.name} | {_n(peer.wf1)} | {peer.p50_1:g} / {peer.p99_1:g} | {_n(peer.wf5)} "
            f"({_n(peer.steps5)}) | {peer.p50_5:g} / {peer.p99_5:g} | {worker} | {server} | - |"
        )
    for peer in PEERS:
        kind = "rank" if peer.nearest_rank else "interp"
        q1, q5 = lat(s.lat1, kind), lat(s.lat5, kind)
        kills = [
            f"{_x(s.kills.get(k), peer.worker_kill_s[0])} ({k})"
            for k in ("orchestrator", "coordinator")
            if s.kills.get(k) is not None
        ]
        broker = s.kills.get("broker")
        rows.append(
            f"| Tenure / {peer.name.split()[0]} | {_x(s.wf1, peer.wf1)} | {_x(q1[0], peer.p50_1)} / "
            f"{_x(q1[1], peer.p99_1)} | {_x(s.wf5, peer.wf5)} ({_x(s.steps5, peer.steps5)}) | "
            f"{_x(q5[0], peer.p50_5)} / {_x(q5[1], peer.p99_5)} | {', '.join(kills) or '-'} | "
            f"{_x(broker, peer.server_kill_s)} | - |"
        )
    return rows


def case_rows(cases: dict[str, CaseResult], cpu: dict[str, Cpu]) -> list[str]:
    rows = [
        "| case | clients | ok / requested | wall s | wf/s | steps/s | p50 | p90 | p99 | max | mean "
        "| p50 / p99 interpolated | GETs per step | repeated calls "
        "| CPU cores: Tenure / broker / client / other |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, c in cases.items():
        lat = [x * 1000 for x in c.latencies_s]
        if not lat:
            rows.append(f"| {name} | {c.clients} | 0 / {c.requested} | {c.wall_s:.1f} | - |" + " - |" * 10)
            continue
        per_step = c.stats.polls / max(1, len(c.flows) * c.steps)
        window = cpu.get(name)
        rows.append(
            f"| {name} ({c.steps}-step) | {c.clients} | {len(c.flows)} / {c.requested} | {c.wall_s:.1f} "
            f"| {_n(c.workflows_per_s)} | {_n(c.workflows_per_s * c.steps)} | {_n(pct_nearest(lat, 0.5), 0)} "
            f"| {_n(pct_nearest(lat, 0.9), 0)} | {_n(pct_nearest(lat, 0.99), 0)} | {_n(max(lat), 0)} "
            f"| {_n(statistics.fmean(lat), 0)} | {_n(pct_interpolated(lat, 0.5), 0)} / "
            f"{_n(pct_interpolated(lat, 0.99), 0)} | {per_step:.1f} | {c.stats.retries} "
            f"| {window.cell() if window else '-'} |"
        )
    return rows


def leg_rows(legs: Sequence[Legs]) -> list[str]:
    if not legs:
        return []
    head = " | ".join(f"{leg.steps}-step workflows: p50 / mean ms" for leg in legs)
    rows = [f"| leg (one client) | {head} |", "|---|" + "---:|" * len(legs)]

    def row(label: str, pick: Callable[[Legs], Sequence[float]]) -> None:
        cells = []
        for leg in legs:
            values = pick(leg)
            cells.append(
                f"{_n(pct_nearest(values, 0.5))} / {_n(statistics.fmean(values))}" if values else "-"
            )
        rows.append(f"| {label} | " + " | ".join(cells) + " |")

    for name, _, _ in LEGS:
        row(name, lambda leg, name=name: leg.per_leg_ms[name])
    row("**one step: propose sent -> visible**", lambda leg: leg.step_total_ms)
    row("(StepIntentRecorded -> the proposal's 202 received)", lambda leg: leg.answered_ms)
    row("the rest of a workflow (submit, claim, open, finish, report)", lambda leg: leg.rest_ms)
    row("GETs per step", lambda leg: [float(p) for p in leg.polls_per_step])
    missing = sum(leg.missing for leg in legs)
    if missing:
        rows.append(f"| (steps whose records the probe missed) | {missing} |" + " |" * (len(legs) - 1))
    return rows


def recovery_rows(results: Sequence[RecoveryResult], cpu: dict[str, Cpu]) -> list[str]:
    rows = [
        "| SIGKILL of | done | at the mark: step 3 proposed / at the environment / seen committed / done "
        "| release -> mark | **kill -> all done** | mark -> all done | release -> all done "
        "| restarts (up after) "
        "| effects applied / expected | duplicate effects: semantic / same key | keys asked again "
        "| GETs per workflow | repeated calls | CPU cores: Tenure / broker / client / other |",
        "|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        m, w = r.mark, r.world
        mark = " / ".join(str(m.get(k, "-")) for k in ("proposed", "at the environment", "seen committed"))
        mark += f" / {m.get('done', '-')}"
        if not r.triggered:
            mark += " (not all at once)"
        window = cpu.get(f"recovery {r.scenario}")
        rows.append(
            f"| {r.scenario} | {r.done} / {r.n} | {mark} | {r.release_to_mark_s:.2f} s "
            f"| {_s(r.kill_to_all_done_s) if r.scenario != 'none' else '-'} | {_s(r.mark_to_all_done_s)} "
            f"| {_s(r.release_to_all_done_s)} | {'; '.join(r.restarts) or 'none'} "
            f"| {w.get('effects applied', '-')} / {w.get('expected', '-')} "
            f"| {w.get('semantic duplicates', '-')} / {w.get('same-key duplicates', '-')} "
            f"| {w.get('keys asked more than once', '-')} | {r.polls_per_workflow:.1f} | {r.retries} "
            f"| {window.cell() if window else '-'} |"
        )
    return rows


def _s(value: float | None) -> str:
    return "not all done" if value is None else f"{value:.2f} s"


def raw_rows(raw: Raw | None, txns: dict[int, list[int]], seq: dict[int, CaseResult]) -> list[str]:
    if raw is None:
        return []
    commit, hop = pct_nearest(raw.commit1_ms, 0.5), pct_nearest(raw.hop_ms, 0.5)
    rows = [
        "| raw confluent-kafka on the same broker | samples | p50 | p99 |",
        "|---|---:|---:|---:|",
        f"| transactional commit of 1 record (begin, produce, flush, commit) | {len(raw.commit1_ms)} "
        f"| {commit:.1f} ms | {pct_nearest(raw.commit1_ms, 0.99):.1f} ms |",
        f"| command -> event hop (produce, consume, commit 1 record, consume it) | {len(raw.hop_ms)} "
        f"| {hop:.1f} ms | {pct_nearest(raw.hop_ms, 0.99):.1f} ms |",
        f"| write + fsync of 400 B | {len(raw.fsync_ms)} | {pct_nearest(raw.fsync_ms, 0.5):.2f} ms "
        f"| {pct_nearest(raw.fsync_ms, 0.99):.2f} ms |",
    ]
    if not any(txns.values()):
        return rows
    rows += [
        "",
        "| one client, serially | transactions per workflow (from the log) | x raw commit p50 "
        "| x raw hop p50 | = wf/s limit at one client (hop) | Tenure at one client: p50 "
        "| Tenure / that floor |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for steps, counts in sorted(txns.items()):
        if not counts:
            continue
        t = statistics.median(counts)
        floor = t * hop
        case = seq.get(steps)
        p50 = pct_nearest(case.latencies_s, 0.5) * 1000 if case and case.flows else float("nan")
        rows.append(
            f"| {steps}-step workflow | {t:g} | {t * commit:.0f} ms | {floor:.0f} ms | {1000 / floor:.1f} "
            f"| {_n(p50, 0)} ms | {_x(p50, floor)} |"
        )
    return rows


def cpu_per_workflow_rows(cases: dict[str, CaseResult], cpu: dict[str, Cpu]) -> list[str]:
    """Each process's CPU per workflow (ms) in each measured case: where a workflow's cost is."""
    measured = [name for name in cases if name in cpu and cpu[name].per_process and cases[name].flows]
    if not measured:
        return []
    names = sorted({n for name in measured for n in cpu[name].per_process})
    rows = [
        "| CPU ms per workflow | " + " | ".join(names) + " | all |",
        "|---|" + "---:|" * (len(names) + 1),
    ]
    for name in measured:
        rate = cases[name].workflows_per_s
        per = cpu[name].per_process
        cells = [1000 * per.get(n, 0.0) / rate for n in names]
        rows.append(f"| {name} | " + " | ".join(f"{c:.1f}" for c in cells) + f" | {sum(cells):.0f} |")
    return rows


def log_rows(records: dict[int, dict[str, float]]) -> list[str]:
    """What one workflow writes, by topic, at one client: records and commit markers (a
    transaction leaves one marker on each partition it wrote); `__transaction_state` takes about
    three records per transaction."""
    if not records:
        return []
    sizes = sorted(records)
    topics = sorted({t for per in records.values() for t, n in per.items() if n > 0})
    rows = [
        "| one client: offsets per workflow (records + commit markers) | "
        + " | ".join(f"{k}-step" for k in sizes)
        + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    for topic in topics:
        rows.append(f"| {topic} | " + " | ".join(f"{records[k].get(topic, 0.0):.1f}" for k in sizes) + " |")
    return rows


def render(
    summary: Summary,
    clients: int,
    n_label: str,
    cases: dict[str, CaseResult],
    legs: Sequence[Legs],
    recoveries: Sequence[RecoveryResult],
    raw: Raw | None,
    txns: dict[int, list[int]],
    seq: dict[int, CaseResult],
    cpu: dict[str, Cpu],
    records: dict[int, dict[str, float]] | None = None,
) -> str:
    lines = headline(summary, clients, n_label)
    lines += [
        "",
        "Ratios are Tenure / peer: above 1 is more workflows/s, or more milliseconds and seconds. "
        "p50 / p99 as each peer computes them (DBOS: nearest rank; Restate: interpolated). "
        "The peers' rows are their published figures on a quiet 2-vCPU machine "
        "(../shared/peers/README.md), not measured in this run. A worker kill is compared with the "
        "peer's best case (DBOS 5.6 s, Restate 3.0 s).",
        "",
    ]
    lines += case_rows(cases, cpu)
    if per_workflow := cpu_per_workflow_rows(cases, cpu):
        lines += ["", *per_workflow]
    if legs:
        lines += ["", *leg_rows(legs)]
    if recoveries:
        lines += ["", *recovery_rows(recoveries, cpu)]
    if raw is not None:
        lines += ["", *raw_rows(raw, txns, seq)]
    if records:
        lines += ["", *log_rows(records)]
    return "\n".join(lines)
