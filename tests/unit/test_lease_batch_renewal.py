"""POST /leases:renew, the batch renewal (issue 16): the request model's bounds, and per-item
answers over the real app and the coordinator's real pure core (tests/support/api_harness.py).
Each item is fenced as a heartbeat is (LEASE-3 epoch, LEASE-5 renewal, LEASE-1 holder)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from services.command_api.lease_batch import MAX_BATCH_RENEWALS, BatchRenewalRequest
from services.common.contracts import RenewLease
from tests.support.api_harness import InMemoryTenure, api_client

pytestmark = pytest.mark.timeout(60)

KEYS = "rita-key=rita:submitter,ron-key=ron:submitter"
RITA = {"Authorization": "Bearer rita-key"}
RON = {"Authorization": "Bearer ron-key"}
LONG_MAX = 2**63 - 1


def item(attempt: str = "att_x_1", epoch: Any = 1, sequence: Any = 1) -> dict[str, Any]:
    return {"attemptId": attempt, "leaseEpoch": epoch, "sequence": sequence}


# --- the request model's bounds -------------------------------------------------------------


def test_the_model_accepts_one_to_the_maximum_items() -> None:
    assert len(BatchRenewalRequest.model_validate({"renewals": [item()]}).renewals) == 1
    most = [item(f"att_x_{i}", LONG_MAX, LONG_MAX) for i in range(MAX_BATCH_RENEWALS)]
    assert len(BatchRenewalRequest.model_validate({"renewals": most}).renewals) == MAX_BATCH_RENEWALS


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"renewals": []},
        {"renewals": [item(f"att_x_{i}") for i in range(MAX_BATCH_RENEWALS + 1)]},
        {"renewals": [item(), item()]},  # the same attempt twice
        {"renewals": [item(epoch=0)]},
        {"renewals": [item(sequence=0)]},
        {"renewals": [item(epoch=LONG_MAX + 1)]},
        {"renewals": [item(sequence=-1)]},
        {"renewals": [item(epoch="1")]},
        {"renewals": [item(epoch=True)]},
        {"renewals": [item(epoch=1.0)]},
        {"renewals": [item(attempt="")]},
        {"renewals": [item(attempt="a" * 201)]},
        {"renewals": [item(attempt="att\x00_x_1")]},
        {"renewals": [item(attempt=7)]},
        {"renewals": [{**item(), "extra": 1}]},
        {"renewals": [{"attemptId": "att_x_1", "leaseEpoch": 1}]},
        {"renewals": item()},
        {"renewals": [item()], "more": True},
    ],
    ids=lambda b: repr(b)[:60],
)
def test_the_model_refuses_everything_out_of_bounds(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        BatchRenewalRequest.model_validate(body)


# --- per-item answers over the app ----------------------------------------------------------


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[tuple[TestClient, InMemoryTenure]]:
    with api_client(tmp_path, api_keys=KEYS, decision_timeout_s=2.0) as pair:
        yield pair


def _held(client: TestClient, n: int, who: dict[str, str] = RITA) -> list[dict[str, Any]]:
    grants = []
    for i in range(n):
        run = client.post(
            "/runs",
            headers={**who, "Idempotency-Key": f"b-{who['Authorization']}-{i}"},
            json={"tenant": "acme", "executionSpec": {"i": i}, "timeoutSeconds": 600},
        ).json()
        grant = client.post(f"/runs/{run['runId']}/attempts", headers=who, json={"runnerId": "host-1"})
        assert grant.status_code == 201, grant.text
        grants.append(grant.json())
    return grants


def test_each_item_is_answered_on_its_own_in_order_LEASE_3_LEASE_5(
    api: tuple[TestClient, InMemoryTenure],
) -> None:
    client, tenure = api
    mine = _held(client, 4)
    theirs = _held(client, 1, RON)[0]
    renewals = [item(g["attemptId"], g["epoch"], 1) for g in mine]
    renewals[2]["leaseEpoch"] = mine[2]["epoch"] + 1  # an epoch never issued: fenced (LEASE-3)
    renewals.append(item(theirs["attemptId"], theirs["epoch"], 1))  # another principal's lease
    renewals.append(item("not-an-attempt", 1, 1))
    renewals.append(item("att_00000000000000000000000000000000_1", 1, 1))  # no such run
    before = len(tenure.commands_of(RenewLease))
    answer = client.post("/leases:renew", headers=RITA, json={"renewals": renewals})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    results = body["results"]
    assert [r["attemptId"] for r in results] == [r["attemptId"] for r in renewals]
    assert [r["status"] for r in results] == ["accepted", "accepted", "refused", "accepted"] + ["refused"] * 3
    assert (body["accepted"], body["refused"], body["pending"]) == (3, 4, 0)
    for r, g in zip(results[:4], mine, strict=True):
        if r["status"] == "accepted":
            assert r["expiresAt"] > r["serverTime"] and r["epoch"] == g["epoch"] and r["sequence"] == 1
            assert r["certainty"] == "active" and r["runStatus"] == "running" and r["stopRequested"] is False
    assert results[2]["problem"]["type"] == "/problems/unknown-attempt", results[2]
    assert results[2]["problem"]["code"] == "UNKNOWN_ATTEMPT" and results[2]["problem"]["status"] == 409
    assert "never issued" in results[2]["problem"]["detail"]
    assert results[4]["problem"]["type"] == "/problems/not-lease-holder"
    assert results[5]["problem"]["type"] == "/problems/unknown-attempt"
    assert results[6]["problem"]["type"] == "/problems/unknown-attempt"
    # Published: one RenewLease per item that passed the API's own checks, none for the others.
    assert len(tenure.commands_of(RenewLease)) - before == 5

    again = client.post("/leases:renew", headers=RITA, json={"renewals": renewals[:2]}).json()
    assert [r["status"] for r in again["results"]] == ["replayed", "replayed"], "a retried batch"


def test_a_batch_whose_commands_kafka_takes_none_of_is_503_with_retry_after(
    api: tuple[TestClient, InMemoryTenure],
) -> None:
    client, tenure = api
    grants = _held(client, 2)
    tenure.mode = "queue_full"
    answer = client.post(
        "/leases:renew",
        headers=RITA,
        json={"renewals": [item(g["attemptId"], g["epoch"], 1) for g in grants]},
    )
    assert answer.status_code == 503 and int(answer.headers["retry-after"]) >= 1
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.json()["type"] == "/problems/unavailable"


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b'{"renewals": []}', 422),
        (b'{"renewals": [{"attemptId": "att_x_1", "leaseEpoch": 1, "sequence": 1, "sequence": 2}]}', 400),
        (b"[1, 2", 400),
        (
            b'{"renewals": ['
            + b",".join([b'{"attemptId":"att_x_1","leaseEpoch":1,"sequence":1}'] * 40_000)
            + b"]}",
            413,
        ),
    ],
    ids=["empty", "duplicate-key", "truncated", "over-the-body-limit"],
)
def test_malformed_bodies_are_problems_and_publish_nothing(
    api: tuple[TestClient, InMemoryTenure], raw: bytes, status: int
) -> None:
    client, tenure = api
    before = len(tenure.commands)
    answer = client.post("/leases:renew", headers={**RITA, "Content-Type": "application/json"}, content=raw)
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert len(tenure.commands) == before


def test_an_unknown_caller_is_401_before_the_body_is_read(api: tuple[TestClient, InMemoryTenure]) -> None:
    client, _ = api
    answer = client.post("/leases:renew", json={"renewals": [item()]})
    assert answer.status_code == 401 and answer.headers["content-type"].startswith("application/problem+json")
