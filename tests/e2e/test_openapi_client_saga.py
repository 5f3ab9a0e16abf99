"""The client generated from GET /openapi.json drives a saga and its watchdog (issue 17).

In a module of its own, apart from tests/e2e/test_openapi_client.py: that module's system keeps
a lease coordinator running for the whole module, and this test's SagaSystem starts another one
on the same broker with the same group instance id and transactional id. Two live processes with
one identity take the group membership and the transactional id from each other (a
misconfiguration no deployment has); with the generation fence on, the claim right after a
submit was once decided by the wrong one (RUN_NOT_FOUND). Here the module fixture is gone first.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.openapi_client import OpenApiClient
from tests.support.saga_system import OPERATOR_KEY, RUNNER_KEY, SagaSystem
from tests.support.system import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def _saga_clients(system: SagaSystem) -> tuple[OpenApiClient, OpenApiClient]:
    document = httpx.get(f"{system.base}/openapi.json", timeout=30).json()
    return OpenApiClient(system.client(RUNNER_KEY), document), OpenApiClient(
        system.client(OPERATOR_KEY), document
    )


@pytest.fixture
def saga_system(tenure_topics: str, tmp_path: Path) -> Iterator[SagaSystem]:
    s = SagaSystem(tenure_topics, tmp_path, watchdog=True).start()
    try:
        yield s
    finally:
        s.stop()


def test_the_generated_client_drives_a_saga_and_its_watchdog(saga_system: SagaSystem) -> None:
    """The README's saga section through the generated client: a trajectory started, two steps
    proposed (202 tickets) and committed by the real orchestrator, gateway and tools, observations
    for the watchdog, the run's watchdog and incidents read, the trajectory finished and the run
    reported (SAGA-1)."""
    runner, operator = _saga_clients(saga_system)
    tag = uuid.uuid4().hex[:8]
    spec = {"tenant": "acme", "executionSpec": {"agent": "deployer", "input": tag}, "timeoutSeconds": 900}
    run_id = runner.submit_run(idempotency_key=f"saga-{tag}", body=spec).body["runId"]
    grant = runner.claim(
        run_id=run_id, body={"runnerId": "runner-1", "leaseSeconds": 120, "heartbeatSeconds": 60}
    )
    assert grant.status == 201, (grant.status, grant.body)
    lease = {"attemptId": grant.body["attemptId"], "leaseEpoch": grant.body["epoch"]}
    started = runner.start_trajectory(
        run_id=run_id, body={**lease, "budget": {"tokens": 50_000, "steps": 10}}
    )
    assert started.status == 201 and started.body["status"] == "forward"

    for index, (tool, params) in enumerate(
        [("vm.provision", {"name": f"web-{tag}"}), ("ip.reserve", {"region": "eu-west"})]
    ):
        ticket = runner.propose_step(
            run_id=run_id, idempotency_key=f"{tag}-{index}", body={**lease, "tool": tool, "params": params}
        )
        assert ticket.status == 202 and ticket.body["stepIndex"] == index, ticket.body

        def committed(i: int = index) -> bool:
            steps = runner.get_trajectory(run_id=run_id).body["steps"]
            return len(steps) > i and steps[i]["status"] == "committed"

        wait_until(committed, 60, f"step {index} to commit")
        observed = runner.observe(
            run_id=run_id,
            body={**lease, "stepSeq": index + 1, "tool": tool, "arguments": params, "summary": "ok"},
        )
        assert observed.status == 202 and observed.body["status"] == "accepted"

    watchdog = wait_until(
        lambda: runner.get_watchdog(run_id=run_id).body.get("observations"), 60, "the watchdog"
    )
    assert watchdog
    assert operator.list_incidents().status == 200
    done = runner.finish_trajectory(run_id=run_id, body=lease)
    assert done.status == 200 and done.body["status"] == "completed", done.body
    report = {"leaseEpoch": lease["leaseEpoch"], "sequence": 1, "outcome": "succeeded", "manifest": []}
    assert runner.report(attempt_id=lease["attemptId"], body=report).body["status"] == "succeeded"
    assert runner.get_run(run_id=run_id).body["status"] == "succeeded"
