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

A run whose steps are a saga (SAGA-1..7) goes through TrajectoryClient (trajectory.py): the
runner proposes each step and the orchestrator dispatches, compensates and recovers.
"""

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
from services.runner_sdk.client import (
    REPORT_OUTCOMES,
    EffectResult,
    Lease,
    RenewalAnswer,
    ReportOutcome,
    TenureClient,
)
from services.runner_sdk.errors import (
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
from services.runner_sdk.keeper import LeaseKeeper, StopRequest
from services.runner_sdk.trajectory import (
    IN_FLIGHT_STATUSES,
    LeaseLike,
    StepOutcome,
    StepTicket,
    StepWaitTimeout,
    TrajectoryClient,
    TrajectoryRejected,
)

__all__ = [
    "IN_FLIGHT_STATUSES",
    "REPORT_OUTCOMES",
    "TERMINAL_CERTAINTIES",
    "TRANSITIONS",
    "Certainty",
    "CertaintyTracker",
    "EffectResult",
    "FencedByRecipient",
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
    "OutcomeUnknown",
    "RenewalAnswer",
    "ReportOutcome",
    "RequestRejected",
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
    "check_transition",
    "is_allowed",
]
