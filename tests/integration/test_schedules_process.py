"""Schedules as real processes on the real broker (EXE-14, DUR-1).

`python -m services.schedules` and the runs coordinator (`python -m services.lease_coordinator`)
run as subprocesses; the schedules processor's clock is moved with its offset file
(TENURE_SCHEDULES_CLOCK_OFFSET_FILE), so minutes of schedule time pass in seconds:
  * SIGKILL of the schedules processor in the middle of a minute's firings of 40 schedules:
    after a restart every (schedule, scheduledAt) has exactly one run;
  * a scheduler down for several intervals coalesces them into one run;
  * overlapPolicy queue holds one pending firing while the run is active, merges later ones,
    and starts it when the run ends (cancelled here).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.common.contracts import CancelRun, RunSubmitted
from services.common.contracts.schedules import CreateSchedule, FiringDecided, FiringQueued, ScheduleCreated
from services.common.ids import command_id_for
from services.common.kafka import CommandPublisher
from services.common.messages import MessageCodec
from services.common.routing import command_record, schedule_command_record
from services.common.topics import RUNS_EVENTS, SCHEDULES_EVENTS
from tests.support.system import (
    ServiceProcess,
    decode_all,
    free_port,
    read_topic,
    service_env,
    stop_all,
    wait_for_ready,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(240)]
MINUTE = 60_000


class Fleet:
    def __init__(self, bootstrap: str, tmp: Path) -> None:
        self.bootstrap = bootstrap
        self.offset_file = tmp / "clock-offset"
        self.port = free_port()
        env = service_env(
            bootstrap,
            tmp / "state",
            TENURE_SCHEDULES_HEALTH_PORT=str(self.port),
            TENURE_COORDINATOR_HEALTH_PORT=str(free_port()),
            TENURE_SCHEDULES_CLOCK_OFFSET_FILE=str(self.offset_file),
            TENURE_INSTANCE_ID=f"it-{uuid.uuid4().hex[:6]}",
        )
        self.schedules = ServiceProcess("schedules", "services.schedules", env, tmp)
        self.coordinator = ServiceProcess("coordinator", "services.lease_coordinator", env, tmp)
        self.publisher = CommandPublisher(bootstrap, client_id="schedules-it")
        self.codec = MessageCodec()
        self.offset = 0

    def set_clock(self, schedule_now_ms: int) -> None:
        """Move the schedules processor's clock so that it reads `schedule_now_ms` now."""
        self.offset = schedule_now_ms - time.time_ns() // 1_000_000
        self.offset_file.write_text(str(self.offset))

    def now(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset

    def start_schedules(self) -> None:
        self.schedules.start()
        wait_for_ready(self.port, process=self.schedules)

    def create(self, schedule_id: str, **overrides: Any) -> None:
        fields: dict[str, Any] = {
            "command_id": f"create-{schedule_id}",
            "run_id": schedule_id,
            "issued_at": 0,
            "correlation_id": schedule_id,
            "actor": "user:alice",
            "tenant": "acme",
            "agent_revision_id": "agrev-it",
            "execution_spec": '{"entrypoint":"nightly"}',
            "retry_safe": False,
            "timeout_seconds": 600,
            "max_attempts": 1,
            "time_zone": "Europe/Berlin",
            "cron": "* * * * *",
            "overlap_policy": "skip",
            "misfire_policy": "coalesce",
            "nonexistent_policy": "skip",
            "repeated_policy": "first",
            **overrides,
        }
        self.publisher.publish(schedule_command_record(self.codec, CreateSchedule(**fields))).result(10)

    def schedule_events(self) -> list[Any]:
        return decode_all(read_topic(self.bootstrap, SCHEDULES_EVENTS.name, SCHEDULES_EVENTS.partitions))

    def runs_submitted(self) -> list[RunSubmitted]:
        events = decode_all(read_topic(self.bootstrap, RUNS_EVENTS.name, RUNS_EVENTS.partitions))
        return [
            e for e in events if isinstance(e, RunSubmitted) and e.idempotency_key.startswith("schedule:")
        ]

    def stop(self) -> None:
        stop_all((self.schedules, self.coordinator))
        self.publisher.close()


@pytest.fixture
def fleet(tenure_topics: str, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tenure_topics, tmp_path)
    f.coordinator.start()
    try:
        yield f
    finally:
        f.stop()


def _sid() -> str:
    return f"sch_{uuid.uuid4().hex[:16]}"


def _of(events: list[Any], sids: set[str], kind: type[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, kind) and e.run_id in sids]


def test_sigkill_mid_firing_creates_exactly_one_run_per_scheduled_at_EXE_14(fleet: Fleet) -> None:
    boundary = (fleet.now() // MINUTE + 2) * MINUTE
    fleet.set_clock(boundary - 6_000)  # the next minute's firings are 6 s away
    fleet.start_schedules()
    sids = {_sid() for _ in range(40)}
    for sid in sids:
        fleet.create(sid)
    wait_until(lambda: len(_of(fleet.schedule_events(), sids, object)) >= 40, 30, "40 schedules created")
    # Kill it as the minute's 40 firings are being decided and committed.
    wait_until(lambda: fleet.now() >= boundary, 15, "the firing minute", poll_s=0.005)
    time.sleep(0.03)
    fleet.schedules.sigkill()
    fleet.start_schedules()
    wait_until(lambda: len(_of(fleet.schedule_events(), sids, FiringDecided)) >= 40, 60, "40 firings decided")
    runs = wait_until(
        lambda: (
            (r := [x for x in fleet.runs_submitted() if x.idempotency_key.split(":")[1] in sids])
            and len(r) >= 40
            and r
        ),
        60,
        "40 runs",
    )
    time.sleep(2)  # anything duplicated would have landed by now
    runs = [x for x in fleet.runs_submitted() if x.idempotency_key.split(":")[1] in sids]
    decided = _of(fleet.schedule_events(), sids, FiringDecided)
    per_key = Counter(r.idempotency_key for r in runs)
    assert len(per_key) == 40 and set(per_key.values()) == {1}, per_key
    assert Counter(d.firing_key for d in decided) == Counter({k: 1 for k in {d.firing_key for d in decided}})
    assert {d.scheduled_at for d in decided} == {boundary}
    assert {r.agent_revision_id for r in runs} == {"agrev-it"}
    assert {dict(r.labels)["schedule"] for r in runs} == sids


def test_a_scheduler_down_for_several_intervals_coalesces_to_one_run_EXE_14(fleet: Fleet) -> None:
    start = (fleet.now() // MINUTE + 1) * MINUTE + 5_000
    fleet.set_clock(start)
    fleet.start_schedules()
    sid = _sid()
    fleet.create(sid)
    wait_until(lambda: _of(fleet.schedule_events(), {sid}, object), 30, "the schedule")
    fleet.schedules.stop()
    fleet.set_clock(start + 5 * MINUTE)  # down for five minutes: five firings missed
    fleet.start_schedules()
    [decided] = wait_until(lambda: _of(fleet.schedule_events(), {sid}, FiringDecided), 30, "the firing")
    assert decided.coalesced == 4 and decided.scheduled_at == start - 5_000 + 5 * MINUTE
    wait_until(lambda: [r for r in fleet.runs_submitted() if sid in r.idempotency_key], 30, "its run")
    time.sleep(1.5)
    assert len(_of(fleet.schedule_events(), {sid}, FiringDecided)) == 1
    assert len([r for r in fleet.runs_submitted() if sid in r.idempotency_key]) == 1


def test_queue_holds_one_pending_firing_while_a_run_is_active_EXE_14(fleet: Fleet) -> None:
    fleet.start_schedules()
    sid = _sid()
    fleet.create(sid, overlap_policy="queue")
    [created] = wait_until(lambda: _of(fleet.schedule_events(), {sid}, ScheduleCreated), 30, "the schedule")
    fleet.set_clock(created.next_run_at - 500)
    [first] = wait_until(lambda: _of(fleet.schedule_events(), {sid}, FiringDecided), 30, "the first firing")
    wait_until(lambda: [r for r in fleet.runs_submitted() if sid in r.idempotency_key], 30, "its run")
    # Three more minutes pass while the first run is still queued (nobody claims it).
    for minute in (1, 2, 3):
        fleet.set_clock(first.scheduled_at + minute * MINUTE + 500)
        wait_until(
            lambda m=minute: len(_of(fleet.schedule_events(), {sid}, FiringQueued)) >= m,
            20,
            f"queued {minute}",
        )
    queued = _of(fleet.schedule_events(), {sid}, FiringQueued)
    assert len({q.firing_key for q in queued}) == 1 and queued[-1].merged == 3
    assert len(_of(fleet.schedule_events(), {sid}, FiringDecided)) == 1
    cancel = CancelRun(
        command_id=command_id_for(first.target_run_id, "CancelRun", "it"),
        run_id=first.target_run_id,
        issued_at=0,
        correlation_id="it",
        actor="user:alice",
        reason="make room",
    )
    fleet.publisher.publish(command_record(fleet.codec, cancel)).result(10)
    decided = wait_until(
        lambda: (d := _of(fleet.schedule_events(), {sid}, FiringDecided)) and len(d) == 2 and d,
        30,
        "the pending run",
    )
    assert decided[1].firing_key == queued[0].firing_key and decided[1].merged == 3
