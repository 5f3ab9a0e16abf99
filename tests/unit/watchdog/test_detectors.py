"""The detectors as properties (WD-2 cycles, WD-3 stagnation and oscillation, WD-4 repeated bad
actions), over generated trajectories, plus the cases that must NOT be loops: declared polling
whose observation changes, transient errors, backtracking."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.watchdog.domain import (
    DEFAULT_THRESHOLDS,
    Detector,
    Mark,
    MetricPoint,
    Thresholds,
    find_cycle,
    find_oscillation,
)
from tests.unit.watchdog.support import Watchdog, observe

K = DEFAULT_THRESHOLDS.max_period
FAST = settings(max_examples=120, deadline=None)


def marks(states: list[str], actions: list[str] | None = None) -> list[Mark]:
    actions = actions or [f"act-{s}" for s in states]
    return [Mark(t, t, s, a) for t, (s, a) in enumerate(zip(states, actions, strict=True), start=1)]


# --- WD-2 ------------------------------------------------------------------------------------------


@FAST
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=60, unique=True))
def test_a_trajectory_through_new_states_never_cycles_wd_2(states: list[int]) -> None:
    """Every mutating step reaches a state never seen before: no cycle, however long the run."""
    steps = [observe(i, "fs.edit", {"v": s}, f"S{s}") for i, s in enumerate(states, start=1)]
    assert Watchdog().run(steps).detections() == []


@FAST
@given(
    prefix=st.lists(st.integers(0, 1000), max_size=10, unique=True),
    period=st.integers(1, K),
    turns=st.integers(2, 4),
)
def test_a_period_k_orbit_is_caught_at_its_first_repeat_with_period_k_wd_2(
    prefix: list[int], period: int, turns: int
) -> None:
    """New states, then the same k actions forever (state orbit of period k): the first detection
    is the step that returns to the state k mutating steps back, and it says k."""
    orbit = [f"orbit-{i}" for i in range(period)]
    steps = [observe(i, "fs.edit", {"v": s}, f"P{s}") for i, s in enumerate(prefix, start=1)]
    for j in range(period * turns):
        seq = len(steps) + 1
        steps.append(observe(seq, "fs.edit", {"o": j % period}, orbit[j % period]))
    detections = Watchdog().run(steps).detections()
    assert detections, "the orbit must be caught"
    first = detections[0]
    assert (first.detector, first.period) == ("cycle", period)
    assert first.step_seq == len(prefix) + period + 1  # the first step that repeats a state
    assert first.returned_to_step == len(prefix) + 1
    assert list(first.repeated_hashes) == [s.state_hash for s in steps[len(prefix) : len(prefix) + period]]


@FAST
@given(st.lists(st.sampled_from("abcd"), min_size=1, max_size=30), st.sampled_from("abcd"))
def test_find_cycle_answers_the_smallest_period_within_k_and_a_real_match(
    history: list[str], now: str
) -> None:
    found = find_cycle(marks(history), now, f"act-{now}", K)
    if found is None:
        # Nothing within K returns to `now` by the same action (the action is named after its state).
        assert now not in history[-K:]
        return
    k, entry = found
    assert 1 <= k <= min(K, len(history))
    assert history[-k] == now and now not in history[len(history) - k + 1 :]
    assert 0 <= entry <= len(history) - k


def test_backtracking_is_not_a_cycle_but_repeating_it_is_wd_2() -> None:
    """A state returned to by another action (a revert) is backtracking; the same action
    reaching the same state again, or the orbit traversed again, is the loop."""
    history = marks(["B", "C"], ["edit-x", "edit-y"])
    assert find_cycle(history, "B", "revert-y", K) is None  # edit X, edit Y, revert Y
    # Redoing Y after reverting it: the loop is edit Y, revert Y, edit Y (from index 1); state B
    # first came from edit X, so the loop started from there, it is not part of it.
    assert find_cycle([*history, Mark(3, 3, "B", "revert-y")], "C", "edit-y", K) == (2, 1)
    # Different spellings of the same two edits: caught once the orbit repeats (H_t-1 == H_t-k-1).
    orbit = marks(["B", "A", "B"], ["sed", "revert", "perl"])
    assert find_cycle(orbit, "A", "revert-2", K) == (2, 1)


def test_the_state_window_is_bounded_by_w_and_k_bounds_the_period_wd_2() -> None:
    th = Thresholds(max_period=3, window=4)
    steps = [observe(i, "fs.edit", {"v": i % 4}, f"S{i % 4}") for i in range(1, 9)]  # period 4 > K
    watchdog = Watchdog(th).run(steps)
    assert watchdog.detections() == []
    assert watchdog.state is not None and len(watchdog.state.marks) == 4


# --- polling and transient errors ------------------------------------------------------------------


@FAST
@given(st.lists(st.text(min_size=1, max_size=20), min_size=2, max_size=40, unique=True))
def test_a_poll_whose_observation_keeps_changing_is_progress(summaries: list[str]) -> None:
    """OpenHands software-agent-sdk #762: "poll every 5 minutes for up to 15 minutes" is not a
    loop while what the poll sees changes, however often it polls."""
    steps = [observe(1, "jobs.submit", {"job": 1}, "J")]
    steps += [
        observe(i, "jobs.status", {"job": 1}, "J", summary=s, polling=True, mutating=False)
        for i, s in enumerate(summaries, start=2)
    ]
    assert Watchdog().run(steps).detections() == []


@FAST
@given(st.integers(1, 10))
def test_a_poll_that_never_changes_is_tolerated_poll_patience_times(patience: int) -> None:
    th = Thresholds(poll_patience=patience)
    steps = [observe(1, "jobs.submit", {}, "J")]
    steps += [
        observe(i, "jobs.status", {}, "J", summary="queued", polling=True, mutating=False)
        for i in range(2, patience + 5)
    ]
    first = Watchdog(th).run(steps).detections()[0]
    # poll 1 observes "queued"; the next `patience` identical ones are tolerated; then a violation.
    assert first.step_seq == 2 + patience + 1 and first.detector == Detector.STAGNATION


@FAST
@given(
    st.lists(st.sampled_from(["A", "B"]), min_size=1, max_size=12),
    st.lists(st.integers(0, 12), max_size=8),
)
def test_transient_errors_never_count_and_never_hide_a_loop(states: list[str], where: list[int]) -> None:
    """Inserting transient failures (429, 5xx, timeouts) anywhere changes no verdict: the same
    detections at the same steps, and a transient failure is never one of them."""
    plain = [observe(i, "fs.edit", {"s": s}, s) for i, s in enumerate(states, start=1)]
    mixed, index_of = [], {}
    for i, state in enumerate(states, start=1):
        for _ in range(where.count(i - 1)):
            mixed.append(observe(len(mixed) + 1, "http.post", {"x": 1}, "A", error="transient"))
        mixed.append(observe(len(mixed) + 1, "fs.edit", {"s": state}, state))
        index_of[len(mixed)] = i
    verdicts = [(d.step_seq, d.detector, d.period) for d in Watchdog().run(plain).detections()]
    seen = [(index_of[d.step_seq], d.detector, d.period) for d in Watchdog().run(mixed).detections()]
    assert seen == verdicts  # and so no transient step was ever a detection (index_of has none)


def test_only_transient_failures_of_one_request_are_never_a_loop() -> None:
    steps = [observe(i, "http.get", {"u": 1}, "A", error="transient") for i in range(1, 50)]
    watchdog = Watchdog().run(steps)
    assert watchdog.detections() == [] and watchdog.state is not None and watchdog.state.turn == 0


# --- WD-3 ------------------------------------------------------------------------------------------


@FAST
@given(st.lists(st.integers(1, 5), min_size=1, max_size=40))
def test_metrics_that_keep_improving_are_never_stagnation_or_oscillation_wd_3(gains: list[int]) -> None:
    passing = 0
    steps = []
    for i, gain in enumerate(gains):
        passing += gain
        steps.append(observe(2 * i + 1, "fs.edit", {"i": i}, f"S{i}"))
        steps.append(observe(2 * i + 2, "pytest", {}, f"S{i}", metrics=[passing], mutating=False))
    assert Watchdog().run(steps).detections() == []


@FAST
@given(st.integers(2, 12), st.integers(0, 3))
def test_no_gain_over_e_mutating_steps_is_stagnation_at_the_e_th_wd_3(epoch: int, reads: int) -> None:
    th = Thresholds(epoch_steps=epoch, max_period=1, window=2)
    steps = [observe(1, "pytest", {}, "S0", metrics=[4], mutating=False)]
    for i in range(1, epoch + 2):
        steps.append(observe(len(steps) + 1, "fs.edit", {"i": i}, f"S{i}"))
        steps += [observe(len(steps) + 1, "fs.read", {"r": r}, f"S{i}", mutating=False) for r in range(reads)]
        steps.append(observe(len(steps) + 1, "pytest", {}, f"S{i}", metrics=[4], mutating=False))
    first = Watchdog(th).run(steps).detections()[0]
    assert first.detector == Detector.STAGNATION
    # The test run after the E-th edit: 1 + E * (edit + reads + test).
    assert first.step_seq == 1 + epoch * (reads + 2)


@FAST
@given(st.lists(st.integers(0, 4), min_size=2, max_size=12))
def test_find_oscillation_matches_a_repeated_move_within_k(values: list[int]) -> None:
    trail = [MetricPoint(i, i, (float(v),)) for i, v in enumerate(values[:-1])]
    now = (float(values[-1]),)
    found = find_oscillation(trail, now, K)
    if found is None:
        return
    period, i = found
    assert trail[i - 1].values == trail[-1].values and trail[i].values == now and trail[-1].values != now
    assert 1 <= period <= K


def test_metric_oscillation_4_3_4_3_is_caught_at_the_second_drop_wd_3() -> None:
    steps = [observe(1, "pytest", {}, "O0", metrics=[4], mutating=False)]
    for i, passing in enumerate((3, 4, 3), start=1):
        steps.append(observe(2 * i, "fs.edit", {"v": i}, f"O{i}"))
        steps.append(observe(2 * i + 1, "pytest", {}, f"O{i}", metrics=[passing], mutating=False))
    [first, *_] = Watchdog().run(steps).detections()
    assert (first.step_seq, first.detector, first.period, first.returned_to_step) == (7, "oscillation", 2, 3)
    assert first.metric_history == "[[4.0],[3.0],[4.0],[3.0]]"


# --- WD-4 ------------------------------------------------------------------------------------------


@FAST
@given(st.integers(1, 5), st.integers(0, 3))
def test_a_failing_request_reissued_in_the_same_state_is_caught_at_repeat_count_wd_4(
    repeats: int, reads: int
) -> None:
    th = Thresholds(repeat_count=repeats)
    steps = []
    for _ in range(repeats + 1):
        steps.append(observe(len(steps) + 1, "http.delete", {"b": "prod"}, "R", error="application"))
        steps += [observe(len(steps) + 1, "fs.read", {"r": r}, "R", mutating=False) for r in range(reads)]
    first = Watchdog(th).run(steps).detections()[0]
    assert first.detector == Detector.REPEATED_BAD_ACTION and first.returned_to_step == 1
    assert first.step_seq == 1 + repeats * (reads + 1)


def test_a_failing_request_retried_after_the_environment_changed_is_not_bad_wd_4() -> None:
    """Re-running the failing tests after an edit, or re-reading a file after creating it."""
    steps = [
        observe(1, "pytest", {}, error="application", mutating=False),
        observe(2, "fs.edit", {"fix": 1}),  # no state hash known: the mutation itself is the change
        observe(3, "pytest", {}, error="application", mutating=False),
        observe(4, "fs.read", {"p": "x"}, "E0", error="application", mutating=False),
        observe(5, "fs.write", {"p": "x"}, "E1"),
        observe(6, "fs.read", {"p": "x"}, "E1", error="application", mutating=False),
    ]
    assert Watchdog().run(steps).detections() == []
