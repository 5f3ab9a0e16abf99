"""The lease protocol end to end: real processes, real broker, driven over HTTP like a runner."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.system import wait_until
from tests.support.tenure import TenureSystem, claim, heartbeat, problem_type, submit

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

OPERATOR_KEY = "op-key"
RUNNER_KEY = "runner-key"


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenureSystem]:
    s = TenureSystem(
        tenure_topics,
        tmp_path_factory.mktemp("leases"),
        TENURE_API_KEYS=f"{OPERATOR_KEY}=olga:operator,{RUNNER_KEY}=rita:submitter",
    ).start()
    yield s
    s.stop()


@pytest.fixture
def client(system: TenureSystem) -> Iterator[httpx.Client]:
    with system.client(RUNNER_KEY) as c:
        yield c


def _view(client: httpx.Client, run_id: str) -> dict[str, Any]:
    body: dict[str, Any] = client.get(f"/runs/{run_id}").json()
    return body


def test_claim_renew_report_with_fencing_answers_EXE_4(client: httpx.Client) -> None:
    run = submit(client, f"lease-{uuid.uuid4()}")
    granted = claim(client, run["runId"], lease_seconds=30, heartbeat_seconds=5)
    assert granted.status_code == 201, granted.text
    grant = granted.json()
    assert grant["epoch"] == 1 and grant["attemptNumber"] == 1
    assert grant["expiresAt"] - grant["serverTime"] == 30_000
    assert grant["heartbeatIntervalSeconds"] == 5
    assert grant["assignment"]["specDigest"] == run["specDigest"]

    first = heartbeat(client, grant, 1)
    assert first.status_code == 200, first.text
    assert first.json()["expiresAt"] >= grant["expiresAt"]
    again = heartbeat(client, grant, 1)
    assert again.status_code == 200 and again.json()["replayed"] is True
    assert heartbeat(client, grant, 2).status_code == 200
    assert problem_type(heartbeat(client, grant, 1)) == "sequence-not-increasing"
    assert problem_type(heartbeat(client, grant, 3, epoch=2)) == "unknown-attempt"
    assert problem_type(
        client.post("/attempts/not-an-attempt/heartbeat", json={"leaseEpoch": 1, "sequence": 9})
    ) == ("unknown-attempt")
    view = _view(client, run["runId"])
    assert view["status"] == "running"
    assert [r["sequence"] for r in view["lease"]["renewals"]] == [1, 2]

    done = client.post(
        f"/attempts/{grant['attemptId']}/report",
        json={"leaseEpoch": 1, "sequence": 3, "outcome": "succeeded", "manifest": []},
    )
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "succeeded"
    assert done.json()["lease"]["certainty"] == "released"
    assert problem_type(heartbeat(client, grant, 4)) == "lease-released"

    record = client.get(f"/runs/{run['runId']}/lease").json()["lease"]
    for field in (
        "leaseId",
        "workId",
        "holder",
        "issuedAt",
        "renewals",
        "expiryRule",
        "certainty",
        "takeoverReason",
        "epoch",
        "effects",
    ):
        assert field in record, f"LEASE-2: the lease record lacks {field}"


def test_many_runners_racing_for_one_run_get_exactly_one_lease_LEASE_3(
    client: httpx.Client, system: TenureSystem
) -> None:
    run = submit(client, f"race-{uuid.uuid4()}")
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def race(i: int) -> None:
        with system.client(RUNNER_KEY) as c:
            response = claim(c, run["runId"], runner=f"runner-{i}", lease_seconds=30, heartbeat_seconds=5)
        with lock:
            answers.append(response)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    granted = [a for a in answers if a.status_code == 201]
    assert len(answers) == 12 and len(granted) == 1, [a.status_code for a in answers]
    assert all(problem_type(a) == "run-not-claimable" for a in answers if a.status_code != 201)
    view = _view(client, run["runId"])
    assert [a["holder"] for a in view["attempts"]] == [granted[0].json()["holder"]]


def test_an_expired_lease_interrupts_and_a_retry_safe_run_is_claimed_again_with_a_higher_epoch_EXE_5(
    client: httpx.Client,
) -> None:
    run = submit(client, f"expire-{uuid.uuid4()}", retry_safe=True)
    grant = claim(client, run["runId"], lease_seconds=2, heartbeat_seconds=1).json()
    assert heartbeat(client, grant, 1).status_code == 200

    view = wait_until(
        lambda: (v := _view(client, run["runId"]))["status"] == "queued" and v["attempts"] and v,
        20,
        "the requeue",
    )
    expired = view["leaseHistory"][-1] if view["lease"] is None else view["lease"]
    assert expired["certainty"] == "expired"
    lag_ms = expired["endedAt"] - expired["expiresAt"]
    assert 0 <= lag_ms < 1000, f"expiry recorded {lag_ms} ms after expiresAt"
    types = [h["type"] for h in view["history"]]
    assert types[-2:] == ["LeaseExpired", "RunRequeued"]
    assert problem_type(heartbeat(client, grant, 2)) == "lease-expired"

    second = claim(client, run["runId"], runner="runner-b", lease_seconds=30, heartbeat_seconds=5)
    assert second.status_code == 201, second.text
    assert second.json()["epoch"] == 2 and second.json()["attemptNumber"] == 2
    assert problem_type(heartbeat(client, grant, 3)) == "stale-epoch"


def test_a_run_that_is_not_retry_safe_stays_interrupted_EXE_5(client: httpx.Client) -> None:
    run = submit(client, f"no-retry-{uuid.uuid4()}", retry_safe=False)
    assert claim(client, run["runId"], lease_seconds=2, heartbeat_seconds=1).status_code == 201
    view = wait_until(
        lambda: (v := _view(client, run["runId"]))["status"] == "interrupted" and v, 20, "expiry"
    )
    assert "LEASE_EXPIRED" in view["statusReason"]
    time.sleep(0.5)
    assert _view(client, run["runId"])["status"] == "interrupted"
    assert problem_type(claim(client, run["runId"], runner="runner-b")) == "run-not-claimable"


def test_operator_takeover_records_reason_and_evidence_and_needs_the_operator_role_LEASE_6_LEASE_7(
    client: httpx.Client, system: TenureSystem
) -> None:
    run = submit(client, f"takeover-{uuid.uuid4()}")
    grant = claim(client, run["runId"], lease_seconds=30, heartbeat_seconds=5).json()
    assert heartbeat(client, grant, 1).status_code == 200
    body = {"reason": "runner wedged on a prompt loop", "newHolder": "olga", "holderKind": "human"}

    refused = client.post(f"/runs/{run['runId']}/lease/takeover", json=body)
    assert refused.status_code == 403 and problem_type(refused) == "forbidden"
    with system.client(OPERATOR_KEY) as operator:
        assert (
            operator.post(f"/runs/{run['runId']}/lease/takeover", json={**body, "reason": ""}).status_code
            == 422
        )
        taken = operator.post(f"/runs/{run['runId']}/lease/takeover", json=body)
    assert taken.status_code == 200, taken.text
    assert taken.json()["epoch"] == 2 and taken.json()["holder"] == "olga"

    record = client.get(f"/runs/{run['runId']}/lease").json()
    assert record["lease"]["takeoverReason"] == body["reason"]
    evidence = record["lease"]["takeoverEvidence"]
    assert evidence["previousHolder"] == "runner-a" and evidence["lastSequence"] == 1
    assert evidence["lastRenewalAt"] > 0 and evidence["by"] == "olga"
    assert record["previousLeases"][-1]["certainty"] == "revoked"
    history = _view(client, run["runId"])["history"]
    assert history[-1]["type"] == "LeaseTakenOver" and history[-1]["actor"] == "olga"
    assert problem_type(heartbeat(client, grant, 2)) == "stale-epoch"
    stale_report = client.post(
        f"/attempts/{grant['attemptId']}/report",
        json={"leaseEpoch": 1, "sequence": 5, "outcome": "succeeded"},
    )
    assert problem_type(stale_report) == "stale-epoch"
    assert _view(client, run["runId"])["status"] == "running", "a stale report changes nothing"


def test_a_coordinator_sigkill_mid_lease_neither_extends_nor_drops_the_lease_LEASE_5(
    client: httpx.Client, system: TenureSystem
) -> None:
    run = submit(client, f"restart-{uuid.uuid4()}")
    # Long enough for a restart on a loaded 2-core machine (a restart that takes longer than
    # the lease lets it expire, correctly, and then no renewal can succeed).
    grant = claim(client, run["runId"], lease_seconds=8, heartbeat_seconds=2).json()
    assert heartbeat(client, grant, 1).status_code == 200
    before = client.get(f"/runs/{run['runId']}/lease").json()["lease"]

    system.processor.sigkill()
    system.processor.start()
    renewed = wait_until(
        lambda: (r := heartbeat(client, grant, 2)).status_code == 200 and r, 30, "a renewal after the restart"
    )
    assert renewed.json()["epoch"] == 1
    after = client.get(f"/runs/{run['runId']}/lease").json()["lease"]
    assert after["epoch"] == before["epoch"] and after["leaseId"] == before["leaseId"]
    assert after["issuedAt"] == before["issuedAt"]
    # No more heartbeats: the restarted coordinator's timer must still expire the lease.
    view = wait_until(
        lambda: (v := _view(client, run["runId"]))["status"] == "interrupted" and v, 30, "expiry"
    )
    lease = view["lease"]
    assert lease["certainty"] == "expired" and lease["endedAt"] >= lease["expiresAt"]


def test_only_the_lease_holder_may_renew_or_report_LEASE_1(
    client: httpx.Client, system: TenureSystem
) -> None:
    run = submit(client, f"holder-{uuid.uuid4()}")
    grant = claim(client, run["runId"], lease_seconds=30, heartbeat_seconds=5).json()
    with system.client(OPERATOR_KEY) as other:
        stolen = heartbeat(other, grant, 1)
        assert stolen.status_code == 403 and problem_type(stolen) == "not-lease-holder", stolen.text
        report = other.post(
            f"/attempts/{grant['attemptId']}/report",
            json={"leaseEpoch": 1, "sequence": 2, "outcome": "failed"},
        )
        assert problem_type(report) == "not-lease-holder"
    assert heartbeat(client, grant, 1).status_code == 200, "the holder itself is unaffected"
    assert _view(client, run["runId"])["status"] == "running"
