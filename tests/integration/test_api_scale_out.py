"""Several command API instances, each with its own projection, give the same answers (issue 16).

Real processes on the real broker: the lease coordinator, the saga orchestrator (with the
simulated environment and the effect gateway it needs) and, for the first test, the projector.
A client alternates between two API instances, writing on one and reading on the other, and
always sees its own writes: run views, leases and trajectory views (read-your-writes across
instances, EXE-4 / LEASE-2 / SAGA-1 views). Neither API has the projector's store open: each
folds the logs into `<state_dir>/api-<instance_id>/views` itself. The second test starts an API
with an empty state folder and no projector at all and checks it serves the same views once
ready, and again after a restart from its own checkpoint. The third: a keyed claim-next repeat
that reaches the other instance answers the same grant (LEASE-1, LEASE-5).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.runner_sdk import Lease, TenureClient, TrajectoryClient
from tests.support.api_instances import ApiInstance, open_paths_of, wait_until_ready
from tests.support.saga_system import OPERATOR_KEY, RUNNER_KEY, SagaSystem
from tests.support.system import ServiceProcess, service_env
from tests.support.tenure import free_port, submit

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def two_apis(
    tenure_topics: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SagaSystem, ApiInstance]]:
    tmp = tmp_path_factory.mktemp("two-apis")
    system = SagaSystem(tenure_topics, tmp).start()
    api_a = system.services[2]
    second = ApiInstance(api_a.env, tmp, "b").start()
    try:
        wait_until_ready(system.base, api_a)
        wait_until_ready(second.base, second.process)
        yield system, second
    finally:
        second.stop()
        system.stop()


def _listed(client: httpx.Client, status: str) -> set[str]:
    found: set[str] = set()
    params: dict[str, Any] = {"status": status, "limit": 200}
    while True:
        page = _ok(client.get("/runs", params=params))
        found |= {item["runId"] for item in page["items"]}
        if not page.get("nextCursor"):
            return found
        params["cursor"] = page["nextCursor"]


def _ok(response: httpx.Response, *codes: int) -> dict[str, Any]:
    assert response.status_code in (codes or (200,)), response.text
    body: dict[str, Any] = response.json()
    return body


def test_a_client_alternating_between_two_api_instances_always_sees_its_own_writes(
    two_apis: tuple[SagaSystem, ApiInstance],
) -> None:
    system, api_b = two_apis
    with (
        httpx.Client(
            base_url=system.base, timeout=30, headers={"Authorization": f"Bearer {RUNNER_KEY}"}
        ) as a,
        api_b.client(RUNNER_KEY) as b,
        TenureClient(api_b.base, system.gateway_url, api_key=RUNNER_KEY) as runs_b,
        TrajectoryClient(system.base, api_key=RUNNER_KEY) as trajectories_a,
        TrajectoryClient(api_b.base, api_key=RUNNER_KEY) as trajectories_b,
    ):
        for round_ in range(3):
            # submit on A, read on B
            run = submit(a, f"alternate-{round_}-{uuid.uuid4()}")
            run_id = run["runId"]
            seen = _ok(b.get(f"/runs/{run_id}"))
            assert seen["version"] >= run["version"] and seen["status"] == "queued"
            # claim on B, read the run and its lease on A
            lease: Lease = runs_b.claim(run_id, "runner-1", [], lease_seconds=120, heartbeat_seconds=60)
            on_a = _ok(a.get(f"/runs/{run_id}"))
            assert on_a["lease"]["attemptId"] == lease.attempt_id, on_a
            assert _ok(a.get(f"/runs/{run_id}/lease"))["lease"]["attemptId"] == lease.attempt_id
            # renew on A, read the lease on B: the renewal shows
            renew = {"leaseEpoch": lease.epoch, "sequence": 1}
            beat = _ok(a.post(f"/attempts/{lease.attempt_id}/heartbeat", json=renew))
            on_b = _ok(b.get(f"/runs/{run_id}/lease"))["lease"]
            assert on_b["attemptId"] == lease.attempt_id and on_b["expiresAt"] == beat["expiresAt"], on_b
            # the next renewal stays off runs.events (issue 16): B's lease record shows it (LEASE-2)
            again = _ok(a.post(f"/attempts/{lease.attempt_id}/heartbeat", json={**renew, "sequence": 2}))
            on_b = _ok(b.get(f"/runs/{run_id}/lease"))["lease"]
            assert on_b["expiresAt"] == again["expiresAt"], on_b
            assert [r["sequence"] for r in on_b["renewals"]] == [1, 2], on_b
            # open the trajectory on B, read it on A; propose a step on A, read it on B
            started = trajectories_b.start_trajectory(lease)
            assert _ok(a.get(f"/runs/{run_id}/trajectory"))["version"] >= started["version"]
            step = trajectories_a.propose_step(lease, "cache.warm", {"name": f"r{round_}"})
            view_b = _ok(b.get(f"/runs/{run_id}/trajectory"))
            assert [s["index"] for s in view_b["steps"]] == [step.step_index], view_b
            # the listing on B (newest last) shows the run just written through A
            assert run_id in _listed(b, "running"), f"{run_id} not listed as running on B"
            # and both instances answer the same: the step's effects may still be adding events to
            # the run (the gateway records them), so B, read after A, is at A's version or past it,
            # and at the same version the two views are identical.
            first, then = _ok(a.get(f"/runs/{run_id}")), _ok(b.get(f"/runs/{run_id}"))
            assert then["version"] >= first["version"], (first, then)
            if then["version"] == first["version"]:
                assert then == first
        # What the barrier costs a read (printed for docs/architecture.md, not asserted).
        took = []
        for _ in range(40):
            began = time.perf_counter()
            _ok(b.get(f"/runs/{run_id}"))
            took.append(time.perf_counter() - began)
        took.sort()
        print(f"GET /runs/{{id}} on B: median {took[20] * 1000:.1f} ms, max {took[-1] * 1000:.1f} ms")

    for api in (system.services[2], api_b.process):
        opened = open_paths_of(api)
        foreign = [p for p in opened if "/projections/run_views" in p]
        assert not foreign, f"{api.name} has the projector's store open: {foreign}"
    assert (api_b.views_path / "CURRENT").exists()
    assert (Path(api_b.env["TENURE_STATE_DIR"]) / "api-0" / "views" / "CURRENT").exists()


def test_a_keyed_claim_next_repeat_on_the_other_instance_answers_the_same_grant_LEASE_1_LEASE_5(
    two_apis: tuple[SagaSystem, ApiInstance],
) -> None:
    """A runner whose 201 from A was lost sends again and reaches B: B finds the grant in the log
    (after its read barrier) and answers it, claiming nothing more; waitedMs is 0 there (A's wait
    is unknown to B, and 0 can only shorten the lease the runner counts, LEASE-4). Another
    principal's same key is not that grant."""
    system, api_b = two_apis
    queue = f"anywhere-{uuid.uuid4().hex[:12]}"
    with (
        httpx.Client(
            base_url=system.base, timeout=30, headers={"Authorization": f"Bearer {RUNNER_KEY}"}
        ) as a,
        api_b.client(RUNNER_KEY) as b,
        api_b.client(OPERATOR_KEY) as b_operator,
    ):
        runs = [
            _ok(
                a.post(
                    "/runs",
                    headers={"Idempotency-Key": f"{queue}-{i}"},
                    json={"tenant": "acme", "executionSpec": {"queue": queue}, "timeoutSeconds": 600},
                ),
                201,
            )["runId"]
            for i in range(2)
        ]
        claim = {"runnerId": "runner-any", "leaseSeconds": 120, "heartbeatSeconds": 60}
        keyed = {"Idempotency-Key": f"{queue}-lost-201"}
        first = _ok(a.post(f"/queues/{queue}/claim", headers=keyed, json=claim), 201)
        again = _ok(b.post(f"/queues/{queue}/claim", headers=keyed, json=claim), 201)
        assert (again["runId"], again["attemptId"], again["epoch"]) == (
            first["runId"],
            first["attemptId"],
            first["epoch"],
        )
        assert first["runId"] == runs[0] and again["waitedMs"] == 0
        assert {k: v for k, v in again.items() if k != "waitedMs"} == {
            k: v for k, v in first.items() if k != "waitedMs"
        }
        # No second run was claimed: the other one is still queued, and goes to another caller.
        assert _ok(b.get(f"/runs/{runs[1]}"))["status"] == "queued"
        theirs = _ok(b_operator.post(f"/queues/{queue}/claim", headers=keyed, json=claim), 201)
        assert theirs["runId"] == runs[1]
        assert (
            b.post(
                f"/queues/{queue}/claim", headers={"Idempotency-Key": f"{queue}-new"}, json=claim
            ).status_code
            == 204
        )


