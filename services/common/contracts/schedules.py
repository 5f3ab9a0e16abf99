"""The Schedule aggregate's commands and events (EXE-14): cron in an IANA zone, overlap, misfire.

The aggregate id is the SCHEDULE id ("sch_<hex>"), in the header's `run_id` slot (the one
aggregate runtime and every Tenure contract name their aggregate there); records are keyed by
it on schedules.commands / schedules.events / schedules.rejections and routed by a stable hash
(services.common.routing `partition_for_schedule`). Times are epoch milliseconds in UTC on the
schedules processor's clock; `scheduled_at` is always a UTC instant, never a local reading.

A firing's key is scheduleId + scheduledAt (a manual run: scheduleId + "manual" + the trigger's
command id) and is the idempotency key of the run it submits, so one firing is one run.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Union

from services.common.contracts._headers import CommandHeader, EventHeader

__all__ = [
    "FIRING_KEY_PREFIX",
    "SCHEDULE_COMMANDS_NS",
    "SCHEDULE_COMMAND_TYPES",
    "SCHEDULE_EVENTS_NS",
    "SCHEDULE_EVENT_TYPES",
    "SCHEDULE_ID_PATTERN",
    "CreateSchedule",
    "FiringDecided",
    "FiringQueued",
    "FiringRefused",
    "FiringSkipped",
    "FiringSubmitted",
    "PauseSchedule",
    "RecordScheduledRun",
    "ResumeSchedule",
    "ScheduleCommand",
    "ScheduleCreated",
    "ScheduleEvent",
    "SchedulePaused",
    "ScheduleRejectionCode",
    "ScheduleResumed",
    "ScheduleUpdated",
    "ScheduledRunEnded",
    "TriggerSchedule",
    "UpdateSchedule",
]

SCHEDULE_COMMANDS_NS = "tenure.schedules.commands"
SCHEDULE_EVENTS_NS = "tenure.schedules.events"
SCHEDULE_ID_PATTERN = r"sch_[0-9a-f]{8,40}"
# Idempotency keys of runs a schedule submits start with it: "schedule:<scheduleId>:...".
FIRING_KEY_PREFIX = "schedule:"


class ScheduleRejectionCode(StrEnum):
    """The schedule's rejection codes; the value is CommandRejected.code."""

    INVALID_COMMAND = "INVALID_COMMAND"
    INVALID_CRON = "INVALID_CRON"
    UNKNOWN_TIME_ZONE = "UNKNOWN_TIME_ZONE"
    SCHEDULE_EXISTS = "SCHEDULE_EXISTS"
    SCHEDULE_NOT_FOUND = "SCHEDULE_NOT_FOUND"
    SCHEDULE_PAUSED = "SCHEDULE_PAUSED"
    SCHEDULE_ACTIVE = "SCHEDULE_ACTIVE"
    UNKNOWN_RUN = "UNKNOWN_RUN"


class _Schedule:
    """`schedule_id`: the aggregate id under its real name (the header's `run_id` slot)."""

    run_id: str

    @property
    def schedule_id(self) -> str:
        return self.run_id


@dataclass(frozen=True, kw_only=True)
class _Definition:
    """What a schedule runs and when: the pinned agent revision, the run template, the zone, the
    cron expression and the policies (overlap skip|queue, misfire skip|coalesce, DST)."""

    agent_revision_id: str
    execution_spec: str
    retry_safe: bool
    timeout_seconds: int
    max_attempts: int
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    time_zone: str
    cron: str
    overlap_policy: str
    misfire_policy: str
    nonexistent_policy: str
    repeated_policy: str


# --- commands (schedules.commands) ------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CreateSchedule(_Schedule, _Definition, CommandHeader):
    tenant: str


@dataclass(frozen=True, kw_only=True)
class UpdateSchedule(_Schedule, _Definition, CommandHeader):
    """The whole new definition (the API merges a PATCH onto the current one)."""


@dataclass(frozen=True, kw_only=True)
class PauseSchedule(_Schedule, CommandHeader):
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class ResumeSchedule(_Schedule, CommandHeader):
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class TriggerSchedule(_Schedule, CommandHeader):
    """A manual run, now: its own key (scheduleId + "manual" + this command's id)."""

    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class RecordScheduledRun(_Schedule, CommandHeader):
    """What the Run a firing submitted did, as the schedules processor's follower of runs.events
    and runs.rejections saw it. `outcome`: "submitted", "ended" (with the run's `status`) or
    "refused" (the coordinator refused the SubmitRun; `status` is its rejection code)."""

    target_run_id: str
    outcome: str
    status: str = ""
    detail: str = ""


# --- events (schedules.events) ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ScheduleCreated(_Schedule, _Definition, EventHeader):
    tenant: str
    next_run_at: int


@dataclass(frozen=True, kw_only=True)
class ScheduleUpdated(_Schedule, _Definition, EventHeader):
    next_run_at: int


@dataclass(frozen=True, kw_only=True)
class SchedulePaused(_Schedule, EventHeader):
    reason: str


@dataclass(frozen=True, kw_only=True)
class ScheduleResumed(_Schedule, EventHeader):
    reason: str
    next_run_at: int


@dataclass(frozen=True, kw_only=True)
class FiringDecided(_Schedule, EventHeader):
    """The intent of a firing, durable before its run exists: the SubmitRun for `target_run_id`
    under `idempotency_key` is committed in the same transaction. `coalesced`: scheduled times
    of a downtime merged into this firing besides its own; `merged`: queued firings it carries."""

    firing_key: str
    scheduled_at: int
    manual: bool
    target_run_id: str
    idempotency_key: str
    coalesced: int
    merged: int
    next_run_at: int


@dataclass(frozen=True, kw_only=True)
class FiringSkipped(_Schedule, EventHeader):
    """A scheduled time that starts no run. `reason`: "overlap" (the previous run was active,
    overlapPolicy skip) or "misfire" (missed while down or paused, misfirePolicy skip)."""

    firing_key: str
    scheduled_at: int
    reason: str
    detail: str
    next_run_at: int


@dataclass(frozen=True, kw_only=True)
class FiringQueued(_Schedule, EventHeader):
    """overlapPolicy queue: held until the active run ends. At most one is pending; a later
    firing merges into it (`merged` counts them all, this one included)."""

    firing_key: str
    scheduled_at: int
    merged: int
    next_run_at: int


@dataclass(frozen=True, kw_only=True)
class FiringSubmitted(_Schedule, EventHeader):
    firing_key: str
    target_run_id: str


@dataclass(frozen=True, kw_only=True)
class ScheduledRunEnded(_Schedule, EventHeader):
    target_run_id: str
    status: str


@dataclass(frozen=True, kw_only=True)
class FiringRefused(_Schedule, EventHeader):
    target_run_id: str
    code: str
    detail: str


ScheduleCommand = Union[
    CreateSchedule, UpdateSchedule, PauseSchedule, ResumeSchedule, TriggerSchedule, RecordScheduledRun
]
ScheduleEvent = Union[
    ScheduleCreated,
    ScheduleUpdated,
    SchedulePaused,
    ScheduleResumed,
    FiringDecided,
    FiringSkipped,
    FiringQueued,
    FiringSubmitted,
    ScheduledRunEnded,
    FiringRefused,
]
SCHEDULE_COMMAND_TYPES: tuple[type[Any], ...] = typing.get_args(ScheduleCommand)
SCHEDULE_EVENT_TYPES: tuple[type[Any], ...] = typing.get_args(ScheduleEvent)
