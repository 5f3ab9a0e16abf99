"""EXE-2 admission on real processes: a tenant's queue places and active slots are reserved
atomically with the run and released with it; over the limit nothing is recorded."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.common.ids import run_id_for
from tests.support.tenure import TenureSystem, claim, problem_type

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


# Function-scoped: the block-policy test below starts a system of its own with API keys, and two
# coordinators of one instance id on one broker fence each other (issue 16's generation fence
# refuses the older member's commits), so this one must be stopped before that one starts.
@pytest.fixture
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenureSystem]:
    s = TenureSystem(
        tenure_topics,
        tmp_path_factory.mktemp("admission"),
        TENURE_MAX_QUEUED_PER_TENANT="2",
        TENURE_MAX_ACTIVE_PER_TENANT="1",
        TENURE_TENANT_LIMITS="roomy=100:100",
    ).start()
    yield s
    s.stop()


def _submit(client: httpx.Client, tenant: str, key: str) -> httpx.Response:
    return client.post(
        "/runs",
        headers={"Idempotency-Key": key},
        json={"tenant": tenant, "executionSpec": {"agent": "adm"}, "timeoutSeconds": 600},
    )


def test_queue_places_and_active_slots_are_limited_per_tenant_EXE_2(system: TenureSystem) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    with system.client() as client:
        first = _submit(client, tenant, "a").json()
        second = _submit(client, tenant, "b").json()
        refused = _submit(client, tenant, "c")
        assert refused.status_code == 429 and problem_type(refused) == "admission-queue-full", refused.text
        assert client.get(f"/runs/{run_id_for(tenant, 'c')}").status_code == 404, "a refusal leaves nothing"
        assert _submit(client, "roomy", f"r-{uuid.uuid4()}").status_code == 201, "limits are per tenant"

        grant: dict[str, Any] = claim(client, first["runId"], lease_seconds=60, heartbeat_seconds=5).json()
        assert grant["epoch"] == 1
        # The claim moved `first` from a queue place to the active slot: one queue place is free.
        assert _submit(client, tenant, "c").status_code == 201
        busy = claim(client, second["runId"], runner="runner-b", lease_seconds=60, heartbeat_seconds=5)
        assert busy.status_code == 429 and problem_type(busy) == "admission-active-full", busy.text
        assert client.get(f"/runs/{second['runId']}").json()["status"] == "queued"

        done = client.post(
            f"/attempts/{grant['attemptId']}/report",
            json={"leaseEpoch": 1, "sequence": 1, "outcome": "failed", "errorCode": "E"},
        )
        assert done.json()["status"] == "failed"
        # Finalising released the active slot atomically with the run's end.
        again = claim(client, second["runId"], runner="runner-b", lease_seconds=60, heartbeat_seconds=5)
        assert again.status_code == 201, again.text


def test_assignment_rechecks_the_block_policy_for_the_submitter_EXE_2(
    tenure_topics: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A submitter of this test's own: the block policy is a compacted topic every module on the
    # broker shares, so blocking a name other modules use (or finding only this block in the
    # list) would depend on which modules ran before, on this broker, in this order.
    submitter = f"rita-{uuid.uuid4().hex[:8]}"
    system = TenureSystem(
        tenure_topics,
        tmp_path_factory.mktemp("blocks"),
        TENURE_API_KEYS=f"op-key=olga:operator,rita-key={submitter}:submitter,runner-key=robo:runner",
    ).start()
    try:
        with (
            system.client("rita-key") as rita,
            system.client("op-key") as olga,
            system.client("runner-key") as runner,
        ):
            run = _submit(rita, "acme", f"blk-{uuid.uuid4()}").json()
            block_path = f"/admin/blocks/principal/{submitter}"
            assert rita.put(block_path, json={"reason": "x"}).status_code == 403
            blocked = olga.put(block_path, json={"reason": "credentials leaked"})
            assert blocked.status_code == 200, blocked.text
            listed = [
                block
                for block in olga.get("/admin/blocks").json()["blocks"]
                if (block["subjectKind"], block["subject"]) == ("principal", submitter)
            ]
            assert [block["reason"] for block in listed] == ["credentials leaked"], listed
            time.sleep(0.5)  # the coordinator follows the policy topic too
            refused = claim(runner, run["runId"], lease_seconds=60, heartbeat_seconds=5)
            assert refused.status_code == 409 and problem_type(refused) == "principal-blocked", refused.text
            assert rita.get(f"/runs/{run['runId']}").json()["status"] == "queued", (
                "not assigned, nothing lost"
            )
            assert olga.delete(block_path).status_code == 200
            time.sleep(0.5)
            granted = claim(runner, run["runId"], lease_seconds=60, heartbeat_seconds=5)
            assert granted.status_code == 201, granted.text
    finally:
        system.stop()
