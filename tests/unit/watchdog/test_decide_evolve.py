"""decide/evolve of the Watchdog aggregate: replay (restore equals rebuild), determinism,
deduplication, validation and the thresholds' bounds (deployment and per run)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.contracts import StepObserved, WatchdogConfigured
from services.common.settings import TenureSettings
from services.watchdog.__main__ import deployment_thresholds
from services.watchdog.domain import (
    BOUNDS,
    DEFAULT_THRESHOLDS,
    MAX_CONFIGURATIONS,
    Rejection,
    Thresholds,
    decide,
    fold,
)
from services.watchdog.state_codec import decode_state, encode_state
from tests.unit.watchdog.support import T0, Watchdog, acknowledge, configure, observe
from tests.unit.watchdog.test_corpus import TRAJECTORIES, observations

STEP = st.tuples(
    st.sampled_from(["fs.edit", "fs.read", "pytest", "jobs.status", "http.post"]),
    st.integers(0, 2),  # the action's argument: few, so that actions repeat
    st.sampled_from(["A", "B", "C", None]),
    st.sampled_from(["none", "none", "application", "transient"]),
    st.booleans(),  # mutating
    st.booleans(),  # polling
    st.lists(st.integers(0, 5), max_size=2),
)


def _drive(steps: list[tuple], thresholds: Thresholds = DEFAULT_THRESHOLDS) -> Watchdog:
    watchdog = Watchdog(thresholds)
    for seq, (tool, arg, state, error, mutating, polling, metrics) in enumerate(steps, start=1):
        summary = f"seen {seq % 3}"
        watchdog.send(
            observe(
                seq,
                tool,
                {"a": arg},
                state,
                error=error,
                mutating=mutating,
                polling=polling,
                metrics=metrics,
                summary=summary,
            )
        )
        interventions = watchdog.interventions()
        pending = watchdog.state.pending_rollback if watchdog.state else ""
        if pending and seq % 4 == 0:
            watchdog.send(acknowledge(pending, interventions[-1].checkpoint_step))
    return watchdog


@settings(max_examples=150, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=40), st.integers(0, 2))
def test_restore_equals_rebuild_the_state_is_the_fold_of_its_events(steps: list[tuple], budget: int) -> None:
    """DUR-1 for the watchdog: the incremental state, the fold of the log and the stored bytes
    decoded again are one and the same, whatever the run did."""
    watchdog = _drive(steps, Thresholds(rollback_budget=budget))
    assert watchdog.state is not None
    assert fold(watchdog.events) == watchdog.state
    assert decode_state(encode_state(watchdog.state)) == watchdog.state
    assert [e.version for e in watchdog.events] == list(range(1, len(watchdog.events) + 1))
    assert len({e.event_id for e in watchdog.events}) == len(watchdog.events)


@pytest.mark.parametrize("name", sorted(TRAJECTORIES))
def test_every_corpus_trajectory_replays_to_the_same_state(name: str) -> None:
    watchdog = Watchdog().run(observations(TRAJECTORIES[name]))
    assert watchdog.state is not None and fold(watchdog.events) == watchdog.state
    assert decode_state(encode_state(watchdog.state)) == watchdog.state


def test_deciding_again_gives_byte_identical_events() -> None:
    steps = observations(TRAJECTORIES["period-2-orbit"])
    watchdog = Watchdog().run(steps[:3])
    last = steps[3]  # the first repeat: observed, detected, level 1
    once = decide(watchdog.state, last, T0 + 5, DEFAULT_THRESHOLDS)
    again = decide(watchdog.state, last, T0 + 5, DEFAULT_THRESHOLDS)
    assert once == again and not isinstance(once, Rejection) and len(once) == 3


def test_a_redelivered_or_older_observation_is_nothing_new_but_sources_count_apart() -> None:
    watchdog = Watchdog().run([observe(1, state="A"), observe(2, state="B")])
    assert watchdog.send(observe(2, state="B")) == ()
    assert watchdog.send(observe(1, state="Z")) == ()  # older than a step already judged
    # The saga numbers its steps by trajectory version: a low number of its own is new.
    events = watchdog.send(observe(1, state="C", source="saga"))
    assert [type(e) for e in events] == [StepObserved]  # type: ignore[union-attr]
    assert watchdog.state is not None and (watchdog.state.last_runner_seq, watchdog.state.last_saga_seq) == (
        2,
        1,
    )


def test_the_first_observation_records_the_deployment_thresholds() -> None:
    events = Watchdog(Thresholds(epoch_steps=9)).send(observe(1))
    assert [type(e) for e in events] == [WatchdogConfigured, StepObserved]  # type: ignore[union-attr]
    assert events[0].epoch_steps == 9 and events[0].origin == "deployment"  # type: ignore[index,union-attr]


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"source": "model"}, "source"),
        ({"step_seq": -1}, "stepSeq"),
        ({"tool": ""}, "tool"),
        ({"action_hash": "ABCDEF0123456789"}, "actionHash"),
        ({"action_hash": "0123"}, "actionHash"),
        ({"state_hash": "f" * 63}, "stateHash"),
        ({"summary": "x" * 2049}, "summary"),
        ({"metrics": tuple(float(i) for i in range(33))}, "metrics"),
        ({"metrics": (float("nan"),)}, "metrics"),
        ({"error_kind": "fatal"}, "errorKind"),
    ],
)
def test_a_malformed_observation_is_refused_with_what_is_wrong(change: dict, complaint: str) -> None:
    refused = Watchdog().send(dataclasses.replace(observe(1), **change))
    assert isinstance(refused, Rejection) and refused.code == "INVALID_OBSERVATION"
    assert complaint in refused.detail


# --- thresholds: per run (ConfigureWatchdog) and per deployment (TenureSettings) -----------------


def test_a_run_overrides_thresholds_within_bounds_and_keeps_the_rest() -> None:
    watchdog = Watchdog(Thresholds(epoch_steps=9))
    [configured] = watchdog.send(configure(max_period=3, rollback_budget=0))  # type: ignore[misc]
    assert isinstance(configured, WatchdogConfigured) and configured.origin == "run"
    assert watchdog.state is not None
    assert watchdog.state.thresholds == Thresholds(max_period=3, epoch_steps=9, rollback_budget=0)
    assert watchdog.send(configure(max_period=3, rollback_budget=0)) == ()  # its redelivery
    # The first observation after it keeps the run's thresholds (no deployment record on top).
    assert [type(e) for e in watchdog.send(observe(1))] == [StepObserved]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "overrides",
    [
        {"max_period": 0},
        {"max_period": 33},
        {"window": 257},
        {"window": 8},
        {"rollback_budget": 6},
        {"ladder_epoch": 0},
        {"epoch_steps": 1},
        {"repeat_count": 11},
        {"poll_patience": 101},
        {"window": -2},
    ],
)
def test_a_threshold_outside_its_bounds_is_refused(overrides: dict[str, int]) -> None:
    refused = Watchdog().send(configure(**overrides))
    assert isinstance(refused, Rejection) and refused.code == "THRESHOLD_OUT_OF_BOUNDS"


def test_a_run_may_configure_its_watchdog_a_bounded_number_of_times() -> None:
    watchdog = Watchdog()
    for i in range(MAX_CONFIGURATIONS):
        assert not isinstance(watchdog.send(configure(f"cfg-{i}", epoch_steps=3 + i)), Rejection)
    refused = watchdog.send(configure("cfg-last", epoch_steps=2))
    assert isinstance(refused, Rejection) and refused.code == "TOO_MANY_CONFIGURATIONS"


def test_the_deployment_settings_have_the_domain_defaults_and_bounds() -> None:
    settings = TenureSettings()
    assert deployment_thresholds(settings) == DEFAULT_THRESHOLDS
    for name, (low, high) in BOUNDS.items():
        field = TenureSettings.model_fields[f"watchdog_{name}"]
        bounds = {type(m).__name__: m for m in field.metadata}
        assert (bounds["Ge"].ge, bounds["Le"].le) == (low, high), name
    with pytest.raises(SystemExit, match="window"):
        deployment_thresholds(TenureSettings(watchdog_max_period=20, watchdog_window=16))


def test_the_readme_documents_every_threshold_setting() -> None:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    for name in BOUNDS:
        assert f"`TENURE_WATCHDOG_{name.upper()}`" in readme, name
    assert json.dumps(BOUNDS["max_period"]) == "[1, 32]"
