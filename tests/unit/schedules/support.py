"""Helpers for the schedule core's tests: commands with defaults, a fold-as-you-go driver."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from services.common.contracts.schedules import CreateSchedule, RecordScheduledRun, ScheduleCommand
from services.schedules.domain import Rejection, ScheduleState, decide, decide_timers, evolve

__all__ = ["SID", "Driver", "at", "create"]

SID = "sch_0123456789abcdef"


def at(text: str, zone: str = "UTC") -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone)).timestamp() * 1000)


def create(**overrides: Any) -> CreateSchedule:
    fields: dict[str, Any] = {
        "command_id": "cmd-create",
        "run_id": SID,
        "issued_at": 0,
        "correlation_id": "corr",
        "actor": "user:alice",
        "tenant": "acme",
        "agent_revision_id": "agrev-1",
        "execution_spec": '{"entrypoint":"triage"}',
        "retry_safe": False,
        "timeout_seconds": 600,
        "max_attempts": 1,
        "time_zone": "Europe/Berlin",
        "cron": "30 2 * * *",
        "overlap_policy": "skip",
        "misfire_policy": "coalesce",
        "nonexistent_policy": "skip",
        "repeated_policy": "first",
    }
    fields.update(overrides)
    return CreateSchedule(**fields)


class Driver:
    """Applies decisions to a state as the processor would; keeps every event."""

    def __init__(self, command: CreateSchedule, now_ms: int) -> None:
        self.state: ScheduleState | None = None
        self.events: list[Any] = []
        self.send(command, now_ms)

    @property
    def s(self) -> ScheduleState:
        assert self.state is not None
        return self.state

    def _apply(self, events: Any) -> list[Any]:
        for event in events:
            self.state = evolve(self.state, event)
        self.events.extend(events)
        return list(events)

    def send(self, command: ScheduleCommand, now_ms: int) -> list[Any]:
        decision = decide(self.state, command, now_ms)
        assert not isinstance(decision, Rejection), decision
        return self._apply(decision)

    def tick(self, now_ms: int) -> list[Any]:
        return self._apply(decide_timers(self.s, now_ms))

    def end_run(self, run_id: str, now_ms: int, status: str = "succeeded") -> list[Any]:
        return self.send(
            RecordScheduledRun(
                command_id=f"end-{run_id}",
                run_id=SID,
                issued_at=now_ms,
                correlation_id="c",
                actor="tenure-schedules",
                target_run_id=run_id,
                outcome="ended",
                status=status,
            ),
            now_ms,
        )
