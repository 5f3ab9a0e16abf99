"""The lifecycle of a tool endpoint's breaker (BRK-1, BRK-2) as an enum with a transition table.

CLOSED       calls pass; their outcomes fill the window; a transport-failure rate above
             tau_fail opens the breaker.
OPEN         every call fails fast (ERR_CIRCUIT_OPEN) until the cooldown runs out.
HALF_OPEN    one canary at a time across the fleet (K_canary = 1); every other call fails fast.
             Its success closes the breaker, its failure re-opens it with a doubled cooldown.
FORCED_OPEN  an operator opened it: every call fails fast until a reset.
DISABLED     an operator disabled it: every call passes, nothing is counted, until a reset.

`evolve` moves only along this table and raises IllegalTransition otherwise, so a defect shows
up as an error instead of a silent state. A status may stay what it is (an outcome recorded
while open changes nothing of the status, a canary is granted again in half-open).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

__all__ = ["TRANSITIONS", "BreakerStatus", "IllegalTransition", "check_transition"]


class BreakerStatus(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"
    FORCED_OPEN = "forced-open"
    DISABLED = "disabled"

    @property
    def fails_fast(self) -> bool:
        """Calls fail fast (all of them, but the one canary of a half-open breaker)."""
        return self in (B.OPEN, B.HALF_OPEN, B.FORCED_OPEN)


B = BreakerStatus
TRANSITIONS: Mapping[BreakerStatus, frozenset[BreakerStatus]] = {
    # An outcome recorded; the rate passed tau_fail; an operator.
    B.CLOSED: frozenset({B.CLOSED, B.OPEN, B.FORCED_OPEN, B.DISABLED}),
    # A straggler's outcome; the cooldown ran out (timer, or a canary asked for after it); an operator.
    B.OPEN: frozenset({B.OPEN, B.HALF_OPEN, B.CLOSED, B.FORCED_OPEN, B.DISABLED}),
    # A grant or an expiry; canary success; canary failure; an operator.
    B.HALF_OPEN: frozenset({B.HALF_OPEN, B.CLOSED, B.OPEN, B.FORCED_OPEN, B.DISABLED}),
    # Only an operator leaves these: a reset closes, or the other operator state.
    B.FORCED_OPEN: frozenset({B.FORCED_OPEN, B.CLOSED, B.DISABLED}),
    B.DISABLED: frozenset({B.DISABLED, B.CLOSED, B.FORCED_OPEN}),
}


class IllegalTransition(ValueError):
    pass


def check_transition(before: BreakerStatus, after: BreakerStatus) -> BreakerStatus:
    if after not in TRANSITIONS[before]:
        raise IllegalTransition(f"breaker: {before.value} -> {after.value} is not allowed")
    return after
