"""The lease benchmark's report (bench/leases.py): its markdown tables and the section it writes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bench._leases_io import EXPIRY_LEASE_SECONDS, LATE_MS, MACHINE, Calls, MachineCpuMeter
from bench.foundation import (
    BATCH,
    RawResult,
    percentile,
)
from bench.foundation import write_section as shared_write_section

if TYPE_CHECKING:  # the results are the bench's own (bench/leases.py); annotations only
    from bench._leases_windows import StepResult
    from bench.leases import ExpiryResult, LogicResult

__all__ = [
    "render",
    "write_section",
]


# --- report -----------------------------------------------------------------------------------


def _ms(v: float) -> str:
    return "-" if v != v else f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}"


def _lat(values: list[float]) -> str:
    return f"{_ms(percentile(values, 50))} / {_ms(percentile(values, 99))} ms"


def _three(v: list[float]) -> str:
    return f"{_ms(percentile(v, 50))} / {_ms(percentile(v, 99))} / {_ms(max(v, default=float('nan')))}"


def _answers(calls: Calls) -> str:
    return ", ".join(f"{n:,} x {k}" for k, n in sorted(calls.answers.items())) or "none"


def _timeline(steps: list[StepResult], buckets: int = 10) -> list[str]:
    """Ack p99 by when the renewal was sent, in `buckets` equal slices of each window: a tail
    that sits in one slice (the first heartbeats, which start the runs) reads differently from
    one spread over the window. Below it the p99 of each leg (send -> decided, decided -> ack,
    split at the decision's serverTime), so that a slow slice shows where it lost its time."""
    lines = [
        f"Ack p99 (ms) by send time, the window cut in {buckets} equal slices (count in brackets):",
        "",
        "| H | " + " | ".join(f"{i + 1}" for i in range(buckets)) + " |",
        "|---:|" + "---:|" * buckets,
    ]
    for s in steps:
        acks = _slice_p99(s, s.ok_timeline, buckets, True)
        lines.append(f"| {s.heartbeat_s} s | " + " | ".join(acks) + " |")
        legs = s.legs_timeline
        for leg, name in ((1, "send -> decided"), (2, "decided -> ack")):
            if legs:
                timeline = [(row[0], row[leg]) for row in legs]
                cells = _slice_p99(s, timeline, buckets, False)
                lines.append(f"| {s.heartbeat_s} s, {name} | " + " | ".join(cells) + " |")
    return lines


def _slice_p99(step: StepResult, timeline: list[tuple[float, float]], buckets: int, count: bool) -> list[str]:
    width = step.duration_s / buckets
    slices: list[list[float]] = [[] for _ in range(buckets)]
    for at, ms in timeline:
        slices[min(max(int(at / width), 0), buckets - 1)].append(ms)
    return [(f"{_ms(percentile(v, 99))}" + (f" ({len(v):,})" if count else "")) if v else "-" for v in slices]


def render(
    raw: RawResult,
    logic: LogicResult,
    idle: ExpiryResult | None,
    steps: list[StepResult],
    cpu: MachineCpuMeter,
    submitted: int,
    submit_s: float,
    batch: int = 0,
) -> str:
    produce_rate = raw.messages / raw.produce_s
    lines = [
        "| Phase | What | Count | Seconds | Rate | p50 / p99 | Tenure/raw |",
        "|---|---|---:|---:|---:|---:|---:|",
        f"| (a) raw | produce ~300 B records, acks=all, idempotent (best of 3) | {raw.messages:,} | "
        f"{raw.produce_s:.2f} | {produce_rate:,.0f}/s | - | baseline |",
        f"| (a) raw | consume them back, read_committed (best of 3) | {raw.messages:,} | "
        f"{raw.consume_s:.2f} | {raw.messages / raw.consume_s:,.0f}/s | - | baseline |",
        f"| (b) submit | SubmitRun produced to runs.commands until every view exists | {submitted:,} | "
        f"{submit_s:.2f} | {submitted / submit_s:,.0f}/s | - | "
        f"1/{produce_rate * submit_s / submitted:,.0f} |",
        f"| (l) processor logic | RenewLease through RunCommandProcessor.handle, batches of {BATCH}, Kafka "
        f"replaced by memory | {logic.renewals:,} | {logic.seconds:.2f} | "
        f"{logic.renewals / logic.seconds:,.0f}/s | - | "
        f"1/{produce_rate * logic.seconds / logic.renewals:,.0f} |",
    ]
    batched = f" in batches of {batch} (POST /leases:renew)" if batch else ""
    for s in steps:
        c = s.claims
        started = "; then its first heartbeat, which starts it (on runs.events)" if s.started_at_claim else ""
        lines.append(
            f"| (r) H={s.heartbeat_s}s | claim: POST /runs/{{id}}/attempts{started} (latency: the claim) "
            f"| {c.count:,} | {c.seconds:.2f} | {c.count / c.seconds:,.0f}/s | {_lat(c.ok_ms)} | - |"
        )
        if (kept := s.kept_alive) is not None and kept.count:
            lines.append(
                f"| (r) H={s.heartbeat_s}s | keepalive while claiming: each held lease renewed once a "
                f"third of its TTL, in batches (not measured; answers: {_answers(kept)}) | {kept.count:,} "
                "| - | - | - | - |"
            )
        if (warm := s.warm_up) is not None:
            first = "" if s.started_at_claim else "; each run's first starts it (on runs.events)"
            lines.append(
                f"| (r) H={s.heartbeat_s}s | warm-up: {warm.duration_s:g} s of heartbeats{batched}"
                f"{first} (answers: {_answers(warm.heartbeats)}) | {warm.acked:,} | "
                f"{warm.heartbeats.seconds:.2f} | "
                f"{warm.achieved:,.0f}/s | {_lat(warm.heartbeats.ok_ms)} | - |"
            )
        lines.append(
            f"| (r) H={s.heartbeat_s}s | **renewals: {s.runs:,} runs, "
            f"{s.offered:,.0f}/s offered**{batched}, ack latency of 200s | {s.acked:,} | "
            f"{s.heartbeats.seconds:.2f} | **{s.achieved:,.0f}/s** | **{_lat(s.heartbeats.ok_ms)}** | "
            f"1/{produce_rate / max(s.achieved, 1e-9):,.0f} |"
        )
        if s.release is not None:
            r = s.release
            lines.append(
                f"| (r) H={s.heartbeat_s}s | release: POST /attempts/{{id}}/report | {r.count:,} | "
                f"{r.seconds:.2f} | {r.count / r.seconds:,.0f}/s | {_lat(r.ok_ms)} | - |"
            )
    ticks = ", ".join(f"{ms:.1f} ms after {n:,}" for n, ms in logic.tick_ms[::3])
    lines += [
        "",
        f"(l) one timer tick with no timer due took {ticks} renewals (each renewal moves its run's timer "
        "key in RocksDB; the tick scans the index from the start of each partition).",
    ]
    lines += [
        "",
        "Renewal steps in detail (ms; a slot is when the schedule wanted a heartbeat):",
        "",
        "| H | Offered | Slots / sent | Achieved | Ack p50 / p99 / max | Slot -> ack p99 "
        "| Send -> decided p50 / p99 | Decided -> ack p50 / p99 | API publish -> decision (mean) "
        f"| Sent >{LATE_MS:.0f} ms late | Events / markers | Answers |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in steps:
        hb = s.heartbeats
        late = sum(1 for v in s.late_ms if v > LATE_MS)
        lines.append(
            f"| {s.heartbeat_s} s | {s.offered:,.0f}/s | {s.scheduled:,} / {hb.count:,} | "
            f"{s.achieved:,.0f}/s | {_three(hb.ok_ms)} | {_ms(percentile(s.from_slot_ms, 99))} | "
            f"{_lat(s.to_decision_ms)[:-3]} | {_lat(s.after_decision_ms)[:-3]} | {_ms(s.decision_ms)} | "
            f"{late:,} ({late / max(hb.count, 1):.0%}) | {s.events:,} / {s.markers:,} | {_answers(hb)} |"
        )
    lines += ["", *_timeline(steps)]
    for s in steps:
        if s.gc:
            lines += ["", f"Garbage-collector passes in the H={s.heartbeat_s}s window (/metrics): {s.gc}."]
    probes = [p for p in [idle, *(s.expiry for s in steps)] if p is not None]
    if probes:
        lines += [
            "",
            f"Expiry detection ({EXPIRY_LEASE_SECONDS} s leases, never renewed; lag in ms after "
            "`lease.expiresAt`):",
            "",
            "| When | Claimed | Decided lag (view `endedAt`) p50 / p99 / max | Readable on runs.events "
            "p50 / p99 / max | Not seen expired | Claim answers |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for p in probes:
            lines.append(
                f"| {p.label} | {p.claims.answers.get('201', 0):,} | {_three(p.decided_lag_ms)} | "
                f"{_three(p.readable_lag_ms)} | {p.missing} | {_answers(p.claims)} |"
            )
    names = [*cpu.pids, MACHINE, "others"]
    lines += [
        "",
        "CPU-seconds per process in each phase (two cores give 2 CPU-seconds per wall second; "
        f"'{MACHINE}' is the machine's busy time from /proc/stat, 'others' what the bench's processes "
        "do not explain); for renewal windows also CPU-µs per acknowledged renewal:",
        "",
        "| Phase | Wall s | " + " | ".join(names) + " |",
        "|---|---:|" + "---:|" * len(names),
    ]
    renewals = {f"(r) H={s.heartbeat_s}s: renewals": s.acked for s in steps}
    for phase, wall, used in cpu.phases:
        used = {**used, "others": used[MACHINE] - sum(v for n, v in used.items() if n != MACHINE)}
        lines.append(
            f"| {phase} | {wall:.1f} | "
            + " | ".join(f"{used[n]:.1f}" if n in used else "-" for n in names)
            + " |"
        )
        if renewals.get(phase):
            per = {n: used[n] / renewals[phase] * 1e6 for n in used}
            lines.append(
                "| ... µs per renewal | | "
                + " | ".join(f"{per[n]:,.0f}" if n in per else "-" for n in names)
                + " |"
            )
    services = list(cpu.threads.pids)
    lines += [
        "",
        "The services' threads in the renewal windows, CPU-seconds main (event loop) / "
        "librdkafka / other Python threads:",
        "",
        "| Phase | Wall s | " + " | ".join(services) + " |",
        "|---|---:|" + "---:|" * len(services),
    ]
    for phase, wall, groups in cpu.threads.phases:
        cells = [" / ".join(f"{groups[n][k]:.1f}" for k in ("main", "librdkafka", "other")) for n in services]
        lines.append(f"| {phase} | {wall:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_section(output: Path, key: str, body: str) -> None:
    """This configuration's section, after the lease runs' anchor (bench.foundation's writer)."""
    shared_write_section(output, key, body, "leases", "<!-- bench:leases runs -->")
