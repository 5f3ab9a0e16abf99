"""The schedules as readers see them (EXE-14): a fold of schedules.events, and the JSON view.

`ScheduleBoard` follows schedules.events and schedules.rejections from the beginning (a
`TopicFeed`), folds each schedule with the aggregate's own `evolve` (one fold per aggregate, none
written here) and remembers recent refusals by the id of the command refused, so the API can
answer a write with its outcome. `schedule_view` renders a state with its next firings in local
time and UTC (RFC 3339) and its history of firings.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from services.common import times
from services.common.contracts import CommandRejected
from services.common.contracts.schedules import SCHEDULE_EVENT_TYPES
from services.common.decisions import FollowerHealth
from services.common.feed import TopicFeed
from services.common.topics import SCHEDULES_EVENTS, SCHEDULES_REJECTIONS
from services.schedules.domain import (
    NonexistentPolicy,
    RepeatedPolicy,
    ScheduleState,
    evolve,
    next_firings,
    zone_of,
)

__all__ = ["ScheduleBoard", "rfc3339", "schedule_view"]

_MAX_REJECTIONS = 10_000


def rfc3339(ms: int, zone: str = "UTC") -> str:
    """A schedule's time to the second: UTC with a Z, or the local time of an IANA `zone`."""
    return times.rfc3339(ms, None if zone == "UTC" else zone_of(zone), timespec="seconds")


def schedule_view(state: ScheduleState, now_ms: int, upcoming: int = 5) -> dict[str, Any]:
    d = state.definition
    policies = NonexistentPolicy(d.nonexistent_policy), RepeatedPolicy(d.repeated_policy)
    after = max(now_ms, state.evaluated_until)
    future = (
        next_firings(d.cron, d.time_zone, after, upcoming, *policies)
        if state.status.value == "active"
        else []
    )
    return {
        "scheduleId": state.schedule_id,
        "version": state.version,
        "status": state.status.value,
        "tenant": state.tenant,
        "owner": state.owner,
        "agentRevisionId": d.agent_revision_id,
        "runTemplate": {
            "executionSpec": d.execution_spec,
            "retrySafe": d.retry_safe,
            "timeoutSeconds": d.timeout_seconds,
            "maxAttempts": d.max_attempts,
            "labels": dict(d.labels),
        },
        "timeZone": d.time_zone,
        "cron": d.cron,
        "overlapPolicy": d.overlap_policy,
        "misfirePolicy": d.misfire_policy,
        "dst": {"nonexistent": d.nonexistent_policy, "repeated": d.repeated_policy},
        "nextRunAt": rfc3339(state.next_run_at) if state.next_run_at and future else None,
        "nextFirings": [{"local": rfc3339(t, d.time_zone), "utc": rfc3339(t)} for t in future],
        "activeRuns": list(state.active_runs),
        "pending": _firing(state.pending, d.time_zone) if state.pending is not None else None,
        "fired": state.fired,
        "skipped": state.skipped,
        "history": [_firing(f, d.time_zone) for f in reversed(state.history)],
        "createdAt": rfc3339(state.created_at),
        "updatedAt": rfc3339(state.updated_at),
    }


def _firing(f: Any, zone: str) -> dict[str, Any]:
    return {
        "firingKey": f.firing_key,
        "scheduledAt": rfc3339(f.scheduled_at),
        "scheduledAtLocal": rfc3339(f.scheduled_at, zone),
        "status": f.status.value,
        "manual": f.manual,
        "runId": f.run_id or None,
        "detail": f.detail,
        "coalesced": f.coalesced,
        "merged": f.merged,
    }


class ScheduleBoard:
    """The schedules' fold and recent refusals, kept current by a `TopicFeed` (the one follower
    every board uses: readiness, retries and health are its)."""

    def __init__(self, bootstrap: str, client_id: str = "tenure-schedule-board") -> None:
        self._lock = threading.Condition()
        self._states: dict[str, ScheduleState] = {}
        self._rejections: OrderedDict[str, CommandRejected] = OrderedDict()
        self._feed = TopicFeed(
            bootstrap,
            (SCHEDULES_EVENTS.name, SCHEDULES_REJECTIONS.name),
            (*SCHEDULE_EVENT_TYPES, CommandRejected),
            self._fold,
            what="schedules",
            client_id=client_id,
            poll_timeout_s=0.05,
        )

    def close(self) -> None:
        self._feed.close()

    @property
    def failure(self) -> str | None:
        """Why the last read of the topics failed; None while reads succeed."""
        return self._feed.failure

    def health(self) -> FollowerHealth:
        return self._feed.health(f"{len(self._states)} schedules")

    def get(self, schedule_id: str) -> ScheduleState | None:
        with self._lock:
            return self._states.get(schedule_id)

    def states(self) -> list[ScheduleState]:
        with self._lock:
            return list(self._states.values())

    def wait(self, answered: Callable[[], Any], timeout_s: float) -> Any:
        """`answered()` once it is truthy (re-checked as events are folded), or None at the timeout."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                value = answered()
                left = deadline - time.monotonic()
                if value or left <= 0:
                    return value or None
                self._lock.wait(min(left, 0.2))

    def wait_current(self, timeout_s: float) -> bool:
        """True once the board has folded everything that was on the log when it started."""
        return self._feed.wait_until_current(timeout_s)

    def rejection(self, command_id: str) -> CommandRejected | None:
        with self._lock:
            return self._rejections.get(command_id)

    def _fold(self, message: object) -> None:
        with self._lock:
            if isinstance(message, SCHEDULE_EVENT_TYPES):
                before = self._states.get(message.run_id)
                if before is not None and message.version <= before.version:
                    return  # a repeat
                try:
                    self._states[message.run_id] = evolve(before, message)
                except ValueError:
                    return  # a gap this reader cannot fold; the next restart reads from the start
            elif isinstance(message, CommandRejected):
                self._rejections[message.causation_id] = message
                while len(self._rejections) > _MAX_REJECTIONS:
                    self._rejections.popitem(last=False)
            self._lock.notify_all()
