"""The command API's other 2xx bodies (sagas, watchdog, schedules, breakers, quarantine,
artifacts, the block policy, health), as documentation models: see `responses_runs.py`.

Declared from the view builders: services/projections/trajectory_views.py `render_trajectory`,
services/projections/watchdog_views.py `render_watchdog`, services/schedules/view.py,
routes_breakers.py `describe_breaker`, services/quarantine/view.py, routes_admin.py.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.command_api.responses_runs import Body, Intervention, Ms, Rfc3339

__all__ = [
    "ArtifactListing",
    "ArtifactView",
    "BlockChange",
    "BlockList",
    "BreakerList",
    "BreakerOverrideAnswer",
    "BreakerView",
    "BulkheadConfig",
    "Health",
    "IncidentList",
    "IncidentView",
    "ObservationAnswer",
    "ProblemDescription",
    "QuarantineView",
    "Readiness",
    "ScheduleList",
    "SchedulePending",
    "ScheduleView",
    "StepTicket",
    "TrajectoryStep",
    "TrajectoryView",
    "WatchdogView",
]


class ProblemDescription(Body):
    type: str
    title: str
    status: int
    meaning: str


class Health(Body):
    status: str
    service: str
    developmentMode: bool | None = None


class Readiness(Health):
    checks: dict[str, dict[str, Any]] = Field(description="Each dependency: {ready, detail, lag?}.")


# --- sagas --------------------------------------------------------------------------------------


class TrajectoryStep(Body):
    index: int
    tool: str
    status: str
    dispatch: int | None = None
    idempotencyKey: str | None = None
    operation: str | None = None
    reversibility: str | None = None
    pivot: bool | None = None
    params: Any = None
    output: Any = None
    error: dict[str, Any] | None = None
    dispatches: list[dict[str, Any]] | None = None


class IncidentView(Body):
    incidentId: str
    runId: str
    failureMode: str
    failedStep: int | None = None
    failedTool: str | None = None
    uncompensated: list[Any] | None = None
    epoch: int | None = None
    openedAt: Ms
    openedAtRfc3339: Rfc3339
    version: int | None = None
    resolution: str | None = None
    resolvedAt: int | None = None
    resolvedAtRfc3339: Rfc3339
    resolvedBy: str | None = None


class IncidentList(Body):
    items: list[IncidentView] = Field(description="Open incidents, oldest first (REC-7).")


class TrajectoryView(Body):
    """A run's saga trajectory as GET /runs/{runId}/trajectory shows it (and its commands answer)."""

    runId: str
    version: int
    status: str
    terminal: bool
    attemptId: str
    epoch: int
    pivotApproval: str
    budget: dict[str, float] = Field(description="What is left: tokens, steps, money (REC-3).")
    rerunCost: dict[str, float]
    plan: Any
    pivotStep: int | None
    pivotCommitted: bool
    stack: list[int]
    compensated: list[int]
    openStep: int | None
    steps: list[TrajectoryStep]
    decisions: list[dict[str, Any]]
    incident: IncidentView | None
    incidents: list[IncidentView]
    recentCommands: list[dict[str, Any]]
    watchdog: dict[str, Any]
    startedAt: Ms
    startedAtRfc3339: Rfc3339
    updatedAt: Ms
    updatedAtRfc3339: Rfc3339


class StepTicket(Body):
    """202: the step's intent is recorded; poll the trajectory for its outcome."""

    runId: str
    stepIndex: int
    dispatch: int
    idempotencyKey: str
    tool: str
    status: str
    commandId: str
    replayed: bool
    version: int | None = None
    watchdog: Intervention = None


# --- the semantic watchdog ----------------------------------------------------------------------


class ObservationAnswer(Body):
    runId: str
    commandId: str
    stepSeq: int
    actionHash: str
    status: str = Field(description='"accepted": durable; the verdict rides the next answer')
    replayed: bool
    watchdog: Intervention


