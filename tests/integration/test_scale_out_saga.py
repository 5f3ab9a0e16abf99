"""Several saga-orchestrator instances in one consumer group, trajectories in flight (issue 16;
SAGA-1, DUR-1).

Real processes on the real broker: the lease coordinator, the simulated environment, the effect
gateway and two orchestrators. Trajectories of tenants spread over all four partitions commit
their steps one after another in parallel; meanwhile the orchestrator owning the most partitions
is SIGKILLed and a third one is ADDED. Afterwards every trajectory committed all its steps and
completed, the environment's own audit shows no effect applied twice and no duplicate, the log
has no duplicate event and no version gap, and each surviving instance's state equals the pure
fold of trajectories.events for the trajectories of the partitions it owns.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.common.contracts import FinishTrajectory
from services.common.ids import run_id_for
from services.common.routing import partition_for_run
from services.common.store import RocksStore
from services.common.topics import TRAJECTORIES_COMMANDS, TRAJECTORIES_EVENTS
from services.saga_orchestrator import state_codec as trajectory_codec
from services.saga_orchestrator.domain import StepStatus, TrajectoryStatus
from services.saga_orchestrator.domain import fold as fold_trajectory
from tests.support.saga import Lease, SagaRunner, SagaSystem, of_run
from tests.support.scale import ProcessorFleet
from tests.support.system import decode_all, read_topic, stop_all, wait_for_http

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(180)]

TRAJECTORIES = 8
STEPS = (
    ("vm.provision", lambda name, vm: {"name": name}),
    ("ip.reserve", lambda name, vm: {"region": "eu-west"}),
    ("sandbox.compile", lambda name, vm: {"vmId": vm, "source": "fn main() {}"}),
    ("firewall.write", lambda name, vm: {"vmId": vm, "port": 443}),
)


def _tenants(tag: str) -> list[str]:
    """Tenants whose runs land on every trajectories.commands partition, two each."""
    chosen: dict[int, list[str]] = defaultdict(list)
    for i in range(1000):
        tenant = f"{tag}-t{i}"
        partition = partition_for_run(run_id_for(tenant, "probe"))
        if len(chosen[partition]) < 2:
            chosen[partition].append(tenant)
        if sum(map(len, chosen.values())) == TRAJECTORIES:
            break
    return [t for ts in chosen.values() for t in ts]


@pytest.fixture
def system(tenure_topics: str, tmp_path: Path) -> Iterator[SagaSystem]:
    # Nominal tool durations x 0.4: a sandbox compile takes 1.7 s (under the 2 s tool timeout),
    # long enough for the SIGKILL to land while steps are in flight.
    saga = SagaSystem(tenure_topics, tmp_path, TENURE_SIM_TIME_SCALE="0.4")
    for service in (saga.coordinator, saga.sim, saga.gateway):  # the orchestrators: a fleet
        service.start()
    try:
        wait_for_http(f"{saga.sim_url}/healthz")
        wait_for_http(f"{saga.gateway_url}/readyz", timeout_s=60)
        yield saga
    finally:
        stop_all((saga.gateway, saga.sim, saga.coordinator))


def _drive(runner: SagaRunner, lease: Lease, name: str, errors: list[BaseException]) -> None:
    """Commit the four steps one after another, then finish the trajectory."""
    try:
        vm = ""
        for index, (tool, params) in enumerate(STEPS):
            command_id = runner.propose(lease, tool, params(name, vm))
            state = runner.wait(
                lease.run_id,
                lambda s, i=index: s.step(i) is not None and s.steps[i].status is StepStatus.COMMITTED,
                f"{tool} of {name} to commit",
                command_id,
                timeout_s=75,
            )
            if index == 0:
                vm = json.loads(state.steps[0].output)["vmId"]
        finish = runner.send(
            FinishTrajectory(
                **runner.header(lease.run_id), attempt_id=lease.attempt_id, lease_epoch=lease.epoch
            )
        )
        runner.wait(
            lease.run_id, lambda s: s.status is TrajectoryStatus.COMPLETED, f"{name} to finish", finish, 75
        )
    except BaseException as exc:
        errors.append(exc)


def test_orchestrators_survive_a_sigkill_and_an_added_instance_mid_flight_SAGA_1_DUR_1(
    system: SagaSystem, tenure_topics: str, tmp_path: Path
) -> None:
    bootstrap = tenure_topics
    tag = f"scale-saga-{time.time_ns()}"
    fleet = ProcessorFleet(
        "saga-orchestrator",
        "services.saga_orchestrator",
        "TENURE_SAGA_HEALTH_PORT",
        bootstrap,
        tmp_path / "fleet",
        TRAJECTORIES_COMMANDS.partitions,
        **{k: v for k, v in system.env.items() if k.startswith("TENURE_") and k != "TENURE_STATE_DIR"},
        TENURE_SESSION_TIMEOUT_S="6",
    )
    (tmp_path / "fleet").mkdir()
    runner = SagaRunner(bootstrap, name="scale-runner")
    errors: list[BaseException] = []
    leases: list[Lease] = []
    try:
        fleet.add("0")
        fleet.add("1")
        fleet.wait_covered(60, members=2)
        for i, tenant in enumerate(_tenants(tag)):
            lease = runner.claim_new_run(f"{tag}-{i}", tenant=tenant)
            runner.start(lease)
            leases.append(lease)
        assert {partition_for_run(lease.run_id) for lease in leases} == set(range(4))
        drivers = [
            threading.Thread(target=_drive, args=(runner, lease, f"{tag}-{i}", errors))
            for i, lease in enumerate(leases)
        ]
        for driver in drivers:
            driver.start()
        time.sleep(1.0)  # the compiles in flight on both instances

        def open_steps() -> int:
            states = [runner.state(lease.run_id) for lease in leases]
            return sum(1 for s in states if s is not None and s.steps and s.steps[-1].is_open)

        owned = fleet.coverage() or {}
        in_flight = open_steps()
        victim = max(owned, key=lambda i: len(owned[i])) if owned else "0"
        fleet.instances[victim].process.sigkill()
        fleet.add("2")
        survivors, took_s = fleet.wait_covered(60, members=2)
        print(
            f"SIGKILL of orchestrator {victim} with {in_flight} steps in flight, one added: "
            f"{dict(survivors)} after {took_s:.1f} s"
        )
        assert in_flight >= 1, "no step was in flight at the SIGKILL"
        for driver in drivers:
            driver.join(150)
        assert not errors, errors
        final = fleet.coverage()
        assert final is not None, "the orchestrators do not cover every partition"
    except BaseException:
        fleet.stop_all()
        print(fleet.log_tails())
        raise
    finally:
        fleet.stop_all()
        runner.close()

    # 1. The environment's own audit: every step took effect exactly once, nothing duplicated.
    audit = system.audit()
    assert audit["duplicates"] == []
    mine = [e for lease in leases for e in of_run(audit["effects"], lease.run_id, "key")]
    assert len(mine) >= TRAJECTORIES * len(STEPS), mine
    assert all(e["applied"] == 1 for e in mine), mine

    # 2. The log: unique events, versions 1..n per trajectory, every one completed.
    runs = {lease.run_id for lease in leases}
    events = [e for e in decode_all(read_topic(bootstrap, TRAJECTORIES_EVENTS.name, 4)) if e.run_id in runs]
    assert len({e.event_id for e in events}) == len(events), "an event was committed twice"
    by_run: dict[str, list[Any]] = defaultdict(list)
    for event in events:
        by_run[event.run_id].append(event)
    assert set(by_run) == runs
    for run_id, run_events in by_run.items():
        assert [e.version for e in run_events] == list(range(1, len(run_events) + 1)), run_id
        folded = fold_trajectory(run_events)
        assert folded.status is TrajectoryStatus.COMPLETED, run_id
        assert [s.status for s in folded.steps] == [StepStatus.COMMITTED] * len(STEPS), run_id

    # 3. Each survivor's state is the fold of the log for the partitions it owns at the end.
    for instance_id, partitions in final.items():
        store = RocksStore(fleet.store_path(instance_id, "saga_orchestrator") / "trajectories")
        try:
            scanned = store.scan("trajectory/")
            stored = {k.removeprefix("trajectory/"): trajectory_codec.decode_state(v) for k, v in scanned}
        finally:
            store.close()
        for run_id in (r for r in runs if partition_for_run(r) in partitions):
            assert stored[run_id] == fold_trajectory(by_run[run_id]), (instance_id, run_id)
