"""A run's trajectory driven over HTTP the way a user's service would (SAGA-1..7, REC-1, REC-7).

Real processes on a real broker: lease coordinator, projector, command API, effect gateway,
simulated environment and saga orchestrator. The runner claims its run and drives the saga with
the runner SDK (TenureClient + TrajectoryClient); bad requests go over raw HTTP so their
problem+json can be read. Outcomes are checked against the simulated environment's own audit,
never only against what the API says.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.common.messages import MessageCodec
from services.common.store import MemoryStore, RocksStore
from services.projections.service import rebuild_trajectories, views_path
from services.projections.trajectory_store import TrajectoryViewStore
from services.runner_sdk import Lease, TenureClient, TrajectoryClient
from tests.support.saga_system import OPERATOR_KEY, RUNNER, RUNNER_KEY, SagaSystem
from tests.support.system import wait_until
from tests.support.tenure import problem_type, submit

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SagaSystem]:
    s = SagaSystem(tenure_topics, tmp_path_factory.mktemp("trajectories")).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def http(system: SagaSystem) -> Iterator[httpx.Client]:
    with system.client(RUNNER_KEY) as c:
        yield c


@pytest.fixture
def operator(system: SagaSystem) -> Iterator[httpx.Client]:
    with system.client(OPERATOR_KEY) as c:
        yield c


@pytest.fixture
def sdk(system: SagaSystem) -> Iterator[tuple[TenureClient, TrajectoryClient]]:
    with (
        TenureClient(system.base, system.gateway_url, api_key=RUNNER_KEY) as runs,
        TrajectoryClient(system.base, api_key=RUNNER_KEY) as trajectories,
    ):
        yield runs, trajectories


def claimed_run(http: httpx.Client, runs: TenureClient, name: str) -> Lease:
    run = submit(http, f"{name}-{uuid.uuid4()}")
    # A long lease: the test does not heartbeat, and the pivot's gate checks the lease is active.
    return runs.claim(run["runId"], "runner-1", [], lease_seconds=120, heartbeat_seconds=60)


def of_run(
    entries: list[dict[str, Any]], run_id: str, key_field: str = "createdByKey"
) -> list[dict[str, Any]]:
    """Audit entries caused by one run (every idempotency key of a run starts with its id)."""
    return [e for e in entries if str(e.get(key_field, "")).startswith(run_id + "/")]


def effects_of(system: SagaSystem, run_id: str) -> list[dict[str, Any]]:
    return of_run(system.audit()["effects"], run_id, "key")


def test_deploy_trajectory_commits_every_step_through_the_pivot_SAGA_1_SAGA_2_SAGA_6(
    system: SagaSystem,
    http: httpx.Client,
    sdk: tuple[TenureClient, TrajectoryClient],
) -> None:
    runs, client = sdk
    lease = claimed_run(http, runs, "deploy")
    name = f"web-{lease.run_id[-8:]}"
    started = client.start_trajectory(
        lease,
        budget={"tokens": 50_000, "steps": 10, "money": 2.0},
        rerun_cost={"durationMs": 46_000, "money": 0.162},
    )
    assert started["runId"] == lease.run_id and started["status"] == "forward" and started["version"] == 1
    assert started["attemptId"] == lease.attempt_id and started["epoch"] == lease.epoch
    assert started["steps"] == [] and started["budget"] == {"tokens": 50_000, "steps": 10, "money": 2.0}

    def commit(tool: str, params: dict[str, Any], index: int) -> dict[str, Any]:
        ticket = client.propose_step(lease, tool, params, tokens_used=1_000)
        assert ticket.step_index == index and ticket.dispatch == 1 and ticket.tool == tool
        # SAGA-1: the orchestrator, not the model, assigned the idempotency key.
        assert ticket.idempotency_key == f"{lease.run_id}/s{index}/d1"
        assert ticket.status == ("awaiting-gate" if tool == "dns.publish" else "pending")
        step = client.wait_for_step(lease.run_id, index, ticket.dispatch, timeout_s=60)
        assert step.committed, step
        assert isinstance(step.output, dict)
        return step.output

    vm = commit("vm.provision", {"name": name}, 0)
    ip = commit("ip.reserve", {"region": "eu-west"}, 1)
    rule = commit("firewall.write", {"vmId": vm["vmId"], "port": 443}, 2)

    before_pivot = client.trajectory(lease.run_id)
    assert before_pivot["stack"] == [0, 1, 2]  # SAGA-2: LIFO stack, the top last
    compensators = [
        (s["compensation"]["operation"], s["compensation"]["params"]) for s in before_pivot["steps"]
    ]
    assert compensators == [
        ("vm.terminate", {"vmId": vm["vmId"]}),
        ("ip.release", {"ipId": ip["ipId"]}),
        ("firewall.unbind", {"ruleId": rule["ruleId"]}),
    ]
    assert before_pivot["budget"]["steps"] == 7 and before_pivot["budget"]["tokens"] == 47_000

    record = commit("dns.publish", {"name": f"{name}.example.org", "address": ip["address"]}, 3)
    after_pivot = client.trajectory(lease.run_id)
    assert after_pivot["status"] == "post-pivot" and after_pivot["pivotStep"] == 3
    assert after_pivot["pivotCommitted"] is True and after_pivot["stack"] == []  # retired (SAGA-6)
    pivot = after_pivot["steps"][3]
    assert pivot["gateVerdict"] == "passed" and pivot["compensation"] is None
    assert {c["name"] for c in pivot["gateChecks"]} == {"lease-active", "dns.name-available"}

    done = client.finish(lease)
    assert done["status"] == "completed" and done["terminal"] is True

    # The environment's own record: each forward effect exactly once, nothing compensated.
    audit = system.audit()
    live = {r["id"] for r in of_run(audit["live"], lease.run_id)}
    assert live == {vm["vmId"], ip["ipId"], rule["ruleId"]}
    assert record["recordId"] in {r["id"] for r in of_run(audit["permanent"], lease.run_id)}
    keys = sorted(e["key"] for e in of_run(audit["effects"], lease.run_id, "key"))
    assert keys == [f"{lease.run_id}/s{i}/d1" for i in range(4)]
    assert not [k for k in audit["duplicates"] if k.startswith(lease.run_id + "/")]

    view = http.get(f"/runs/{lease.run_id}/trajectory")
    assert view.status_code == 200 and view.json()["version"] == done["version"]


def test_a_repeated_proposal_with_the_same_idempotency_key_is_one_step(
    http: httpx.Client, sdk: tuple[TenureClient, TrajectoryClient]
) -> None:
    runs, client = sdk
    lease = claimed_run(http, runs, "repeat")
    client.start_trajectory(lease)
    first = client.propose_step(lease, "cache.warm", {"name": "repeat"}, idempotency_key="warm-1")
    again = client.propose_step(lease, "cache.warm", {"name": "repeat"}, idempotency_key="warm-1")
    assert (again.step_index, again.dispatch, again.idempotency_key) == (
        first.step_index,
        first.dispatch,
        first.idempotency_key,
    )
    assert client.wait_for_step(lease.run_id, first.step_index).committed
    view = client.trajectory(lease.run_id)
    assert len(view["steps"]) == 1 and len(view["steps"][0]["dispatches"]) == 1


def test_bad_requests_are_refused_specifically_and_change_nothing(
    system: SagaSystem,
    http: httpx.Client,
    operator: httpx.Client,
    sdk: tuple[TenureClient, TrajectoryClient],
) -> None:
    runs, client = sdk
    lease = claimed_run(http, runs, "refusals")
    path = f"/runs/{lease.run_id}/trajectory"
    lease_fields = {"attemptId": lease.attempt_id, "leaseEpoch": lease.epoch}

    missing = http.get(path)
    assert missing.status_code == 404 and problem_type(missing) == "trajectory-not-found"
    no_trajectory = http.post(
        f"{path}/steps", json={**lease_fields, "tool": "vm.provision", "params": {"name": "x"}}
    )
    assert no_trajectory.status_code == 404 and problem_type(no_trajectory) == "trajectory-not-found"
    assert no_trajectory.json()["code"] == "TRAJECTORY_NOT_FOUND"

    two_pivots = [
        {"stepId": "a", "tool": "dns.publish", "params": {"name": "a.example.org", "address": "203.0.113.1"}},
        {"stepId": "b", "tool": "dns.publish", "params": {"name": "b.example.org", "address": "203.0.113.2"}},
    ]
    refused_plan = http.post(path, json={**lease_fields, "plan": two_pivots})
    assert refused_plan.status_code == 422 and problem_type(refused_plan) == "plan-rejected"
    assert refused_plan.json()["code"] == "PLAN_REJECTED" and "TWO_PIVOTS" in refused_plan.json()["detail"]
    assert http.get(path).status_code == 404  # the refused plan opened nothing

    client.start_trajectory(lease)
    vm = client.propose_step(lease, "vm.provision", {"name": "refusals"})
    assert client.wait_for_step(lease.run_id, vm.step_index).committed
    before = http.get(path).json()
    effects_before = effects_of(system, lease.run_id)

    unknown = http.post(f"{path}/steps", json={**lease_fields, "tool": "vm.teleport", "params": {}})
    assert unknown.status_code == 422 and problem_type(unknown) == "unknown-tool"
    assert unknown.json()["code"] == "UNKNOWN_TOOL" and "vm.teleport" in unknown.json()["detail"]

    invalid = http.post(
        f"{path}/steps",
        json={**lease_fields, "tool": "firewall.write", "params": {"vmId": "vm-1", "port": 70000}},
    )
    assert invalid.status_code == 422 and problem_type(invalid) == "invalid-parameters"
    assert invalid.json()["code"] == "INVALID_PARAMETERS"
    assert "firewall.write parameters at port" in invalid.json()["detail"]
    assert "65535" in invalid.json()["detail"]

    approval = http.post(f"{path}/steps/0/approval", json={"decision": "approve"})
    assert approval.status_code == 403 and problem_type(approval) == "forbidden"

    # An operator takes the lease over for the same principal: the old attempt is stale (LEASE-3).
    takeover = operator.post(
        f"/runs/{lease.run_id}/lease/takeover",
        json={"reason": "moving the run", "newHolder": RUNNER, "leaseSeconds": 120},
    )
    assert takeover.status_code == 200, takeover.text
    grant = takeover.json()
    stale = http.post(
        f"{path}/steps", json={**lease_fields, "tool": "ip.reserve", "params": {"region": "eu"}}
    )
    assert stale.status_code == 409 and problem_type(stale) == "stale-epoch"
    stale_finish = http.post(f"{path}/finish", json=lease_fields)
    assert stale_finish.status_code == 409 and problem_type(stale_finish) == "stale-epoch"

    after = http.get(path).json()
    assert after == before  # no refusal changed the trajectory
    assert effects_of(system, lease.run_id) == effects_before  # nor touched the environment

    # The new holder carries on under its own epoch.
    new_lease = Lease(
        run_id=lease.run_id,
        attempt_id=grant["attemptId"],
        attempt_number=0,
        lease_id=grant["leaseId"],
        epoch=grant["epoch"],
        expires_at=grant["expiresAt"],
        lease_seconds=grant["leaseSeconds"],
        heartbeat_interval_seconds=grant["heartbeatIntervalSeconds"],
        server_time=grant["serverTime"],
        assignment=grant["assignment"],
    )
    ip = client.propose_step(new_lease, "ip.reserve", {"region": "eu"})
    step = client.wait_for_step(lease.run_id, ip.step_index)
    assert step.committed and client.trajectory(lease.run_id)["epoch"] == grant["epoch"]


def test_human_approval_gates_the_pivot_SAGA_6(
    http: httpx.Client, operator: httpx.Client, sdk: tuple[TenureClient, TrajectoryClient]
) -> None:
    runs, client = sdk
    lease = claimed_run(http, runs, "approval")
    client.start_trajectory(lease, pivot_approval="human")
    ticket = client.propose_step(
        lease, "dns.publish", {"name": f"approval-{lease.run_id[-8:]}.example.org", "address": "203.0.113.9"}
    )
    waiting = wait_until(
        lambda: client.trajectory(lease.run_id)["status"] == "awaiting-approval",
        30,
        "the gate to ask a human",
    )
    assert waiting
    view = client.trajectory(lease.run_id)
    assert (
        view["steps"][0]["status"] == "awaiting-gate"
        and view["steps"][0]["gateVerdict"] == "waiting-approval"
    )
    approved = operator.post(
        f"/runs/{lease.run_id}/trajectory/steps/{ticket.step_index}/approval",
        json={"decision": "approve", "note": "change window open"},
    )
    assert approved.status_code == 200, approved.text
    assert approved.json()["steps"][0]["approval"] == "approve"
    step = client.wait_for_step(lease.run_id, ticket.step_index, ticket.dispatch)
    assert step.committed and step.step["gateVerdict"] == "passed"
    assert client.finish(lease)["status"] == "completed"


def test_a_fatal_compensator_opens_an_incident_an_operator_resolves_REC_7(
    system: SagaSystem,
    http: httpx.Client,
    operator: httpx.Client,
    sdk: tuple[TenureClient, TrajectoryClient],
) -> None:
    runs, client = sdk
    lease = claimed_run(http, runs, "incident")
    client.start_trajectory(lease)
    ticket = client.propose_step(lease, "vm.provision", {"name": f"incident-{lease.run_id[-8:]}"})
    vm = client.wait_for_step(lease.run_id, ticket.step_index)
    assert vm.committed
    system.arm(
        "vm.terminate",
        status=403,
        problem="auth-revoked",
        detail="the cloud credentials were revoked",
        match={"vmId": vm.output["vmId"]},
    )
    aborted = client.abort(lease, "the runner gives up")
    assert aborted["decisions"][-1]["action"] == "BACKWARD_ROLLBACK"

    def listed() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = http.get("/incidents").json()["items"]
        return [i for i in items if i["runId"] == lease.run_id]

    (incident,) = wait_until(listed, 60, "the incident to be listed")
    assert incident["failureMode"] == "COMPENSATION_CORRUPTED" and incident["failedTool"] == "vm.provision"
    assert [u["tool"] for u in incident["uncompensated"]] == ["vm.provision"]
    view = client.trajectory(lease.run_id)
    assert view["status"] == "frozen" and view["incident"]["incidentId"] == incident["incidentId"]
    assert view["steps"][0]["status"] == "panic"

    refused = http.post(
        f"/incidents/{incident['incidentId']}/resolve", json={"runId": lease.run_id, "resolution": "abandon"}
    )
    assert refused.status_code == 403 and problem_type(refused) == "forbidden"
    resolved = operator.post(
        f"/incidents/{incident['incidentId']}/resolve",
        json={"runId": lease.run_id, "resolution": "compensated-manually", "note": "terminated by hand"},
    )
    assert resolved.status_code == 200, resolved.text
    body = resolved.json()
    assert body["status"] == "rolled-back" and body["incident"] is None
    assert body["incidents"][0]["resolution"] == "compensated-manually"
    assert body["incidents"][0]["resolvedBy"] == "olga"
    wait_until(lambda: not listed(), 30, "the incident to leave the open list")
    again = operator.post(
        f"/incidents/{incident['incidentId']}/resolve",
        json={"runId": lease.run_id, "resolution": "abandon"},
    )
    assert again.status_code == 409 and problem_type(again) == "trajectory-ended"


def test_trajectory_views_rebuilt_from_the_log_equal_the_live_ones_DUR_1(
    system: SagaSystem, tenure_topics: str
) -> None:
    """Runs last in this module: every trajectory above has settled, so the projector's live
    views (read as a secondary, like the API does) must equal a refold of trajectories.events."""
    codec = MessageCodec()
    live = TrajectoryViewStore(RocksStore(views_path(system.tmp / "state"), secondary=True), codec)
    rebuilt = TrajectoryViewStore(MemoryStore(), codec)
    report = rebuild_trajectories(tenure_topics, rebuilt)
    assert report.runs >= 5 and report.events > 0

    def caught_up() -> bool:
        live.refresh()
        return live.all_views() == rebuilt.all_views()

    wait_until(caught_up, 30, "the live trajectory views to equal the rebuilt ones")
    assert live.open_incidents() == rebuilt.open_incidents()


def test_a_long_poll_waits_on_the_server_and_answers_the_moment_the_view_moves(
    http: httpx.Client, sdk: tuple[TenureClient, TrajectoryClient]
) -> None:
    """GET /runs/{id}/trajectory?afterVersion=v&waitMs=w: push instead of poll (issue 11).

    Nothing changes: the answer comes after about `w`, with the same version. A step is
    proposed meanwhile: the answer comes once the view is past `v`, long before `w`."""
    runs, client = sdk
    lease = claimed_run(http, runs, "long-poll")
    client.start_trajectory(lease)
    first = client.propose_step(lease, "cache.warm", {"name": "lp-1"})
    assert client.wait_for_step(lease.run_id, first.step_index).committed
    path = f"/runs/{lease.run_id}/trajectory"
    version = int(http.get(path).json()["version"])

    began = time.monotonic()
    idle = http.get(path, params={"afterVersion": version, "waitMs": 1500})
    waited = time.monotonic() - began
    assert idle.status_code == 200 and int(idle.json()["version"]) == version
    assert 1.3 <= waited < 5.0, f"an idle long-poll answered after {waited:.2f}s, not ~1.5s"

    answered: dict[str, Any] = {}

    def long_poll() -> None:
        t0 = time.monotonic()
        response = http.get(path, params={"afterVersion": version, "waitMs": 8000})
        answered.update(seconds=time.monotonic() - t0, status=response.status_code, view=response.json())

    poller = threading.Thread(target=long_poll)
    poller.start()
    time.sleep(0.3)  # the poll is waiting on the server
    client.propose_step(lease, "cache.warm", {"name": "lp-2"})
    poller.join(10)
    assert answered["status"] == 200
    assert int(answered["view"]["version"]) > version
    assert answered["seconds"] < 3.0, f"the long-poll saw the change after {answered['seconds']:.2f}s"

    # Bounded like every number: a wait past 30 s or a negative version is a 422 problem.
    for params in ({"afterVersion": version, "waitMs": 30_001}, {"afterVersion": -1}, {"afterVersion": "x"}):
        refused = http.get(path, params=params)
        assert refused.status_code == 422, (params, refused.text)
        assert refused.headers["content-type"].startswith("application/problem+json")
