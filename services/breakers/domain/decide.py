"""decide(state, command, now, policy) -> events or a Rejection; the timers; all pure (BRK-1, BRK-2).

  Closed     every outcome is recorded (CallOutcomeRecorded) into a ring of the last W; once it
             holds min_calls, a failure rate strictly above tau_fail opens (BreakerOpened, with
             the window as evidence and T_cooldown = the policy's base).
  Open       outcomes of calls still in flight are recorded but not counted. A canary asked for
             before the cooldown ran out is refused BREAKER_OPEN; after it, it is granted (the
             breaker half-opens with the grant). The timer at `half_open_at` half-opens it.
  Half-open  the one canary slot (K_canary = 1) is granted like a lease: to one instance, until
             `expires_at`; a second request is refused CANARY_IN_FLIGHT. The holder's report
             closes the breaker (success: the window is reset, the cooldown back to base) or
             re-opens it with T = min(2 * T, T_max). A holder that reports nothing loses the slot
             at `expires_at` (CanaryExpired, a timer; or the next request takes it over).
  Operators  ForceOpen / Disable / Reset, each with its reason recorded.

Redeliveries get no second answer: an outcome is dropped when its instance's seq was seen, any
other accepted command when its id is among the state's recent ones. Each event's id is derived
from its cause, so deciding a command again gives the same records.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from services.breakers.domain.evolve import evolve
from services.breakers.domain.lifecycle import BreakerStatus
from services.breakers.domain.policy import BreakerPolicy, is_failure
from services.breakers.domain.state import BreakerState
from services.common.contracts.breakers import (
    ENDPOINT_ID_PATTERN,
    MAX_DETAIL_CHARS,
    MAX_REASON_CHARS,
    OUTCOMES,
    BreakerClosed,
    BreakerCommand,
    BreakerDisabled,
    BreakerEvent,
    BreakerForcedOpen,
    BreakerHalfOpened,
    BreakerOpened,
    BreakerRejectionCode,
    BreakerReopened,
    BreakerReset,
    CallOutcomeRecorded,
    CanaryExpired,
    CanaryGranted,
    DisableBreaker,
    ForceOpenBreaker,
    RecordCallOutcome,
    ReportCanary,
    RequestCanary,
    ResetBreaker,
)
from services.common.ids import derived_id

__all__ = [
    "ACTOR",
    "Decision",
    "Rejection",
    "decide",
    "decide_timers",
    "next_timer_at",
]

ACTOR = "tenure-breakers"
C = BreakerRejectionCode
B = BreakerStatus
_ENDPOINT = re.compile(ENDPOINT_ID_PATTERN)
_MAX_INSTANCE_CHARS = 128


@dataclass(frozen=True)
class Rejection:
    code: BreakerRejectionCode
    detail: str
    state: BreakerState | None = None


Decision = tuple[BreakerEvent, ...] | Rejection


class _Emitter:
    """Builds a decision's events one by one, folding each at once into `state`."""

    def __init__(
        self, state: BreakerState | None, endpoint: str, cause: str, correlation: str, actor: str, now_ms: int
    ) -> None:
        self._state = state
        self._header = (endpoint, cause, correlation, actor)
        self.now_ms = now_ms
        self.events: list[BreakerEvent] = []

    @classmethod
    def of(cls, state: BreakerState | None, command: BreakerCommand, now_ms: int) -> _Emitter:
        return cls(state, command.run_id, command.command_id, command.correlation_id, command.actor, now_ms)

    @property
    def state(self) -> BreakerState:
        assert self._state is not None, "no breaker yet"
        return self._state

    def emit(self, kind: type[Any], **fields: Any) -> None:
        version = (self._state.version if self._state is not None else 0) + 1
        endpoint, cause, correlation, actor = self._header
        event = kind(
            event_id=derived_id("brk", cause, kind.__name__, str(version)),
            run_id=endpoint,
            version=version,
            occurred_at=self.now_ms,
            causation_id=cause,
            correlation_id=correlation,
            actor=actor,
            **fields,
        )
        self._state = evolve(self._state, event)
        self.events.append(event)


