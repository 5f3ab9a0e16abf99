"""A looping runner is caught by the semantic watchdog, end to end (WD-1, WD-5, REC-7).

Real processes on a real broker: lease coordinator, projector, command API, simulated
environment, effect gateway, saga orchestrator and the watchdog. The runner claims its run,
drives its saga with the SDK and reports its own steps (a 2-state loop: the environment goes
A, B, A, B ...) with the hash of its state; the saga reports the steps it dispatched itself.
The ladder must reach the runner on its next answers, and be enforced where it acts:

* level 1: the next proposal of the looping action is refused (STATE_OSCILLATION_DETECTED) with
  the intervention in the problem, on the heartbeat answer and through `on_intervention`;
* level 2: the action is tombstoned, refused by the orchestrator AND by the effect gateway on a
  direct POST /effects (nothing dispatched: checked in the simulated environment's audit);
* level 3 before the pivot: the saga is unwound (its compensators ran: the VM is terminated in
  the environment's audit) and the lease revoked; after the pivot: the trajectory freezes with
  an incident and the lease is revoked (REC-7).

Thresholds are set per run (PUT /runs/{runId}/watchdog), so the test does not depend on the
deployment's defaults.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.common.ids import action_hash
from services.runner_sdk import (
    ActionTombstoned,
    Intervention,
    InterventionInbox,
    Lease,
    LeaseConflict,
    TenureClient,
    TrajectoryClient,
    TrajectoryRejected,
    WatchdogClient,
)
from tests.support.saga_system import OPERATOR_KEY, RUNNER_KEY, SagaSystem
from tests.support.system import wait_until
from tests.support.tenure import submit

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

STATES = {"eu": "a" * 64, "us": "b" * 64}  # the environment after reserving in each region


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SagaSystem]:
    s = SagaSystem(tenure_topics, tmp_path_factory.mktemp("watchdog"), watchdog=True).start()
    try:
        yield s
    finally:
        s.stop()


class LoopingRunner:
    """A runner whose model keeps reserving an IP in one region, then the other, and back."""

    def __init__(self, system: SagaSystem, name: str) -> None:
        self.system = system
        self.heard: list[Intervention] = []
        inbox = InterventionInbox(self.heard.append)  # one memory for the three clients
        self.runs = TenureClient(system.base, system.gateway_url, api_key=RUNNER_KEY, on_intervention=inbox)
        self.trajectories = TrajectoryClient(system.base, api_key=RUNNER_KEY, on_intervention=inbox)
        self.watchdog = WatchdogClient(system.base, api_key=RUNNER_KEY, on_intervention=inbox)
        self.http = system.client(RUNNER_KEY)
        run = submit(self.http, f"{name}-{uuid.uuid4()}")
        # A long lease: the test renews by hand only to read the heartbeat's answer.
        self.lease: Lease = self.runs.claim(
            run["runId"], "runner-1", [], lease_seconds=120, heartbeat_seconds=60
        )
        self.run_id = self.lease.run_id
        self.step = 0
        self.sequence = 0

    def close(self) -> None:
        for closing in (self.runs, self.trajectories, self.watchdog, self.http):
            closing.close()

    def commit(self, tool: str, params: dict[str, Any]) -> Any:
        ticket = self.trajectories.propose_step(self.lease, tool, params)
        outcome = self.trajectories.wait_for_step(
            self.run_id, ticket.step_index, ticket.dispatch, timeout_s=60
        )
        assert outcome.committed, outcome
        return outcome

    def observe(self, region: str) -> None:
        """One turn of the loop, reported as the runner's own step (WD-1)."""
        self.step += 1
        self.watchdog.report_observation(
            self.lease,
            self.step,
            "ip.reserve",
            {"region": region},
            state_hash=STATES[region],
            summary=f"reserved an address in {region}",
        )

    def heartbeat(self) -> Intervention | None:
        self.sequence += 1
        return self.runs.heartbeat(self.lease, self.sequence).watchdog

    def trajectory(self) -> dict[str, Any]:
        return self.trajectories.trajectory(self.run_id)

    def wait_for_trajectory(self, what: str, predicate: Any, timeout_s: float = 30) -> dict[str, Any]:
        found: dict[str, Any] = wait_until(
            lambda: view if predicate(view := self.trajectory()) else None, timeout_s, what, poll_s=0.1
        )
        return found


