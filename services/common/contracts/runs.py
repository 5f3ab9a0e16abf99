"""Commands, events and rejections of the Run aggregate as immutable values.

Field names are snake_case here and camelCase on the wire (the Avro schemas in schemas/runs);
`to_record`/`from_record` translate one to the other so no other module spells a wire name.
Avro maps are read-only mappings here and Avro arrays are tuples, so values stay immutable.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Union

__all__ = [
    "COMMAND_TYPES",
    "EVENT_TYPES",
    "AttemptClaimed",
    "AttemptReported",
    "CancelRun",
    "ClaimRun",
    "CommandRejected",
    "DeadlineReached",
    "EffectIntentRecorded",
    "EffectOutcomeRecorded",
    "LeaseAtRisk",
    "LeaseExpired",
    "LeaseRenewed",
    "LeaseTakenOver",
    "RecordEffectIntent",
    "RecordEffectOutcome",
    "RenewLease",
    "ReportAttempt",
    "RetryRun",
    "RunCancelRequested",
    "RunCancelled",
    "RunCommand",
    "RunEvent",
    "RunFailed",
    "RunInterrupted",
    "RunRequeued",
    "RunRetried",
    "RunSubmitted",
    "SubmitRun",
    "TakeOverLease",
    "from_record",
    "full_name_of",
    "to_record",
]

_COMMANDS_NS = "tenure.runs.commands"
_EVENTS_NS = "tenure.runs.events"
_REJECTIONS_NS = "tenure.runs.rejections"


# --- commands -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _CommandBase:
    command_id: str
    run_id: str
    issued_at: int
    correlation_id: str
    actor: str


@dataclass(frozen=True, kw_only=True)
class SubmitRun(_CommandBase):
    """Create a Run; `parent_run_id` names the terminal Run a user's retry copies (EXE-5)."""

    tenant: str
    idempotency_key: str
    execution_spec: str
    retry_safe: bool = False
    timeout_seconds: int
    max_attempts: int = 3
    parent_run_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class CancelRun(_CommandBase):
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class ClaimRun(_CommandBase):
    """A runner or human asks for a queued Run; 0 seconds means the deployment default."""

    runner_id: str
    holder_kind: str = "runner"
    capabilities: tuple[str, ...] = ()
    lease_seconds: int = 0
    heartbeat_seconds: int = 0


@dataclass(frozen=True, kw_only=True)
class RenewLease(_CommandBase):
    """The holder's heartbeat, fenced by attempt id and lease epoch (EXE-4)."""

    attempt_id: str
    lease_epoch: int
    sequence: int


@dataclass(frozen=True, kw_only=True)
class ReportAttempt(_CommandBase):
    """The holder's terminal report of its Attempt: outcome "succeeded" or "failed"."""

    attempt_id: str
    lease_epoch: int
    sequence: int
    outcome: str
    error_code: str = ""
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class TakeOverLease(_CommandBase):
    """Revoke the current lease and issue a new one to `new_holder` (LEASE-6, LEASE-7)."""

    reason: str
    new_holder: str
    holder_kind: str = "runner"
    lease_seconds: int = 0


@dataclass(frozen=True, kw_only=True)
class RecordEffectIntent(_CommandBase):
    """The holder announces an external effect before causing it (intent before action)."""

    attempt_id: str
    lease_epoch: int
    effect_id: str
    idempotency_key: str
    tool: str
    operation: str


@dataclass(frozen=True, kw_only=True)
class RecordEffectOutcome(_CommandBase):
    """How an announced effect ended: "committed", "failed" or "unknown"."""

    attempt_id: str
    lease_epoch: int
    effect_id: str
    outcome: str
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class RetryRun(_CommandBase):
    """A user's explicit retry of an interrupted Run: same Run, a new Attempt later (EXE-5)."""

    acknowledge_repeated_effects: bool = False
    reason: str = ""


RunCommand = Union[
    SubmitRun,
    CancelRun,
    ClaimRun,
    RenewLease,
    ReportAttempt,
    TakeOverLease,
    RecordEffectIntent,
    RecordEffectOutcome,
    RetryRun,
]

# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _EventBase:
    event_id: str
    run_id: str
    version: int
    occurred_at: int
    causation_id: str
    correlation_id: str
    actor: str


