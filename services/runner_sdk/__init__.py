"""Tenure's runner SDK: claim a run, keep its lease, fence effects by it, report the outcome.

A sketch of a runner's life (see keeper.py for the rules):

client = TenureClient(api_url, gateway_url, api_key="...")
with LeaseKeeper.claim(client, run_id, "runner-7", ["checkpoint-v1"]) as keeper:
    keeper.send_effect("step-3", "ledger", "transfer", {...})  # only while VALID (LEASE-4)
    keeper.checkpoint(digest)                                   # also in JEOPARDY
    keeper.finish("succeeded")                                  # terminal report, releases

A stop request (cancel, EXE-7; deadline, EXE-10) comes on a renewal answer: the keeper's
`stop_requested` / `wait_for_stop_request()` / `on_stop_requested` callback tell the runner, which
stops and confirms with `keeper.finish("cancelled")`.

An effect whose tool's fleet-wide circuit breaker is open raises CircuitOpen (BRK-2: the
dependency and the cooldown remaining; nothing was dispatched), and the client does not send it
again before that cooldown; `client.breaker(endpoint)` reads a breaker.

A run whose steps are a saga (SAGA-1..7) goes through TrajectoryClient (trajectory.py): the
runner proposes each step and the orchestrator dispatches, compensates and recovers.

The semantic watchdog (WD-1..WD-6) judges whether the run progresses: WatchdogClient
(watchdog.py) reports the runner's own steps with the hash of its state (canonical.py),
`on_intervention` (interventions.py) hears the ladder's rungs on proposal and heartbeat answers,
and LoopGuard with Checkpoints (checkpoints.py) keeps a checkpoint per step and rolls back to
the one before a cycle when told (level 2), acknowledging it.
"""

from services.runner_sdk.canonical import (
    DEFAULT_IGNORED,
    DEFAULT_JSON_FILES,
    DEFAULT_VOLATILE_KEYS,
    canonical_document,
    canonical_text,
    json_state_hash,
    state_hash,
    tree_snapshot,
    tree_state_hash,
)
from services.runner_sdk.certainty import (
    TERMINAL_CERTAINTIES,
    TRANSITIONS,
    Certainty,
    CertaintyTracker,
    JournalEntry,
    JournalKind,
    check_transition,
    is_allowed,
)
from services.runner_sdk.checkpoints import (
    RUN_START,
    Checkpoint,
    CheckpointMissing,
    Checkpoints,
    LoopGuard,
    Restored,
)
from services.runner_sdk.client import (
    REPORT_OUTCOMES,
    BreakerView,
    EffectResult,
    Lease,
    RenewalAnswer,
    ReportOutcome,
    TenureClient,
)
from services.runner_sdk.errors import (
    ERR_CIRCUIT_OPEN,
    ActionTombstoned,
    CircuitOpen,
    FencedByRecipient,
    InvalidCertaintyTransition,
    LeaseConflict,
    LeaseInJeopardy,
    LeaseLost,
    LeaseReleased,
    OutcomeUnknown,
    RequestRejected,
    RunNotClaimable,
    RunNotFound,
    TenureProblem,
    TenureRunnerError,
    TenureUnavailable,
    ToolFailed,
    UnexpectedResponse,
)
from services.runner_sdk.interventions import (
    DEADLOCK,
    INTERRUPT,
    ROLLBACK,
    Intervention,
    InterventionInbox,
)
from services.runner_sdk.keeper import LeaseKeeper, StopRequest
from services.runner_sdk.renewals import BATCH_RENEWAL_MAX, BatchRenewalResult
from services.runner_sdk.trajectory import (
    IN_FLIGHT_STATUSES,
    LeaseLike,
    StepOutcome,
    StepTicket,
    StepWaitTimeout,
    TrajectoryClient,
    TrajectoryRejected,
)
from services.runner_sdk.watchdog import (
    ObservationReceipt,
    WatchdogClient,
    action_hash,
    effect_action_hash,
)

__all__ = [
    "BATCH_RENEWAL_MAX",
    "DEADLOCK",
    "DEFAULT_IGNORED",
    "DEFAULT_JSON_FILES",
    "DEFAULT_VOLATILE_KEYS",
    "ERR_CIRCUIT_OPEN",
    "INTERRUPT",
    "IN_FLIGHT_STATUSES",
    "REPORT_OUTCOMES",
    "ROLLBACK",
    "RUN_START",
    "TERMINAL_CERTAINTIES",
    "TRANSITIONS",
    "ActionTombstoned",
    "BatchRenewalResult",
    "BreakerView",
    "Certainty",
    "CertaintyTracker",
    "Checkpoint",
    "CheckpointMissing",
    "Checkpoints",
    "CircuitOpen",
    "EffectResult",
    "FencedByRecipient",
    "Intervention",
    "InterventionInbox",
    "InvalidCertaintyTransition",
    "JournalEntry",
    "JournalKind",
    "Lease",
    "LeaseConflict",
    "LeaseInJeopardy",
    "LeaseKeeper",
    "LeaseLike",
    "LeaseLost",
    "LeaseReleased",
    "LoopGuard",
    "ObservationReceipt",
    "OutcomeUnknown",
    "RenewalAnswer",
    "ReportOutcome",
    "RequestRejected",
    "Restored",
    "RunNotClaimable",
    "RunNotFound",
    "StepOutcome",
    "StepTicket",
    "StepWaitTimeout",
    "StopRequest",
    "TenureClient",
    "TenureProblem",
    "TenureRunnerError",
    "TenureUnavailable",
    "ToolFailed",
    "TrajectoryClient",
    "TrajectoryRejected",
    "UnexpectedResponse",
    "WatchdogClient",
    "action_hash",
    "canonical_document",
    "canonical_text",
    "check_transition",
    "effect_action_hash",
    "is_allowed",
    "json_state_hash",
    "state_hash",
    "tree_snapshot",
    "tree_state_hash",
]
