"""EXE-14 on the pure core: firing keys, overlap skip/queue, misfire skip/coalesce (also across
a DST transition), manual runs, pause/resume/update, and the lifecycle tables, exhaustively."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from services.common.contracts.schedules import (
    FiringDecided,
    FiringQueued,
    FiringSkipped,
    PauseSchedule,
    ResumeSchedule,
    ScheduledRunEnded,
    TriggerSchedule,
    UpdateSchedule,
)
from services.common.ids import run_id_for
from services.schedules.domain import (
    FIRING_TRANSITIONS,
    TRANSITIONS,
    FiringStatus,
    IllegalTransition,
    Rejection,
    ScheduleStatus,
    check_firing,
    check_transition,
    decide,
    submission,
)
from tests.unit.schedules.support import SID, Driver, at, create

MIN = 60_000


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def _kinds(events: list[object]) -> list[str]:
    return [type(e).__name__ for e in events]


def test_a_firing_is_keyed_by_schedule_and_utc_instant_and_names_its_run_EXE_14() -> None:
    d = Driver(create(), at("2026-03-27T12:00:00"))
    assert _iso(d.s.next_run_at) == "2026-03-28T01:30:00+00:00"  # 02:30 CET, stored in UTC
    [fired] = d.tick(d.s.next_run_at + 5)
    assert isinstance(fired, FiringDecided)
    assert fired.idempotency_key == f"schedule:{SID}:2026-03-28T01:30:00Z"
    assert fired.target_run_id == run_id_for("acme", fired.idempotency_key)
    # The next one skips the nonexistent 02:30 of 29 March (spring forward): 30 March, CEST.
    assert _iso(fired.next_run_at) == "2026-03-30T00:30:00+00:00"
    run = submission(d.s, fired)
    assert (run.run_id, run.idempotency_key, run.agent_revision_id) == (
        fired.target_run_id,
        fired.idempotency_key,
        "agrev-1",
    )
    assert dict(run.labels) == {"schedule": SID}
    # Deciding the same state again yields the very same records (deterministic ids).
    assert d.tick(d.s.next_run_at - 1) == []


def test_overlap_skip_records_the_skip_with_the_active_run_EXE_14() -> None:
    d = Driver(create(cron="* * * * *", time_zone="UTC"), at("2026-01-01T00:00:30"))
    [first] = d.tick(at("2026-01-01T00:01:00"))
    [skipped] = d.tick(at("2026-01-01T00:02:00"))
    assert isinstance(skipped, FiringSkipped) and skipped.reason == "overlap"
    assert first.target_run_id in skipped.detail
    d.end_run(first.target_run_id, at("2026-01-01T00:02:10"))
    [again] = d.tick(at("2026-01-01T00:03:00"))
    assert isinstance(again, FiringDecided) and _iso(again.scheduled_at) == "2026-01-01T00:03:00+00:00"


def test_overlap_queue_holds_one_pending_firing_and_merges_later_ones_EXE_14() -> None:
    d = Driver(create(cron="* * * * *", time_zone="UTC", overlap_policy="queue"), at("2026-01-01T00:00:30"))
    [first] = d.tick(at("2026-01-01T00:01:00"))
    queued = [d.tick(at(f"2026-01-01T00:0{m}:00"))[0] for m in (2, 3, 4)]
    assert all(isinstance(q, FiringQueued) for q in queued)
    assert {q.firing_key for q in queued} == {f"{SID}/2026-01-01T00:02:00Z"}  # one pending, merged
    assert d.s.pending is not None and d.s.pending.merged == 3
    ended = d.end_run(first.target_run_id, at("2026-01-01T00:04:20"))
    assert _kinds(ended) == ["ScheduledRunEnded", "FiringDecided"]
    assert ended[1].firing_key == f"{SID}/2026-01-01T00:02:00Z" and ended[1].merged == 3
    assert d.s.pending is None and d.s.active_runs == (ended[1].target_run_id,)


def test_misfire_coalesce_makes_one_run_for_a_whole_downtime_EXE_14() -> None:
    d = Driver(create(cron="*/15 * * * *", time_zone="UTC"), at("2026-01-01T00:00:30"))
    d.tick(at("2026-01-01T00:15:00"))
    d.end_run(d.s.active_runs[0], at("2026-01-01T00:16:00"))
    events = d.tick(at("2026-01-01T03:10:00"))  # down from 00:16 to 03:10: 11 firings missed
    assert _kinds(events) == ["FiringDecided"]
    assert _iso(events[0].scheduled_at) == "2026-01-01T03:00:00+00:00" and events[0].coalesced == 11 - 1
    assert _iso(d.s.next_run_at) == "2026-01-01T03:15:00+00:00"


def test_misfire_skip_records_each_missed_firing_and_runs_none_EXE_14() -> None:
    d = Driver(create(cron="0 * * * *", time_zone="UTC", misfire_policy="skip"), at("2026-01-01T00:00:30"))
    events = d.tick(at("2026-01-01T05:30:00"))
    assert _kinds(events) == ["FiringSkipped"] * 5 and {e.reason for e in events} == {"misfire"}
    assert not d.s.active_runs and d.s.skipped == 5


def test_downtime_across_spring_forward_counts_only_existing_local_times_EXE_14() -> None:
    """Berlin, hourly at :30 from 00:30 to 05:30 local on 29 March 2026: 02:30 does not exist,
    so the downtime 00:45-05:45 local missed 4 firings (01:30, 03:30, 04:30, 05:30), not 5."""
    zone = "Europe/Berlin"
    d = Driver(create(cron="30 * * * *", misfire_policy="skip"), at("2026-03-29T00:45:00", zone))
    events = d.tick(at("2026-03-29T05:45:00", zone))
    assert [_iso(e.scheduled_at) for e in events] == [
        "2026-03-29T00:30:00+00:00",  # 01:30 CET
        "2026-03-29T01:30:00+00:00",  # 03:30 CEST
        "2026-03-29T02:30:00+00:00",
        "2026-03-29T03:30:00+00:00",
    ]
    c = Driver(create(cron="30 * * * *"), at("2026-03-29T00:45:00", zone))
    [one] = c.tick(at("2026-03-29T05:45:00", zone))
    assert one.coalesced == 3 and _iso(one.scheduled_at) == "2026-03-29T03:30:00+00:00"


def test_downtime_across_fall_back_runs_the_repeated_hour_once_EXE_14() -> None:
    zone = "Europe/Berlin"
    d = Driver(create(cron="30 2 * * *", misfire_policy="skip"), at("2026-10-24T12:00:00", zone))
    events = d.tick(at("2026-10-26T12:00:00", zone))
    assert [_iso(e.scheduled_at) for e in events] == [
        "2026-10-25T00:30:00+00:00",
        "2026-10-26T01:30:00+00:00",
    ]
    both = Driver(
        create(cron="30 2 * * *", misfire_policy="skip", repeated_policy="both"),
        at("2026-10-24T12:00:00", zone),
    )
    assert len(both.tick(at("2026-10-26T12:00:00", zone))) == 3


def test_manual_trigger_has_its_own_key_and_never_collides_EXE_14() -> None:
    d = Driver(create(), at("2026-03-27T12:00:00"))
    trigger = TriggerSchedule(
        command_id="cmd-t1", run_id=SID, issued_at=0, correlation_id="c", actor="user:bob"
    )
    [manual] = d.send(trigger, at("2026-03-28T01:30:00"))
    assert manual.manual and manual.idempotency_key == f"schedule:{SID}:manual:cmd-t1"
    assert d.send(trigger, at("2026-03-28T01:31:00")) == []  # a redelivery
    d.end_run(manual.target_run_id, at("2026-03-28T01:30:30"))
    [scheduled] = d.tick(at("2026-03-28T01:31:00"))
    assert scheduled.target_run_id != manual.target_run_id and not scheduled.manual


def test_pause_resume_and_update_follow_the_key_rules_EXE_14() -> None:
    d = Driver(create(cron="0 * * * *", time_zone="UTC"), at("2026-01-01T00:00:30"))
    header = {"run_id": SID, "issued_at": 0, "correlation_id": "c", "actor": "user:alice"}
    d.send(PauseSchedule(command_id="p1", **header), at("2026-01-01T00:10:00"))
    assert d.tick(at("2026-01-01T03:00:00")) == []
    again = decide(d.s, PauseSchedule(command_id="p2", **header), at("2026-01-01T00:11:00"))
    assert isinstance(again, Rejection) and again.code.value == "SCHEDULE_PAUSED"
    d.send(ResumeSchedule(command_id="r1", **header), at("2026-01-01T03:05:00"))
    [one] = d.tick(at("2026-01-01T03:05:00"))  # the pause's misfires coalesce to one run
    assert one.coalesced == 2 and _iso(one.scheduled_at) == "2026-01-01T03:00:00+00:00"
    fields = {k: v for k, v in create().__dict__.items() if k not in ("command_id", "tenant", *header)}
    update = UpdateSchedule(
        command_id="u1", **header, **{**fields, "cron": "*/5 * * * *", "time_zone": "UTC"}
    )
    [updated] = d.send(update, at("2026-01-01T03:06:00"))
    assert _iso(updated.next_run_at) == "2026-01-01T03:10:00+00:00"


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("cron", "61 * * * *", "INVALID_CRON"),
        ("cron", "* * *", "INVALID_CRON"),
        ("time_zone", "Mars/Olympus", "UNKNOWN_TIME_ZONE"),
        ("overlap_policy", "parallel", "INVALID_COMMAND"),
        ("execution_spec", "[1]", "INVALID_COMMAND"),
    ],
)
def test_invalid_definitions_are_refused_with_the_field_EXE_14(field: str, value: str, code: str) -> None:
    decision = decide(None, create(**{field: value}), 0)
    assert isinstance(decision, Rejection) and decision.code.value == code


def test_schedule_lifecycle_table_is_exhaustive() -> None:
    for before, after in itertools.product(ScheduleStatus, ScheduleStatus):
        if after in TRANSITIONS[before]:
            assert check_transition(before, after) is after
        else:
            with pytest.raises(IllegalTransition):
                check_transition(before, after)
    assert set(TRANSITIONS) == set(ScheduleStatus)


def test_firing_lifecycle_table_is_exhaustive() -> None:
    allowed = {
        (FiringStatus.QUEUED, FiringStatus.DECIDED),
        (FiringStatus.DECIDED, FiringStatus.SUBMITTED),
        (FiringStatus.DECIDED, FiringStatus.ENDED),
        (FiringStatus.DECIDED, FiringStatus.REFUSED),
        (FiringStatus.SUBMITTED, FiringStatus.ENDED),
    }
    assert set(FIRING_TRANSITIONS) == set(FiringStatus)
    for before, after in itertools.product(FiringStatus, FiringStatus):
        if (before, after) in allowed:
            assert check_firing(before, after) is after
        else:
            with pytest.raises(IllegalTransition):
                check_firing(before, after)


def test_run_outcomes_for_unknown_runs_change_nothing() -> None:
    d = Driver(create(), at("2026-03-27T12:00:00"))
    assert d.end_run("run_unknown", at("2026-03-27T12:01:00")) == []
    assert not [e for e in d.events if isinstance(e, ScheduledRunEnded)]
