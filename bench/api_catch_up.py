"""An API instance's start-up catch-up: its own projection building its views from Kafka.

Starts a broker of its own, commits the workload of bench/run_views_fold.py to runs.events as
the coordinator commits it, with the state changelog (bench/restore.py's `produce`: `--runs`
runs, about 50 events each at the default 40 renewals), then opens an `ApiProjection`
(services/command_api/projection.py) on an empty state folder and times it until its readiness
says caught up: first seeded from the state changelog (the default), then folding every event
(`seed_runs=False`, as every instance did before 2026-12-06), and checks that both show the
same views; then closes the seeded one and opens it again on the same folder (a restart from its
own checkpoint, which folds nothing) and times that; and times a raw read of the same records
for comparison. Each API instance pays the first figure once per empty state folder, the last on
every restart.

    PYTHONPATH=. .venv/bin/python -m bench.api_catch_up [--runs 2000]

A script, not a test: it measures and prints, it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.restore import produce
from bench.run_views_fold import workload
from services.command_api.projection import ApiProjection
from services.common.broker import free_port, start_broker
from services.common.kafka import TopicFollower, create_topics
from services.common.messages import MessageCodec
from services.common.topics import RUNS_EVENTS, TOPICS

__all__ = ["main"]


def _ready_after(projection: ApiProjection, began: float, timeout_s: float = 600.0) -> float:
    while not projection.health().ready:
        if time.monotonic() - began > timeout_s:
            raise TimeoutError(projection.health().detail)
        time.sleep(0.01)
    return time.monotonic() - began


def _raw_read(bootstrap: str, expected: int) -> float:
    began = time.monotonic()
    follower = TopicFollower(bootstrap, [RUNS_EVENTS.name], "beginning", "bench-raw")
    seen = 0
    while seen < expected:
        seen += len(follower.poll(max_records=5000, timeout_s=0.5))
    follower.close()
    return time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--renewals", type=int, default=40)
    args = parser.parse_args()
    codec = MessageCodec()
    events = workload(args.runs, args.renewals, 100)
    with tempfile.TemporaryDirectory(prefix="tenure-bench-api-") as tmp:
        broker = start_broker(
            port=free_port(), data_dir=Path(tmp) / "kafka" / "data", state_dir=Path(tmp) / "kafka"
        )
        try:
            bootstrap = broker.bootstrap_servers
            create_topics(bootstrap, TOPICS)
            produce(bootstrap, events, 500, "api-catch-up")
            raw_s = _raw_read(bootstrap, len(events))
            folded_dir, seeded_dir = Path(tmp) / "state" / "folded", Path(tmp) / "state" / "seeded"
            # The seeded instance first: a second reader of the same log finds the broker's
            # page cache warmer, and that should not be the seeding's advantage.
            began = time.monotonic()
            projection = ApiProjection(bootstrap, seeded_dir, codec)
            seeded_s = _ready_after(projection, began)
            got = projection.runs.all_views()
            projection.close()
            began = time.monotonic()
            projection = ApiProjection(bootstrap, folded_dir, codec, seed_runs=False)
            folded_s = _ready_after(projection, began)
            expected = projection.runs.all_views()
            projection.close()
            if got != expected:
                raise AssertionError("the seeded instance's views differ from the folding one's")
            began = time.monotonic()
            projection = ApiProjection(bootstrap, seeded_dir, codec)
            again_s = _ready_after(projection, began)
            projection.close()
        finally:
            broker.stop()
    n = len(events)
    print(f"{n} runs.events of {len(expected)} runs (the same views both ways)")
    print(f"raw read:                                  {raw_s:6.2f}s ({n / raw_s:,.0f} events/s)")
    print(f"empty state folder, every event folded:    {folded_s:6.2f}s ({n / folded_s:,.0f} events/s)")
    print(f"empty state folder, seeded from runs.states: {seeded_s:6.2f}s ({n / seeded_s:,.0f} events/s)")
    print(f"restart from its checkpoint:               {again_s:6.2f}s")


if __name__ == "__main__":
    main()
