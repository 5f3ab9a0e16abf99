"""How a Run's life goes beyond one Attempt: cancel of a running Run, deadlines, user retries
and waiting for a user's input from a checkpoint, as immutable values (times are epoch millis).
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.contracts._headers import CommandHeader, EventHeader

__all__ = [
    "DeadlineReached",
    "InputProvided",
    "InputRequested",
    "ProvideInput",
    "RequestInput",
    "RetryRun",
    "RunCancelRequested",
    "RunFailed",
    "RunInterrupted",
    "RunRetried",
]

# --- commands -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RetryRun(CommandHeader):
    """A user's explicit retry of an interrupted Run: same Run, a new Attempt later (EXE-5)."""

    acknowledge_repeated_effects: bool = False
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class RequestInput(CommandHeader):
    """The holder saved a checkpoint and asks a user for input, then releases its lease (EXE-8).

    Fenced like a heartbeat (EXE-4). `input_schema` is a JSON Schema as canonical JSON; after
    `expires_at` the waiting Run fails with INPUT_EXPIRED (EXE-10).
    """

    attempt_id: str
    lease_epoch: int
    sequence: int
    checkpoint_digest: str
    input_schema: str
    prompt: str
    expires_at: int


@dataclass(frozen=True, kw_only=True)
class ProvideInput(CommandHeader):
    """A user's answer (canonical JSON, already validated by the API against the request's
    schema); a repeated `response_id` creates no further Attempt (EXE-8)."""

    response_id: str
    answer: str


# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RunCancelRequested(EventHeader):
    """Cancel of a running Run accepted: it is cancelling until the runner confirms (EXE-7)."""

    reason: str
    previous_status: str
    attempt_id: str
    epoch: int
    grace_until: int


@dataclass(frozen=True, kw_only=True)
class RunInterrupted(EventHeader):
    """Stopped without a confirmed result, e.g. reason "CANCEL_UNCONFIRMED" (EXE-7, EXE-10)."""

    reason: str
    attempt_id: str | None = None
    epoch: int = 0
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class DeadlineReached(EventHeader):
    """The deadline passed; with `stop_requested` the holder must confirm a stop (EXE-10)."""

    deadline_at: int
    previous_status: str
    stop_requested: bool
    attempt_id: str | None = None
    epoch: int = 0
    grace_until: int | None = None


@dataclass(frozen=True, kw_only=True)
class RunFailed(EventHeader):
    """The Run ended failed (terminal), e.g. code "DEADLINE_EXCEEDED" or "PREPARATION_FAILED"."""

    code: str
    detail: str
    attempt_id: str | None = None
    epoch: int = 0


@dataclass(frozen=True, kw_only=True)
class RunRetried(EventHeader):
    """A user's retry of an interrupted Run accepted: the Run is queued again (EXE-5)."""

    acknowledged_repeated_effects: bool
    reason: str
    attempts_used: int
    previous_status: str


@dataclass(frozen=True, kw_only=True)
class InputRequested(EventHeader):
    """The Run waits for input from the checkpoint `checkpoint_digest` (EXE-8); the deadline
    keeps running meanwhile (EXE-10)."""

    attempt_id: str
    epoch: int
    request_id: str
    checkpoint_digest: str
    input_schema: str
    prompt: str
    expires_at: int


@dataclass(frozen=True, kw_only=True)
class InputProvided(EventHeader):
    """The answer to request `request_id` was accepted; a continuation Attempt resumes from
    `checkpoint_digest`, pinned to the original ExecutionSpec (EXE-8, EXE-9)."""

    request_id: str
    response_id: str
    answer: str
    checkpoint_digest: str
