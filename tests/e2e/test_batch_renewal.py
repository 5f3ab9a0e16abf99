"""POST /leases:renew on the real broker and processes (issue 16; EXE-4, LEASE-3, LEASE-5):
50 leases renewed in one request, one of them with an epoch that was never issued, answered
each on its own; then the same through the runner SDK's `renew_leases`."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import pytest

from services.runner_sdk import Lease, LeaseConflict, TenureClient
from tests.support.tenure import TenureSystem, submit

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

LEASES = 50


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenureSystem]:
    s = TenureSystem(tenure_topics, tmp_path_factory.mktemp("batch")).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def leases(system: TenureSystem) -> list[Lease]:
    with system.client() as http, TenureClient(system.base, system.gateway_url) as sdk:
        run_ids = [submit(http, key=f"batch-{uuid.uuid4()}-{i}")["runId"] for i in range(LEASES)]
        return [sdk.claim(run_id, "host-1", [], lease_seconds=60, heartbeat_seconds=20) for run_id in run_ids]


def test_fifty_leases_renewed_in_one_request_one_refused_on_its_own_LEASE_3_LEASE_5(
    system: TenureSystem, leases: list[Lease]
) -> None:
    wrong = 17
    items = [{"attemptId": x.attempt_id, "leaseEpoch": x.epoch, "sequence": 1} for x in leases]
    items[wrong]["leaseEpoch"] = leases[wrong].epoch + 5
    with system.client() as http:
        answer = http.post("/leases:renew", json={"renewals": items})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert (body["accepted"], body["refused"], body["pending"]) == (LEASES - 1, 1, 0), body
        results = body["results"]
        assert [r["attemptId"] for r in results] == [x.attempt_id for x in leases]
        refused = results[wrong]
        assert refused["status"] == "refused"
        assert refused["problem"]["code"] == "UNKNOWN_ATTEMPT" and refused["problem"]["status"] == 409
        for i, (r, lease) in enumerate(zip(results, leases, strict=True)):
            if i != wrong:
                assert r["status"] == "accepted" and r["expiresAt"] >= lease.expires_at, r
        # The coordinator recorded each renewal: the lease record shows the new expiry.
        record = http.get(f"/runs/{leases[0].run_id}/lease").json()
        assert record["lease"]["expiresAt"] == results[0]["expiresAt"]

    # The same through the SDK: one result per lease, in order; the refused one a LeaseConflict.
    renewals = [(x, 2) for x in leases]
    renewals[wrong] = (dataclasses.replace(leases[wrong], epoch=leases[wrong].epoch + 5), 2)
    with TenureClient(system.base, system.gateway_url) as sdk:
        outcome = sdk.renew_leases(renewals)
        assert [r.attempt_id for r in outcome] == [x.attempt_id for x in leases]
        assert [r.ok for r in outcome].count(True) == LEASES - 1 and not outcome[wrong].ok
        assert isinstance(outcome[wrong].error, LeaseConflict)
        assert all(
            r.answer is not None and r.answer.sequence == 2 for i, r in enumerate(outcome) if i != wrong
        )
        replay = sdk.renew_leases(renewals[:3])
        assert [r.status for r in replay] == ["replayed"] * 3, "a retried batch changes nothing"
