"""The owner prototype that bench/owner_path.py measures (issue 11): its group commit and its
report.

The prototype feeds requests straight into the one aggregate runtime. What must hold for its
figures to mean anything: every command waiting when the committer is free is decided in one
batch and one transaction, each request is answered with its own aggregate's state after that
commit, a refused command is answered as refused, and the whole 1-step workflow of the
benchmark goes through both aggregates to a succeeded run. Checked here over the in-memory
event log (the bench itself runs on a real broker).
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench._owner_server import Committer, CountingLog, Sharded, create_app
from bench.owner_path import OwnerRun, report, tenants_over_partitions
from services.common.clock import SystemClock
from services.common.contracts import ClaimRun, RunCommand, SubmitRun
from services.common.eventlog import MemoryEventLog
from services.common.ids import run_id_for
from services.common.messages import MessageCodec
from services.common.routing import command_record, partition_for_run, trajectory_command_record
from services.common.settings import repo_root
from services.common.store import MemoryStore
from services.common.topics import RUNS_COMMANDS
from services.lease_coordinator.domain.state import RunState
from services.lease_coordinator.processor import RunCommandProcessor
from services.saga_orchestrator.domain import load_catalog
from services.saga_orchestrator.processor import TrajectoryProcessor

CATALOG = repo_root() / "services" / "sim_environment" / "tools.json"
CODEC, CLOCK = MessageCodec(), SystemClock()


def _run_committer(*, start: bool) -> Committer[RunState, RunCommand]:
    log = CountingLog(MemoryEventLog())
    processor = RunCommandProcessor(log, MemoryStore(), CODEC, CLOCK)
    return Committer(
        processor,
        log,
        lambda command: command_record(CODEC, command),
        lambda state, command_id: command_id in state.handled_commands,
        group=True,
        start=start,
    )


def _submit(key: str) -> SubmitRun:
    header: dict[str, Any] = {"issued_at": CLOCK.now_ms(), "correlation_id": key, "actor": "test"}
    return SubmitRun(
        command_id=f"cmd_{key}",
        run_id=run_id_for("t", key),
        tenant="t",
        idempotency_key=key,
        execution_spec="{}",
        timeout_seconds=60,
        **header,
    )


def test_every_waiting_command_is_one_batch_and_one_transaction_each_answered_with_its_state() -> None:
    committer = _run_committer(start=False)

    async def scenario() -> list[RunState | None]:
        waiting = [asyncio.ensure_future(committer.decide(_submit(f"k{i}"))) for i in range(20)]
        await asyncio.sleep(0.05)  # every request has queued its command
        committer.start()
        return await asyncio.wait_for(asyncio.gather(*waiting), 10)

    states = asyncio.run(scenario())
    assert [s.run_id if s else None for s in states] == [run_id_for("t", f"k{i}") for i in range(20)]
    assert all(s is not None and s.version == 1 for s in states)
    assert (committer.batches, committer.commands) == (1, 20)
    assert committer.log.transactions == 1
    assert committer.log.records >= 20  # the 20 RunSubmitted, with their changelog states


def test_a_refused_command_is_answered_as_refused_and_one_that_raises_with_its_error() -> None:
    committer = _run_committer(start=True)
    claim = ClaimRun(
        command_id="cmd_claim",
        run_id=run_id_for("t", "nobody"),
        issued_at=CLOCK.now_ms(),
        correlation_id="x",
        actor="test",
        runner_id="r",
    )
    assert asyncio.run(asyncio.wait_for(committer.decide(claim), 10)) is None
    malformed = replace(claim, command_id="cmd_claim_2", run_id="not-a-run")
    with pytest.raises(ValueError, match="not a run id"):
        asyncio.run(asyncio.wait_for(committer.decide(malformed), 10))
    # ... and the committer goes on deciding.
    assert asyncio.run(asyncio.wait_for(committer.decide(_submit("after")), 10)) is not None


def test_the_benchmark_workflow_goes_through_both_aggregates(tmp_path: Path) -> None:
    runs = _run_committer(start=True)
    log = CountingLog(MemoryEventLog())
    trajectories = Committer(
        TrajectoryProcessor(log, MemoryStore(), CODEC, CLOCK, load_catalog(CATALOG)),
        log,
        lambda command: trajectory_command_record(CODEC, command),
        lambda state, command_id: command_id in state.causes,
        group=True,
    )
    with TestClient(create_app(Sharded.single(runs), Sharded.single(trajectories), CLOCK)) as client:
        run_id = client.post("/runs", json={"key": "wf-1"}).json()["runId"]
        grant = client.post(f"/runs/{run_id}/attempts", json={"runnerId": "r", "leaseSeconds": 600}).json()
        lease = {"attemptId": grant["attemptId"], "leaseEpoch": grant["epoch"]}
        assert client.post(f"/runs/{run_id}/trajectory", json=lease).status_code == 201
        step = client.post(
            f"/runs/{run_id}/trajectory/steps", json={**lease, "tool": "cache.warm", "params": {"name": "s"}}
        )
        assert step.json() == {"stepIndex": 0, "status": "committed"}
        assert client.post(f"/runs/{run_id}/trajectory/finish", json=lease).json()["status"] == "completed"
        assert client.post(f"/runs/{run_id}/report", json=lease).json()["status"] == "succeeded"
        # A second proposal under the same lease after the finish is refused, as a 409.
        again = {**lease, "tool": "cache.warm", "params": {"name": "late"}}
        assert client.post(f"/runs/{run_id}/trajectory/steps", json=again).status_code == 409
        stats = client.get("/stats").json()
    # submit, claim, effect intent, effect outcome, report; open, propose, commit, finish; the
    # refused proposal. One at a time, so each was a batch of its own, and each batch wrote
    # (its events, or the refusal).
    assert stats["commands"] == stats["batches"] == stats["transactions"] == 10


def test_the_report_sets_each_case_against_dbos() -> None:
    runs = [
        OwnerRun(
            "group commit", 1, 1000, 10.0, 80.0, 120.0, 7.0, 7.0, 2.0, 3.0, 3.3, 5.0, 2.0, 5.0, 20.0, 3.0, 9.0
        ),
        OwnerRun(
            "group commit",
            5,
            400,
            10.0,
            200.0,
            300.0,
            20.0,
            15.0,
            3.0,
            3.0,
            8.3,
            5.5,
            2.0,
            5.0,
            14.0,
            3.0,
            9.0,
        ),
    ]
    text = report(runs, argparse.Namespace(clients=8, seconds=10.0))
    one = next(line for line in text.splitlines() if line.startswith("| group commit | 1 |"))
    cells = [cell.strip() for cell in one.strip("|").split("|")]
    assert cells[2] == "100.0"  # 1,000 workflows in 10 s
    assert cells[4] == f"{100.0 / 144.0:.2f}x"
    assert cells[11] == "14.00"  # owner + broker
    assert cells[12] == f"{2000 / 144.0:.1f}"
    five = next(line for line in text.splitlines() if line.startswith("| group commit | 5 |"))
    assert f"{40.0 / 45.4:.2f}x" in five


def test_the_tenants_land_on_distinct_partitions_round_robin() -> None:
    names = tenants_over_partitions(6)
    partitions = [partition_for_run(run_id_for(name, "k")) for name in names]
    assert sorted(set(partitions)) == list(range(RUNS_COMMANDS.partitions))
    assert all(names[i] == names[i % RUNS_COMMANDS.partitions] for i in range(6))  # round robin
    assert len(tenants_over_partitions(1)) == 1
