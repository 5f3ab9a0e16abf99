"""Golden sample values of the schedules' records (tenure.schedules.*, EXE-14) and the Run fields they add."""

from __future__ import annotations

from typing import Any

from golden_base import _COMMAND, _EVENT, _SPEC
from golden_runs import _RUN_SUBMITTED_V1, _SUBMIT_RUN_V1

__all__ = ["SAMPLES"]

# Schedules (tenure.schedules.*, EXE-14) and the Run fields they add: one Berlin schedule at
# 02:30 local, across the spring-forward night of 2026-03-29 (no 02:30 that day: skipped).
_SCHEDULE_ID = "sch_5e1d0c2b9a8f7e6d"
_SCHEDULE_COMMAND = {**_COMMAND, "runId": _SCHEDULE_ID, "actor": "user:alice@example.org"}
_SCHEDULE_EVENT = {**_EVENT, "runId": _SCHEDULE_ID, "causationId": "cmd-sch-1"}
_SCHEDULE_DEFINITION = {
    "agentRevisionId": "agrev_2026_03_01_a",
    "executionSpec": _SPEC,
    "retrySafe": True,
    "timeoutSeconds": 3600,
    "maxAttempts": 2,
    "labels": {"team": "triage"},
    "timeZone": "Europe/Berlin",
    "cron": "30 2 * * *",
    "overlapPolicy": "queue",
    "misfirePolicy": "coalesce",
    "nonexistentPolicy": "skip",
    "repeatedPolicy": "first",
}
_SCHEDULE_TIMER = {
    **_SCHEDULE_EVENT,
    "actor": "tenure-schedules",
    "causationId": "timer/sch_5e1d0c2b9a8f7e6d/1774661400000",
}
_FIRING = {"firingKey": "sch_5e1d0c2b9a8f7e6d/2026-03-28T01:30:00Z", "scheduledAt": 1_774_661_400_000}
SAMPLES: dict[tuple[str, int], dict[str, Any]] = dict(
    {
        ("tenure.runs.commands.SubmitRun", 3): {
            **_SUBMIT_RUN_V1,
            "commandId": "cmd-scheduled-1",
            "idempotencyKey": "schedule:sch_5e1d0c2b9a8f7e6d:2026-03-28T01:30:00Z",
            "parentRunId": None,
            "agentRevisionId": "agrev_2026_03_01_a",
            "labels": {"schedule": _SCHEDULE_ID},
        },
        ("tenure.runs.events.RunSubmitted", 4): {
            **_RUN_SUBMITTED_V1,
            "labels": {"schedule": _SCHEDULE_ID},
            "parentRunId": None,
            "agentRevisionId": "agrev_2026_03_01_a",
        },
        ("tenure.schedules.commands.CreateSchedule", 1): {
            **_SCHEDULE_COMMAND, **_SCHEDULE_DEFINITION, "tenant": "acme",
        },
        ("tenure.schedules.commands.UpdateSchedule", 1): {
            **_SCHEDULE_COMMAND, **_SCHEDULE_DEFINITION,
            "commandId": "cmd-sch-2", "nonexistentPolicy": "shift",
        },
        ("tenure.schedules.commands.PauseSchedule", 1): {
            **_SCHEDULE_COMMAND, "reason": "Wartung — maintenance",
        },
        ("tenure.schedules.commands.ResumeSchedule", 1): {**_SCHEDULE_COMMAND, "reason": "done"},
        ("tenure.schedules.commands.TriggerSchedule", 1): {**_SCHEDULE_COMMAND, "reason": "run it now"},
        ("tenure.schedules.commands.RecordScheduledRun", 1): {
            **_SCHEDULE_COMMAND,
            "actor": "tenure-schedules",
            "targetRunId": "run_0a1b2c3d",
            "outcome": "ended",
            "status": "succeeded",
            "detail": "",
        },
        ("tenure.schedules.events.ScheduleCreated", 1): {
            **_SCHEDULE_EVENT, **_SCHEDULE_DEFINITION, "eventId": "sch_e1", "version": 1, "tenant": "acme",
            "nextRunAt": 1_774_661_400_000,
        },
        ("tenure.schedules.events.ScheduleUpdated", 1): {
            **_SCHEDULE_EVENT, **_SCHEDULE_DEFINITION, "eventId": "sch_e2", "version": 2,
            "nonexistentPolicy": "shift", "nextRunAt": 1_774_661_400_000,
        },
        ("tenure.schedules.events.SchedulePaused", 1): {
            **_SCHEDULE_EVENT, "eventId": "sch_e3", "version": 3, "reason": "Wartung — maintenance",
        },
        ("tenure.schedules.events.ScheduleResumed", 1): {
            **_SCHEDULE_EVENT, "eventId": "sch_e4", "version": 4, "reason": "done",
            "nextRunAt": 1_774_661_400_000,
        },
        ("tenure.schedules.events.FiringDecided", 1): {
            **_SCHEDULE_TIMER, **_FIRING, "eventId": "sch_e5", "version": 5, "manual": False,
            "targetRunId": "run_0a1b2c3d",
            "idempotencyKey": "schedule:sch_5e1d0c2b9a8f7e6d:2026-03-28T01:30:00Z",
            "coalesced": 0, "merged": 0, "nextRunAt": 1_774_830_600_000,
        },
        ("tenure.schedules.events.FiringSkipped", 1): {
            **_SCHEDULE_TIMER, **_FIRING, "eventId": "sch_e6", "version": 6, "reason": "overlap",
            "detail": "run run_0a1b2c3d is still active", "nextRunAt": 1_774_830_600_000,
        },
        ("tenure.schedules.events.FiringQueued", 1): {
            **_SCHEDULE_TIMER, **_FIRING, "eventId": "sch_e7", "version": 7, "merged": 2,
            "nextRunAt": 1_774_830_600_000,
        },
        ("tenure.schedules.events.FiringSubmitted", 1): {
            **_SCHEDULE_EVENT, "eventId": "sch_e8", "version": 8, "firingKey": _FIRING["firingKey"],
            "targetRunId": "run_0a1b2c3d",
        },
        ("tenure.schedules.events.ScheduledRunEnded", 1): {
            **_SCHEDULE_EVENT, "eventId": "sch_e9", "version": 9, "targetRunId": "run_0a1b2c3d",
            "status": "succeeded",
        },
        ("tenure.schedules.events.FiringRefused", 1): {
            **_SCHEDULE_EVENT, "eventId": "sch_e10", "version": 10, "targetRunId": "run_0a1b2c3d",
            "code": "ADMISSION_QUEUE_FULL", "detail": "tenant acme already has 100 queued runs (limit 100)",
        },
    }
)  # fmt: skip
