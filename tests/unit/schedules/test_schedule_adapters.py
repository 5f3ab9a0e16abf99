"""EXE-14 adapters: the state codec round-trips, the follower maps run events to the schedule's
commands (and ignores what is not a schedule's), the view shows local time and UTC."""

from __future__ import annotations

from typing import Any

from services.common.contracts import AttemptReported, CommandRejected, RunCancelled, RunSubmitted
from services.common.contracts.schedules import PauseSchedule
from services.schedules.follower import outcome_of
from services.schedules.state_codec import decode_state, encode_state
from services.schedules.view import schedule_view
from tests.unit.schedules.support import SID, Driver, at, create

HEADER = {"version": 2, "occurred_at": 1, "causation_id": "c", "correlation_id": "k", "actor": "a"}


def _queued_driver() -> Driver:
    d = Driver(
        create(
            cron="* * * * *", time_zone="Europe/Berlin", overlap_policy="queue", labels={"team": "triage"}
        ),
        at("2026-01-01T00:00:30"),
    )
    d.tick(at("2026-01-01T00:01:00"))
    d.tick(at("2026-01-01T00:02:00"))
    return d


def test_the_state_codec_round_trips_every_field() -> None:
    d = _queued_driver()
    assert d.s.pending is not None and d.s.history and d.s.active_runs
    assert decode_state(encode_state(d.s)) == d.s
    d.send(PauseSchedule(command_id="p", run_id=SID, issued_at=0, correlation_id="c", actor="x"), 0)
    assert decode_state(encode_state(d.s)) == d.s


def test_the_follower_reports_a_schedules_runs_and_nothing_else_EXE_14() -> None:
    d = _queued_driver()
    run_id = d.s.active_runs[0]
    index = {run_id: SID}.get
    submitted = RunSubmitted(
        event_id="e1",
        run_id=run_id,
        tenant="acme",
        idempotency_key=f"schedule:{SID}:2026-01-01T00:01:00Z",
        execution_spec="{}",
        spec_digest="d",
        retry_safe=False,
        timeout_seconds=1,
        max_attempts=1,
        queue_reservation_id="q",
        **{**HEADER, "version": 1},
    )
    command = outcome_of(submitted, index, 5)
    assert command is not None and (command.run_id, command.outcome) == (SID, "submitted")
    assert outcome_of(submitted, index, 6) == command.__class__(**{**command.__dict__, "issued_at": 6})
    other: Any = RunSubmitted(**{**submitted.__dict__, "idempotency_key": "user-key"})
    assert outcome_of(other, index, 5) is None
    ended = outcome_of(
        RunCancelled(
            event_id="e2",
            run_id=run_id,
            reason="",
            previous_status="queued",
            reservation_released=True,
            **HEADER,
        ),
        index,
        5,
    )
    assert ended is not None and (ended.outcome, ended.status) == ("ended", "cancelled")
    prep = AttemptReported(
        event_id="e3",
        run_id=run_id,
        attempt_id="a",
        lease_id="l",
        epoch=1,
        sequence=1,
        outcome="preparation_failed",
        error_code="",
        detail="",
        **HEADER,
    )
    assert outcome_of(prep, index, 5) is None  # a requeue or a RunFailed follows
    refused = CommandRejected(
        event_id="e4",
        run_id=run_id,
        occurred_at=1,
        causation_id="c",
        correlation_id="k",
        actor="a",
        command_type="SubmitRun",
        code="ADMISSION_QUEUE_FULL",
        detail="full",
        current_status=None,
        current_version=0,
    )
    answer = outcome_of(refused, index, 5)
    assert answer is not None and (answer.outcome, answer.status) == ("refused", "ADMISSION_QUEUE_FULL")
    stranger = RunCancelled(
        event_id="e5",
        run_id="run_other",
        reason="",
        previous_status="queued",
        reservation_released=True,
        **HEADER,
    )
    assert outcome_of(stranger, index, 5) is None  # not a run of any schedule here


def test_the_view_shows_next_firings_in_local_time_and_utc_EXE_14() -> None:
    d = Driver(create(), at("2026-03-27T12:00:00"))
    view = schedule_view(d.s, at("2026-03-27T12:00:00"), upcoming=3)
    assert view["nextFirings"] == [
        {"local": "2026-03-28T02:30:00+01:00", "utc": "2026-03-28T01:30:00Z"},
        {"local": "2026-03-30T02:30:00+02:00", "utc": "2026-03-30T00:30:00Z"},
        {"local": "2026-03-31T02:30:00+02:00", "utc": "2026-03-31T00:30:00Z"},
    ]
    assert view["nextRunAt"] == "2026-03-28T01:30:00Z" and view["dst"] == {
        "nonexistent": "skip",
        "repeated": "first",
    }
