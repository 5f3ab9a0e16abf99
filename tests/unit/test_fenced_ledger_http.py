"""The fenced ledger's HTTP app, through FastAPI's TestClient: effects applied, fenced (LEASE-3) and
replayed (EXE-6), the probe after a lost acknowledgement (REC-6), problem+json for bad headers and
bodies, the fault routes and concurrent posts of one key."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.fenced_ledger.app import PROBLEM_TYPES, create_app
from services.fenced_ledger.store import LedgerStore
from tests.support.ledger import ledger_store

pytestmark = pytest.mark.timeout(30)

PROBLEM_JSON = "application/problem+json"
# A fresh ledger file per test.
store = pytest.fixture(name="store")(ledger_store)


# --------------------------------------------------------------------------- HTTP app


@pytest.fixture
def client(store: LedgerStore) -> Iterator[TestClient]:
    with TestClient(create_app(store, faults_enabled=True)) as test_client:
        yield test_client


def _post(
    client: TestClient,
    key: str,
    epoch: int,
    operation: str = "credit",
    payload: dict[str, Any] | None = None,
    work: str = "run-1",
) -> Any:
    return client.post(
        "/effects",
        headers={"Idempotency-Key": key, "X-Work-Id": work, "X-Fencing-Epoch": str(epoch)},
        json={
            "operation": operation,
            "payload": payload if payload is not None else {"account": "a", "amount": 10},
        },
    )


def _assert_problem(response: Any, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    body: dict[str, Any] = response.json()
    assert body["type"] == f"/problems/{slug}"
    assert body["status"] == status
    assert body["title"] == PROBLEM_TYPES[slug].title
    assert body["detail"]
    return body


def test_app_applies_an_effect_201(client: TestClient) -> None:
    response = _post(client, "k1", 3, payload={"account": "a", "amount": 40})
    assert response.status_code == 201
    assert response.headers["location"] == "/effects/k1"
    assert "idempotent-replay" not in response.headers
    body = response.json()
    assert body["effectId"].startswith("eff_")
    assert (body["idempotencyKey"], body["workId"], body["epoch"], body["balance"]) == ("k1", "run-1", 3, 40)
    assert client.get("/accounts/a").json() == {"account": "a", "balance": 40}


def test_app_stale_epoch_is_refused_and_nothing_changes_LEASE_3(client: TestClient) -> None:
    assert _post(client, "k1", 5, payload={"account": "a", "amount": 100}).status_code == 201
    before = client.get("/works/run-1").json()
    problem = _assert_problem(
        _post(client, "k2", 4, "debit", {"account": "a", "amount": 30}), 409, "stale-epoch"
    )
    assert (problem["highestEpoch"], problem["presentedEpoch"], problem["workId"]) == (5, 4, "run-1")
    assert client.get("/works/run-1").json() == before
    assert client.get("/accounts/a").json()["balance"] == 100
    _assert_problem(client.get("/effects/k2"), 404, "effect-not-found")


def test_app_higher_epoch_raises_the_bar_LEASE_3(client: TestClient) -> None:
    assert _post(client, "k1", 1).status_code == 201
    assert _post(client, "k2", 1).status_code == 201  # equal epoch: same holder, still allowed
    assert _post(client, "k3", 2).status_code == 201
    assert client.get("/works/run-1").json()["highestEpoch"] == 2
    problem = _assert_problem(_post(client, "k4", 1), 409, "stale-epoch")
    assert problem["highestEpoch"] == 2
    assert client.get("/accounts/a").json()["balance"] == 30


def test_app_same_key_replays_without_applying_twice_EXE_6(client: TestClient) -> None:
    first = _post(client, "k1", 1, payload={"account": "a", "amount": 25})
    again = _post(client, "k1", 1, payload={"account": "a", "amount": 25})
    assert again.status_code == 200
    assert again.headers["idempotent-replay"] == "true"
    assert again.json() == first.json()
    assert client.get("/accounts/a").json()["balance"] == 25
    assert [e["idempotencyKey"] for e in client.get("/works/run-1").json()["effects"]] == ["k1"]


def test_app_conflicting_reuse_of_a_key_is_422(client: TestClient) -> None:
    first = _post(client, "k1", 1, payload={"account": "a", "amount": 25})
    problem = _assert_problem(
        _post(client, "k1", 1, payload={"account": "a", "amount": 26}), 422, "idempotency-key-conflict"
    )
    assert problem["differences"] == ["payload"]
    assert problem["effectId"] == first.json()["effectId"]
    assert client.get("/accounts/a").json()["balance"] == 25


def test_app_probe_finds_or_does_not_find_REC_6(client: TestClient) -> None:
    _assert_problem(client.get("/effects/k1"), 404, "effect-not-found")
    created = _post(client, "k1", 2, "note", {"text": "hello"}).json()
    found = client.get("/effects/k1")
    assert found.status_code == 200
    effect = found.json()
    assert (effect["effectId"], effect["workId"], effect["epoch"], effect["operation"]) == (
        created["effectId"],
        "run-1",
        2,
        "note",
    )
    assert effect["payload"] == {"text": "hello"}
    assert effect["result"] == created


def test_app_insufficient_funds_is_409_and_balance_unchanged(client: TestClient) -> None:
    _post(client, "k1", 1, payload={"account": "a", "amount": 5})
    problem = _assert_problem(
        _post(client, "k2", 1, "debit", {"account": "a", "amount": 6}), 409, "insufficient-funds"
    )
    assert (problem["balance"], problem["amount"]) == (5, 6)
    assert client.get("/accounts/a").json()["balance"] == 5
    _assert_problem(client.get("/effects/k2"), 404, "effect-not-found")


@pytest.mark.parametrize(
    ("headers", "slug"),
    [
        ({"X-Work-Id": "r", "X-Fencing-Epoch": "1"}, "idempotency-key-required"),
        ({"Idempotency-Key": "k", "X-Fencing-Epoch": "1"}, "work-id-required"),
        ({"Idempotency-Key": "k", "X-Work-Id": "r"}, "fencing-epoch-required"),
        ({"Idempotency-Key": "k", "X-Work-Id": "r", "X-Fencing-Epoch": "one"}, "fencing-epoch-invalid"),
    ],
)
def test_app_bad_headers_are_400(client: TestClient, headers: dict[str, str], slug: str) -> None:
    _assert_problem(
        client.post("/effects", headers=headers, json={"operation": "note", "payload": {}}), 400, slug
    )


def test_app_bad_bodies_are_422(client: TestClient) -> None:
    headers = {"Idempotency-Key": "k", "X-Work-Id": "r", "X-Fencing-Epoch": "1"}
    _assert_problem(
        client.post("/effects", headers=headers, json={"operation": "steal", "payload": {}}),
        422,
        "invalid-effect",
    )
    broken = client.post(
        "/effects", headers={**headers, "Content-Type": "application/json"}, content=b"{nope"
    )
    _assert_problem(broken, 422, "invalid-request")
    _assert_problem(client.get("/effects/k"), 404, "effect-not-found")


def test_app_unknown_work_account_and_path_are_404_problems(client: TestClient) -> None:
    _assert_problem(client.get("/works/nobody"), 404, "work-not-found")
    _assert_problem(client.get("/accounts/nobody"), 404, "account-not-found")
    _assert_problem(client.get("/nowhere"), 404, "not-found")
    _assert_problem(client.delete("/effects/k"), 405, "method-not-allowed")


def test_app_serves_its_problem_types_and_health(client: TestClient) -> None:
    described = client.get("/problems/stale-epoch").json()
    assert (described["type"], described["status"]) == ("/problems/stale-epoch", 409)
    _assert_problem(client.get("/problems/made-up"), 404, "problem-type-not-found")
    assert client.get("/healthz").json() == {"status": "ok", "faultsEnabled": True}


def test_app_fault_routes_do_not_exist_unless_enabled(store: LedgerStore) -> None:
    with TestClient(create_app(store)) as plain:
        _assert_problem(plain.post("/faults", json={"delayAfterCommitMs": 10, "times": 1}), 404, "not-found")
        _assert_problem(plain.get("/faults"), 404, "not-found")
        assert plain.get("/healthz").json()["faultsEnabled"] is False


@pytest.mark.parametrize(
    "body",
    [
        {"times": 1},
        {"delayAfterCommitMs": 10},
        {"delayAfterCommitMs": -1, "times": 1},
        {"delayAfterCommitMs": 10, "times": 0},
        {"delayAfterCommitMs": 10, "failBeforeCommit": "503", "times": 1},
        {"failBeforeCommit": "500", "times": 1},
        {"failBeforeCommit": "503", "times": 1, "other": True},
        [],
    ],
)
def test_app_invalid_fault_plans_are_422(client: TestClient, body: Any) -> None:
    _assert_problem(client.post("/faults", json=body), 422, "invalid-fault")


def test_app_delay_after_commit_the_effect_exists_before_the_answer_REC_6(client: TestClient) -> None:
    armed = client.post("/faults", json={"delayAfterCommitMs": 1500, "times": 1})
    assert armed.json() == {"delayAfterCommitMs": 1500, "remaining": 1}
    answers: list[Any] = []
    caller = threading.Thread(target=lambda: answers.append(_post(client, "slow", 1)))
    started = time.monotonic()
    caller.start()
    try:
        probe_status, probe_body, caller_waiting = 404, None, False
        while time.monotonic() - started < 1.2:
            probe = client.get("/effects/slow")
            if probe.status_code == 200:
                probe_status, probe_body, caller_waiting = 200, probe.json(), caller.is_alive()
                break
            time.sleep(0.02)
    finally:
        # Join before asserting: leaving a request in flight would hang the TestClient teardown.
        caller.join(timeout=10)
    # The effect is committed and visible while its caller is still waiting: a caller that gave
    # up now would have lost only the acknowledgement, and the probe tells it not to resend.
    assert probe_status == 200
    assert caller_waiting
    assert answers[0].status_code == 201
    assert time.monotonic() - started >= 1.5
    assert probe_body is not None
    assert answers[0].json() == probe_body["result"]
    retry = _post(client, "slow", 1)
    assert (retry.status_code, retry.headers["idempotent-replay"]) == (200, "true")
    assert client.get("/accounts/a").json()["balance"] == 10
    assert client.get("/faults").json() == {"remaining": 0}


def test_app_fail_before_commit_applies_nothing(client: TestClient) -> None:
    client.post("/faults", json={"failBeforeCommit": "503", "times": 2})
    _assert_problem(_post(client, "k1", 1), 503, "injected-fault")
    _assert_problem(_post(client, "k1", 1), 503, "injected-fault")
    _assert_problem(client.get("/effects/k1"), 404, "effect-not-found")
    _assert_problem(client.get("/works/run-1"), 404, "work-not-found")
    assert _post(client, "k1", 1).status_code == 201  # the plan is used up
    assert client.get("/accounts/a").json()["balance"] == 10


def test_app_delete_faults_disarms(client: TestClient) -> None:
    client.post("/faults", json={"failBeforeCommit": 503, "times": 5})
    assert client.delete("/faults").json() == {"remaining": 0}
    assert _post(client, "k1", 1).status_code == 201


def test_app_eight_threads_posting_one_key_apply_it_once_EXE_6(client: TestClient) -> None:
    barrier = threading.Barrier(8)

    def post(_: int) -> Any:
        barrier.wait()
        return _post(client, "same", 1, payload={"account": "a", "amount": 13})

    with ThreadPoolExecutor(max_workers=8) as pool:
        responses = list(pool.map(post, range(8)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * 7 + [201]
    assert len({r.json()["effectId"] for r in responses}) == 1
    assert all(r.headers.get("idempotent-replay") == "true" for r in responses if r.status_code == 200)
    assert client.get("/accounts/a").json()["balance"] == 13
    assert len(client.get("/works/run-1").json()["effects"]) == 1
