"""The circuit breaker of one tool endpoint (BRK-1, BRK-2): what it is told, and what it decides.

One breaker per tool endpoint, shared by the whole fleet: every gateway instance reports its
calls' outcomes to it and follows its state. The aggregate id is the ENDPOINT id, carried in the
header's `run_id` slot (the one aggregate runtime and every Tenure contract name their aggregate
there; `endpoint` reads it under its real name). Records are keyed by endpoint on
breakers.commands / breakers.events / breakers.rejections, routed by services.common.routing
`partition_for_endpoint`. Refusals are CommandRejected records with a `BreakerRejectionCode`.

Outcome classes (`outcome`): "success" (including application errors such as 404 or a
validation failure: the endpoint answered), "transport-failure" (timeout, connect error, 5xx,
429, malformed frame) and "slow" (answered, but over the slow-call threshold). Durations are
milliseconds; times are epoch milliseconds on the breaker processor's clock.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Union

from services.common.contracts._headers import CommandHeader, EventHeader

__all__ = [
    "BREAKER_COMMANDS_NS",
    "BREAKER_COMMAND_TYPES",
    "BREAKER_EVENTS_NS",
    "BREAKER_EVENT_TYPES",
    "ENDPOINT_ID_PATTERN",
    "MAX_DETAIL_CHARS",
    "MAX_REASON_CHARS",
    "OUTCOMES",
    "SLOW",
    "SUCCESS",
    "TRANSPORT_FAILURE",
    "BreakerClosed",
    "BreakerCommand",
    "BreakerDisabled",
    "BreakerEvent",
    "BreakerForcedOpen",
    "BreakerHalfOpened",
    "BreakerOpened",
    "BreakerRejectionCode",
    "BreakerReopened",
    "BreakerReset",
    "CallOutcomeRecorded",
    "CanaryExpired",
    "CanaryGranted",
    "DisableBreaker",
    "ForceOpenBreaker",
    "RecordCallOutcome",
    "ReportCanary",
    "RequestCanary",
    "ResetBreaker",
]

BREAKER_COMMANDS_NS = "tenure.breakers.commands"
BREAKER_EVENTS_NS = "tenure.breakers.events"

SUCCESS = "success"
TRANSPORT_FAILURE = "transport-failure"
SLOW = "slow"
OUTCOMES = (SUCCESS, TRANSPORT_FAILURE, SLOW)

# An endpoint id names a tool endpoint the gateway calls, e.g. "env" or "ledger/transfer": it is
# a Kafka key and a store key, so it is short and plain.
ENDPOINT_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:/@-]{0,199}"
MAX_DETAIL_CHARS = 200
MAX_REASON_CHARS = 1000


class BreakerRejectionCode(StrEnum):
    """The breaker's rejection codes (services/breakers); the value is CommandRejected.code."""

    INVALID_COMMAND = "INVALID_COMMAND"
    BREAKER_NOT_FOUND = "BREAKER_NOT_FOUND"
    # A canary was asked of a breaker that lets calls through: nothing to probe, just call.
    BREAKER_CLOSED = "BREAKER_CLOSED"
    BREAKER_DISABLED = "BREAKER_DISABLED"
    # Open and still cooling down (the detail says how long), or forced open by an operator.
    BREAKER_OPEN = "BREAKER_OPEN"
    BREAKER_FORCED_OPEN = "BREAKER_FORCED_OPEN"
    # Half-open, and another instance holds the one canary slot (K_canary = 1).
    CANARY_IN_FLIGHT = "CANARY_IN_FLIGHT"
    # A canary report for a slot the reporter does not hold (expired, re-granted, never granted).
    CANARY_NOT_HELD = "CANARY_NOT_HELD"


class _Endpoint:
    """`endpoint`: the aggregate id under its real name (the header's `run_id` slot)."""

    run_id: str

    @property
    def endpoint(self) -> str:
        return self.run_id


# --- commands (breakers.commands) -------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RecordCallOutcome(_Endpoint, CommandHeader):
    """One call to the endpoint, as a gateway instance saw it. `seq` is the instance's own
    strictly increasing number: the breaker drops an outcome whose seq it has seen from that
    instance (a redelivery), so a retried publish is counted once."""

    instance_id: str
    seq: int
    outcome: str
    duration_ms: int = 0
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class RequestCanary(_Endpoint, CommandHeader):
    """Ask for the one canary slot of a half-open breaker (granted like a lease, with an expiry)."""

    instance_id: str