@dataclass(frozen=True, kw_only=True)
class RunSubmitted(_EventBase):
    tenant: str
    idempotency_key: str
    execution_spec: str
    spec_digest: str
    retry_safe: bool
    timeout_seconds: int
    max_attempts: int
    queue_reservation_id: str
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    parent_run_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class RunCancelled(_EventBase):
    reason: str
    previous_status: str
    reservation_released: bool


@dataclass(frozen=True, kw_only=True)
class AttemptClaimed(_EventBase):
    """A new Attempt and its lease, issued together; times are epoch millis.

    `deadline_at` is fixed at the Run's first assignment and repeated on later claims (EXE-10).
    """

    attempt_id: str
    attempt_number: int
    lease_id: str
    epoch: int
    holder: str
    holder_kind: str
    capabilities: tuple[str, ...]
    lease_seconds: int
    heartbeat_seconds: int
    at_risk_after_ms: int
    expires_at: int
    deadline_at: int | None = None


@dataclass(frozen=True, kw_only=True)
class LeaseRenewed(_EventBase):
    """An accepted heartbeat; `run_started` when it moved the Run preparing -> running."""

    attempt_id: str
    lease_id: str
    epoch: int
    sequence: int
    expires_at: int
    run_started: bool = False


@dataclass(frozen=True, kw_only=True)
class LeaseAtRisk(_EventBase):
    """No renewal for the lease's at-risk interval: jeopardy, not yet expiry (LEASE-4)."""

    attempt_id: str
    lease_id: str
    epoch: int
    last_renewal_at: int
    expires_at: int


@dataclass(frozen=True, kw_only=True)
class LeaseExpired(_EventBase):
    """The lease passed `expires_at` (the rule's deadline; `occurred_at` is the timer's decision)."""

    attempt_id: str
    lease_id: str
    epoch: int
    expires_at: int
    last_renewal_at: int
    last_sequence: int


@dataclass(frozen=True, kw_only=True)
class RunRequeued(_EventBase):
    """The Run went back to the queue for another Attempt, e.g. reason "LEASE_EXPIRED"."""

    reason: str
    attempts_used: int
    attempts_remaining: int


@dataclass(frozen=True, kw_only=True)
class LeaseTakenOver(_EventBase):
    """The previous lease revoked and a new one issued with a higher epoch, and why."""

    previous_attempt_id: str
    previous_lease_id: str
    previous_epoch: int
    previous_holder: str
    attempt_id: str
    lease_id: str
    epoch: int
    holder: str
    holder_kind: str
    reason: str
    last_renewal_at: int
    last_sequence: int
    effects_attempted: tuple[str, ...]
    lease_seconds: int
    heartbeat_seconds: int
    at_risk_after_ms: int
    expires_at: int


@dataclass(frozen=True, kw_only=True)
class AttemptReported(_EventBase):
    """The holder's accepted terminal report of its Attempt."""

    attempt_id: str
    lease_id: str
    epoch: int
    sequence: int
    outcome: str
    error_code: str
    detail: str


@dataclass(frozen=True, kw_only=True)
class EffectIntentRecorded(_EventBase):
    """An external effect announced under a lease before it was caused."""

    attempt_id: str
    lease_id: str
    epoch: int
    effect_id: str
    idempotency_key: str
    tool: str
    operation: str


@dataclass(frozen=True, kw_only=True)
class EffectOutcomeRecorded(_EventBase):
    """The recorded outcome of an announced effect."""

    attempt_id: str
    lease_id: str
    epoch: int
    effect_id: str
    outcome: str
    detail: str


@dataclass(frozen=True, kw_only=True)
class RunCancelRequested(_EventBase):
    """Cancel of a running Run accepted: it is cancelling until the runner confirms (EXE-7)."""

    reason: str
    previous_status: str
    attempt_id: str
    epoch: int
    grace_until: int


@dataclass(frozen=True, kw_only=True)
class RunInterrupted(_EventBase):
    """Stopped without a confirmed result, e.g. reason "CANCEL_UNCONFIRMED" (EXE-7, EXE-10)."""

    reason: str
    attempt_id: str | None = None
    epoch: int = 0
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class DeadlineReached(_EventBase):
    """The deadline passed; with `stop_requested` the holder must confirm a stop (EXE-10)."""

    deadline_at: int
    previous_status: str
    stop_requested: bool
    attempt_id: str | None = None
    epoch: int = 0
    grace_until: int | None = None


@dataclass(frozen=True, kw_only=True)
class RunFailed(_EventBase):
    """The Run ended failed (terminal), e.g. code "DEADLINE_EXCEEDED" or "PREPARATION_FAILED"."""

    code: str
    detail: str
    attempt_id: str | None = None
    epoch: int = 0


