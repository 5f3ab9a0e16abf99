"""The projector's Run-view fold rate, in process: events/s through RunViewStore.apply on RocksDB.

No broker and no processes: runs.events records are built in memory from runs driven through
the pure aggregate (tests/unit/run_walks.py), then folded into a RunViewStore over a RocksStore
in a temporary directory, as the projector does with what it polls. Two batch sizes: catching up
(1000 records per poll, the projector's max) and following live traffic (small polls).

The workload: `--runs` runs, `--in-flight` of them progressing at once, interleaved on the log
the way concurrent runs are: each is claimed, heartbeats (`--renewals` renewals, 20 s apart),
records a few effect intents and outcomes, asks for an upload grant and reports success; every
tenth is taken over by an operator first and every seventh loses its lease and is requeued.

    PYTHONPATH=. .venv/bin/python -m bench.run_views_fold [--runs 1000] [--renewals 40]

A script, not a test: it measures and prints, it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import zlib
from pathlib import Path

from services.common.contracts import RunEvent
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec
from services.common.store import RocksStore
from services.common.topics import RUNS_EVENTS
from services.projections.store import RunViewStore
from tests.unit.run_walks import RunWalk, Step

__all__ = ["main"]


def _life(index: int, renewals: int) -> list[Step]:
    steps: list[Step] = [("claim", 0, 1_000)]
    if index % 7 == 3:
        steps += [("renew", 1, 1_000), ("tick", 0, 100_000), ("claim", 0, 1_000)]
    if index % 10 == 5:
        steps += [("renew", 1, 1_000), ("takeover", 2, 1_000)]  # to operator:olga, 90 s
    for n in range(renewals):
        steps.append(("renew", 1, 20_000))
        if n % 10 == 4:
            steps += [("intent", 1, 0), ("outcome", 0, 0)]
    steps += [("grant", 1, 0), ("report", 4, 1_000)]  # variant 4: succeeded, verified, a manifest
    return steps


def workload(runs: int, renewals: int, in_flight: int) -> list[RunEvent]:
    """The events of `runs` runs, `in_flight` at a time, interleaved round-robin."""
    lives: list[list[RunEvent]] = []
    for index in range(runs):
        walk = RunWalk(f"bench-{index}", retry_safe=True, max_attempts=3, timeout_seconds=7 * 24 * 3600)
        for step in _life(index, renewals):
            walk.step(*step)
        lives.append(walk.events)
    log: list[RunEvent] = []
    for start in range(0, runs, in_flight):
        group = [list(reversed(events)) for events in lives[start : start + in_flight]]
        while any(group):
            for events in group:
                if events:
                    log.append(events.pop())
    return log


def records(events: list[RunEvent], codec: MessageCodec) -> list[InboundRecord]:
    next_offset = [0] * RUNS_EVENTS.partitions
    out = []
    for event in events:
        partition = zlib.crc32(event.run_id.encode()) % RUNS_EVENTS.partitions
        encoded = codec.outbound(RUNS_EVENTS.name, event.run_id, event, partition)
        out.append(
            InboundRecord(
                encoded.topic, partition, next_offset[partition], encoded.key, encoded.value, encoded.headers
            )
        )
        next_offset[partition] += 1
    return out


def fold_rate(inbound: list[InboundRecord], batch: int, workdir: Path) -> tuple[float, float]:
    """(events per wall second, events per CPU second of this process) folding `inbound` in
    polls of `batch` records into a fresh store. On a busy machine the CPU figure is the steadier."""
    store = RocksStore(workdir)
    views = RunViewStore(store, MessageCodec())
    wall, cpu = time.perf_counter(), time.process_time()
    for start in range(0, len(inbound), batch):
        views.apply(inbound[start : start + batch])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    store.close()
    return len(inbound) / wall, len(inbound) / cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--renewals", type=int, default=40)
    parser.add_argument("--in-flight", type=int, default=100)
    parser.add_argument("--batches", default="1000,20")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    codec = MessageCodec()
    events = workload(args.runs, args.renewals, args.in_flight)
    inbound = records(events, codec)
    print(f"{len(inbound)} events of {args.runs} runs ({args.in_flight} in flight), best of {args.repeat}")
    with tempfile.TemporaryDirectory(prefix="tenure-bench-views-") as tmp:
        for batch in (int(b) for b in args.batches.split(",")):
            rates = [
                fold_rate(inbound, batch, Path(tmp) / f"b{batch}-{attempt}") for attempt in range(args.repeat)
            ]
            wall, cpu = max(r[0] for r in rates), max(r[1] for r in rates)
            print(
                f"batch {batch:>5}: best {wall:,.0f} events/s wall, {cpu:,.0f} events/s of CPU "
                f"(runs: {', '.join(f'{r[0]:,.0f}/{r[1]:,.0f}' for r in rates)})"
            )


if __name__ == "__main__":
    main()
