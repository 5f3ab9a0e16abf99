"""The two transition tables of a saga (services/saga_orchestrator/domain/lifecycle.py), exhaustively.

SAGA-3 (a sub-transaction's states form an explicit matrix; every forward mutation ends COMMITTED
or COMPENSATED) and SAGA-6 / REC-7 (a trajectory's phases: forward, post-pivot, unwinding, frozen):
for every (before, after) pair of each enum, check_step / check_trajectory accept exactly the pairs
the table lists and raise IllegalTransition for every other; terminal statuses have no exit; and
every status is reachable from the initial one through the table.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping
from typing import TypeVar

import pytest

from services.saga_orchestrator.domain.lifecycle import (
    STEP_TRANSITIONS,
    TRAJECTORY_TRANSITIONS,
    IllegalTransition,
    StepStatus,
    TrajectoryStatus,
    check_step,
    check_trajectory,
)

S = StepStatus
Status = TypeVar("Status", StepStatus, TrajectoryStatus)
T = TrajectoryStatus

STEP_PAIRS = list(itertools.product(StepStatus, repeat=2))
TRAJECTORY_PAIRS = list(itertools.product(TrajectoryStatus, repeat=2))

# The trajectory's terminal statuses, as the spec names them: a clean end, a clean rollback, and an
# operator's decision to stop without compensating (REC-7).
TERMINAL_TRAJECTORY = {T.COMPLETED, T.ROLLED_BACK, T.ABANDONED}


def reachable(table: Mapping[Status, frozenset[Status]], start: set[Status]) -> set[Status]:
    """Breadth-first search over the table's edges."""
    seen = set(start)
    queue = deque(start)
    while queue:
        for after in table[queue.popleft()]:
            if after not in seen:
                seen.add(after)
                queue.append(after)
    return seen


def test_every_status_has_a_row_in_its_table() -> None:
    assert set(STEP_TRANSITIONS) == set(StepStatus)
    assert set(TRAJECTORY_TRANSITIONS) == set(TrajectoryStatus)
    for targets in (*STEP_TRANSITIONS.values(), *TRAJECTORY_TRANSITIONS.values()):
        assert isinstance(targets, frozenset)


@pytest.mark.parametrize(("before", "after"), STEP_PAIRS, ids=lambda s: s.value)
def test_check_step_accepts_exactly_the_table_saga_3(before: StepStatus, after: StepStatus) -> None:
    if after in STEP_TRANSITIONS[before]:
        assert check_step(before, after, 7) is after
    else:
        with pytest.raises(IllegalTransition) as refused:
            check_step(before, after, 7)
        message = str(refused.value)
        assert "step 7" in message and before.value in message and after.value in message


@pytest.mark.parametrize(("before", "after"), TRAJECTORY_PAIRS, ids=lambda s: s.value)
def test_check_trajectory_accepts_exactly_the_table_saga_6(
    before: TrajectoryStatus, after: TrajectoryStatus
) -> None:
    # Staying in the same status is not a transition (events that change only a step keep it).
    if after is before or after in TRAJECTORY_TRANSITIONS[before]:
        assert check_trajectory(before, after) is after
    else:
        with pytest.raises(IllegalTransition) as refused:
            check_trajectory(before, after)
        message = str(refused.value)
        assert before.value in message and after.value in message


def test_illegal_transition_is_a_value_error() -> None:
    assert issubclass(IllegalTransition, ValueError)


def test_compensated_is_the_only_terminal_step_status_saga_3() -> None:
    terminal = {status for status, targets in STEP_TRANSITIONS.items() if not targets}
    assert terminal == {S.COMPENSATED}
    for after in StepStatus:
        with pytest.raises(IllegalTransition):
            check_step(S.COMPENSATED, after, 0)


@pytest.mark.parametrize("terminal", [s for s in TrajectoryStatus if s in TERMINAL_TRAJECTORY], ids=str)
def test_terminal_trajectory_statuses_have_no_exit(terminal: TrajectoryStatus) -> None:
    assert terminal.is_terminal
    assert TRAJECTORY_TRANSITIONS[terminal] == frozenset()
    for after in TrajectoryStatus:
        if after is not terminal:
            with pytest.raises(IllegalTransition):
                check_trajectory(terminal, after)


def test_is_terminal_is_exactly_the_statuses_without_exits() -> None:
    without_exits = {status for status, targets in TRAJECTORY_TRANSITIONS.items() if not targets}
    assert without_exits == TERMINAL_TRAJECTORY
    assert {status for status in TrajectoryStatus if status.is_terminal} == TERMINAL_TRAJECTORY


def test_every_step_status_is_reachable_from_an_initial_one() -> None:
    """A step starts PENDING (class I/II) or AWAITING_GATE (a pivot) when its intent is recorded."""
    assert reachable(STEP_TRANSITIONS, {S.PENDING, S.AWAITING_GATE}) == set(StepStatus)
    # and each initial status alone reaches the terminal COMPENSATED state or a commit
    for initial in (S.PENDING, S.AWAITING_GATE):
        assert {S.COMMITTED, S.FAILED, S.COMPENSATED, S.PANIC} <= reachable(STEP_TRANSITIONS, {initial})


def test_every_trajectory_status_is_reachable_from_forward() -> None:
    assert reachable(TRAJECTORY_TRANSITIONS, {T.FORWARD}) == set(TrajectoryStatus)


def test_every_non_terminal_trajectory_status_can_still_end() -> None:
    """No trap: from every live status some terminal status is reachable (at worst via FROZEN)."""
    for status in TrajectoryStatus:
        assert reachable(TRAJECTORY_TRANSITIONS, {status}) & TERMINAL_TRAJECTORY, status


def test_every_forward_step_can_end_committed_or_compensated_saga_3() -> None:
    """SAGA-3: from every step status, COMMITTED or COMPENSATED is still reachable."""
    for status in StepStatus:
        assert reachable(STEP_TRANSITIONS, {status}) & {S.COMMITTED, S.COMPENSATED}, status


def test_pivot_boundary_edges_saga_6() -> None:
    """After the pivot there is no direct way back to rolling back: POST_PIVOT has no edge to
    FORWARD, UNWINDING or ROLLED_BACK (AWAITING_REPAIR is shared by both phases, so the table alone
    cannot forbid the longer path; decide/evolve return a post-pivot repair to POST_PIVOT, which
    test_trajectory_decide.py and the properties check). A pivot only dispatches after its gate."""
    assert TRAJECTORY_TRANSITIONS[T.POST_PIVOT] == {T.AWAITING_REPAIR, T.COMPLETED, T.FROZEN}
    assert S.DISPATCHED not in STEP_TRANSITIONS[S.AWAITING_GATE]
    assert S.COMMITTED not in STEP_TRANSITIONS[S.AWAITING_GATE]
    assert STEP_TRANSITIONS[S.AWAITING_GATE] == {S.PREPARING, S.FAILED}


def test_panic_is_left_only_towards_compensation_saga_3() -> None:
    assert STEP_TRANSITIONS[S.PANIC] == {S.COMPENSATING, S.COMPENSATED}
    for after in (S.PENDING, S.DISPATCHED, S.COMMITTED, S.FAILED, S.PREPARING, S.AWAITING_GATE):
        with pytest.raises(IllegalTransition):
            check_step(S.PANIC, after, 3)
