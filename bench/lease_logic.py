"""The lease coordinator's processor logic alone, at several numbers of live leases (issue 16).

Phase (l) of bench/leases.py on its own: R runs submitted and claimed, then ten renewals each,
through `RunCommandProcessor.handle` in batches of 200, Kafka replaced by the in-memory log
(RocksDB real), at Tenure's default keepalive fraction (so every renewal after the first is
kept). Run it at more live leases than the coordinator's decoded-state cache holds (20,000) to
see what a renewal costs when the runs do not all fit, as at the issue's 100,000 runs.

    PYTHONPATH=. .venv/bin/python -m bench.lease_logic [--runs 5000,30000] [--repeats 2]

Its limit is the 5,000 renewals/s goal on two cores: the line printed gives the renewals/s one
core reaches and the share of a core 5,000/s would take. A script, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.leases import bench_logic

__all__ = ["main"]

GOAL_PER_S = 5_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="5000,30000", help="live leases per measurement, comma-separated")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    counts = [int(part) for part in args.runs.split(",") if part]
    if not counts or min(counts) < 1 or max(counts) > 200_000 or not 1 <= args.repeats <= 10:
        parser.error("--runs: 1 to 200,000 each; --repeats: 1 to 10")
    for runs in counts:
        for repeat in range(1, args.repeats + 1):
            with tempfile.TemporaryDirectory(prefix="tenure-lease-logic-") as workdir:
                result = bench_logic(runs, Path(workdir))
            per_s = result.renewals / result.seconds
            print(
                f"{runs:,} live leases, run {repeat}: {result.renewals:,} renewals in "
                f"{result.seconds:.2f} s, {per_s:,.0f}/s on one core, {1e6 / per_s:.1f} µs each; "
                f"{GOAL_PER_S:,}/s would take {GOAL_PER_S / per_s:.2f} of a core",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
