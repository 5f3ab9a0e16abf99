"""The foundation benchmark's report (bench/foundation.py): its markdown tables, the section
body with the run's context (commit, command, machine, broker) and the writer that puts a section
into docs/benchmarks.md; the other benches write their sections with the same two functions."""

from __future__ import annotations

import datetime as dt
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

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
from bench._foundation_toolkit import CpuMeter, percentile
from services.common.broker import KAFKA_VERSION, BrokerHandle
from services.common.settings import repo_root
from services.common.topics import RUNS_COMMANDS

__all__ = ["render_tables", "section_body", "write_section"]


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