def decide(
    state: BreakerState | None, command: BreakerCommand, now_ms: int, policy: BreakerPolicy
) -> Decision:
    problem = _invalid(command)
    if problem:
        return Rejection(C.INVALID_COMMAND, problem, state)
    if isinstance(command, RecordCallOutcome):
        return _outcome(state, command, now_ms, policy)
    if state is not None and command.command_id in state.recent:
        return ()  # accepted before: a redelivery
    if isinstance(command, RequestCanary):
        return _request_canary(state, command, now_ms, policy)
    if isinstance(command, ReportCanary):
        return _report_canary(state, command, now_ms, policy)
    if isinstance(command, ForceOpenBreaker):
        return _operator(state, command, now_ms, BreakerForcedOpen, B.FORCED_OPEN, C.BREAKER_FORCED_OPEN)
    if isinstance(command, DisableBreaker):
        return _operator(state, command, now_ms, BreakerDisabled, B.DISABLED, C.BREAKER_DISABLED)
    if isinstance(command, ResetBreaker):
        if state is None:
            return Rejection(C.BREAKER_NOT_FOUND, f"no breaker for endpoint {command.run_id}", state)
        em = _Emitter.of(state, command, now_ms)
        em.emit(BreakerReset, reason=command.reason, previous_status=state.status.value)
        return tuple(em.events)
    return Rejection(C.INVALID_COMMAND, f"{type(command).__name__} is not a breaker command", state)


def _invalid(command: BreakerCommand) -> str:
    """Why `command` is malformed, for humans; empty when it is well-formed."""
    if not _ENDPOINT.fullmatch(command.run_id):
        return "runId must be a tool endpoint id (letters, digits and ._:/@-, at most 200)"
    holders = (RecordCallOutcome, RequestCanary, ReportCanary)
    if isinstance(command, holders) and not 0 < len(command.instance_id) <= _MAX_INSTANCE_CHARS:
        return f"instanceId must have 1 to {_MAX_INSTANCE_CHARS} characters"
    if isinstance(command, (RecordCallOutcome, ReportCanary)):
        if command.outcome not in OUTCOMES:
            return f"outcome must be one of {', '.join(OUTCOMES)}"
        if command.duration_ms < 0:
            return "durationMs must not be negative"
        if len(command.detail) > MAX_DETAIL_CHARS:
            return f"detail must have at most {MAX_DETAIL_CHARS} characters"
    if isinstance(command, RecordCallOutcome) and command.seq < 0:
        return "seq must not be negative"
    if isinstance(command, (ForceOpenBreaker, DisableBreaker, ResetBreaker)) and not (
        command.reason.strip() and len(command.reason) <= MAX_REASON_CHARS
    ):
        return f"an operator gives a reason (1 to {MAX_REASON_CHARS} characters)"
    return ""


# --- Closed: the window ---------------------------------------------------------------------------


def _outcome(
    state: BreakerState | None, command: RecordCallOutcome, now_ms: int, policy: BreakerPolicy
) -> Decision:
    if state is not None and command.seq <= state.last_seq(command.instance_id):
        return ()  # seen from this instance: a redelivery (or a straggler behind a newer report)
    counted = state is None or state.status is B.CLOSED
    em = _Emitter.of(state, command, now_ms)
    em.emit(
        CallOutcomeRecorded,
        instance_id=command.instance_id,
        seq=command.seq,
        outcome=command.outcome,
        duration_ms=command.duration_ms,
        detail=command.detail,
        failure=is_failure(command.outcome, command.duration_ms, policy),
        counted=counted,
        window_size=policy.window,
    )
    after = em.state
    if counted and len(after.window) >= policy.min_calls and after.error_rate > policy.failure_rate:
        em.emit(
            BreakerOpened,
            window=after.window,
            calls=len(after.window),
            failures=after.failures,
            error_rate=after.error_rate,
            threshold=policy.failure_rate,
            min_calls=policy.min_calls,
            cooldown_ms=policy.cooldown_ms,
            half_open_at=now_ms + policy.cooldown_ms,
        )
    return tuple(em.events)


# --- Half-open: the one canary -----------------------------------------------------------------


