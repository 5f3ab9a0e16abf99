"""Tenure's runner SDK: claim a run, keep its lease, fence effects by it, report the outcome.

A sketch of a runner's life (see keeper.py for the rules):

client = TenureClient(api_url, gateway_url, api_key="...")
with LeaseKeeper.claim(client, run_id, "runner-7", ["checkpoint-v1"]) as keeper:
    keeper.send_effect("step-3", "ledger", "transfer", {...})  # only while VALID (LEASE-4)
    keeper.checkpoint(digest)                                   # also in JEOPARDY
    keeper.finish("succeeded")                                  # terminal report, releases
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
from services.runner_sdk.client import EffectResult, Lease, RenewalAnswer, ReportOutcome, TenureClient
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
from services.runner_sdk.keeper import LeaseKeeper

__all__ = [
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
    "LeaseLost",
    "LeaseReleased",
    "OutcomeUnknown",
    "RenewalAnswer",
    "ReportOutcome",
    "RequestRejected",
    "RunNotClaimable",
    "RunNotFound",
    "TenureClient",
    "TenureProblem",
    "TenureRunnerError",
    "TenureUnavailable",
    "ToolFailed",
    "UnexpectedResponse",
    "check_transition",
    "is_allowed",
]
