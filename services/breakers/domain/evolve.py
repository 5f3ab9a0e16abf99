"""evolve(state, event) -> state: the fold of a breaker's events (pure, total over valid histories).

Each event says everything the fold needs (W in force, the classification of an outcome, the
cooldown), so the fold depends on no setting. The status moves only along the lifecycle table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from services.breakers.domain.lifecycle import BreakerStatus, IllegalTransition, check_transition
from services.breakers.domain.state import MAX_INSTANCES, MAX_RECENT, BreakerState, Canary
from services.common.contracts.breakers import (
    BreakerClosed,
    BreakerDisabled,
    BreakerEvent,
    BreakerForcedOpen,
    BreakerHalfOpened,
    BreakerOpened,
    BreakerReopened,
    BreakerReset,
    CallOutcomeRecorded,
    CanaryExpired,
    CanaryGranted,
)

__all__ = ["evolve", "fold"]

B = BreakerStatus
# The events that may create a breaker: an outcome of a first call, or an operator acting first.
_FIRST = (CallOutcomeRecorded, BreakerForcedOpen, BreakerDisabled)
# The statuses each machine-made transition may start from (operators may act from any status
# the lifecycle table allows): the table says what may follow what, this says which event may.
_FROM: dict[type[BreakerEvent], frozenset[BreakerStatus]] = {
    BreakerOpened: frozenset({B.CLOSED}),
    BreakerHalfOpened: frozenset({B.OPEN}),
    CanaryGranted: frozenset({B.OPEN, B.HALF_OPEN}),
    CanaryExpired: frozenset({B.HALF_OPEN}),
    BreakerClosed: frozenset({B.HALF_OPEN}),
    BreakerReopened: frozenset({B.HALF_OPEN}),
}


def fold(events: Iterable[BreakerEvent]) -> BreakerState | None:
    state: BreakerState | None = None
    for event in events:
        state = evolve(state, event)
    return state


def evolve(state: BreakerState | None, event: BreakerEvent) -> BreakerState:
    if state is None:
        if not isinstance(event, _FIRST):
            raise ValueError(f"{type(event).__name__} for breaker {event.run_id}, which does not exist")
        state = BreakerState(endpoint=event.run_id, version=0, status=B.CLOSED)
    if event.version != state.version + 1 or event.run_id != state.endpoint:
        raise ValueError(
            f"{type(event).__name__} v{event.version} of {event.run_id} does not follow "
            f"{state.endpoint} v{state.version}"
        )
    allowed = _FROM.get(type(event))
    if allowed is not None and state.status not in allowed:
        raise IllegalTransition(f"breaker: {type(event).__name__} cannot happen while {state.status.value}")
    state = replace(state, version=event.version, updated_at=event.occurred_at)
    if isinstance(event, CallOutcomeRecorded):
        return _outcome(state, event)
    if isinstance(event, BreakerOpened):
        return replace(
            state,
            status=check_transition(state.status, B.OPEN),
            cooldown_ms=event.cooldown_ms,
            open_since=event.occurred_at,
            opened_at=event.occurred_at,
            half_open_at=event.half_open_at,
            times_opened=state.times_opened + 1,
        )
    if isinstance(event, BreakerHalfOpened):
        return replace(state, status=check_transition(state.status, B.HALF_OPEN))
    if isinstance(event, CanaryGranted):
        canary = Canary(
            event.canary_id, event.instance_id, event.causation_id, event.occurred_at, event.expires_at
        )
        return _remember(
            replace(state, status=check_transition(state.status, B.HALF_OPEN), canary=canary), event
        )
    if isinstance(event, CanaryExpired):
        return replace(state, status=check_transition(state.status, B.HALF_OPEN), canary=None)
    if isinstance(event, BreakerClosed):
        return _remember(_closed(state), event)
    if isinstance(event, BreakerReopened):
        reopened = replace(
            state,
            status=check_transition(state.status, B.OPEN),
            cooldown_ms=event.cooldown_ms,
            opened_at=event.occurred_at,
            half_open_at=event.half_open_at,
            canary=None,
            times_opened=state.times_opened + 1,
        )
        return _remember(reopened, event)
    if isinstance(event, BreakerForcedOpen):
        forced = replace(state, status=check_transition(state.status, B.FORCED_OPEN), canary=None)
        return _remember(replace(forced, reason=event.reason, half_open_at=0), event)
    if isinstance(event, BreakerDisabled):
        disabled = replace(state, status=check_transition(state.status, B.DISABLED), canary=None, window=())
        return _remember(replace(disabled, reason=event.reason, half_open_at=0), event)
    if isinstance(event, BreakerReset):
        return _remember(replace(_closed(state), reason=event.reason), event)
    raise TypeError(f"not a breaker event: {type(event).__name__}")


def _outcome(state: BreakerState, event: CallOutcomeRecorded) -> BreakerState:
    instances = tuple(entry for entry in state.instances if entry[0] != event.instance_id)
    instances = (*instances, (event.instance_id, event.seq))[-MAX_INSTANCES:]
    window = state.window
    if event.counted:
        window = (*window, event.failure)[-event.window_size :]
    return replace(
        state, status=check_transition(state.status, state.status), window=window, instances=instances
    )


def _closed(state: BreakerState) -> BreakerState:
    return replace(
        state,
        status=check_transition(state.status, B.CLOSED),
        window=(),
        cooldown_ms=0,
        open_since=0,
        opened_at=0,
        half_open_at=0,
        canary=None,
    )


def _remember(state: BreakerState, event: BreakerEvent) -> BreakerState:
    """Keep the id of the command behind `event`, so a redelivery of it is answered with nothing."""
    if event.causation_id in state.recent:
        return state
    return replace(state, recent=(*state.recent, event.causation_id)[-MAX_RECENT:])
