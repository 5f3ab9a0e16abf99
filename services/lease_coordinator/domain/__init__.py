"""The pure core of the Run aggregate: no I/O, no clock reads, immutable values only."""

from services.lease_coordinator.domain.inputs import CHECKPOINT_CAPABILITY, run_id_of_grant
from services.lease_coordinator.domain.lease import decide_timers, next_timer_at
from services.lease_coordinator.domain.lifecycle import (
    LEASE_TRANSITIONS,
    TERMINAL_STATUSES,
    TRANSITIONS,
    IllegalTransition,
    LeaseCertainty,
    RunStatus,
    check_transition,
    is_allowed,
)
from services.lease_coordinator.domain.run import decide, evolve, fold, rejection_event
from services.lease_coordinator.domain.state import (
    DEFAULT_POLICY,
    Decision,
    EffectRecord,
    InputWait,
    LeasePolicy,
    LeaseState,
    Rejection,
    RejectionCode,
    RunState,
    StopKind,
    StopRequest,
    attempt_id_for,
    run_id_of_attempt,
)

__all__ = [
    "CHECKPOINT_CAPABILITY",
    "DEFAULT_POLICY",
    "LEASE_TRANSITIONS",
    "TERMINAL_STATUSES",
    "TRANSITIONS",
    "Decision",
    "EffectRecord",
    "IllegalTransition",
    "InputWait",
    "LeaseCertainty",
    "LeasePolicy",
    "LeaseState",
    "Rejection",
    "RejectionCode",
    "RunState",
    "RunStatus",
    "StopKind",
    "StopRequest",
    "attempt_id_for",
    "check_transition",
    "decide",
    "decide_timers",
    "evolve",
    "fold",
    "is_allowed",
    "next_timer_at",
    "rejection_event",
    "run_id_of_attempt",
    "run_id_of_grant",
]
