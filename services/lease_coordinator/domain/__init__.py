"""The pure core of the Run aggregate: no I/O, no clock reads, immutable values only."""

from services.lease_coordinator.domain.lifecycle import (
    TERMINAL_STATUSES,
    TRANSITIONS,
    IllegalTransition,
    RunStatus,
    check_transition,
    is_allowed,
)
from services.lease_coordinator.domain.run import (
    Decision,
    Rejection,
    RejectionCode,
    RunState,
    decide,
    evolve,
    fold,
)

__all__ = [
    "TERMINAL_STATUSES",
    "TRANSITIONS",
    "Decision",
    "IllegalTransition",
    "Rejection",
    "RejectionCode",
    "RunState",
    "RunStatus",
    "check_transition",
    "decide",
    "evolve",
    "fold",
    "is_allowed",
]
