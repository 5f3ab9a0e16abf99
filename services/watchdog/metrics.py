"""The semantic watchdog's metrics, counted from the events it commits (WD-2..WD-5).

`tenure_watchdog_detections_total{detector}` (cycle, stagnation, oscillation,
repeated-bad-action) and `tenure_watchdog_interventions_total{level}` (1 oscillation notice,
2 rollback, 3 semantic deadlock): both bounded by the domain's enums.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.contracts import InterventionIssued, LoopDetected
from services.common.metrics import ProcessorMetrics, counter

__all__ = ["WatchdogMetrics"]


class WatchdogMetrics:
    def __init__(self, metrics: ProcessorMetrics) -> None:
        r = metrics.registry
        self._detections = counter(
            r, "tenure_watchdog_detections", "Loops detected (WD-2..WD-4), by detector.", ["detector"]
        )
        self._interventions = counter(
            r,
            "tenure_watchdog_interventions",
            "Interventions issued (WD-5), by rung of the ladder: 1 notice, 2 rollback, 3 deadlock.",
            ["level"],
        )
        metrics.on_commit(self.count)

    def count(self, events: Sequence[object]) -> None:
        for event in events:
            if isinstance(event, InterventionIssued):
                self._interventions.labels(str(event.level)).inc()
            elif isinstance(event, LoopDetected):
                self._detections.labels(event.detector).inc()