@dataclass(frozen=True, kw_only=True)
class ReportCanary(_Endpoint, CommandHeader):
    """How the canary call of a granted slot went."""

    instance_id: str
    canary_id: str
    outcome: str
    duration_ms: int = 0
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class ForceOpenBreaker(_Endpoint, CommandHeader):
    """Operator: fail every call fast until a reset (resilience4j FORCED_OPEN)."""

    reason: str


@dataclass(frozen=True, kw_only=True)
class DisableBreaker(_Endpoint, CommandHeader):
    """Operator: let every call through and count nothing until a reset (resilience4j DISABLED)."""

    reason: str


@dataclass(frozen=True, kw_only=True)
class ResetBreaker(_Endpoint, CommandHeader):
    """Operator: back to Closed with an empty window and the base cooldown."""

    reason: str


# --- events (breakers.events) -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CallOutcomeRecorded(_Endpoint, EventHeader):
    """An outcome taken in. `failure`: it counts as a failure (a transport failure, or a slow
    call while slow calls count); `counted`: it entered the window (only while Closed);
    `window_size`: the W in force, so the fold needs no setting."""

    instance_id: str
    seq: int
    outcome: str
    duration_ms: int
    detail: str
    failure: bool
    counted: bool
    window_size: int


@dataclass(frozen=True, kw_only=True)
class BreakerOpened(_Endpoint, EventHeader):
    """Closed -> Open: the window's error rate passed the threshold. `window`: the evidence, oldest
    first, True = failure."""

    window: tuple[bool, ...]
    calls: int
    failures: int
    error_rate: float
    threshold: float
    min_calls: int
    cooldown_ms: int
    half_open_at: int


@dataclass(frozen=True, kw_only=True)
class BreakerHalfOpened(_Endpoint, EventHeader):
    """Open -> Half-open: the cooldown ran out (a timer of the breaker processor)."""

    opened_at: int
    cooldown_ms: int


@dataclass(frozen=True, kw_only=True)
class CanaryGranted(_Endpoint, EventHeader):
    """The one canary slot, to `instance_id` until `expires_at`. `granted_from`: "open" (the
    cooldown ran out before its timer fired; the breaker half-opens with this grant) or
    "half-open". `expired_canary_id`: the slot this grant replaces, whose lease had run out ("")."""

    canary_id: str
    instance_id: str
    granted_from: str
    expires_at: int
    expired_canary_id: str


@dataclass(frozen=True, kw_only=True)
class CanaryExpired(_Endpoint, EventHeader):
    """The canary's holder reported nothing before its lease ran out (it died, most likely): the
    slot is free again, the breaker stays half-open."""

    canary_id: str
    instance_id: str
    expires_at: int


@dataclass(frozen=True, kw_only=True)
class BreakerClosed(_Endpoint, EventHeader):
    """Half-open -> Closed: the canary succeeded; the window is reset, the cooldown back to base."""

    canary_id: str
    instance_id: str
    outcome: str
    duration_ms: int
    open_for_ms: int


@dataclass(frozen=True, kw_only=True)
class BreakerReopened(_Endpoint, EventHeader):
    """Half-open -> Open: the canary failed; the cooldown is min(2 * previous, max)."""

    canary_id: str
    instance_id: str
    outcome: str
    duration_ms: int
    detail: str
    previous_cooldown_ms: int
    cooldown_ms: int
    half_open_at: int


@dataclass(frozen=True, kw_only=True)
class BreakerForcedOpen(_Endpoint, EventHeader):
    reason: str
    previous_status: str


@dataclass(frozen=True, kw_only=True)
class BreakerDisabled(_Endpoint, EventHeader):
    reason: str
    previous_status: str


@dataclass(frozen=True, kw_only=True)
class BreakerReset(_Endpoint, EventHeader):
    reason: str
    previous_status: str


BreakerCommand = Union[
    RecordCallOutcome, RequestCanary, ReportCanary, ForceOpenBreaker, DisableBreaker, ResetBreaker
]
BreakerEvent = Union[
    CallOutcomeRecorded,
    BreakerOpened,
    BreakerHalfOpened,
    CanaryGranted,
    CanaryExpired,
    BreakerClosed,
    BreakerReopened,
    BreakerForcedOpen,
    BreakerDisabled,
    BreakerReset,
]
BREAKER_COMMAND_TYPES: tuple[type[Any], ...] = typing.get_args(BreakerCommand)
BREAKER_EVENT_TYPES: tuple[type[Any], ...] = typing.get_args(BreakerEvent)
