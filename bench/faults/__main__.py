"""`python -m bench.faults`: the fault-injection scoreboard (DUR-3) on the same seeded workload.

    PYTHONPATH=. .venv/bin/python -m bench.faults --trajectories 1000 --seed 7 --workers 8 \\
        --configs all --out docs/benchmarks.md --plot docs/fault-scoreboard.png

Configurations: unmanaged, log-only, saga-memory, tenure (or 1-4, or all). Tenure needs Kafka:
KAFKA_BOOTSTRAP_SERVERS if set, else a broker started for the run. Prints the table (with the
seed's completion rates alongside); with --out, replaces (or appends) this run's section of that
markdown file, command and seed included; draws the outcome mix to --plot.

A script, not a test: it measures and reports, it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from bench.faults.harness import Scoreboard, parse_configs, run_scoreboard
from bench.faults.plot import LABELS, SEED_COMPLETION, plot_outcomes, render_details, say
from bench.faults.worker import REPO_ROOT

__all__ = ["main", "markdown_section", "write_section"]


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def section_key(board: Scoreboard) -> str:
    configs = ",".join(r.config for r in board.results)
    return f"trajectories={board.trajectories} seed={board.seed} workers={board.workers} configs={configs}"


def markdown_section(board: Scoreboard, plot: Path | None, out: Path) -> str:
    commit = _git("rev-parse", "--short", "HEAD")
    if commit and _git("status", "--porcelain"):
        commit += " (plus uncommitted changes)"
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    model = next((x.split(":", 1)[1].strip() for x in cpuinfo if x.startswith("model name")), "?")
    command = board.command
    if os.environ.get("PYTHONPATH"):
        command = f"PYTHONPATH={os.environ['PYTHONPATH']} {command}"
    injected = ", ".join(f"{k} {v}" for k, v in sorted(board.faults.items()) if k not in ("turns", "none"))
    lines = [
        f"### Fault-injection scoreboard: {section_key(board)}",
        "",
        f"- Date: {board.started_at:%Y-%m-%d %H:%M} UTC; git commit: {commit or 'none'}",
        f"- Command: `{command}` (seed {board.seed})",
        f"- Machine: {os.cpu_count()} CPUs ({model}), Python {sys.version.split()[0]}; 1-minute load "
        f"{board.load[0]:.2f} at the start, {board.load[1]:.2f} at the end",
        f"- Workload: {board.trajectories} trajectories, {board.faults.get('turns', 0)} planned turns; "
        f"faults planned per turn: {injected} ({board.faults.get('none', 0)} turns without)",
        "",
        board.table(),
        "",
        render_details(board.results),
        "",
        "Outcomes come from the environment's audit, not from the runners: *completed* = the runner "
        "finished and every planned turn's effect is in the world once; *clean* = completed + cleanly "
        "aborted (nothing of the trajectory left in the world); *escalated* = an incident that lists "
        "exactly what was left; *corrupted* = a duplicated effect, an orphaned resource, a committed "
        "turn lost across a kill, or a wrong incident. RTO: from a kill to the first commit of the "
        "turn that was in flight (or a later one); MTTR: from a kill to that commit or the "
        "trajectory's end. The seed's completion rates (DUR-3) are for comparison only.",
    ]
    if plot is not None:
        try:
            relative = os.path.relpath(plot.resolve(), out.resolve().parent)
        except ValueError:
            relative = str(plot)
        lines += ["", f"![Outcome mix per configuration]({relative})"]
    return "\n".join(lines)


def write_section(output: Path, key: str, body: str) -> None:
    """Replace this configuration's section between its markers, or append it."""
    begin, end = f"<!-- bench:faults {key} BEGIN -->", f"<!-- bench:faults {key} END -->"
    section = f"{begin}\n{body}\n{end}"
    text = output.read_text() if output.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip("\n") + f"\n\n{section}\n"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.faults",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--trajectories", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workers", type=int, default=8, help="runner worker processes per configuration")
    parser.add_argument(
        "--configs", default="all", help='"all" or e.g. "unmanaged,log-only,saga-memory" (or 1,2,3)'
    )
    parser.add_argument(
        "--out", default="", help="markdown file whose section for this run is replaced or appended"
    )
    parser.add_argument(
        "--plot", default="docs/fault-scoreboard.png", help='PNG of the outcome mix ("" for none)'
    )
    parser.add_argument(
        "--trajectory-timeout", type=float, default=300.0, help="seconds before a trajectory is cut"
    )
    parser.add_argument(
        "--effect-timeout", type=float, default=1.0, help="seconds an ablation waits for a tool"
    )
    parser.add_argument(
        "--spares", type=int, default=1, help="warm spare workers for the restarts after kills"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--keep-temp", action="store_true", help="keep the work dir (worker logs, audits)")
    return parser.parse_args(argv)


def _in_repo(path: str) -> Path:
    return Path(path) if Path(path).is_absolute() else REPO_ROOT / path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        configs = parse_configs(args.configs)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    board = run_scoreboard(
        configs,
        args.trajectories,
        args.seed,
        args.workers,
        trajectory_timeout_s=args.trajectory_timeout,
        effect_timeout_s=args.effect_timeout,
        spares=args.spares,
        progress=not args.no_progress,
        keep_temp=args.keep_temp,
    )
    print(board.table())
    print()
    print(render_details(board.results))
    plot = _in_repo(args.plot) if args.plot else None
    if plot is not None:
        plot_outcomes(
            board.results,
            plot,
            labels=LABELS,
            seed_completion=SEED_COMPLETION,
            title=f"Fault-injection scoreboard: {args.trajectories} trajectories, seed {args.seed}",
        )
        say(f"plot written to {plot}")
    if args.out:
        out = _in_repo(args.out)
        write_section(out, section_key(board), markdown_section(board, plot, out))
        say(f"section '{section_key(board)}' written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
