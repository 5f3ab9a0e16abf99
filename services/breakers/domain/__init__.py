"""The circuit breaker's pure core (BRK-1, BRK-2): the lifecycle, decide/evolve, the timers.

No I/O and no clock anywhere below: time comes in as a value and the deployment's settings as a
`BreakerPolicy`; `decide`, `decide_timers` and `evolve` are total functions of them.
"""

from services.breakers.domain.decide import (
    ACTOR,
    Decision,
    Rejection,
    decide,
    decide_timers,
    next_timer_at,
)
from services.breakers.domain.evolve import evolve, fold
from services.breakers.domain.lifecycle import (
    TRANSITIONS,
    BreakerStatus,
    IllegalTransition,
    check_transition,
)
from services.breakers.domain.policy import (
    BOUNDS,
    DEFAULT_POLICY,
    BreakerPolicy,
    is_failure,
    out_of_bounds,
    outcome_for_status,
)
from services.breakers.domain.state import (
    MAX_INSTANCES,
    MAX_RECENT,
    BreakerState,
    Canary,
    Verdict,
    verdict,
)

__all__ = [
    "ACTOR",
    "BOUNDS",
    "DEFAULT_POLICY",
    "MAX_INSTANCES",
    "MAX_RECENT",
    "TRANSITIONS",
    "BreakerPolicy",
    "BreakerState",
    "BreakerStatus",
    "Canary",
    "Decision",
    "IllegalTransition",
    "Rejection",
    "Verdict",
    "check_transition",
    "decide",
    "decide_timers",
    "evolve",
    "fold",
    "is_failure",
    "next_timer_at",
    "out_of_bounds",
    "outcome_for_status",
    "verdict",
]