def _request_canary(
    state: BreakerState | None, command: RequestCanary, now_ms: int, policy: BreakerPolicy
) -> Decision:
    if state is None or state.status is B.CLOSED:
        return Rejection(C.BREAKER_CLOSED, "the breaker is closed: calls pass, no canary is needed", state)
    if state.status is B.DISABLED:
        return Rejection(C.BREAKER_DISABLED, "the breaker is disabled: calls pass", state)
    if state.status is B.FORCED_OPEN:
        return Rejection(C.BREAKER_FORCED_OPEN, f"forced open by an operator: {state.reason}", state)
    expired = ""
    if state.status is B.OPEN:
        if now_ms < state.half_open_at:
            left = state.half_open_at - now_ms
            return Rejection(C.BREAKER_OPEN, f"open, cooling down for {left} ms more", state)
        granted_from = "open"
    else:
        canary = state.canary
        if canary is not None and now_ms < canary.expires_at:
            left = canary.expires_at - now_ms
            return Rejection(
                C.CANARY_IN_FLIGHT,
                f"{canary.instance_id} holds the canary slot {canary.canary_id} for {left} ms more",
                state,
            )
        expired = canary.canary_id if canary is not None else ""
        granted_from = "half-open"
    em = _Emitter.of(state, command, now_ms)
    em.emit(
        CanaryGranted,
        canary_id=derived_id("cny", command.command_id),
        instance_id=command.instance_id,
        granted_from=granted_from,
        expires_at=now_ms + policy.canary_lease_ms,
        expired_canary_id=expired,
    )
    return tuple(em.events)


def _report_canary(
    state: BreakerState | None, command: ReportCanary, now_ms: int, policy: BreakerPolicy
) -> Decision:
    canary = state.canary if state is not None else None
    if (
        state is None
        or canary is None
        or (canary.canary_id, canary.instance_id)
        != (
            command.canary_id,
            command.instance_id,
        )
    ):
        held = f"{canary.canary_id} held by {canary.instance_id}" if canary is not None else "no slot held"
        return Rejection(
            C.CANARY_NOT_HELD, f"{command.instance_id} does not hold {command.canary_id} ({held})", state
        )
    # A report after the lease ran out but before anyone took the slot over still counts: the
    # canary call did reach the endpoint, and nobody else has probed it since.
    em = _Emitter.of(state, command, now_ms)
    if not is_failure(command.outcome, command.duration_ms, policy):
        em.emit(
            BreakerClosed,
            canary_id=canary.canary_id,
            instance_id=command.instance_id,
            outcome=command.outcome,
            duration_ms=command.duration_ms,
            open_for_ms=max(0, now_ms - state.open_since),
        )
        return tuple(em.events)
    cooldown = min(2 * state.cooldown_ms, policy.cooldown_max_ms)
    em.emit(
        BreakerReopened,
        canary_id=canary.canary_id,
        instance_id=command.instance_id,
        outcome=command.outcome,
        duration_ms=command.duration_ms,
        detail=command.detail,
        previous_cooldown_ms=state.cooldown_ms,
        cooldown_ms=cooldown,
        half_open_at=now_ms + cooldown,
    )
    return tuple(em.events)


# --- operators ----------------------------------------------------------------------------------


def _operator(
    state: BreakerState | None,
    command: ForceOpenBreaker | DisableBreaker,
    now_ms: int,
    kind: type[BreakerForcedOpen] | type[BreakerDisabled],
    target: BreakerStatus,
    already: BreakerRejectionCode,
) -> Decision:
    if state is not None and state.status is target:
        return Rejection(already, f"the breaker is {target.value} already ({state.reason})", state)
    em = _Emitter.of(state, command, now_ms)
    em.emit(kind, reason=command.reason, previous_status=state.status.value if state is not None else "")
    return tuple(em.events)


# --- timers -------------------------------------------------------------------------------------


def next_timer_at(state: BreakerState | None) -> int | None:
    """When the breaker has timer work next: the end of the cooldown, or of the canary's lease."""
    if state is None:
        return None
    if state.status is B.OPEN:
        return state.half_open_at
    if state.status is B.HALF_OPEN and state.canary is not None:
        return state.canary.expires_at
    return None


def decide_timers(state: BreakerState, now_ms: int) -> tuple[BreakerEvent, ...]:
    """The events of the breaker's due timer at `now_ms`, recorded with `now_ms`."""
    due = next_timer_at(state)
    if due is None or now_ms < due:
        return ()
    if state.status is B.OPEN:
        em = _Emitter(
            state, state.endpoint, f"timer/{state.endpoint}/{state.opened_at}", state.endpoint, ACTOR, now_ms
        )
        em.emit(BreakerHalfOpened, opened_at=state.opened_at, cooldown_ms=state.cooldown_ms)
        return tuple(em.events)
    canary = state.canary
    assert canary is not None
    em = _Emitter(state, state.endpoint, f"timer/{canary.canary_id}", state.endpoint, ACTOR, now_ms)
    em.emit(
        CanaryExpired,
        canary_id=canary.canary_id,
        instance_id=canary.instance_id,
        expires_at=canary.expires_at,
    )
    return tuple(em.events)
