"""What one run-hour writes to the system of record (issue 16): events and bytes on runs.events.

A run is submitted, claimed and renewed at its heartbeat for an hour, then reports success,
driven through the Run aggregate's own `decide`/`evolve` on a moved clock (no broker: the bytes
are the records' encoded values and headers exactly as the coordinator writes them). It prints
the count and bytes per event type and the share that renewals take, then what the same hour
adds to the Run's compacted state changelog (runs.states): at a 20 s heartbeat each event is its
own transaction, which carries the run's state after it and the partition's checkpoint. Those
bytes are written, but compaction keeps only the last state of the run, so they are not retained.

    .venv/bin/python -m bench.run_hour [--heartbeat-s 20] [--hours 1]
"""

from __future__ import annotations

import argparse
from collections import Counter

from services.common.aggregate.changelog import unit_records
from services.common.kafka import OutboundRecord
from services.common.messages import MessageCodec, record_bytes
from services.common.topics import RUNS_EVENTS, RUNS_STATES
from services.lease_coordinator.domain import RunState, evolve
from services.lease_coordinator.state_codec import STATE_FORMAT, encode_state
from tests.support.lease_run import Run, renew_cmd, report_cmd

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heartbeat-s", type=int, default=20)
    parser.add_argument("--hours", type=float, default=1.0)
    args = parser.parse_args(argv)
    run = Run()
    grant = run.claim(lease_seconds=90, heartbeat_seconds=args.heartbeat_s)
    renewals = int(args.hours * 3600 // args.heartbeat_s)
    for sequence in range(1, renewals + 1):
        run.at(run.now + args.heartbeat_s * 1000)
        run.accept(renew_cmd(run.run_id, grant.attempt_id, grant.epoch, sequence))
    run.at(run.now + 1000)
    run.accept(report_cmd(run.run_id, grant.attempt_id, grant.epoch, renewals + 1, "succeeded"))
    codec = MessageCodec()
    count: Counter[str] = Counter()
    size: Counter[str] = Counter()
    for event in run.events:
        record = codec.outbound(RUNS_EVENTS.name, run.run_id, event, 0)
        kind = type(event).__name__
        count[kind] += 1
        size[kind] += record_bytes(record)
    total_events, total_bytes = sum(count.values()), sum(size.values())
    head = f"one run, {args.hours:g} h at a {args.heartbeat_s} s heartbeat"
    print(f"{head}: {total_events} events, {total_bytes:,} bytes")
    for kind, n in count.most_common():
        print(f"  {kind:<22} {n:>6} events {size[kind]:>9,} bytes ({size[kind] / total_bytes:.0%})")
    changelog: list[OutboundRecord] = []
    state: RunState | None = None
    for offset, event in enumerate(run.events):
        state = evolve(state, event)
        changelog += unit_records(
            RUNS_STATES.name, [(run.run_id, 0, encode_state(state))], {0: offset}, STATE_FORMAT
        )
    written = sum(record_bytes(record) for record in changelog)
    last_state = record_bytes(changelog[-2])  # the run's last state (the checkpoint follows it)
    print(
        f"state changelog ({RUNS_STATES.name}): {len(changelog)} records, {written:,} bytes written;"
        f" retained after compaction: 1 state of {last_state:,} bytes (plus the partition's checkpoint)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
