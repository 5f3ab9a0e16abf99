"""The runner SDK's exceptions: one class per thing a runner must react to differently.

The split that matters most (LEASE-4): a *refusal* (409: the coordinator or a fenced recipient
said no, so the lease is gone) versus an *unknown outcome* (timeout, connection error, 5xx: the
request may or may not have taken effect). An unknown outcome is never treated as a refusal, and
never as a success either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The code of a call refused because its dependency's circuit breaker is open (BRK-2).
ERR_CIRCUIT_OPEN = "ERR_CIRCUIT_OPEN"

__all__ = [
    "ERR_CIRCUIT_OPEN",
    "ActionTombstoned",
    "CircuitOpen",
    "FencedByRecipient",
    "InvalidCertaintyTransition",
    "LeaseConflict",
    "LeaseInJeopardy",
    "LeaseLost",
    "LeaseReleased",
    "OutcomeUnknown",
    "RequestRejected",
    "RunNotClaimable",
    "RunNotFound",
    "TenureProblem",
    "TenureRunnerError",
    "TenureUnavailable",
    "ToolFailed",
    "UnexpectedResponse",
]


class TenureRunnerError(Exception):
    """Base class of every error the runner SDK raises."""


class TenureProblem(TenureRunnerError):
    """The service answered with an RFC 9457 problem; `problem_type` is the slug after /problems/."""

    def __init__(self, status: int, problem_type: str, detail: str, body: Mapping[str, Any] | None = None):
        self.status = status
        self.problem_type = problem_type
        self.detail = detail
        self.body: Mapping[str, Any] = dict(body or {})
        super().__init__(f"HTTP {status} {problem_type}: {detail}")


class RequestRejected(TenureProblem):
    """A 4xx that is neither a lease conflict nor a claim refusal (validation, auth, not found)."""


class ActionTombstoned(RequestRejected):
    """409 action-tombstoned: the semantic watchdog tombstoned this action for the run (WD-5
    level 2); the gateway and the orchestrator refuse it from now on. Not a lease conflict: the
    lease is still held; choose another action."""

    @property
    def action_hash(self) -> str:
        return str(self.body.get("actionHash") or "")


class CircuitOpen(RequestRejected):
    """ERR_CIRCUIT_OPEN (problem type circuit-open): the fleet-wide circuit breaker of the
    dependency is open (BRK-2), so the call failed fast and NOTHING was dispatched to it. Neither
    a lease conflict (the lease is still held) nor an unknown outcome.

    Wait at least `cooldown_remaining_s` before calling `dependency` again: until then the
    TenureClient refuses the same call itself, without sending it (`local` is True then).
    `pending_intent`: the gateway holds an unsettled earlier try under this idempotency key, so
    the retry must keep the key (it should anyway, EXE-6).
    """

    def __init__(
        self,
        status: int,
        problem_type: str,
        detail: str,
        body: Mapping[str, Any] | None = None,
        *,
        dependency: str = "",
        cooldown_remaining_s: float = 0.0,
        local: bool = False,
        pending_intent: bool = False,
    ):
        super().__init__(status, problem_type, detail, body)
        self.dependency = dependency
        self.cooldown_remaining_s = max(0.0, cooldown_remaining_s)
        self.local = local
        self.pending_intent = pending_intent


class RunNotFound(TenureProblem):
    """404 run-not-found on claim: no run with this id exists."""


class RunNotClaimable(TenureProblem):
    """409 on claim: the run is not queued (`run-not-claimable`) or `attempts-exhausted`."""


class LeaseConflict(TenureProblem):
    """409 on heartbeat, report or effect: this holder no longer holds the lease.

    `problem_type` says why: stale-epoch, unknown-attempt, sequence-not-increasing, lease-expired,
    lease-revoked (or fenced-by-recipient, see the subclass). The lease is lost immediately.
    """


class FencedByRecipient(LeaseConflict):
    """409 fenced-by-recipient: the tool itself refused this epoch (LEASE-3)."""


class ToolFailed(TenureProblem):
    """502 tool-failed: the tool answered with a failure; the effect did not commit."""


class OutcomeUnknown(TenureProblem):
    """504 outcome-unknown: the gateway cannot tell whether the effect happened.

    Retry with the SAME idempotency key (EXE-6) once the lease is VALID again.
    """


class TenureUnavailable(TenureRunnerError):
    """No usable answer: connection error, timeout or a 5xx from the API. The outcome is UNKNOWN.

    The request may have taken effect. It is not a refusal: the lease is in jeopardy, not lost.
    """

    def __init__(
        self,
        operation: str,
        reason: str,
        status: int | None = None,
        problem_type: str = "",
        retry_after_s: float | None = None,
    ):
        self.operation = operation
        self.reason = reason
        self.status = status
        self.problem_type = problem_type
        # The answer's Retry-After, when it had one: how long the API asks to be left alone
        # (a batch renewal refused `overloaded` by admission control was not sent at all).
        self.retry_after_s = retry_after_s
        super().__init__(f"{operation}: outcome unknown ({reason})")


class UnexpectedResponse(TenureRunnerError):
    """A 2xx whose body does not follow the contract (missing field, wrong type, not JSON)."""


class LeaseInJeopardy(TenureRunnerError):
    """Refused locally: the holder cannot tell whether its lease is still valid (LEASE-4).

    Nothing was sent. Checkpoint and wait; the keeper keeps renewing and the lease either comes
    back to VALID or is LOST.
    """

    def __init__(self, action: str, reason: str, idempotency_key: str = ""):
        self.action = action
        self.reason = reason
        self.idempotency_key = idempotency_key
        super().__init__(f"{action} refused: lease in jeopardy ({reason})")


class LeaseLost(TenureRunnerError):
    """The lease is lost (refused by the coordinator or a recipient, or its bound passed).

    Stop working: another holder may already have taken over with a higher epoch.
    """

    def __init__(self, action: str, reason: str, problem_type: str = ""):
        self.action = action
        self.reason = reason
        self.problem_type = problem_type
        super().__init__(f"{action} refused: lease lost ({reason})")


class LeaseReleased(TenureRunnerError):
    """The lease was released by this holder's terminal report; nothing more can be done under it."""

    def __init__(self, action: str):
        self.action = action
        super().__init__(f"{action} refused: the lease was already released by the terminal report")


class InvalidCertaintyTransition(TenureRunnerError):
    """A certainty transition outside the table in certainty.py (a bug in the caller)."""

    def __init__(self, source: str, target: str):
        self.source = source
        self.target = target
        super().__init__(f"certainty cannot move {source} -> {target}")