@dataclass(frozen=True, kw_only=True)
class RunRetried(_EventBase):
    """A user's retry of an interrupted Run accepted: the Run is queued again (EXE-5)."""

    acknowledged_repeated_effects: bool
    reason: str
    attempts_used: int
    previous_status: str


RunEvent = Union[
    RunSubmitted,
    RunCancelled,
    AttemptClaimed,
    LeaseRenewed,
    LeaseAtRisk,
    LeaseExpired,
    RunRequeued,
    LeaseTakenOver,
    AttemptReported,
    EffectIntentRecorded,
    EffectOutcomeRecorded,
    RunCancelRequested,
    RunInterrupted,
    DeadlineReached,
    RunFailed,
    RunRetried,
]

# --- rejections -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CommandRejected:
    """A command the processor refused. It changes nothing, so it carries no aggregate version."""

    event_id: str
    run_id: str
    occurred_at: int
    causation_id: str
    correlation_id: str
    actor: str
    command_type: str
    code: str
    detail: str
    current_status: str | None
    current_version: int


# --- wire mapping ---------------------------------------------------------------------------

COMMAND_TYPES: tuple[type[Any], ...] = (
    SubmitRun,
    CancelRun,
    ClaimRun,
    RenewLease,
    ReportAttempt,
    TakeOverLease,
    RecordEffectIntent,
    RecordEffectOutcome,
    RetryRun,
)
EVENT_TYPES: tuple[type[Any], ...] = (
    RunSubmitted,
    RunCancelled,
    AttemptClaimed,
    LeaseRenewed,
    LeaseAtRisk,
    LeaseExpired,
    RunRequeued,
    LeaseTakenOver,
    AttemptReported,
    EffectIntentRecorded,
    EffectOutcomeRecorded,
    RunCancelRequested,
    RunInterrupted,
    DeadlineReached,
    RunFailed,
    RunRetried,
)
_NAMESPACE_BY_TYPE: dict[type[Any], str] = {
    **{cls: _COMMANDS_NS for cls in COMMAND_TYPES},
    **{cls: _EVENTS_NS for cls in EVENT_TYPES},
    CommandRejected: _REJECTIONS_NS,
}
_TYPE_BY_FULL_NAME: dict[str, type[Any]] = {
    f"{ns}.{cls.__name__}": cls for cls, ns in _NAMESPACE_BY_TYPE.items()
}

_CAMEL_BOUNDARY = re.compile(r"_([a-z])")
_SNAKE_BOUNDARY = re.compile(r"([A-Z])")


def _to_camel(name: str) -> str:
    return _CAMEL_BOUNDARY.sub(lambda m: m.group(1).upper(), name)


def _to_snake(name: str) -> str:
    return _SNAKE_BOUNDARY.sub(lambda m: "_" + m.group(1).lower(), name)


def full_name_of(message: object) -> str:
    """The Avro full name of a contract value or type, e.g. tenure.runs.events.RunSubmitted."""
    cls = message if isinstance(message, type) else type(message)
    return f"{_NAMESPACE_BY_TYPE[cls]}.{cls.__name__}"


def _to_wire(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def _from_wire(value: Any) -> Any:
    # Read-only containers keep decoded values immutable, and tuples keep them hashable.
    if isinstance(value, Mapping):
        return MappingProxyType(dict(value))
    if isinstance(value, list):
        return tuple(value)
    return value


def to_record(message: object) -> dict[str, Any]:
    """The Avro record (camelCase dict; maps as dicts, arrays as lists) of a contract value."""
    if not dataclasses.is_dataclass(message) or isinstance(message, type):
        raise TypeError(f"not a contract value: {message!r}")
    return {_to_camel(f.name): _to_wire(getattr(message, f.name)) for f in dataclasses.fields(message)}


def from_record(full_name: str, record: Mapping[str, Any]) -> Any:
    """The contract value for a decoded Avro record; unknown wire fields are ignored.

    Maps become read-only mappings and arrays become tuples, so the value stays immutable.
    """
    try:
        cls = _TYPE_BY_FULL_NAME[full_name]
    except KeyError:
        raise KeyError(f"no contract type is registered for schema {full_name!r}") from None
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in record.items():
        name = _to_snake(key)
        if name in names:
            kwargs[name] = _from_wire(value)
    return cls(**kwargs)
