"""Building observations and driving the watchdog's pure core, for the watchdog's tests."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.common.contracts import (
    AcknowledgeRollback,
    ConfigureWatchdog,
    InterventionIssued,
    LoopDetected,
    ObserveStep,
    WatchdogEvent,
)
from services.common.ids import action_hash, run_id_for
from services.watchdog.domain import DEFAULT_THRESHOLDS, Rejection, Thresholds, WatchdogState, decide, evolve

RUN = run_id_for("acme", "watchdog-tests")
T0 = 1_767_225_600_000


def state_hash(label: str) -> str:
    """A stand-in for the SHA-256 of a canonical snapshot: the snapshot is named by its label."""
    return hashlib.sha256(label.encode()).hexdigest()


def observe(
    seq: int,
    tool: str = "fs.edit",
    args: Any = None,
    state: str | None = None,
    *,
    run_id: str = RUN,
    source: str = "runner",
    summary: str = "",
    metrics: Sequence[float] = (),
    error: str = "none",
    polling: bool = False,
    mutating: bool = True,
) -> ObserveStep:
    return ObserveStep(
        command_id=f"obs-{run_id}-{source}-{seq}",
        run_id=run_id,
        issued_at=T0 + seq,
        correlation_id=run_id,
        actor="runner:tests",
        source=source,
        step_seq=seq,
        tool=tool,
        action_hash=action_hash(tool, {} if args is None else args),
        state_hash=state_hash(state) if state else "",
        summary=summary,
        metrics=tuple(float(m) for m in metrics),
        error_kind=error,
        polling=polling,
        mutating=mutating,
    )


def acknowledge(intervention_id: str, checkpoint_step: int = -1, run_id: str = RUN) -> AcknowledgeRollback:
    return AcknowledgeRollback(
        command_id=f"ack-{intervention_id}",
        run_id=run_id,
        issued_at=T0,
        correlation_id=run_id,
        actor="runner:tests",
        intervention_id=intervention_id,
        checkpoint_step=checkpoint_step,
    )


def configure(command_id: str = "cfg-1", run_id: str = RUN, **overrides: int) -> ConfigureWatchdog:
    return ConfigureWatchdog(
        command_id=command_id, run_id=run_id, issued_at=T0, correlation_id=run_id, actor="tests", **overrides
    )


@dataclass
class Watchdog:
    """One run's watchdog driven through decide/evolve, as the processor would."""

    thresholds: Thresholds = DEFAULT_THRESHOLDS
    state: WatchdogState | None = None
    events: list[WatchdogEvent] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    now_ms: int = T0

    def send(self, command: Any) -> tuple[WatchdogEvent, ...] | Rejection:
        self.now_ms += 1000
        decision = decide(self.state, command, self.now_ms, self.thresholds)
        if isinstance(decision, Rejection):
            self.rejections.append(decision)
            return decision
        for event in decision:
            self.state = evolve(self.state, event)
        self.events.extend(decision)
        return decision

    def run(self, commands: Iterable[Any]) -> Watchdog:
        for command in commands:
            self.send(command)
        return self

    def detections(self) -> list[LoopDetected]:
        return [e for e in self.events if isinstance(e, LoopDetected)]

    def interventions(self) -> list[InterventionIssued]:
        return [e for e in self.events if isinstance(e, InterventionIssued)]

    def levels(self) -> list[int]:
        return [e.level for e in self.interventions()]
