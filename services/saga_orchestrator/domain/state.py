"""Immutable state of a trajectory, folded from its events by `evolve` (trajectory.py).

Everything an event says is kept as the event said it (JSON strings stay strings), so replaying
the log reproduces the state exactly without the tool catalog or a clock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from services.saga_orchestrator.domain.lifecycle import StepStatus, TrajectoryStatus

__all__ = [
    "OPEN_STEP_STATUSES",
    "Incident",
    "StepState",
    "TrajectoryState",
    "compensation_key",
    "step_key",
]

OPEN_STEP_STATUSES = frozenset(
    {StepStatus.AWAITING_GATE, StepStatus.PREPARING, StepStatus.PENDING, StepStatus.DISPATCHED}
)


def step_key(run_id: str, step_index: int, dispatch: int) -> str:
    """The idempotency key of one dispatch: assigned by the orchestrator, never the model (SAGA-1).

    A new key per dispatch, because a definite failure is final for its key at the gateway; an
    unknown outcome is retried under the SAME dispatch, hence the same key, after a probe."""
    return f"{run_id}/s{step_index}/d{dispatch}"


def compensation_key(run_id: str, step_index: int, attempt: int) -> str:
    return f"{run_id}/s{step_index}/c{attempt}"


@dataclass(frozen=True)
class StepState:
    index: int
    tool: str
    gateway_tool: str
    operation: str
    reversibility: str
    params: str
    plan_step_id: str
    status: StepStatus
    dispatch: int
    idempotency_key: str
    not_before: int = 0
    output: str = ""
    compensation: str = ""  # JSON {gatewayTool, operation, params, costMs, costMoney}; "" = none
    error_kind: str = ""
    error_message: str = ""
    error_status: int = 0
    error_class: str = ""
    signatures: tuple[str, ...] = ()  # this step's error signatures, oldest first (REC-5)
    consecutive_repairs: int = 0
    transient_retries: int = 0
    unknown_outcomes: int = 0
    repairing_kind: str = ""  # the error kind the current dispatch is a repair of
    gate_checks: str = ""
    gate_verdict: str = ""
    approval: str = ""  # "", "approve" or "refuse"
    compensation_attempt: int = 1
    compensation_not_before: int = 0

    @property
    def is_pivot(self) -> bool:
        return self.reversibility == "III"

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_STEP_STATUSES

    def compensation_spec(self) -> dict[str, Any]:
        value = json.loads(self.compensation) if self.compensation else {}
        return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Incident:
    incident_id: str
    failure_mode: str
    failed_step: int
    resume_to: TrajectoryStatus
    epoch: int
    revoked_epoch: int = 0


@dataclass(frozen=True)
class TrajectoryState:
    run_id: str
    version: int
    status: TrajectoryStatus
    attempt_id: str
    epoch: int
    pivot_approval: str
    budget_tokens: int
    budget_steps: int
    budget_money: float
    rerun_cost_ms: int
    rerun_cost_money: float
    plan: str = ""  # the compiled plan as canonical JSON: {"order": [...], "pivot": id, "outbox": [...]}
    steps: tuple[StepState, ...] = ()
    stack: tuple[int, ...] = ()  # step indexes; the top of the LIFO stack is the last item
    pivot_step: int = -1
    compensated: tuple[int, ...] = ()  # in unwind order
    incident: Incident | None = None
    causes: frozenset[str] = field(default_factory=frozenset)  # command ids already decided
    # The semantic watchdog's interventions (WD-5, RecordWatchdogIntervention):
    # the action hash (services.common.ids.action_hash) a level-1 interrupt refuses, until the
    # runner's next accepted proposal of another action;
    interrupt_action: str = ""
    # the action hashes tombstoned for this run (level 2): refused whenever proposed;
    tombstones: tuple[str, ...] = ()
    # level 3 recorded: no proposal is accepted; unwound (before the pivot) or frozen once no
    # step is in flight;
    semantic_deadlock: bool = False
    # the latest intervention as canonical JSON {interventionId, level, code, actionHash, period,
    # checkpointStep, detector, detail, message}, for the runner's next answer; "" = none.
    watchdog_intervention: str = ""
    # the id of the level-3 intervention that made the deadlock (kept apart from the latest one,
    # which a later intervention replaces): the key of the lease revocation it owes;
    deadlock_intervention: str = ""
    # the epoch whose lease was revoked for a deadlock unwound before the pivot (0 = not yet);
    # after the pivot the incident records it instead (Incident.revoked_epoch).
    deadlock_revoked_epoch: int = 0
    # the run's tenant (StartTrajectory v2): its provenance graph gets each committed step's
    # output as an artifact (QUA-2); "" when the trajectory was started before v2 (none is).
    tenant: str = ""

    def step(self, index: int) -> StepState | None:
        return self.steps[index] if 0 <= index < len(self.steps) else None

    def with_step(self, step: StepState) -> TrajectoryState:
        steps = list(self.steps)
        if step.index == len(steps):
            steps.append(step)
        else:
            steps[step.index] = step
        return replace(self, steps=tuple(steps))

    @property
    def pivot_committed(self) -> bool:
        pivot = self.step(self.pivot_step)
        return pivot is not None and pivot.status is StepStatus.COMMITTED

    @property
    def owes_deadlock_revocation(self) -> bool:
        """WD-5 level 3 before the pivot: once the unwind is done (and only then: the compensators
        run under the current epoch), the run's lease is revoked, once. An unwind that froze on
        the way, whose incident revoked the lease already (REC-7), owes nothing more."""
        return (
            self.status is TrajectoryStatus.ROLLED_BACK
            and self.semantic_deadlock
            and bool(self.deadlock_intervention)
            and not self.deadlock_revoked_epoch
            and not (self.incident is not None and self.incident.revoked_epoch)
        )

    @property
    def open_step(self) -> StepState | None:
        return next((s for s in self.steps if s.is_open), None)

    def plan_value(self) -> dict[str, Any]:
        value = json.loads(self.plan) if self.plan else {}
        return value if isinstance(value, dict) else {}

    def next_plan_step(self) -> dict[str, Any] | None:
        """The first plan step (in compiled order) no step has executed yet."""
        done = {s.plan_step_id for s in self.steps if s.plan_step_id}
        for item in self.plan_value().get("order", []):
            if isinstance(item, dict) and item.get("stepId") not in done:
                return item
        return None