class WatchdogView(Body):
    runId: str
    version: int
    status: str
    terminal: bool
    thresholds: dict[str, int]
    configurations: list[dict[str, Any]]
    turn: int
    rollbacks: dict[str, int] = Field(description="{used, budget}")
    pendingRollback: Any = None
    tombstones: list[Any]
    pendingIntervention: Intervention
    observations: list[dict[str, Any]]
    detections: list[dict[str, Any]]
    interventions: list[dict[str, Any]]
    startedAt: str = Field(json_schema_extra={"format": "date-time"})
    updatedAt: str = Field(json_schema_extra={"format": "date-time"})


# --- schedules ----------------------------------------------------------------------------------


class ScheduleView(Body):
    scheduleId: str
    version: int
    status: str
    tenant: str
    owner: str
    agentRevisionId: str | None
    runTemplate: dict[str, Any]
    timeZone: str
    cron: str
    overlapPolicy: str
    misfirePolicy: str
    dst: dict[str, str]
    nextRunAt: str | None = Field(json_schema_extra={"format": "date-time"})
    nextFirings: list[dict[str, str]] = Field(description="[{local, utc}], RFC 3339")
    activeRuns: list[str]
    pending: dict[str, Any] | None
    fired: int
    skipped: int
    history: list[dict[str, Any]]
    createdAt: str = Field(json_schema_extra={"format": "date-time"})
    updatedAt: str = Field(json_schema_extra={"format": "date-time"})


class ScheduleList(Body):
    items: list[ScheduleView]


class SchedulePending(Body):
    """202: the schedule command is durable but not yet decided; GET the schedule."""

    scheduleId: str
    commandId: str
    status: str


# --- circuit breakers and bulkheads -------------------------------------------------------------


class BreakerView(Body):
    endpoint: str
    status: str = Field(description="closed, open, half_open, forced_open or disabled")
    failsFast: bool
    version: int
    errorRate: float
    window: dict[str, float]
    cooldownMs: int
    cooldownRemainingMs: int
    retryAfterMs: int
    halfOpenAt: str | None
    openSince: str | None
    openedAt: str | None
    timesOpened: int
    canaryHolder: str | None
    canary: dict[str, Any] | None
    reason: str | None
    reportingInstances: int
    lastTransition: dict[str, Any] | None
    updatedAt: str | None
    recentOutcomes: list[bool] | None = Field(default=None, description="GET /breakers/{endpoint} only")
    transitions: list[dict[str, Any]] | None = Field(
        default=None, description="GET /breakers/{endpoint} only"
    )


class BreakerOverrideAnswer(BreakerView):
    commandId: str
    replayed: bool


class BreakerList(Body):
    breakers: list[BreakerView]
    count: int
    serverTime: str = Field(json_schema_extra={"format": "date-time"})


class BulkheadConfig(Body):
    defaultDomain: str
    pools: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    connectionLimit: int
    occupancy: str


# --- quarantine and artifacts -------------------------------------------------------------------


class QuarantineView(Body):
    runId: str
    status: str
    version: int
    trigger: dict[str, Any] | None
    stages: dict[str, Any]
    taintFrom: Any
    holder: str | None
    leaseEpoch: int | None
    cleared: dict[str, Any] | None
    taintedArtifacts: list[Any]
    suspectArtifacts: list[Any]
    suspectRuns: list[Any]
    uncompensatedEffects: list[Any] | None = None
    incidentId: str | None = None
    inFlightEffects: list[Any] | None = None


class ArtifactView(Body):
    artifactId: str
    envelope: dict[str, Any]
    taint: str
    taintOrigin: str | None
    tombstoned: bool
    cleared: dict[str, Any] | None


class ArtifactListing(Body):
    items: list[ArtifactView]
    count: int
    tombstonedHidden: bool


# --- the block policy ---------------------------------------------------------------------------


class BlockChange(Body):
    subjectKind: str
    subject: str
    blocked: bool
    reason: str
    by: str
    at: Ms
    status: str | None = Field(default=None, description='"pending" with 202: not yet in force here')


class BlockList(Body):
    blocks: list[BlockChange]
