"""Schedules at scale (EXE-14): N schedules firing every minute through the real processor.

    python -m bench.schedules [--schedules 10000] [--minutes 3]      (make bench-schedules)

Starts its own broker (or uses KAFKA_BOOTSTRAP_SERVERS), `python -m services.schedules` as a
real process, and creates N schedules with cron `* * * * *` (UTC, overlap skip). Every run a
firing submits is reported ended at once (a RecordScheduledRun, what the follower sends when a
run finishes), so every schedule fires every minute. Measured per firing, over the minutes after
the first full one:
  * lag in transaction: scheduledAt -> the FiringDecided record (its CreateTime, stamped when it
    was produced into the transaction that also carries the run's SubmitRun);
  * lag visible: scheduledAt -> the bench's read_committed consumer received it (the run's
    SubmitRun is committed with it, so the coordinator can see it from then on);
and the schedules process's CPU (utime + stime from /proc over the window, % of one core).
Also checked: exactly one SubmitRun per FiringDecided (no duplicate submission).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.foundation import percentile, say, service_env, spawn
from services.common.backoff import Backoff
from services.common.broker import free_port, start_broker
from services.common.contracts import SubmitRun
from services.common.contracts.schedules import CreateSchedule, FiringDecided, RecordScheduledRun
from services.common.kafka import CommandPublisher, TopicFollower, create_topics
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.routing import schedule_command_record
from services.common.topics import RUNS_COMMANDS, SCHEDULES_EVENTS, TOPICS

__all__ = ["main"]

MINUTE = 60_000


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _create(sid: str) -> CreateSchedule:
    return CreateSchedule(
        command_id=f"bench-create-{sid}",
        run_id=sid,
        issued_at=0,
        correlation_id=sid,
        actor="user:bench",
        tenant=f"t{int(sid[-4:], 16) % 16}",
        agent_revision_id="agrev-bench",
        execution_spec='{"entrypoint":"bench"}',
        retry_safe=False,
        timeout_seconds=600,
        max_attempts=1,
        time_zone="UTC",
        cron="* * * * *",
        overlap_policy="skip",
        misfire_policy="coalesce",
        nonexistent_policy="skip",
        repeated_policy="first",
    )


def _ended(event: FiringDecided) -> RecordScheduledRun:
    return RecordScheduledRun(
        command_id=f"bench-end-{event.target_run_id}",
        run_id=event.run_id,
        issued_at=0,
        correlation_id=event.run_id,
        actor="tenure-schedules",
        target_run_id=event.target_run_id,
        outcome="ended",
        status="succeeded",
    )


def _follower(bootstrap: str, topic: str) -> TopicFollower:
    # A fresh broker may not have elected the new topics' leaders yet: ask again, with backoff.
    backoff = Backoff(base_s=0.2, cap_s=2.0)
    for _ in range(30):
        try:
            return TopicFollower(bootstrap, [topic], "end", f"bench-schedules-{topic}")
        except Exception as exc:
            say(f"following {topic}: {exc}; again")
            time.sleep(backoff.next_delay())
    raise RuntimeError(f"cannot follow {topic}")


def run(bootstrap: str, workdir: Path, schedules: int, minutes: int) -> dict[str, Any]:
    create_topics(bootstrap, TOPICS)
    env = service_env(bootstrap, workdir / "state", TENURE_SCHEDULES_HEALTH_PORT=str(free_port()))
    service = spawn("schedules", "services.schedules", workdir, env)
    codec = MessageCodec()
    publisher = CommandPublisher(bootstrap, client_id="bench-schedules")
    events = _follower(bootstrap, SCHEDULES_EVENTS.name)
    submits = _follower(bootstrap, RUNS_COMMANDS.name)
    sids = [f"sch_{i:016x}" for i in range(schedules)]
    say(f"creating {schedules} schedules")
    futures = [publisher.publish(schedule_command_record(codec, _create(s))) for s in sids]
    for future in futures:
        future.result(60)
    # Measure from the first minute boundary at least 20 s after the creations were sent.
    start = ((time.time_ns() // 1_000_000 + 20_000) // MINUTE + 1) * MINUTE
    end = start + minutes * MINUTE
    first = time.strftime("%H:%M:%S", time.gmtime(start / 1000))
    say(f"measuring the firings of {minutes} minutes from {first}Z")
    lag_tx: list[float] = []
    lag_visible: list[float] = []
    decided: Counter[str] = Counter()
    submitted: Counter[str] = Counter()
    cpu_start: float | None = None
    wall_start = 0.0
    cpu = float("nan")
    measured = False
    while time.time_ns() // 1_000_000 < end + 30_000:
        service.check_alive()
        now = time.time_ns() // 1_000_000
        if cpu_start is None and now >= start:
            cpu_start, wall_start = _cpu_s(service.process.pid), time.monotonic()
        for record in events.poll(max_records=5000, timeout_s=0.1):
            try:
                event = codec.decode(record.value)
            except UndecodableRecord:
                continue
            if not isinstance(event, FiringDecided):
                continue
            publisher.publish(schedule_command_record(codec, _ended(event)))
            if start <= event.scheduled_at < end:
                received = time.time_ns() // 1_000_000
                lag_tx.append(record.timestamp_ms - event.scheduled_at)
                lag_visible.append(received - event.scheduled_at)
                decided[event.idempotency_key] += 1
        for record in submits.poll(max_records=5000, timeout_s=0.0):
            command = codec.decode(record.value)
            if isinstance(command, SubmitRun):
                submitted[command.idempotency_key] += 1
        if cpu_start is not None and now >= end and not measured:
            cpu, measured = (_cpu_s(service.process.pid) - cpu_start) / (time.monotonic() - wall_start), True
    # Read runs.commands to its end as of now (every SubmitRun committed with a firing is there).
    target = submits.end_offsets(RUNS_COMMANDS.name)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for record in submits.poll(max_records=5000, timeout_s=0.5):
            command = codec.decode(record.value)
            if isinstance(command, SubmitRun):
                submitted[command.idempotency_key] += 1
        positions = submits.positions(RUNS_COMMANDS.name)
        if all(positions.get(p, -1) >= end for p, end in target.items()):
            break
    service.process.terminate()
    service.process.wait(30)
    publisher.close()
    expected = schedules * minutes
    return {
        "schedules": schedules,
        "minutes": minutes,
        "firings": len(lag_tx),
        "expected": expected,
        "lag_tx_p50": percentile(lag_tx, 50),
        "lag_tx_p99": percentile(lag_tx, 99),
        "lag_visible_p50": percentile(lag_visible, 50),
        "lag_visible_p99": percentile(lag_visible, 99),
        "lag_visible_max": max(lag_visible, default=float("nan")),
        "cpu_core_fraction": cpu,
        "duplicate_firings": sum(1 for c in decided.values() if c > 1),
        # A SubmitRun may be read before its FiringDecided: all are counted, then matched here.
        "submits_per_firing": sorted({submitted[k] for k in decided}),
        "firings_without_submit": sum(1 for k in decided if submitted[k] == 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--minutes", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tenure-bench-schedules-") as tmp:
        workdir = Path(tmp)
        broker = start_broker(port=None, data_dir=workdir / "kafka" / "data", state_dir=workdir / "kafka")
        try:
            result = run(broker.bootstrap_servers, workdir, args.schedules, args.minutes)
        finally:
            broker.stop()
    print(
        "| schedules | minutes | firings (expected) | lag in tx p50 / p99 | lag visible p50/p99/max | CPU |"
    )
    print("|---|---|---|---|---|---|")
    print(
        f"| {result['schedules']} | {result['minutes']} | {result['firings']} ({result['expected']}) | "
        f"{result['lag_tx_p50']:.0f} / {result['lag_tx_p99']:.0f} ms | "
        f"{result['lag_visible_p50']:.0f} / {result['lag_visible_p99']:.0f} / "
        f"{result['lag_visible_max']:.0f} ms | "
        f"{result['cpu_core_fraction']:.0%} of a core |"
    )
    print(
        f"duplicate firings: {result['duplicate_firings']}; SubmitRun records per firing: "
        f"{result['submits_per_firing']}; firings without a SubmitRun: {result['firings_without_submit']}"
    )


if __name__ == "__main__":
    main()
