"""The lease bench's timeline: ack p99 by slice of the window, and below it each leg's p99 by
slice (send -> decided, decided -> ack), so a slow slice shows which side lost the time."""

from __future__ import annotations

import pytest

from bench._leases_report import _timeline
from bench._leases_windows import Calls, StepResult

pytestmark = pytest.mark.timeout(30)


def _step() -> StepResult:
    step = StepResult(heartbeat_s=20, runs=10, runners=1, duration_s=10.0, claims=Calls())
    for at in range(10):  # one renewal a second; the sixth waits 300 ms after its decision
        slow = at == 5
        step.ok_timeline.append((at + 0.5, 320.0 if slow else 30.0))
        step.legs_timeline.append((at + 0.5, 20.0, 300.0 if slow else 10.0))
    return step


def test_each_leg_has_its_own_row_and_the_slow_slice_shows_which_leg() -> None:
    lines = _timeline([_step()], buckets=5)
    ack, to_decision, after_decision = lines[-3:]
    assert ack.startswith("| 20 s | ") and "(2)" in ack
    assert to_decision.startswith("| 20 s, send -> decided | ")
    assert after_decision.startswith("| 20 s, decided -> ack | ")
    assert to_decision.split(" | ")[1:] == ["20.0"] * 4 + ["20.0 |"]
    cells = after_decision.rstrip(" |").split(" | ")[1:]
    assert cells == ["10.0", "10.0", "300", "10.0", "10.0"], "the third slice holds the slow one"


def test_without_decision_times_only_the_ack_row_is_written() -> None:
    step = _step()
    step.legs_timeline.clear()
    lines = _timeline([step], buckets=5)
    assert lines[-1].startswith("| 20 s | ") and "decided" not in lines[-1]
