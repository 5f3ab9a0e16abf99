"""The watchdog's lifecycle (WD-5) as a table, tested exhaustively: every pair of statuses is
allowed exactly when the table says so, and every allowed transition is one the ladder really
takes (driven through decide/evolve), so the table holds nothing dead."""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Callable

import pytest

from services.common.contracts import RollbackAcknowledged, WatchdogEvent
from services.watchdog.domain import (
    TRANSITIONS,
    IllegalTransition,
    Thresholds,
    WatchdogState,
    WatchdogStatus,
    check_transition,
    evolve,
)
from tests.unit.watchdog.support import RUN, Watchdog, acknowledge, observe

# The module, not the function the package exports under the same name: its emitter folds
# every event it decides with this module's `evolve`, which the coverage test watches.
decide_module = importlib.import_module("services.watchdog.domain.decide")
W = WatchdogStatus
PAIRS = list(itertools.product(W, W))


@pytest.mark.parametrize(("before", "after"), PAIRS, ids=[f"{b.value}->{a.value}" for b, a in PAIRS])
def test_every_pair_of_statuses_is_allowed_exactly_when_the_table_says_so_wd_5(
    before: WatchdogStatus, after: WatchdogStatus
) -> None:
    if after in TRANSITIONS[before]:
        assert check_transition(before, after) is after
    else:
        with pytest.raises(IllegalTransition):
            check_transition(before, after)


def test_the_table_covers_every_status_and_only_deadlock_is_terminal() -> None:
    assert set(TRANSITIONS) == set(W)
    assert [s for s in W if not TRANSITIONS[s]] == [W.DEADLOCKED] and W.DEADLOCKED.is_terminal
    assert TRANSITIONS[W.WATCHING] == {W.INTERRUPTED}, "the ladder always starts at level 1"
    assert all(W.WATCHING not in TRANSITIONS[s] for s in (W.ROLLBACK_REQUESTED, W.DEADLOCKED))


def _loop(start: int, turns: int) -> list:
    return [observe(start + i, "fs.edit", {"v": i % 2}, "B" if i % 2 == 0 else "A") for i in range(turns)]


def _taken(scenario: Callable[[Watchdog], None], thresholds: Thresholds) -> set[tuple[W, W]]:
    """The status changes one scenario makes, seen through evolve."""
    seen: set[tuple[W, W]] = set()
    real = decide_module.evolve

    def watching(state: WatchdogState | None, event: WatchdogEvent) -> WatchdogState:
        after = real(state, event)
        if state is not None and state.status is not after.status:
            seen.add((state.status, after.status))
        return after

    patch = pytest.MonkeyPatch()
    patch.setattr(decide_module, "evolve", watching)
    try:
        watchdog = Watchdog(thresholds)
        scenario(watchdog)
    finally:
        patch.undo()
    # The self-transition (level 2 again while a rollback is pending) is seen on the events.
    levels = watchdog.levels()
    if any(a == b == 2 for a, b in itertools.pairwise(levels)):
        seen.add((W.ROLLBACK_REQUESTED, W.ROLLBACK_REQUESTED))
    return seen


def _climb(watchdog: Watchdog) -> None:
    watchdog.run(_loop(1, 8))


def _ack_then_quiet_then_loop(watchdog: Watchdog) -> None:
    watchdog.run(_loop(1, 4))  # 1, 2
    watchdog.send(acknowledge(watchdog.interventions()[-1].intervention_id))
    watchdog.run(observe(10 + i, "fs.edit", {"q": i}, f"Q{i}") for i in range(4))  # probation passes
    watchdog.run(_loop(20, 4))  # 1 again, then 2


def _ack_then_loop(watchdog: Watchdog) -> None:
    watchdog.run(_loop(1, 4))
    watchdog.send(acknowledge(watchdog.interventions()[-1].intervention_id))
    watchdog.run(_loop(20, 3))  # a violation on probation: escalates


def _interrupted_then_quiet(watchdog: Watchdog) -> None:
    watchdog.run(_loop(1, 3))
    watchdog.run(observe(10 + i, "fs.edit", {"q": i}, f"Q{i}") for i in range(4))


SCENARIOS = [
    (_climb, Thresholds()),  # watching -> interrupted -> rollback-requested -> deadlocked
    (_climb, Thresholds(rollback_budget=0)),  # interrupted -> deadlocked
    (_climb, Thresholds(rollback_budget=3)),  # rollback-requested -> rollback-requested
    (_ack_then_quiet_then_loop, Thresholds()),  # -> rolled-back -> watching
    (_ack_then_loop, Thresholds()),  # rolled-back -> deadlocked
    (_ack_then_loop, Thresholds(rollback_budget=2)),  # rolled-back -> rollback-requested
    (_interrupted_then_quiet, Thresholds()),  # interrupted -> watching
]


def test_every_transition_of_the_table_is_taken_by_the_ladder_wd_5() -> None:
    taken: set[tuple[W, W]] = set()
    for scenario, thresholds in SCENARIOS:
        taken |= _taken(scenario, thresholds)
    table = {(before, after) for before, afters in TRANSITIONS.items() for after in afters}
    assert taken == table, f"never taken: {sorted((b.value, a.value) for b, a in table - taken)}"


def test_evolve_refuses_a_transition_outside_the_table() -> None:
    watchdog = Watchdog().run(_loop(1, 2))
    assert watchdog.state is not None and watchdog.state.status is W.WATCHING
    stray = RollbackAcknowledged(
        event_id="e",
        run_id=RUN,
        version=watchdog.state.version + 1,
        occurred_at=0,
        causation_id="c",
        correlation_id="c",
        actor="t",
        intervention_id="itv_x",
        checkpoint_step=0,
        restored_state_hash="",
    )
    with pytest.raises(IllegalTransition):
        evolve(watchdog.state, stray)
