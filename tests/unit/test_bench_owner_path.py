"""The owner prototype that bench/owner_path.py measures (issue 11): its routes over the group
committer, and its report.

The prototype feeds requests into the one aggregate runtime through the group committer over
joint units (services/common/aggregate/group_commit.py; tests/unit/test_joint_unit.py holds its
own tests). What must hold for the bench's figures to mean anything: the whole workflow of the
benchmark goes through both aggregates to a succeeded run, a step costs two units (one with
`--separate`: three), and a refused command is answered as refused. Checked here over the
in-memory event log (the bench itself runs on a real broker).
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench._owner_server import CountingLog, Owner, Sharded, create_app
from bench.owner_path import OwnerRun, report, tenants_over_partitions
from services.common.clock import SystemClock
from services.common.eventlog import MemoryEventLog
from services.common.ids import run_id_for
from services.common.messages import MessageCodec
from services.common.routing import partition_for_run
from services.common.store import MemoryStore
from services.common.topics import RUNS_COMMANDS

CLOCK = SystemClock()
CODEC = MessageCodec()


def _owner() -> Owner:
    log = CountingLog(MemoryEventLog())
    return Owner(log, MemoryStore(), MemoryStore(), set(range(RUNS_COMMANDS.partitions)))


def _workflow(client: TestClient, key: str) -> dict[str, Any]:
    run_id = client.post("/runs", json={"key": key}).json()["runId"]
    grant = client.post(f"/runs/{run_id}/attempts", json={"runnerId": "r", "leaseSeconds": 600}).json()
    lease = {"attemptId": grant["attemptId"], "leaseEpoch": grant["epoch"]}
    assert client.post(f"/runs/{run_id}/trajectory", json=lease).status_code == 201
    step = client.post(
        f"/runs/{run_id}/trajectory/steps", json={**lease, "tool": "cache.warm", "params": {"name": "s"}}
    )
    assert step.json() == {"stepIndex": 0, "status": "committed"}
    assert client.post(f"/runs/{run_id}/trajectory/finish", json=lease).json()["status"] == "completed"
    assert client.post(f"/runs/{run_id}/report", json=lease).json()["status"] == "succeeded"
    return {"run_id": run_id, **lease}


@pytest.mark.parametrize(("separate", "requests_per_step"), [(False, 2), (True, 4)])
def test_the_benchmark_workflow_goes_through_both_aggregates(separate: bool, requests_per_step: int) -> None:
    owner = _owner()
    try:
        with TestClient(create_app(Sharded.single(owner), CLOCK, separate=separate)) as client:
            lease = _workflow(client, "wf-1")
            # A second proposal under the same lease after the finish is refused, as a 409.
            again = {"attemptId": lease["attemptId"], "leaseEpoch": lease["leaseEpoch"]}
            late = {**again, "tool": "cache.warm", "params": {"name": "late"}}
            assert client.post(f"/runs/{lease['run_id']}/trajectory/steps", json=late).status_code == 409
            stats = client.get("/stats").json()
    finally:
        owner.committer.stop()
    # submit, claim, open, the step, finish, report, then the refused proposal, one request at a
    # time, and each unit wrote (its events, or the refusal). A step is two requests of two
    # commands each; with --separate, four requests, the last two (the outcome and the commit)
    # sent together: one unit or two.
    requests = 5 + requests_per_step + 1
    assert stats["transactions"] == stats["batches"]
    assert stats["commands"] == requests
    assert stats["batches"] in ((requests - 1, requests) if separate else (requests,))


def test_the_combined_calls_make_the_same_workflow_in_two_units_fewer() -> None:
    """The claim that opens the trajectory and the finish that reports the attempt: each one
    request and one unit of two commands, with the same events as the separate calls."""
    owner = _owner()
    try:
        with TestClient(create_app(Sharded.single(owner), CLOCK)) as client:
            run_id = client.post("/runs", json={"key": "combined"}).json()["runId"]
            claim = {"runnerId": "r", "leaseSeconds": 600, "openTrajectory": True}
            grant = client.post(f"/runs/{run_id}/attempts", json=claim).json()
            assert grant["trajectory"] == {"status": "forward", "version": 1}
            lease = {"attemptId": grant["attemptId"], "leaseEpoch": grant["epoch"]}
            step = {**lease, "tool": "cache.warm", "params": {"name": "s"}}
            assert client.post(f"/runs/{run_id}/trajectory/steps", json=step).json()["status"] == "committed"
            finish = {**lease, "reportSucceeded": True}
            finished = client.post(f"/runs/{run_id}/trajectory/finish", json=finish).json()
            assert (finished["status"], finished["run"]["status"]) == ("completed", "succeeded")
            # A claim of a run that is not there opens nothing: the first command's 409.
            nobody = run_id_for("bench-owner", "nobody")
            assert client.post(f"/runs/{nobody}/attempts", json=claim).status_code == 409
            stats = client.get("/stats").json()
    finally:
        owner.committer.stop()
    # submit, claim + open, the step (two units), finish + report, the refused claim.
    assert (stats["batches"], stats["commands"]) == (6, 6)
    trajectory_events = [type(e).__name__ for e in _events(owner, "trajectory")]
    assert trajectory_events[0] == "TrajectoryStarted" and trajectory_events[-1] == "TrajectoryCompleted"
    assert type(_events(owner, "run")[-1]).__name__ == "AttemptReported"


def _events(owner: Owner, aggregate: str) -> list[Any]:
    processor = owner.runs if aggregate == "run" else owner.trajectories
    log = owner.log._inner  # the counted in-memory log
    assert isinstance(log, MemoryEventLog)
    topic = processor.definition.events_topic
    return [
        CODEC.decode(r.value)
        for (name, _), records in sorted(log.topics.items())
        if name == topic
        for r in records
    ]


def test_a_refused_claim_is_answered_409_and_the_owner_goes_on() -> None:
    owner = _owner()
    try:
        with TestClient(create_app(Sharded.single(owner), CLOCK)) as client:
            nobody = run_id_for("bench-owner", "nobody")
            answer = client.post(f"/runs/{nobody}/attempts", json={"runnerId": "r", "leaseSeconds": 60})
            assert answer.status_code == 409
            _workflow(client, "after")
    finally:
        owner.committer.stop()


def test_the_report_sets_each_case_against_dbos() -> None:
    runs = [
        OwnerRun(
            "joint units", 1, 1000, 10.0, 80.0, 120.0, 7.0, 7.0, 2.0, 3.0, 3.3, 5.0, 2.0, 5.0, 20.0, 3.0, 9.0
        ),
        OwnerRun(
            "joint units",
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
    one = next(line for line in text.splitlines() if line.startswith("| joint units | 1 |"))
    cells = [cell.strip() for cell in one.strip("|").split("|")]
    assert cells[2] == "100.0"  # 1,000 workflows in 10 s
    assert cells[4] == f"{100.0 / 144.0:.2f}x"
    assert cells[11] == "14.00"  # owner + broker
    assert cells[12] == f"{2000 / 144.0:.1f}"
    five = next(line for line in text.splitlines() if line.startswith("| joint units | 5 |"))
    assert f"{40.0 / 45.4:.2f}x" in five


def test_the_tenants_land_on_distinct_partitions_round_robin() -> None:
    names = tenants_over_partitions(6)
    partitions = [partition_for_run(run_id_for(name, "k")) for name in names]
    assert sorted(set(partitions)) == list(range(RUNS_COMMANDS.partitions))
    assert all(names[i] == names[i % RUNS_COMMANDS.partitions] for i in range(6))  # round robin
    assert len(tenants_over_partitions(1)) == 1
