"""The lifecycles of a schedule and of one firing (EXE-14), as StrEnums with transition tables.

Schedule:  ACTIVE  fires on its cron;  PAUSED  does not (firings missed while paused are
           misfires when it resumes). Update keeps the status.
Firing:    QUEUED (overlap queue, held until the active run ends) -> DECIDED (intent durable,
           SubmitRun committed with it) -> SUBMITTED (the run exists) -> ENDED; DECIDED may also
           end as REFUSED (the coordinator refused the run) or go straight to ENDED (the run
           ended before its submission was seen). SKIPPED never starts a run.

`evolve` moves only along these tables and raises IllegalTransition otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

__all__ = [
    "FIRING_TRANSITIONS",
    "TRANSITIONS",
    "FiringStatus",
    "IllegalTransition",
    "ScheduleStatus",
    "check_firing",
    "check_transition",
]


class ScheduleStatus(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"


class FiringStatus(StrEnum):
    QUEUED = "queued"
    DECIDED = "decided"
    SUBMITTED = "submitted"
    ENDED = "ended"
    REFUSED = "refused"
    SKIPPED = "skipped"


S, F = ScheduleStatus, FiringStatus
TRANSITIONS: Mapping[ScheduleStatus, frozenset[ScheduleStatus]] = {
    S.ACTIVE: frozenset({S.ACTIVE, S.PAUSED}),
    S.PAUSED: frozenset({S.PAUSED, S.ACTIVE}),
}
FIRING_TRANSITIONS: Mapping[FiringStatus, frozenset[FiringStatus]] = {
    F.QUEUED: frozenset({F.DECIDED}),
    F.DECIDED: frozenset({F.SUBMITTED, F.ENDED, F.REFUSED}),
    F.SUBMITTED: frozenset({F.ENDED}),
    F.ENDED: frozenset(),
    F.REFUSED: frozenset(),
    F.SKIPPED: frozenset(),
}


class IllegalTransition(ValueError):
    pass


def check_transition(before: ScheduleStatus, after: ScheduleStatus) -> ScheduleStatus:
    if after not in TRANSITIONS[before]:
        raise IllegalTransition(f"schedule: {before.value} -> {after.value} is not allowed")
    return after


def check_firing(before: FiringStatus, after: FiringStatus) -> FiringStatus:
    if after not in FIRING_TRANSITIONS[before]:
        raise IllegalTransition(f"firing: {before.value} -> {after.value} is not allowed")
    return after
