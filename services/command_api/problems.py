"""RFC 9457 problem details: every error the API returns says what went wrong, specifically.

Each problem type is a relative URI under /problems/ that the API itself serves, so a client (or
a person at 3 a.m.) can dereference the `type` of an error and read what it means.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from services.command_api.quarantine_problems import QUARANTINE_PROBLEMS, QUARANTINE_REJECTION_PROBLEMS
from services.common.contracts import (
    BreakerRejectionCode,
    RejectionCode,
    TrajectoryRejectionCode,
    WatchdogRejectionCode,
)
from services.common.contracts.schedules import ScheduleRejectionCode
from services.common.problem_json import (
    COMMON_PROBLEMS,
    Problem,
    ProblemCatalog,
    ProblemType,
    install_problem_handlers,
)

__all__ = [
    "BREAKER_PROBLEMS",
    "BREAKER_REJECTION_PROBLEMS",
    "CATALOG",
    "PROBLEM_TYPES",
    "QUARANTINE_PROBLEMS",
    "QUARANTINE_REJECTION_PROBLEMS",
    "REJECTION_PROBLEMS",
    "SCHEDULE_PROBLEMS",
    "SCHEDULE_REJECTION_PROBLEMS",
    "TRAJECTORY_PROBLEMS",
    "TRAJECTORY_REJECTION_PROBLEMS",
    "WATCHDOG_PROBLEMS",
    "WATCHDOG_REJECTION_PROBLEMS",
    "ApiProblem",
    "problem_response",
    "register_problem_handlers",
]


# The saga's problems (routes_trajectories.py), kept with the others so /problems/<slug> serves them.
TRAJECTORY_PROBLEMS: tuple[ProblemType, ...] = (
    ProblemType(
        "trajectory-not-found",
        "The run has no trajectory",
        404,
        "Start the trajectory first: POST /runs/{runId}/trajectory.",
    ),
    ProblemType(
        "trajectory-exists", "The run already has a trajectory", 409, "A run has exactly one trajectory."
    ),
    ProblemType(
        "trajectory-ended",
        "The trajectory has ended",
        409,
        "It completed, rolled back or was abandoned; nothing can change it.",
    ),
    ProblemType(
        "trajectory-conflict",
        "The trajectory cannot take this command now",
        409,
        "The saga orchestrator refused the command in the trajectory's current state; `code` says "
        "why (e.g. STEP_IN_FLIGHT, REPAIR_EXPECTED, PLAN_MISMATCH, PIVOT_COMMITTED).",
    ),
    ProblemType(
        "unknown-tool",
        "No tool is registered under this name",
        422,
        "Tools are registered by their authors (SAGA-2); propose one of the registered tools.",
    ),
    ProblemType(
        "invalid-parameters",
        "The step's parameters do not match the tool's schema",
        422,
        "The orchestrator validates parameters against the tool's JSON Schema before recording "
        "any intent (SAGA-1); `detail` lists what is wrong.",
    ),
    ProblemType(
        "plan-rejected",
        "The plan cannot be compiled",
        422,
        "A plan must be an acyclic graph of registered steps with at most one pivot (SAGA-6/7).",
    ),
    ProblemType(
        "two-pivots",
        "At most one pivot per trajectory",
        422,
        "A second irreversible step was proposed (SAGA-6); declare both in a plan so an outbound "
        "message can be staged in the outbox and released with the pivot.",
    ),
    ProblemType(
        "incident-not-open",
        "The incident is not open",
        409,
        "The incident was resolved already, or belongs to another run.",
    ),
    ProblemType(
        "trajectory-frozen",
        "The trajectory is frozen",
        409,
        "An incident froze the trajectory (REC-7): nothing is dispatched until an operator "
        "resolves it (POST /incidents/{incidentId}/resolve).",
    ),
    ProblemType(
        "step-in-flight",
        "A step is still in flight",
        409,
        "The orchestrator still owes the open step an outcome; poll GET /runs/{runId}/trajectory "
        "until the step settles, then propose the next one.",
    ),
    ProblemType(
        "budget-exhausted",
        "The trajectory's budget is spent",
        409,
        "No steps, tokens or money are left in the trajectory's budget (REC-3).",
    ),
    ProblemType(
        "unknown-step",
        "No such step",
        404,
        "The trajectory has no step with this index.",
    ),
    ProblemType(
        "resume-needs-new-lease",
        "Resuming needs a lease taken over after the freeze",
        409,
        "Take the lease over first (POST /runs/{runId}/lease/takeover) and pass the new attemptId "
        "and leaseEpoch (REC-7).",
    ),
)

# The orchestrator's rejection codes, mapped to the problem a caller should see. Every code the
# saga's decide can return is listed (tests/unit/test_rejection_problem_types.py checks it); the
# conflicts of the trajectory's current state share trajectory-conflict, whose `code` says which.
# Keyed by the enum members (equal to the wire's code strings), so a code the saga lacks is a
# failure at import here, not a silent fall-through to trajectory-conflict.
TRAJECTORY_REJECTION_PROBLEMS: dict[str, str] = {
    TrajectoryRejectionCode.TRAJECTORY_NOT_FOUND: "trajectory-not-found",
    TrajectoryRejectionCode.TRAJECTORY_EXISTS: "trajectory-exists",
    TrajectoryRejectionCode.TRAJECTORY_ENDED: "trajectory-ended",
    TrajectoryRejectionCode.TRAJECTORY_COMPLETED: "trajectory-ended",
    TrajectoryRejectionCode.TRAJECTORY_ROLLED_BACK: "trajectory-ended",
    TrajectoryRejectionCode.TRAJECTORY_ABANDONED: "trajectory-ended",
    TrajectoryRejectionCode.TRAJECTORY_FROZEN: "trajectory-frozen",
    TrajectoryRejectionCode.TRAJECTORY_FORWARD: "trajectory-conflict",
    TrajectoryRejectionCode.TRAJECTORY_AWAITING_REPAIR: "trajectory-conflict",
    TrajectoryRejectionCode.TRAJECTORY_AWAITING_APPROVAL: "trajectory-conflict",
    TrajectoryRejectionCode.TRAJECTORY_POST_PIVOT: "trajectory-conflict",
    TrajectoryRejectionCode.TRAJECTORY_UNWINDING: "trajectory-conflict",
    TrajectoryRejectionCode.TRAJECTORY_BUSY: "trajectory-conflict",
    TrajectoryRejectionCode.UNKNOWN_TOOL: "unknown-tool",
    TrajectoryRejectionCode.UNKNOWN_STEP: "unknown-step",
    TrajectoryRejectionCode.INVALID_PARAMETERS: "invalid-parameters",
    TrajectoryRejectionCode.PLAN_REJECTED: "plan-rejected",
    TrajectoryRejectionCode.PLAN_INCOMPLETE: "trajectory-conflict",
    TrajectoryRejectionCode.PLAN_MISMATCH: "trajectory-conflict",
    TrajectoryRejectionCode.TWO_PIVOTS: "two-pivots",
    TrajectoryRejectionCode.STALE_EPOCH: "stale-epoch",
    TrajectoryRejectionCode.LEASE_REQUIRED: "resume-needs-new-lease",
    TrajectoryRejectionCode.INCIDENT_NOT_OPEN: "incident-not-open",
    TrajectoryRejectionCode.INVALID_COMMAND: "validation-failed",
    TrajectoryRejectionCode.STEP_IN_FLIGHT: "step-in-flight",
    TrajectoryRejectionCode.BUDGET_EXHAUSTED: "budget-exhausted",
    TrajectoryRejectionCode.NOT_AWAITING_REPAIR: "trajectory-conflict",
    TrajectoryRejectionCode.REPAIR_EXPECTED: "trajectory-conflict",
    TrajectoryRejectionCode.REPAIR_TOOL_MISMATCH: "trajectory-conflict",
    TrajectoryRejectionCode.PARTIAL_EFFECTS: "trajectory-conflict",
    TrajectoryRejectionCode.NOT_RETRYABLE_AFTER_PIVOT: "trajectory-conflict",
    TrajectoryRejectionCode.PIVOT_COMMITTED: "trajectory-conflict",
    TrajectoryRejectionCode.NO_PIVOT_PENDING: "trajectory-conflict",
    # The semantic watchdog's refusals (WD-5): each its own problem, carrying the intervention.
    TrajectoryRejectionCode.STATE_OSCILLATION_DETECTED: "state-oscillation-detected",
    TrajectoryRejectionCode.ACTION_TOMBSTONED: "action-tombstoned",
    TrajectoryRejectionCode.ERR_SEMANTIC_DEADLOCK: "semantic-deadlock",
}

# The semantic watchdog's problems (routes_watchdog.py and the watchdog's refusals of proposals).
WATCHDOG_PROBLEMS: tuple[ProblemType, ...] = (
    ProblemType(
        "state-oscillation-detected",
        "The run is looping: propose something else",
        409,
        "The semantic watchdog found the run busy but not progressing (WD-2..WD-4) and interrupted "
        "it (WD-5 level 1, STATE_OSCILLATION_DETECTED); this proposal repeats the action the "
        "interrupt named. `watchdog` carries the intervention: the synthetic observation for the "
        "model's context (`message`), the period, the step the environment returned to and the "
        "action hash. Nothing was recorded; propose a different action.",
    ),
    ProblemType(
        "action-tombstoned",
        "The action is tombstoned for this run",
        409,
        "A second violation within the ladder epoch (WD-5 level 2, ROLLBACK_REQUESTED) tombstoned "
        "this action (tool + canonical arguments, `actionHash`) for the run: the orchestrator and "
        "the effect gateway refuse it from now on. Restore the checkpoint the intervention in "
        "`watchdog` names, acknowledge it (POST /runs/{runId}/watchdog/rollback) and try a "
        "different action. Nothing was recorded.",
    ),
    ProblemType(
        "semantic-deadlock",
        "The run is in semantic deadlock",
        409,
        "The run kept looping after its rollback budget was spent (WD-5 level 3, "
        "ERR_SEMANTIC_DEADLOCK): no step is accepted, the saga is unwound before its pivot or "
        "frozen with an incident after it, and the run's log is handed to an operator.",
    ),
    ProblemType(
        "watchdog-not-found",
        "The run has no watchdog yet",
        404,
        "A run's watchdog begins with its first observation (a step the saga dispatched, "
        "POST /runs/{runId}/observations) or configuration (PUT /runs/{runId}/watchdog).",
    ),
    ProblemType(
        "no-rollback-pending",
        "No such rollback is awaited",
        409,
        "Only the pending level-2 intervention (ROLLBACK_REQUESTED, `pendingRollback` in "
        "GET /runs/{runId}/watchdog) can be acknowledged; `detail` names the one awaited, if any.",
    ),
    ProblemType(
        "watchdog-threshold-out-of-bounds",
        "A watchdog threshold is out of bounds",
        422,
        "Each threshold has fixed bounds (README, TENURE_WATCHDOG_*) and the window must exceed "
        "the longest period; `detail` says which value is wrong. Nothing was recorded.",
    ),
    ProblemType(
        "watchdog-configurations-exhausted",
        "The run's watchdog was configured too often",
        409,
        "A run may set its watchdog's thresholds a few times only (each is kept on the log).",
    ),
    ProblemType(
        "invalid-observation",
        "The observation cannot be taken in",
        422,
        "The semantic watchdog refused the observation (WD-1): `detail` says which field is wrong.",
    ),
)

# The watchdog's rejection codes, mapped like the other aggregates' (each explicitly).
WATCHDOG_REJECTION_PROBLEMS: dict[str, str] = {
    WatchdogRejectionCode.INVALID_OBSERVATION: "invalid-observation",
    WatchdogRejectionCode.INVALID_COMMAND: "validation-failed",
    WatchdogRejectionCode.THRESHOLD_OUT_OF_BOUNDS: "watchdog-threshold-out-of-bounds",
    WatchdogRejectionCode.TOO_MANY_CONFIGURATIONS: "watchdog-configurations-exhausted",
    WatchdogRejectionCode.NO_ROLLBACK_PENDING: "no-rollback-pending",
    WatchdogRejectionCode.WATCHDOG_NOT_FOUND: "watchdog-not-found",
    WatchdogRejectionCode.WATCHDOG_DEADLOCKED: "semantic-deadlock",
}

# The circuit breakers' problems (routes_breakers.py, BRK-1, BRK-2).
BREAKER_PROBLEMS: tuple[ProblemType, ...] = (
    ProblemType(
        "breaker-not-found",
        "No breaker for this endpoint",
        404,
        "A tool endpoint's breaker begins with the first call the effect gateway reports to it; "
        "GET /breakers lists the breakers there are. An endpoint id is letters, digits and "
        "._:/@- (at most 200).",
    ),
    ProblemType(
        "breaker-conflict",
        "The breaker is in that state already",
        409,
        "The breaker refused the operator's command in its current state (`code`: "
        "BREAKER_FORCED_OPEN, BREAKER_DISABLED, ...; `currentStatus`): nothing was recorded. A "
        "reset is always accepted.",
    ),
)

# The breaker's rejection codes, each mapped explicitly (tests/unit/test_breaker_routes.py checks
# that every code is listed). Only the operators' commands come from the API; the canary's and
# the outcomes' codes are listed so a new code cannot fall through silently.
BREAKER_REJECTION_PROBLEMS: dict[str, str] = {
    BreakerRejectionCode.INVALID_COMMAND: "validation-failed",
    BreakerRejectionCode.BREAKER_NOT_FOUND: "breaker-not-found",
    BreakerRejectionCode.BREAKER_CLOSED: "breaker-conflict",
    BreakerRejectionCode.BREAKER_DISABLED: "breaker-conflict",
    BreakerRejectionCode.BREAKER_OPEN: "breaker-conflict",
    BreakerRejectionCode.BREAKER_FORCED_OPEN: "breaker-conflict",
    BreakerRejectionCode.CANARY_IN_FLIGHT: "breaker-conflict",
    BreakerRejectionCode.CANARY_NOT_HELD: "breaker-conflict",
}


# Quarantine and taint: services/command_api/quarantine_problems.py (QUA-1, QUA-2).

PROBLEM_TYPES: dict[str, ProblemType] = {
    p.slug: p
    for p in (
        ProblemType(
            "validation-failed",
            "The request is not valid",
            422,
            "A field is missing, has the wrong type or is out of range; see `errors`.",
        ),
        ProblemType(
            "idempotency-key-required",
            "Idempotency-Key header is required",
            400,
            "Submissions must carry an Idempotency-Key so retries never create a second run.",
        ),
        ProblemType(
            "idempotency-key-conflict",
            "Idempotency-Key reused with a different request",
            409,
            "A key names one request: the whole request (every body field, the path and the "
            "calling principal) is compared with the one first sent under the key, and "
            "`fields` lists what differs. Send the original request again to get its answer, "
            "or use a new key for a new request; nothing was recorded. The same holds for a "
            "runner's report or input request repeated under the same attempt and sequence, "
            "and an input answer repeated under the same responseId.",
        ),
        ProblemType("run-not-found", "Run not found", 404, "No run with this id exists."),
        ProblemType(
            "run-already-terminal",
            "The run has already ended",
            409,
            "The run is succeeded, failed or cancelled; nothing can change it.",
        ),
        ProblemType(
            "invalid-transition",
            "The run cannot make this transition now",
            409,
            "The run's current status does not allow the command.",
        ),
        ProblemType(
            "command-rejected",
            "The command was rejected",
            409,
            "The coordinator refused the command; `code` says why.",
        ),
        ProblemType(
            "invalid-cursor",
            "The paging cursor is not valid",
            400,
            "Pass back the `nextCursor` of the previous page unchanged, with the same filter.",
        ),
        ProblemType(
            "unavailable",
            "A dependency is unavailable",
            503,
            "Kafka or the run views did not answer within the request's deadline "
            "(TENURE_DECISION_TIMEOUT_S); retry after `Retry-After` seconds. When a command was "
            "not acknowledged in time it may still be recorded: a retry under the same "
            "Idempotency-Key is the same command and is decided once.",
        ),
        ProblemType(
            "overloaded",
            "The lease coordinator is behind; this batch was not sent",
            503,
            "Admission control (TENURE_API_SHED_AFTER_MS): a batch renewal this API instance "
            "published earlier has waited longer than that for its decisions, so new batches are "
            "refused, unpublished, until the coordinator catches up. Nothing was recorded: send "
            "the same batch again after `Retry-After` seconds (`oldestWaitMs` says how far behind).",
        ),
        ProblemType(
            "not-ready",
            "The API is not ready",
            503,
            "GET /readyz: a dependency the API needs is not ready (`notReady` names them, "
            "`checks` says why); poll again after `Retry-After` seconds.",
        ),
        ProblemType(
            "forbidden",
            "Your role may not do this",
            403,
            "The caller's role or identity does not allow this action: takeovers, the block "
            "policy, approvals, incidents and the circuit breakers' overrides need the operator "
            "role (LEASE-7); a run is "
            "cancelled, retried or answered by its submitter or an operator; `detail` says which.",
        ),
        ProblemType(
            "run-not-claimable",
            "The run cannot be claimed now",
            409,
            "Only a queued run can be claimed; someone else may hold it.",
        ),
        ProblemType("attempts-exhausted", "No attempts left", 409, "The run used all of maxAttempts."),
        ProblemType(
            "unknown-attempt",
            "Unknown attempt",
            409,
            "The attempt id or epoch was never issued for this run.",
        ),
        ProblemType(
            "stale-epoch",
            "Stale fencing epoch",
            409,
            "A newer lease with a higher epoch exists; this holder must stop (LEASE-3).",
        ),
        ProblemType(
            "sequence-not-increasing",
            "Sequence not increasing",
            409,
            "Heartbeat and report sequences must increase strictly per attempt.",
        ),
        ProblemType(
            "lease-expired",
            "The lease expired",
            409,
            "The coordinator's clock passed the lease's expiry; the holder must stop.",
        ),
        ProblemType("lease-revoked", "The lease was revoked", 409, "An operator took the lease over."),
        ProblemType("lease-released", "The lease was released", 409, "The attempt already reported."),
        ProblemType(
            "takeover-not-possible",
            "Nothing to take over",
            409,
            "Only a preparing or running run has a lease to take over.",
        ),
        ProblemType(
            "duplicate-effect", "Effect already recorded", 409, "This effect id is already recorded."
        ),
        ProblemType("unknown-effect", "Unknown effect", 409, "No intent was recorded for this effect."),
        ProblemType(
            "retry-needs-acknowledgement",
            "Acknowledge that external actions may repeat",
            409,
            "An explicit retry may repeat effects of the failed attempt (EXE-5); send "
            "acknowledgeRepeatedEffects=true to go ahead.",
        ),
        ProblemType(
            "cancel-already-requested",
            "The run is already stopping",
            409,
            "A cancel or a deadline stop was already requested; the runner must confirm it.",
        ),
        ProblemType(
            "admission-queue-full",
            "The tenant's queue is full",
            429,
            "The tenant already has as many queued runs as its limit allows (EXE-2); nothing "
            "was recorded. Retry later or raise the limit.",
        ),
        ProblemType(
            "admission-active-full",
            "The tenant has no free active slot",
            429,
            "The tenant already runs as many runs as its limit allows (EXE-2); the run stays "
            "queued. Claim again later.",
        ),
        ProblemType(
            "input-invalid",
            "The answer does not match the input schema",
            422,
            "The answer is validated against the JSON Schema of the run's input request (EXE-8).",
        ),
        ProblemType(
            "grant-not-found", "No such upload grant", 404, "Ask for a grant for your attempt first."
        ),
        ProblemType("grant-expired", "The upload grant expired", 410, "Ask for a new grant."),
        ProblemType("upload-too-large", "The upload exceeds its grant", 413, "The grant limits the size."),
        ProblemType(
            "artifact-exists",
            "The artifact already exists with other content",
            409,
            "Artifacts are immutable; upload under a new destination.",
        ),
        ProblemType(
            "capability-missing",
            "The attempt lacks a capability",
            409,
            "Waiting for input needs capability checkpoint-v1 declared at claim time.",
        ),
        ProblemType("input-expired", "The input request expired", 409, "The run failed with INPUT_EXPIRED."),
        ProblemType(
            "principal-blocked",
            "The run's submitter is blocked",
            409,
            "Assignment re-checks the block policy (EXE-2): the run is not assigned while its "
            "submitter is blocked.",
        ),
        ProblemType(
            "tenant-blocked",
            "The run's tenant is blocked",
            409,
            "Assignment re-checks the block policy (EXE-2): the tenant's runs wait.",
        ),
        ProblemType(
            "duplicate-sequence",
            "This sequence was already used",
            409,
            "The attempt already sent a heartbeat or report with this sequence; heartbeats are "
            "answered from the lease as it stands, reports must use a new sequence.",
        ),
        ProblemType(
            "run-id-mismatch",
            "The run id does not match the submission",
            422,
            "A run id is derived from the tenant and the Idempotency-Key; this one is not.",
        ),
        ProblemType(
            "not-lease-holder",
            "You do not hold this lease",
            403,
            "Only the principal that claimed the lease (or the holder a takeover named) may "
            "renew it, report on it or act under it.",
        ),
    )
}
PROBLEM_TYPES.update({p.slug: p for p in TRAJECTORY_PROBLEMS if p.slug not in PROBLEM_TYPES})
PROBLEM_TYPES.update({p.slug: p for p in WATCHDOG_PROBLEMS if p.slug not in PROBLEM_TYPES})
PROBLEM_TYPES.update({p.slug: p for p in BREAKER_PROBLEMS if p.slug not in PROBLEM_TYPES})
PROBLEM_TYPES.update({p.slug: p for p in QUARANTINE_PROBLEMS if p.slug not in PROBLEM_TYPES})
# Schedules (routes_schedules.py, EXE-14).
SCHEDULE_PROBLEMS: tuple[ProblemType, ...] = (
    ProblemType(
        "schedule-not-found",
        "No such schedule",
        404,
        "GET /schedules lists the schedules there are; a schedule id is sch_ and 8 to 40 hex digits.",
    ),
    ProblemType(
        "invalid-schedule",
        "The schedule's cron expression or time zone cannot be used",
        422,
        "`field` names the member at fault (cron or timeZone) and `detail` says why: a cron "
        "expression has five fields (minute hour day month weekday); a time zone is an IANA name "
        "such as Europe/Berlin. Nothing was recorded.",
    ),
    ProblemType(
        "schedule-conflict",
        "The schedule is in that state already",
        409,
        "Pausing a paused schedule, resuming an active one, or creating one that exists (`code`).",
    ),
)
SCHEDULE_REJECTION_PROBLEMS: dict[str, str] = {
    ScheduleRejectionCode.INVALID_COMMAND: "validation-failed",
    ScheduleRejectionCode.INVALID_CRON: "invalid-schedule",
    ScheduleRejectionCode.UNKNOWN_TIME_ZONE: "invalid-schedule",
    ScheduleRejectionCode.SCHEDULE_EXISTS: "schedule-conflict",
    ScheduleRejectionCode.SCHEDULE_NOT_FOUND: "schedule-not-found",
    ScheduleRejectionCode.SCHEDULE_PAUSED: "schedule-conflict",
    ScheduleRejectionCode.SCHEDULE_ACTIVE: "schedule-conflict",
    ScheduleRejectionCode.UNKNOWN_RUN: "validation-failed",
}
PROBLEM_TYPES.update({p.slug: p for p in SCHEDULE_PROBLEMS if p.slug not in PROBLEM_TYPES})
PROBLEM_TYPES.update({p.slug: p for p in COMMON_PROBLEMS if p.slug not in PROBLEM_TYPES})
CATALOG = ProblemCatalog(PROBLEM_TYPES.values())

# The coordinator's rejection codes, mapped to the problem a caller should see.
REJECTION_PROBLEMS: dict[str, str] = {
    RejectionCode.RUN_NOT_FOUND: "run-not-found",
    RejectionCode.RUN_ALREADY_TERMINAL: "run-already-terminal",
    RejectionCode.INVALID_TRANSITION: "invalid-transition",
    RejectionCode.IDEMPOTENCY_KEY_CONFLICT: "idempotency-key-conflict",
    RejectionCode.INVALID_COMMAND: "validation-failed",
    RejectionCode.RUN_NOT_CLAIMABLE: "run-not-claimable",
    RejectionCode.ATTEMPTS_EXHAUSTED: "attempts-exhausted",
    RejectionCode.UNKNOWN_ATTEMPT: "unknown-attempt",
    RejectionCode.STALE_EPOCH: "stale-epoch",
    RejectionCode.SEQUENCE_NOT_INCREASING: "sequence-not-increasing",
    RejectionCode.LEASE_EXPIRED: "lease-expired",
    RejectionCode.LEASE_REVOKED: "lease-revoked",
    RejectionCode.LEASE_RELEASED: "lease-released",
    RejectionCode.TAKEOVER_NOT_POSSIBLE: "takeover-not-possible",
    RejectionCode.DUPLICATE_EFFECT: "duplicate-effect",
    RejectionCode.UNKNOWN_EFFECT: "unknown-effect",
    RejectionCode.RETRY_NEEDS_ACKNOWLEDGEMENT: "retry-needs-acknowledgement",
    RejectionCode.CANCEL_ALREADY_REQUESTED: "cancel-already-requested",
    RejectionCode.CAPABILITY_MISSING: "capability-missing",
    RejectionCode.ADMISSION_QUEUE_FULL: "admission-queue-full",
    RejectionCode.PRINCIPAL_BLOCKED: "principal-blocked",
    RejectionCode.TENANT_BLOCKED: "tenant-blocked",
    # Not a coordinator code: the API itself refuses a caller that is not the lease's holder.
    "NOT_LEASE_HOLDER": "not-lease-holder",
    RejectionCode.ADMISSION_ACTIVE_FULL: "admission-active-full",
    RejectionCode.INPUT_EXPIRED: "input-expired",
    RejectionCode.DUPLICATE_SEQUENCE: "duplicate-sequence",
    RejectionCode.RUN_ID_MISMATCH: "run-id-mismatch",
}


class ApiProblem(Problem):
    """A problem of the command API (the shared `Problem`, kept under the API's historic name)."""


def problem_response(
    slug: str, detail: str, instance: str | None = None, status: int | None = None, **extensions: Any
) -> JSONResponse:
    return CATALOG.response(slug, detail, instance, status, **extensions)


def register_problem_handlers(app: FastAPI) -> None:
    install_problem_handlers(app, CATALOG)
