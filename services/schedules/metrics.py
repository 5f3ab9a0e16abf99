"""The schedules' metrics, counted from the firings the schedules processor commits (EXE-14).

`tenure_schedule_firing_lag_seconds`: from a firing's scheduled time to the tick that decided
it (a manual trigger has no scheduled lateness and is not observed); a firing decided after a
downtime shows the downtime. `tenure_schedule_firings_total{outcome}`: decided, queued, skipped.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.contracts.schedules import FiringDecided, FiringQueued, FiringSkipped
from services.common.metrics import ProcessorMetrics, counter, histogram

__all__ = ["ScheduleMetrics"]

# A tick decides a due firing within its interval (100 ms); a downtime makes it minutes or hours.
_LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


class ScheduleMetrics:
    def __init__(self, metrics: ProcessorMetrics) -> None:
        r = metrics.registry
        self._lag = histogram(
            r,
            "tenure_schedule_firing_lag_seconds",
            "From a firing's scheduled time to its decision (scheduled firings only).",
            buckets=_LAG_BUCKETS,
        )
        self._firings = counter(
            r, "tenure_schedule_firings", "Scheduled times handled, by outcome.", ["outcome"]
        )
        metrics.on_commit(self.count)

    def count(self, events: Sequence[object]) -> None:
        for event in events:
            if isinstance(event, FiringDecided):
                self._firings.labels("decided").inc()
                if not event.manual:
                    self._lag.observe(max(0, event.occurred_at - event.scheduled_at) / 1000)
            elif isinstance(event, FiringQueued):
                self._firings.labels("queued").inc()
            elif isinstance(event, FiringSkipped):
                self._firings.labels("skipped").inc()
