"""The state of one schedule: the fold of its events (services/schedules/domain/evolve.py)."""

from __future__ import annotations

from dataclasses import dataclass

from services.schedules.domain.lifecycle import FiringStatus, ScheduleStatus

__all__ = ["MAX_HISTORY", "MAX_RECENT", "Definition", "Firing", "ScheduleState"]

# Firings the state (and so the view) keeps, newest last; older ones live in the log.
MAX_HISTORY = 50
# Ids of accepted commands kept, so a redelivery is answered with nothing.
MAX_RECENT = 32


@dataclass(frozen=True)
class Definition:
    agent_revision_id: str
    execution_spec: str
    retry_safe: bool
    timeout_seconds: int
    max_attempts: int
    labels: tuple[tuple[str, str], ...]
    time_zone: str
    cron: str
    overlap_policy: str
    misfire_policy: str
    nonexistent_policy: str
    repeated_policy: str


@dataclass(frozen=True)
class Firing:
    firing_key: str
    scheduled_at: int
    status: FiringStatus
    manual: bool = False
    run_id: str = ""
    detail: str = ""
    decided_at: int = 0
    coalesced: int = 0
    merged: int = 0


@dataclass(frozen=True)
class ScheduleState:
    """`evaluated_until`: every scheduled time at or before it has been handled (fired, skipped
    or queued). `active_runs`: runs of this schedule not known to have ended. `pending`: the one
    queued firing (overlap queue), if any."""

    schedule_id: str
    version: int
    status: ScheduleStatus
    tenant: str
    owner: str
    definition: Definition
    next_run_at: int = 0
    evaluated_until: int = 0
    active_runs: tuple[str, ...] = ()
    pending: Firing | None = None
    history: tuple[Firing, ...] = ()
    recent: tuple[str, ...] = ()
    fired: int = 0
    skipped: int = 0
    created_at: int = 0
    updated_at: int = 0

    @property
    def run_id(self) -> str:
        """The aggregate id under the runtime's conventional name."""
        return self.schedule_id