def test_an_api_with_an_empty_state_folder_and_no_projector_serves_the_views_once_caught_up(
    tenure_topics: str, tmp_path: Path
) -> None:
    env = service_env(
        tenure_topics,
        tmp_path / "state",
        TENURE_API_PORT=str(free_port()),
        TENURE_DECISION_TIMEOUT_S="10",
        TENURE_COORDINATOR_HEALTH_PORT=str(free_port()),
    )
    coordinator = ServiceProcess("lease-coordinator", "services.lease_coordinator", env, tmp_path)
    writer = ApiInstance(env, tmp_path, "writer")
    fresh = ApiInstance(env, tmp_path, "fresh")
    try:
        coordinator.start()
        writer.start()
        wait_until_ready(writer.base, writer.process)
        written: dict[str, dict[str, Any]] = {}
        with writer.client() as w:
            for i in range(4):
                run = submit(w, f"fresh-{i}-{uuid.uuid4()}")
                if i % 2:
                    claimed = w.post(
                        f"/runs/{run['runId']}/attempts",
                        json={"runnerId": "r", "leaseSeconds": 120, "heartbeatSeconds": 60},
                    )
                    _ok(claimed, 201)
                written[run["runId"]] = _ok(w.get(f"/runs/{run['runId']}"))
        assert not (fresh.views_path / "CURRENT").exists()  # empty: nothing of its own yet
        began = time.monotonic()
        fresh.start()
        body = wait_until_ready(fresh.base, fresh.process)
        first_catch_up_s = time.monotonic() - began
        assert body["checks"]["views"]["ready"] is True
        with fresh.client() as f:
            for run_id, view in written.items():
                assert _ok(f.get(f"/runs/{run_id}")) == view
        # A restart resumes from its own checkpoint: only the tail is folded again.
        fresh.process.stop()
        began = time.monotonic()
        fresh.start()
        wait_until_ready(fresh.base, fresh.process)
        restart_s = time.monotonic() - began
        with fresh.client() as f, writer.client() as w:
            for run_id, view in written.items():
                assert _ok(f.get(f"/runs/{run_id}")) == _ok(w.get(f"/runs/{run_id}")) == view
        foreign = [p for p in open_paths_of(fresh.process) if "/projections/" in p]
        assert not foreign
        print(f"empty-folder API ready in {first_catch_up_s:.2f}s; after a restart in {restart_s:.2f}s")
    finally:
        fresh.stop()
        writer.stop()
        coordinator.stop()
