"""RTO of the scoreboard's Tenure configuration grouped by what was killed (DUR-3: what dominates).

    .venv/bin/python -m bench.faults.rto_breakdown --trajectories 300 --seed 7

Runs `run_scoreboard(["tenure"], ...)` and records, for every kill, the time until the trajectory
committed the turn in flight (or a later one), keyed by the target (the runner, or which of
Tenure's processes) and the kill point; prints the scoreboard row and a table per target.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from bench.faults import outcomes
from bench.faults.harness import run_scoreboard
from bench.faults.outcomes import TrajectoryRecord, percentile

__all__ = ["main"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    samples: dict[str, list[float]] = defaultdict(list)
    original = outcomes.recovery_times

    def recording(record: TrajectoryRecord) -> tuple[list[float], list[float]]:
        for kill in record.kills:
            commits = [c.at for c in record.commits if c.at > kill.at and c.turn >= kill.turn]
            if commits:
                samples[f"{kill.target}/{kill.point or '-'}"].append(min(commits) - kill.at)
        return original(record)

    # The scoreboard computes its RTO samples through this function: observe it, change nothing.
    outcomes.recovery_times = recording
    try:
        board = run_scoreboard(
            ["tenure"], args.trajectories, seed=args.seed, workers=args.workers, progress=False
        )
    finally:
        outcomes.recovery_times = original
    print(board.table())
    print("| killed | kills | RTO median s | RTO p90 s | RTO max s |")
    print("|---|---:|---:|---:|---:|")
    for key in sorted(samples):
        values = samples[key]
        print(
            f"| {key} | {len(values)} | {statistics.median(values):.2f} | {percentile(values, 90):.2f} "
            f"| {max(values):.2f} |"
        )


if __name__ == "__main__":
    main()
