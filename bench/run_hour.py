"""What one run-hour writes (issue 16): events and bytes on runs.events, runs.renewals, runs.states.

A run is submitted, claimed and renewed at its heartbeat for an hour, then reports success. It
is driven through the lease coordinator's own processor (the one aggregate runtime, on the
in-memory log twin and a moved clock: no broker, and the bytes are the records' encoded values,
keys and headers exactly as the coordinator commits them). It runs twice, with every renewal on
runs.events (`TENURE_LEASE_KEEPALIVE_FRACTION=0`, the layout before renewals were kept) and with
the default fraction, and prints per topic the records and bytes written, per event type on
runs.events, and what compaction retains of the state changelog.

    PYTHONPATH=. .venv/bin/python -m bench.run_hour [--heartbeat-s 20] [--lease-s 90] [--hours 1]
"""

from __future__ import annotations

import argparse
from collections import Counter

from services.common.clock import ManualClock
from services.common.eventlog import MemoryEventLog
from services.common.messages import MessageCodec
from services.common.store import MemoryStore
from services.common.topics import RUNS_EVENTS, RUNS_RENEWALS, RUNS_STATES
from services.lease_coordinator.domain import LeasePolicy
from services.lease_coordinator.processor import RunCommandProcessor
from tests.support.lease_run import claim_cmd, renew_cmd, report_cmd
from tests.unit.strategies import submit_command
from tests.unit.test_run_processor import CommandTopic

__all__ = ["main"]

CODEC = MessageCodec()


def _bytes(record: object) -> int:
    key, value, headers = record.key, record.value, record.headers  # type: ignore[attr-defined]
    return len(key or b"") + len(value) + sum(len(k) + len(v) for k, v in headers)


def one_hour(fraction: float, heartbeat_s: int, lease_s: int, hours: float) -> MemoryEventLog:
    log, clock, topic = MemoryEventLog(), ManualClock(), CommandTopic()
    processor = RunCommandProcessor(
        log, MemoryStore(), CODEC, clock, LeasePolicy(keepalive_fraction=fraction)
    )
    processor.handle([topic.record(submit_command("acme", "run-hour", command_id="submit"))])
    run_id = next(
        k.decode()
        for (t, _), records in log.topics.items()
        if t == RUNS_EVENTS.name
        for k in [records[0].key]
    )
    claim = claim_cmd(run_id, command_id="claim", lease_seconds=lease_s, heartbeat_seconds=heartbeat_s)
    processor.handle([topic.record(claim)])
    lease = processor.load(run_id).lease  # type: ignore[union-attr]
    assert lease is not None
    renewals = int(hours * 3600 // heartbeat_s)
    for sequence in range(1, renewals + 1):
        clock.advance(heartbeat_s * 1000)
        processor.handle([topic.record(renew_cmd(run_id, lease.attempt_id, lease.epoch, sequence))])
        processor.tick()
    clock.advance(1000)
    processor.handle([topic.record(report_cmd(run_id, lease.attempt_id, lease.epoch, renewals + 1))])
    return log


def report(label: str, log: MemoryEventLog) -> tuple[int, int]:
    print(label)
    total_records = total_bytes = 0
    for name in (RUNS_EVENTS.name, RUNS_RENEWALS.name, RUNS_STATES.name):
        records = [r for (t, _), rs in log.topics.items() if t == name for r in rs]
        size = sum(_bytes(r) for r in records)
        total_records, total_bytes = total_records + len(records), total_bytes + size
        print(f"  {name:<16} {len(records):>6} records {size:>10,} bytes")
        if name == RUNS_EVENTS.name:
            kinds: Counter[str] = Counter(type(CODEC.decode(r.value)).__name__ for r in records)
            for kind, n in kinds.most_common():
                print(f"    {kind:<22} {n:>6}")
        if name == RUNS_STATES.name and records:
            latest = {r.key: r for r in records}
            kept = sum(_bytes(r) for r in latest.values())
            print(f"    retained after compaction: {len(latest)} records, {kept:,} bytes")
    print(f"  all topics       {total_records:>6} records {total_bytes:>10,} bytes written")
    events = [r for (t, _), rs in log.topics.items() if t == RUNS_EVENTS.name for r in rs]
    return len(events), sum(_bytes(r) for r in events)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heartbeat-s", type=int, default=20)
    parser.add_argument("--lease-s", type=int, default=90)
    parser.add_argument("--hours", type=float, default=1.0)
    args = parser.parse_args(argv)
    head = f"one run, {args.hours:g} h, {args.lease_s} s lease, {args.heartbeat_s} s heartbeat"
    before = report(
        f"{head}; every renewal on runs.events:", one_hour(0, args.heartbeat_s, args.lease_s, args.hours)
    )
    fraction = LeasePolicy().keepalive_fraction
    after = report(
        f"{head}; renewals kept off runs.events (keepalive fraction {fraction:g}):",
        one_hour(fraction, args.heartbeat_s, args.lease_s, args.hours),
    )
    print(
        f"runs.events, the record kept forever: {before[0]} -> {after[0]} events "
        f"({after[0] / before[0]:.2f}x), {before[1]:,} -> {after[1]:,} bytes ({after[1] / before[1]:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
