"""What every decision shares: the inputs beside the state, the rejection value and the emitter."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.common.contracts import TrajectoryEvent, TrajectoryRejectionCode
from services.common.ids import derived_id
from services.saga_orchestrator.domain.evolve import evolve
from services.saga_orchestrator.domain.policy import RecoveryPolicy
from services.saga_orchestrator.domain.repair_stats import RepairStats
from services.saga_orchestrator.domain.state import TrajectoryState
from services.saga_orchestrator.domain.tools import ToolCatalog

__all__ = ["Emitter", "Rejection", "SagaContext"]


@dataclass(frozen=True)
class SagaContext:
    """Everything `decide` needs besides the state and the command: values, never services."""

    catalog: ToolCatalog
    policy: RecoveryPolicy = field(default_factory=RecoveryPolicy)
    stats: RepairStats = field(default_factory=RepairStats)
    # An outcome still unknown after this many reconciling dispatches freezes the run (REC-7).
    max_unknown_outcomes: int = 4
    # A compensator still failing retriably after this many attempts is treated as fatal.
    max_compensation_attempts: int = 6


@dataclass(frozen=True)
class Rejection:
    code: TrajectoryRejectionCode
    detail: str
    state: TrajectoryState | None = None


class Emitter:
    """Builds a decision's events one by one, folding each at once into `state`."""

    def __init__(
        self, state: TrajectoryState | None, command: Any, now_ms: int, context: SagaContext
    ) -> None:
        self._state = state
        self._command = command
        self.now_ms = now_ms
        self.context = context
        self.events: list[TrajectoryEvent] = []

    @property
    def state(self) -> TrajectoryState:
        assert self._state is not None, "no trajectory yet"
        return self._state

    @property
    def command(self) -> Any:
        return self._command

    def emit(self, kind: type[Any], **fields: Any) -> Any:
        version = (self._state.version if self._state is not None else 0) + 1
        cause = self._command.command_id
        event = kind(
            event_id=derived_id("evt", cause, kind.__name__, str(version)),
            run_id=self._command.run_id,
            version=version,
            occurred_at=self.now_ms,
            causation_id=cause,
            correlation_id=self._command.correlation_id,
            actor=self._command.actor,
            **fields,
        )
        self._state = evolve(self._state, event)
        self.events.append(event)
        return event
