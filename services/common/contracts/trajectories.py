"""The Trajectory aggregate (the saga of one Run, SAGA-1..7, REC-1..7) and operator incidents.

One trajectory per Run: the aggregate id is the runId, so a trajectory's commands and events live
on the partition of its run. Tool parameters and outputs are arbitrary JSON chosen by each tool's
author, so they travel as canonical JSON strings; everything the orchestrator itself decides on
is a typed field. Money is a double in the currency of the deployment; durations are millis.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.contracts._headers import CommandHeader, EventHeader

__all__ = [
    "AbortTrajectory",
    "AdoptLease",
    "ApprovePivot",
    "CompensationCompleted",
    "CompensationFailed",
    "CompensationStackRetired",
    "FinishTrajectory",
    "IncidentOpened",
    "IncidentResolved",
    "LeaseAdopted",
    "LeaseRevocationRecorded",
    "PivotApproved",
    "PivotGateEvaluated",
    "ProposeStep",
    "RecordCompensationOutcome",
    "RecordLeaseRevocation",
    "RecordPivotGate",
    "RecordStepOutcome",
    "RecordWatchdogIntervention",
    "RecoveryDecided",
    "ResolveIncident",
    "StartTrajectory",
    "StepCommitted",
    "StepFailed",
    "StepIntentRecorded",
    "StepOutcomeUnknown",
    "TrajectoryCompleted",
    "TrajectoryFrozen",
    "TrajectoryRolledBack",
    "TrajectoryStarted",
    "WatchdogInterventionRecorded",
]

# --- commands -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StartTrajectory(CommandHeader):
    """The lease holder opens the saga of its run, optionally with a plan (a DAG of steps)."""

    attempt_id: str
    lease_epoch: int
    plan: str = ""
    pivot_approval: str = "none"
    budget_tokens: int = 200_000
    budget_steps: int = 50
    budget_money: float = 10.0
    rerun_cost_ms: int = 0
    rerun_cost_money: float = 0.0
    # v2 (QUA-2): the run's tenant, whose provenance graph gets each committed step's output.
    tenant: str | None = None


@dataclass(frozen=True, kw_only=True)
class ProposeStep(CommandHeader):
    """The runner proposes the next step (or, with repairOf >= 0, a repair of a failed step)."""

    attempt_id: str
    lease_epoch: int
    tool: str
    params: str
    plan_step_id: str = ""
    repair_of: int = -1
    tokens_used: int = 0
    money_used: float = 0.0


@dataclass(frozen=True, kw_only=True)
class RecordStepOutcome(CommandHeader):
    """The orchestrator's executor reports what the gateway answered for one dispatch."""

    step_index: int
    dispatch: int
    outcome: str
    output: str = ""
    partial_output: str = ""
    error_kind: str = ""
    error_message: str = ""
    error_status: int = 0
    reconciled: bool = False
    lease_epoch: int = 0


@dataclass(frozen=True, kw_only=True)
class RecordCompensationOutcome(CommandHeader):
    """The executor reports one compensator run: "compensated", "retriable" or "fatal"."""

    step_index: int
    attempt: int
    outcome: str
    error_kind: str = ""
    error_message: str = ""
    lease_epoch: int = 0


@dataclass(frozen=True, kw_only=True)
class RecordPivotGate(CommandHeader):
    """The executor's deterministic pre-pivot checks (verifiers, lease), as a JSON list."""

    step_index: int
    checks: str


@dataclass(frozen=True, kw_only=True)
class ApprovePivot(CommandHeader):
    """A human approves (or refuses) the pending pivot where the run's policy asks for it."""

    step_index: int
    decision: str
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class AdoptLease(CommandHeader):
    """The run's new lease holder (after a takeover) takes over the trajectory's dispatching."""

    attempt_id: str
    lease_epoch: int


@dataclass(frozen=True, kw_only=True)
class FinishTrajectory(CommandHeader):
    attempt_id: str
    lease_epoch: int


@dataclass(frozen=True, kw_only=True)
class AbortTrajectory(CommandHeader):
    """The runner gives up before the pivot: unwind everything committed so far."""

    attempt_id: str
    lease_epoch: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class RecordLeaseRevocation(CommandHeader):
    """The executor confirms the run's lease was revoked (its epoch bumped past `revoked_epoch`):
    for a frozen trajectory, `incident_id` names its incident (REC-7); for a semantic deadlock
    unwound before the pivot (WD-5 level 3, the trajectory ROLLED_BACK), it carries the id of the
    level-3 watchdog intervention instead, the one command an ended trajectory still takes."""

    incident_id: str
    revoked_epoch: int


@dataclass(frozen=True, kw_only=True)
class ResolveIncident(CommandHeader):
    """An operator resolves a frozen trajectory: "resume", "compensated-manually" or "abandon".

    "resume" continues under the lease the operator obtained (attemptId/leaseEpoch of it)."""

    incident_id: str
    resolution: str
    note: str = ""
    attempt_id: str = ""
    lease_epoch: int = 0


@dataclass(frozen=True, kw_only=True)
class RecordWatchdogIntervention(CommandHeader):
    """The semantic watchdog's intervention for this run (WD-5), sent in the transaction of its
    InterventionIssued: level 1 refuses the runner's next proposal of `action_hash` (and is
    delivered to it), level 2 tombstones `action_hash` for the run, level 3 ends the trajectory:
    unwound before the pivot, frozen with an incident after it (REC-7)."""

    intervention_id: str
    level: int
    code: str
    action_hash: str
    period: int
    checkpoint_step: int
    detector: str
    detail: str
    message: str


# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TrajectoryStarted(EventHeader):
    attempt_id: str
    epoch: int
    plan: str
    pivot_approval: str
    budget_tokens: int
    budget_steps: int
    budget_money: float
    rerun_cost_ms: int
    rerun_cost_money: float
    tenant: str | None = None  # v2 (QUA-2): None when the starter predates it


@dataclass(frozen=True, kw_only=True)
class StepIntentRecorded(EventHeader):
    """Intent before action: the step's dispatch is durable before the gateway may send it."""

    step_index: int
    dispatch: int
    tool: str
    gateway_tool: str
    operation: str
    params: str
    idempotency_key: str
    reversibility: str
    attempt_id: str
    epoch: int
    plan_step_id: str
    repair_of: int
    not_before: int
    status: str
    tokens_used: int
    money_used: float


@dataclass(frozen=True, kw_only=True)
class LeaseAdopted(EventHeader):
    """Work still owed is dispatched under the new lease from now on (its fencing epoch)."""

    attempt_id: str
    epoch: int
    previous_attempt_id: str
    previous_epoch: int


@dataclass(frozen=True, kw_only=True)
class PivotGateEvaluated(EventHeader):
    """The pre-pivot gate's verdict: "passed" records the pivot PREPARING (SAGA-6)."""

    step_index: int
    checks: str
    verdict: str
    detail: str


@dataclass(frozen=True, kw_only=True)
class PivotApproved(EventHeader):
    step_index: int
    approver: str
    decision: str
    note: str


@dataclass(frozen=True, kw_only=True)
class StepCommitted(EventHeader):
    """COMMITTED, and the bound compensator pushed on the LIFO stack in the same record."""

    step_index: int
    dispatch: int
    output: str
    compensation: str
    reconciled: bool
    stack_depth: int


@dataclass(frozen=True, kw_only=True)
class StepOutcomeUnknown(EventHeader):
    """DISPATCHED: the effect may have happened; the next dispatch reconciles first (REC-6)."""

    step_index: int
    dispatch: int
    detail: str


@dataclass(frozen=True, kw_only=True)
class StepFailed(EventHeader):
    step_index: int
    dispatch: int
    error_kind: str
    error_message: str
    error_status: int
    error_class: str
    signature: str
    partial_output: str
    compensation: str


@dataclass(frozen=True, kw_only=True)
class RecoveryDecided(EventHeader):
    """REC-1: D's decision for a failed step, with the gate that decided and every input."""

    step_index: int
    action: str
    gate: str
    reason: str
    error_class: str
    signature: str
    inputs: str


@dataclass(frozen=True, kw_only=True)
class CompensationStackRetired(EventHeader):
    """The pivot committed: the compensation stack is retired, never to be unwound (SAGA-6)."""

    pivot_step: int
    retired_steps: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class CompensationCompleted(EventHeader):
    """COMPENSATED, logged before the pop (SAGA-3)."""

    step_index: int
    attempt: int
    idempotency_key: str


@dataclass(frozen=True, kw_only=True)
class CompensationFailed(EventHeader):
    """A compensator failed: "retriable" (COMPENSATING, backs off) or "fatal" (PANIC)."""

    step_index: int
    attempt: int
    severity: str
    error_kind: str
    error_message: str
    not_before: int


@dataclass(frozen=True, kw_only=True)
class TrajectoryCompleted(EventHeader):
    steps: int


@dataclass(frozen=True, kw_only=True)
class TrajectoryRolledBack(EventHeader):
    """Cleanly aborted: every committed effect before the pivot was compensated."""

    compensated_steps: tuple[int, ...]
    reason: str


@dataclass(frozen=True, kw_only=True)
class TrajectoryFrozen(EventHeader):
    """REC-7 terminal escalation: no more dispatch; an incident is opened for an operator."""

    incident_id: str
    failure_mode: str
    failed_step: int
    failed_tool: str
    error_context: str
    uncompensated: str
    snapshot_ref: str
    epoch: int


@dataclass(frozen=True, kw_only=True)
class LeaseRevocationRecorded(EventHeader):
    incident_id: str
    revoked_epoch: int


@dataclass(frozen=True, kw_only=True)
class IncidentResolved(EventHeader):
    incident_id: str
    resolution: str
    note: str
    attempt_id: str
    epoch: int


@dataclass(frozen=True, kw_only=True)
class WatchdogInterventionRecorded(EventHeader):
    """The trajectory took in a watchdog intervention (its fields as the command gave them)."""

    intervention_id: str
    level: int
    code: str
    action_hash: str
    period: int
    checkpoint_step: int
    detector: str
    detail: str
    message: str


@dataclass(frozen=True, kw_only=True)
class IncidentOpened:
    """On tenure.incidents, the out-of-band channel (REC-7); keyed by runId.

    Published after the TrajectoryFrozen event is committed, naming its exact log position;
    at-least-once, so consumers drop repeats by incidentId."""

    incident_id: str
    run_id: str
    occurred_at: int
    failure_mode: str
    failed_step: int
    failed_tool: str
    error_context: str
    uncompensated: str
    snapshot_ref: str
    log_topic: str
    log_partition: int
    log_offset: int
