"""Tenure's runner SDK: claim a run, keep its lease, fence effects by it, report the outcome.

Distributed on its own as tenure-sdk (import name tenure_sdk; sdk/pyproject.toml).

Most runners are a Worker (worker.py; AsyncWorker for `async def`, async_worker.py): the
function is the user's, and the SDK claims the next run of a queue (POST /queues/{q}/claim,
tenant-fair), renews, reports, confirms cancels and honours jeopardy:

worker = Worker(TenureClient(api_url, gateway_url, api_key="..."), "runner-7")

@worker.task("default")
def handle(task: Task) -> list[dict] | None:   # the ResultManifest; raise TaskFailed to fail
    task.effect("step-3", "ledger", "transfer", {...})

worker.run()

Services that submit runs use RunsClient / AsyncRunsClient (runs.py). Both HTTP clients have
an async twin over the same sans-IO core (protocol.py).

Underneath, a runner's life by hand (see keeper.py for the rules):

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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .async_client import (
        AsyncTenureClient,
    )
    from .async_worker import (
        AsyncTask,
        AsyncWorker,
    )
    from .backoff import (
        Backoff,
    )
    from .canonical import (
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
    from .certainty import (
        TERMINAL_CERTAINTIES,
        TRANSITIONS,
        Certainty,
        CertaintyTracker,
        JournalEntry,
        JournalKind,
        check_transition,
        is_allowed,
    )
    from .checkpoints import (
        RUN_START,
        Checkpoint,
        CheckpointMissing,
        Checkpoints,
        LoopGuard,
        Restored,
    )
    from .client import (
        REPORT_OUTCOMES,
        BreakerView,
        EffectResult,
        Lease,
        RenewalAnswer,
        ReportOutcome,
        TenureClient,
    )
    from .errors import (
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
    from .interventions import (
        DEADLOCK,
        INTERRUPT,
        ROLLBACK,
        Intervention,
        InterventionInbox,
    )
    from .keeper import (
        LeaseKeeper,
        StopRequest,
    )
    from .renewals import (
        BATCH_RENEWAL_MAX,
        BatchRenewalResult,
    )
    from .runs import (
        TERMINAL_STATUSES,
        AsyncRunsClient,
        RunsClient,
        RunWaitTimeout,
    )  # the names, for type checkers; at run time they load on first use
    from .trajectory import (
        IN_FLIGHT_STATUSES,
        LeaseLike,
        StepOutcome,
        StepTicket,
        StepWaitTimeout,
        TrajectoryClient,
        TrajectoryRejected,
    )
    from .watchdog import (
        ObservationReceipt,
        WatchdogClient,
        action_hash,
        effect_action_hash,
    )
    from .worker import (
        Task,
        TaskFailed,
        TaskOutcome,
        Worker,
    )

# Loaded lazily (PEP 562): services.common imports the pure helpers (backoff, hashing) from this
# package, and a processor that does must not load the HTTP clients with them.
_HOMES = {
    "AsyncTask": "async_worker",
    "AsyncWorker": "async_worker",
    "AsyncRunsClient": "runs",
    "RunWaitTimeout": "runs",
    "RunsClient": "runs",
    "TERMINAL_STATUSES": "runs",
    "ActionTombstoned": "errors",
    "AsyncTenureClient": "async_client",
    "BATCH_RENEWAL_MAX": "renewals",
    "Backoff": "backoff",
    "BatchRenewalResult": "renewals",
    "BreakerView": "client",
    "Certainty": "certainty",
    "CertaintyTracker": "certainty",
    "Checkpoint": "checkpoints",
    "CheckpointMissing": "checkpoints",
    "Checkpoints": "checkpoints",
    "CircuitOpen": "errors",
    "DEADLOCK": "interventions",
    "DEFAULT_IGNORED": "canonical",
    "DEFAULT_JSON_FILES": "canonical",
    "DEFAULT_VOLATILE_KEYS": "canonical",
    "ERR_CIRCUIT_OPEN": "errors",
    "EffectResult": "client",
    "FencedByRecipient": "errors",
    "INTERRUPT": "interventions",
    "IN_FLIGHT_STATUSES": "trajectory",
    "Intervention": "interventions",
    "InterventionInbox": "interventions",
    "InvalidCertaintyTransition": "errors",
    "JournalEntry": "certainty",
    "JournalKind": "certainty",
    "Lease": "client",
    "LeaseConflict": "errors",
    "LeaseInJeopardy": "errors",
    "LeaseKeeper": "keeper",
    "LeaseLike": "trajectory",
    "LeaseLost": "errors",
    "LeaseReleased": "errors",
    "LoopGuard": "checkpoints",
    "ObservationReceipt": "watchdog",
    "OutcomeUnknown": "errors",
    "REPORT_OUTCOMES": "client",
    "ROLLBACK": "interventions",
    "RUN_START": "checkpoints",
    "RenewalAnswer": "client",
    "ReportOutcome": "client",
    "RequestRejected": "errors",
    "Restored": "checkpoints",
    "RunNotClaimable": "errors",
    "RunNotFound": "errors",
    "StepOutcome": "trajectory",
    "StepTicket": "trajectory",
    "StepWaitTimeout": "trajectory",
    "StopRequest": "keeper",
    "TERMINAL_CERTAINTIES": "certainty",
    "TRANSITIONS": "certainty",
    "Task": "worker",
    "TaskFailed": "worker",
    "TaskOutcome": "worker",
    "TenureClient": "client",
    "TenureProblem": "errors",
    "TenureRunnerError": "errors",
    "TenureUnavailable": "errors",
    "ToolFailed": "errors",
    "TrajectoryClient": "trajectory",
    "TrajectoryRejected": "trajectory",
    "UnexpectedResponse": "errors",
    "WatchdogClient": "watchdog",
    "Worker": "worker",
    "action_hash": "watchdog",
    "canonical_document": "canonical",
    "canonical_text": "canonical",
    "check_transition": "certainty",
    "effect_action_hash": "watchdog",
    "is_allowed": "certainty",
    "json_state_hash": "canonical",
    "state_hash": "canonical",
    "tree_snapshot": "canonical",
    "tree_state_hash": "canonical",
}

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
    "TERMINAL_STATUSES",
    "TRANSITIONS",
    "ActionTombstoned",
    "AsyncRunsClient",
    "AsyncTask",
    "AsyncTenureClient",
    "AsyncWorker",
    "Backoff",
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
    "RunWaitTimeout",
    "RunsClient",
    "StepOutcome",
    "StepTicket",
    "StepWaitTimeout",
    "StopRequest",
    "Task",
    "TaskFailed",
    "TaskOutcome",
    "TenureClient",
    "TenureProblem",
    "TenureRunnerError",
    "TenureUnavailable",
    "ToolFailed",
    "TrajectoryClient",
    "TrajectoryRejected",
    "UnexpectedResponse",
    "WatchdogClient",
    "Worker",
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


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
