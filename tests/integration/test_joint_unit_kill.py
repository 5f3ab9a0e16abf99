"""The joint unit on a real broker and real RocksDB, SIGKILLed mid-stream (issue 11, DUR-1,
LEASE-3): a process owns the Run and the Trajectory and decides each step's intent and the
effect's intent it leads to in one transaction (tests/support/owner_worker.py).

Checked on the committed log right after the kill, and again after a second incarnation finished
the work from the start: every step's intent on trajectories.events has its effect's intent on
runs.events and the other way round (one transaction: never one without the other), no event
twice, versions 1, 2, 3 ... per aggregate, and each participant's RocksDB equals the fold of its
own events."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from services.common.lifeline import lifeline_argv
from services.common.store import RocksStore
from services.common.topics import RUNS_EVENTS, TRAJECTORIES_EVENTS
from services.lease_coordinator.domain import fold
from services.lease_coordinator.state_codec import decode_state
from services.saga_orchestrator import state_codec as trajectory_codec
from services.saga_orchestrator.domain import fold as fold_trajectory
from tests.support.system import REPO_ROOT, decode_all, read_topic, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(240)]

RUNS, STEPS = 24, 3


def _worker(bootstrap: str, state_dir: Path, tag: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    argv = [
        sys.executable,
        "-m",
        "tests.support.owner_worker",
        bootstrap,
        str(state_dir),
        tag,
        str(RUNS),
        str(STEPS),
    ]
    log = open(state_dir / "worker.log", "ab")  # noqa: SIM115  (the child keeps its own descriptor)
    try:
        return subprocess.Popen(lifeline_argv(argv), env=env, stdout=log, stderr=subprocess.STDOUT)
    finally:
        log.close()


def _answered(state_dir: Path) -> list[str]:
    path = state_dir / "progress"
    return path.read_text().splitlines() if path.exists() else []


def _check_the_log(bootstrap: str, tag: str, runs: set[str]) -> tuple[list[Any], list[Any]]:
    run_events = [e for e in decode_all(read_topic(bootstrap, RUNS_EVENTS.name, 4)) if e.run_id in runs]
    trajectory_events = [
        e for e in decode_all(read_topic(bootstrap, TRAJECTORIES_EVENTS.name, 4)) if e.run_id in runs
    ]
    for events, version in ((run_events, "version"), (trajectory_events, "version")):
        ids = Counter(e.event_id for e in events)
        assert not [i for i, n in ids.items() if n > 1], "no event twice"
        by_run: dict[str, list[int]] = defaultdict(list)
        for event in events:
            by_run[event.run_id].append(getattr(event, version))
        for run_id, versions in by_run.items():
            assert versions == list(range(1, len(versions) + 1)), run_id
    intents = {e.idempotency_key for e in trajectory_events if type(e).__name__ == "StepIntentRecorded"}
    effects = {e.idempotency_key for e in run_events if type(e).__name__ == "EffectIntentRecorded"}
    assert intents == effects, "a step's intent and its effect's intent are committed together"
    return run_events, trajectory_events


def test_a_sigkilled_owner_leaves_every_step_with_its_effect_intent_and_a_rerun_adds_nothing_twice_dur_1(
    tenure_topics: str, tmp_path: Path
) -> None:
    bootstrap, tag = tenure_topics, f"joint{uuid.uuid4().hex[:8]}"
    first = _worker(bootstrap, tmp_path, tag)
    try:
        wait_until(
            lambda: len(_answered(tmp_path)) >= RUNS * STEPS // 3 or first.poll() is not None, 120, "steps"
        )
        assert first.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    answered = _answered(tmp_path)
    assert "done" not in answered, "killed mid-stream"
    runs = {line.split()[0] for line in answered}
    _check_the_log(bootstrap, tag, runs)  # right after the kill: nothing half-committed

    second = _worker(bootstrap, tmp_path, tag)
    assert second.wait(180) == 0, (tmp_path / "worker.log").read_text()[-3000:]
    assert _answered(tmp_path)[-1] == "done"
    runs = {line.split()[0] for line in _answered(tmp_path) if line != "done"}
    assert len(runs) == RUNS
    run_events, trajectory_events = _check_the_log(bootstrap, tag, runs)
    assert (
        len({e.idempotency_key for e in run_events if type(e).__name__ == "EffectIntentRecorded"})
        == RUNS * STEPS
    )

    # Each participant's RocksDB equals the fold of its own events.
    store = RocksStore(tmp_path / "runs")
    try:
        stored = {k.removeprefix("run/"): decode_state(v) for k, v in store.scan("run/")}
    finally:
        store.close()
    for run_id in runs:
        assert stored[run_id] == fold([e for e in run_events if e.run_id == run_id]), run_id
    store = RocksStore(tmp_path / "trajectories")
    try:
        scanned = store.scan("trajectory/")
        trajectories = {k.removeprefix("trajectory/"): trajectory_codec.decode_state(v) for k, v in scanned}
    finally:
        store.close()
    for run_id in runs:
        assert trajectories[run_id] == fold_trajectory(
            [e for e in trajectory_events if e.run_id == run_id]
        ), run_id
