"""The Trajectory aggregate's recovery metrics, counted from the events the orchestrator commits.

`tenure_recovery_decisions_total{gate,decision}`: every RecoveryDecided (REC-1), by the gate that
decided it and the action it chose; `tenure_pivot_gate_verdicts_total{verdict}`: the pre-pivot
gate's verdicts (SAGA-6). Both label sets are the policy's enums: bounded.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.contracts import PivotGateEvaluated, RecoveryDecided
from services.common.metrics import ProcessorMetrics, counter

__all__ = ["RecoveryMetrics"]


class RecoveryMetrics:
    def __init__(self, metrics: ProcessorMetrics) -> None:
        r = metrics.registry
        self._decisions = counter(
            r,
            "tenure_recovery_decisions",
            "Recovery decisions for failed steps (REC-1), by the gate that decided and the action.",
            ["gate", "decision"],
        )
        self._verdicts = counter(
            r, "tenure_pivot_gate_verdicts", "Pre-pivot gate verdicts (SAGA-6).", ["verdict"]
        )
        metrics.on_commit(self.count)

    def count(self, events: Sequence[object]) -> None:
        for event in events:
            if isinstance(event, RecoveryDecided):
                self._decisions.labels(event.gate, event.action).inc()
            elif isinstance(event, PivotGateEvaluated):
                self._verdicts.labels(event.verdict).inc()