@pytest.fixture
def operator(system: SagaSystem) -> Iterator[httpx.Client]:
    with system.client(OPERATOR_KEY) as c:
        yield c


def reserve(region: str) -> str:
    return action_hash("ip.reserve", {"region": region})


def test_wd_5_a_looping_runner_gets_level_1_then_2_then_3_and_the_saga_unwinds_before_the_pivot(
    system: SagaSystem,
) -> None:
    runner = LoopingRunner(system, "wd-pre-pivot")
    try:
        view = runner.watchdog.configure(
            runner.run_id, max_period=4, window=16, ladder_epoch=5, rollback_budget=1
        )
        assert view["thresholds"]["ladderEpoch"] == 5 and view["configurations"][-1]["origin"] == "run"
        runner.trajectories.start_trajectory(runner.lease)
        vm = runner.commit("vm.provision", {"name": f"wd-{uuid.uuid4().hex[:8]}"}).output
        # The saga reported the step it dispatched (WD-1: source "saga").
        wait_until(
            lambda: any(o["source"] == "saga" for o in runner.watchdog.view(runner.run_id)["observations"]),
            30,
            "the saga's observation of its step",
        )

        # --- level 1: eu, us, eu: the environment is back where it was at step 1 (period 2).
        for region in ("eu", "us", "eu"):
            runner.observe(region)
        runner.wait_for_trajectory(
            "the interrupt", lambda t: t["watchdog"]["interruptAction"] == reserve("eu")
        )
        with pytest.raises(TrajectoryRejected) as refused:
            runner.trajectories.propose_step(runner.lease, "ip.reserve", {"region": "eu"})
        assert refused.value.status == 409 and refused.value.code == "STATE_OSCILLATION_DETECTED"
        interrupt = refused.value.watchdog
        assert interrupt is not None and interrupt.level == 1 and interrupt.period == 2
        assert interrupt.returned_to_step == 1 and interrupt.action_hash == reserve("eu")
        assert "STATE_OSCILLATION_DETECTED" in interrupt.message
        assert runner.heartbeat() == interrupt, "the heartbeat answer carries it too"
        assert runner.heard == [interrupt], "on_intervention heard it once, before the refusal was raised"

        # --- level 2: us again, within the ladder epoch: roll back, and "us" is tombstoned.
        runner.observe("us")
        runner.wait_for_trajectory("the tombstone", lambda t: reserve("us") in t["watchdog"]["tombstones"])
        with pytest.raises(TrajectoryRejected) as tombstoned:
            runner.trajectories.propose_step(runner.lease, "ip.reserve", {"region": "us"})
        assert tombstoned.value.code == "ACTION_TOMBSTONED"
        rollback = tombstoned.value.watchdog
        assert rollback is not None and rollback.is_rollback and rollback.action_hash == reserve("us")
        assert rollback.truncated_steps, "the looping turns are marked truncated"
        # ... and at the gateway: a direct effect of the tombstoned action records nothing.
        with pytest.raises(ActionTombstoned) as at_gateway:
            runner.runs.effect(
                runner.lease, f"{runner.run_id}/direct-us", "env", "ip.reserve", {"region": "us"}
            )
        assert at_gateway.value.status == 409 and at_gateway.value.action_hash == reserve("us")
        assert not [e for e in system.audit()["effects"] if e["key"] == f"{runner.run_id}/direct-us"]
        assert runner.heartbeat() == rollback and runner.heard == [interrupt, rollback]
        acknowledged = runner.watchdog.acknowledge_rollback(
            runner.lease, rollback.intervention_id, rollback.checkpoint_step
        )
        assert acknowledged["status"] == "rolled-back" and acknowledged["pendingRollback"] is None

        # --- level 3: the loop resumes after the rollback, the budget is spent: deadlock.
        for region in ("eu", "us", "eu"):
            runner.observe(region)
        unwound = runner.wait_for_trajectory("the unwind", lambda t: t["status"] == "rolled-back", 60)
        assert unwound["watchdog"]["semanticDeadlock"] is True
        assert unwound["watchdog"]["intervention"]["code"] == "ERR_SEMANTIC_DEADLOCK"
        assert any(d["gate"] == "semantic-watchdog" for d in unwound["decisions"])
        assert unwound["compensated"] == [0], "the saga's one step was compensated"
        # The environment's own record: the VM is gone.
        released = {r["id"] for r in system.audit()["released"]}
        assert vm["vmId"] in released
        dog = runner.watchdog.view(runner.run_id)
        assert dog["status"] == "deadlocked" and [i["level"] for i in dog["interventions"]] == [1, 2, 3]
        assert all(i["evidence"]["detector"] == "cycle" for i in dog["interventions"])
        assert dog["interventions"][1]["acknowledgedAt"].endswith("Z")
        # An operator sees the whole ladder in the run's own view too.
        run_view = runner.http.get(f"/runs/{runner.run_id}").json()
        assert [i["level"] for i in run_view["watchdog"]["interventions"]] == [1, 2, 3]
        assert run_view["watchdog"]["href"] == f"/runs/{runner.run_id}/watchdog"
        # The run's capabilities are revoked too (a takeover bumps the epoch): the runner is
        # fenced out of its trajectory and its lease.
        wait_until(
            lambda: (
                runner.http.get(f"/runs/{runner.run_id}/lease").json()["lease"]["epoch"] > runner.lease.epoch
            ),
            30,
            "the lease's revocation after the unwind",
        )
        with pytest.raises(LeaseConflict):
            runner.trajectories.propose_step(runner.lease, "ip.reserve", {"region": "ap"})
    finally:
        runner.close()


