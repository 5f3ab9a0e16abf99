"""The two lifecycles of a saga as enums with explicit transition tables (SAGA-3, SAGA-6).

A sub-transaction (step) and the trajectory as a whole each move only along these tables;
`evolve` refuses anything else, so a bug shows up as an error instead of a silent state.
"""

from __future__ import annotations

import enum
from typing import Mapping

__all__ = [
    "STEP_TRANSITIONS",
    "TRAJECTORY_TRANSITIONS",
    "IllegalTransition",
    "StepStatus",
    "TrajectoryStatus",
    "check_step",
    "check_trajectory",
]


class StepStatus(enum.Enum):
    AWAITING_GATE = "awaiting-gate"  # a pivot waiting for its deterministic gate / approval
    PREPARING = "preparing"  # the pivot's gate passed: the durable PREPARING record (SAGA-6)
    PENDING = "pending"  # intent recorded, the gateway may dispatch
    DISPATCHED = "dispatched"  # sent, outcome unknown: reconcile before any retry (REC-6)
    COMMITTED = "committed"
    FAILED = "failed"  # no effect (or only partial effects, compensated like a commit)
    COMPENSATING = "compensating"  # a compensator failed retriably and backs off
    COMPENSATED = "compensated"
    PANIC = "panic"  # a compensator failed fatally: a human must look (SAGA-3)


class TrajectoryStatus(enum.Enum):
    FORWARD = "forward"  # preparation phase: steps run, the compensation stack is live
    AWAITING_REPAIR = "awaiting-repair"  # D chose FORWARD_REPAIR: the runner must propose a fix
    AWAITING_APPROVAL = "awaiting-approval"  # the pivot waits for a human (SAGA-6)
    POST_PIVOT = "post-pivot"  # the pivot committed; the stack is retired, never rolled back
    UNWINDING = "unwinding"  # BACKWARD_ROLLBACK in progress (SAGA-3)
    COMPLETED = "completed"
    ROLLED_BACK = "rolled-back"  # cleanly aborted: every committed effect compensated
    FROZEN = "frozen"  # REC-7: escalated to an operator; nothing is dispatched
    ABANDONED = "abandoned"  # an operator closed the incident without compensating the rest

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({TrajectoryStatus.COMPLETED, TrajectoryStatus.ROLLED_BACK, TrajectoryStatus.ABANDONED})

S = StepStatus
STEP_TRANSITIONS: Mapping[StepStatus, frozenset[StepStatus]] = {
    S.AWAITING_GATE: frozenset({S.PREPARING, S.FAILED}),
    S.PREPARING: frozenset({S.DISPATCHED, S.COMMITTED, S.FAILED}),
    S.PENDING: frozenset({S.DISPATCHED, S.COMMITTED, S.FAILED}),
    S.DISPATCHED: frozenset({S.DISPATCHED, S.COMMITTED, S.FAILED}),
    # A failed step is re-dispatched (retry or repair) or, with partial effects, compensated.
    S.FAILED: frozenset({S.PENDING, S.AWAITING_GATE, S.COMPENSATING, S.COMPENSATED, S.PANIC}),
    S.COMMITTED: frozenset({S.COMPENSATING, S.COMPENSATED, S.PANIC}),
    S.COMPENSATING: frozenset({S.COMPENSATING, S.COMPENSATED, S.PANIC}),
    S.COMPENSATED: frozenset(),
    # Only an operator leaves PANIC: by hand (COMPENSATED) or by resuming the unwind (REC-7).
    S.PANIC: frozenset({S.COMPENSATING, S.COMPENSATED}),
}

T = TrajectoryStatus
TRAJECTORY_TRANSITIONS: Mapping[TrajectoryStatus, frozenset[TrajectoryStatus]] = {
    T.FORWARD: frozenset(
        {T.AWAITING_REPAIR, T.AWAITING_APPROVAL, T.POST_PIVOT, T.UNWINDING, T.COMPLETED, T.FROZEN}
    ),
    T.AWAITING_REPAIR: frozenset({T.FORWARD, T.POST_PIVOT, T.UNWINDING, T.FROZEN}),
    T.AWAITING_APPROVAL: frozenset({T.FORWARD, T.UNWINDING, T.FROZEN}),
    T.POST_PIVOT: frozenset({T.AWAITING_REPAIR, T.COMPLETED, T.FROZEN}),
    T.UNWINDING: frozenset({T.ROLLED_BACK, T.FROZEN}),
    T.FROZEN: frozenset(
        {T.FORWARD, T.AWAITING_REPAIR, T.POST_PIVOT, T.UNWINDING, T.ROLLED_BACK, T.ABANDONED}
    ),
    T.COMPLETED: frozenset(),
    T.ROLLED_BACK: frozenset(),
    T.ABANDONED: frozenset(),
}


class IllegalTransition(ValueError):
    pass


def check_step(before: StepStatus, after: StepStatus, step_index: int) -> StepStatus:
    if after not in STEP_TRANSITIONS[before]:
        raise IllegalTransition(f"step {step_index}: {before.value} -> {after.value} is not allowed")
    return after


def check_trajectory(before: TrajectoryStatus, after: TrajectoryStatus) -> TrajectoryStatus:
    if before is not after and after not in TRAJECTORY_TRANSITIONS[before]:
        raise IllegalTransition(f"trajectory: {before.value} -> {after.value} is not allowed")
    return after
