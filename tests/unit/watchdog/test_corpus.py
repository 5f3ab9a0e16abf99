"""The recorded corpus (tests/unit/watchdog/corpus): zero false positives on progress-making runs,
detection at the first repeat on looping ones (WD-1..WD-4).

Progress-making: ordinary work, legitimate polling of a long job whose observation changes,
retries through transient errors, a revert followed by a different edit, a retry after the cause
was fixed. Looping: period 1, 2 and 3 orbits, metric stagnation, metric oscillation (4 -> 3 ->
4 -> 3 tests passing), a repeated failing action, a poll that never changes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.common.contracts import ObserveStep
from tests.unit.watchdog.support import Watchdog, observe

CORPUS = Path(__file__).resolve().parent / "corpus"
TRAJECTORIES = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(CORPUS.glob("*.json"))}
PROGRESS = sorted(name for name, t in TRAJECTORIES.items() if t["label"] == "progress")
LOOPING = sorted(name for name, t in TRAJECTORIES.items() if t["label"] == "looping")


def observations(trajectory: dict[str, Any]) -> list[ObserveStep]:
    return [
        observe(
            seq,
            step["tool"],
            step.get("args", {}),
            step.get("state"),
            summary=step.get("summary", ""),
            metrics=step.get("metrics", ()),
            error=step.get("error", "none"),
            polling=step.get("polling", False),
            mutating=step.get("mutating", True),
        )
        for seq, step in enumerate(trajectory["steps"], start=1)
    ]


def test_the_corpus_covers_every_case_the_issue_names() -> None:
    assert {
        "ordinary-work",
        "legitimate-polling",
        "transient-retries",
        "revert-then-different-edit",
    } <= set(PROGRESS)
    assert {
        "period-1-orbit",
        "period-2-orbit",
        "period-3-orbit",
        "metric-stagnation",
        "metric-oscillation",
        "repeated-failing-action",
    } <= set(LOOPING)
    assert {t["expect"]["detector"] for t in TRAJECTORIES.values() if "expect" in t} == {
        "cycle",
        "stagnation",
        "oscillation",
        "repeated-bad-action",
    }


@pytest.mark.parametrize("name", PROGRESS)
def test_a_progress_making_trajectory_is_never_flagged_wd_1_to_wd_4(name: str) -> None:
    watchdog = Watchdog().run(observations(TRAJECTORIES[name]))
    flagged = [(d.step_seq, d.detector, d.detail) for d in watchdog.detections()]
    print(f"\n{name}: progress, {len(TRAJECTORIES[name]['steps'])} steps, detections: {flagged or 'none'}")
    assert not watchdog.rejections
    assert flagged == [], f"{name}: false positive at step(s) {flagged}"
    assert watchdog.interventions() == []


@pytest.mark.parametrize("name", LOOPING)
def test_a_looping_trajectory_is_caught_at_its_first_repeat_wd_2_to_wd_4(name: str) -> None:
    trajectory = TRAJECTORIES[name]
    expect = trajectory["expect"]
    watchdog = Watchdog().run(observations(trajectory))
    detections = watchdog.detections()
    assert detections, f"{name}: loop not detected (expected at step {expect['step']})"
    first = detections[0]
    print(
        f"\n{name}: looping, detected at step {first.step_seq} by {first.detector} "
        f"(period {first.period}; expected step {expect['step']}): {first.detail}"
    )
    found = (first.step_seq, first.detector, first.period)
    wanted = (expect["step"], expect["detector"], expect["period"])
    assert found == wanted, (
        f"{name}: detected at step {found[0]} by {found[1]} (k={found[2]}), expected {wanted}"
    )
    # Nothing before the first repeat, and the first detection starts the ladder at level 1.
    assert watchdog.interventions()[0].level == 1
    assert watchdog.interventions()[0].detection_id == first.detection_id