def test_wd_5_a_loop_after_the_pivot_freezes_the_trajectory_with_an_incident(
    system: SagaSystem, operator: httpx.Client
) -> None:
    runner = LoopingRunner(system, "wd-post-pivot")
    try:
        # No rollback budget: the second violation within the epoch is level 3 at once.
        runner.watchdog.configure(runner.run_id, max_period=4, window=16, ladder_epoch=5, rollback_budget=0)
        runner.trajectories.start_trajectory(runner.lease)
        name = f"wd-{uuid.uuid4().hex[:8]}"
        runner.commit("vm.provision", {"name": name})
        runner.commit("dns.publish", {"name": f"{name}.example.org", "address": "203.0.113.9"})
        assert runner.trajectory()["pivotCommitted"] is True
        for region in ("eu", "us", "eu", "us"):
            runner.observe(region)
        frozen = runner.wait_for_trajectory("the freeze", lambda t: t["status"] == "frozen", 60)
        incident = frozen["incident"]
        assert incident is not None and incident["failureMode"] == "POST_PIVOT_STALLED"
        assert incident["errorContext"]["kind"] == "ERR_SEMANTIC_DEADLOCK"
        opened = wait_until(
            lambda: [i for i in operator.get("/incidents").json()["items"] if i["runId"] == runner.run_id],
            30,
            "the incident on the open-incidents list",
        )
        assert opened[0]["incidentId"] == incident["incidentId"]
        # Nothing was rolled back after the pivot: the VM and the DNS record stand.
        live = [r for r in system.audit()["live"] if str(r.get("createdByKey", "")).startswith(runner.run_id)]
        assert live, "after the pivot nothing is compensated"
        dog = runner.watchdog.view(runner.run_id)
        assert [i["code"] for i in dog["interventions"]] == [
            "STATE_OSCILLATION_DETECTED",
            "ERR_SEMANTIC_DEADLOCK",
        ]
        # REC-7: the runner's lease is revoked (a takeover bumps the epoch) and it is fenced out.
        lease = wait_until(
            lambda: (
                (body := runner.http.get(f"/runs/{runner.run_id}/lease").json())["lease"]["epoch"]
                > runner.lease.epoch
                and body
            ),
            30,
            "the lease's revocation",
        )
        assert lease["previousLeases"][-1]["attemptId"] == runner.lease.attempt_id
        with pytest.raises(LeaseConflict):
            runner.heartbeat()
    finally:
        runner.close()


def test_wd_5_the_observation_to_intervention_path_is_fast(system: SagaSystem) -> None:
    """Not a benchmark (bench/watchdog_latency.py is): the runner hears of a loop within seconds."""
    runner = LoopingRunner(system, "wd-latency")
    try:
        runner.watchdog.configure(runner.run_id, max_period=2, window=8)
        for region in ("eu", "us"):
            runner.observe(region)
        version = runner.watchdog.view(runner.run_id)["version"]
        started = time.monotonic()
        runner.observe("eu")
        found = runner.watchdog.wait_for_intervention(runner.run_id, after_version=version, timeout_s=20)
        assert found is not None and found.code == "STATE_OSCILLATION_DETECTED"
        assert time.monotonic() - started < 10
    finally:
        runner.close()
