"""The effect gateway's lock on real processes (LEASE-1, LEASE-3): no key, no effect; another
principal's key, no effect; and in neither case is anything recorded or sent.

Before, with TENURE_API_KEYS set, `POST /effects` with no Authorization header or with another
principal's key was accepted and the credit landed at the ledger: knowing a run id, an attempt
id and an epoch was enough to act under someone else's lease. The ledger (which is not Tenure)
and runs.events are read directly, so "nothing recorded" is not the gateway's own word.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.common.contracts import EffectIntentRecorded
from services.common.topics import RUNS_EVENTS
from tests.support.system import decode_all, read_topic
from tests.support.tenure import TenureSystem, claim, problem_type, submit

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

KEYS = "runkey=svc-a:submitter,otherkey=svc-b:submitter,sagakey=tenure-saga:service,opkey=olga:operator"


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenureSystem]:
    s = TenureSystem(
        tenure_topics,
        tmp_path_factory.mktemp("gateway-auth"),
        gateway=True,
        TENURE_API_KEYS=KEYS,
        TENURE_SERVICE_KEY="sagakey",
    ).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def lease(system: TenureSystem) -> dict[str, Any]:
    """A run svc-a submitted and claimed: svc-a holds its lease."""
    with system.client("runkey") as client:
        run_id = submit(client, f"gw-auth-{uuid.uuid4()}")["runId"]
        granted = claim(client, run_id, runner="svc-a-runner", lease_seconds=120, heartbeat_seconds=30)
        assert granted.status_code == 201, granted.text
        grant: dict[str, Any] = granted.json()
    return {"runId": run_id, "attemptId": grant["attemptId"], "epoch": grant["epoch"]}


def send(system: TenureSystem, lease: dict[str, Any], key: str, api_key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.post(
        f"{system.gateway_url}/effects",
        headers=headers,
        json={
            **lease,
            "idempotencyKey": key,
            "tool": "ledger",
            "operation": "credit",
            "payload": {"account": f"acct-{lease['runId']}", "amount": 5},
        },
        timeout=30,
    )


def at_ledger(system: TenureSystem, key: str) -> int:
    return httpx.get(f"{system.ledger_url}/effects/{key}", timeout=10).status_code


def intents(system: TenureSystem, run_id: str) -> set[str]:
    records = read_topic(system.bootstrap, RUNS_EVENTS.name, RUNS_EVENTS.partitions)
    return {
        e.idempotency_key
        for e in decode_all(records)
        if isinstance(e, EffectIntentRecorded) and e.run_id == run_id
    }


def test_no_key_is_401_and_another_principals_key_is_403_and_nothing_lands_lease_1_lease_3(
    system: TenureSystem, lease: dict[str, Any]
) -> None:
    tag = uuid.uuid4().hex[:8]
    anonymous = send(system, lease, f"anon-{tag}", None)
    assert anonymous.status_code == 401, anonymous.text
    assert problem_type(anonymous) == "unauthenticated"
    assert anonymous.headers["www-authenticate"] == "Bearer"
    unknown = send(system, lease, f"unknown-{tag}", "no-such-key")
    assert unknown.status_code == 401 and problem_type(unknown) == "unauthenticated"
    usurper = send(system, lease, f"svc-b-{tag}", "otherkey")
    assert usurper.status_code == 403, usurper.text
    assert problem_type(usurper) == "not-lease-holder"
    operator = send(system, lease, f"olga-{tag}", "opkey")
    assert operator.status_code == 403 and problem_type(operator) == "not-lease-holder"

    # The holder's own effect comes after the refused ones: had any of them recorded an intent,
    # it would be on runs.events before this one.
    mine = send(system, lease, f"svc-a-{tag}", "runkey")
    assert mine.status_code == 200, mine.text
    assert mine.json()["outcome"] == "committed"
    assert at_ledger(system, f"svc-a-{tag}") == 200
    refused = {f"anon-{tag}", f"unknown-{tag}", f"svc-b-{tag}", f"olga-{tag}"}
    for key in refused:
        assert at_ledger(system, key) == 404, f"{key} reached the ledger"
    recorded = intents(system, lease["runId"])
    assert f"svc-a-{tag}" in recorded
    assert not recorded & refused, f"a refused effect was recorded: {recorded & refused}"


def test_the_service_key_acts_for_a_trajectory_under_the_holders_lease_lease_1(
    system: TenureSystem, lease: dict[str, Any]
) -> None:
    key = f"saga-{uuid.uuid4().hex[:8]}"
    answer = send(system, lease, key, "sagakey")
    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "committed"
    assert at_ledger(system, key) == 200


def test_verify_and_reads_need_a_key_and_health_says_it_is_not_development_mode(
    system: TenureSystem, lease: dict[str, Any]
) -> None:
    body = {"runId": lease["runId"], "tool": "ledger", "verifier": "balance", "payload": {}}
    verify = httpx.post(f"{system.gateway_url}/verify", json=body, timeout=10)
    assert verify.status_code == 401 and problem_type(verify) == "unauthenticated"
    other = httpx.post(
        f"{system.gateway_url}/verify", json=body, headers={"Authorization": "Bearer otherkey"}, timeout=10
    )
    assert other.status_code == 403 and problem_type(other) == "not-lease-holder"
    fencing = f"{system.gateway_url}/runs/{lease['runId']}/fencing"
    assert httpx.get(fencing, timeout=10).status_code == 401
    read = httpx.get(fencing, headers={"Authorization": "Bearer otherkey"}, timeout=10)
    assert read.status_code == 200 and read.json()["epoch"] == lease["epoch"]
    health = httpx.get(f"{system.gateway_url}/healthz", timeout=10)
    assert health.status_code == 200 and health.json()["developmentMode"] is False
    ready = httpx.get(f"{system.gateway_url}/readyz", timeout=10)
    assert ready.status_code == 200, ready.text
    assert all(check["ok"] for check in ready.json()["checks"].values())


def test_hostile_input_at_the_gateway_is_a_4xx_problem_never_a_500(
    system: TenureSystem, lease: dict[str, Any]
) -> None:
    for overrides in ({"epoch": 2**63}, {"epoch": "5"}, {"epoch": True}, {"runId": "att_zzzz_1"}):
        response = httpx.post(
            f"{system.gateway_url}/effects",
            headers={"Authorization": "Bearer runkey"},
            json={**lease, "idempotencyKey": "hostile", "tool": "ledger", "operation": "credit", **overrides},
            timeout=10,
        )
        assert response.status_code == 422, (overrides, response.text)
        assert problem_type(response) == "validation-failed"
