"""POST /queues/{queue}/claim, the server-side claim-next (issue 17), over the real app and the
lease coordinator's real pure core (tests/support/api_harness.py): the queue a run waits in, the
runner's capabilities, round-robin fairness across tenants, a lost race moving on to the next
candidate, 204 when nothing is claimable and the long-poll that waits for a run (LEASE-1)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.command_api.routes_queues import fair_order, queue_of, required_capabilities
from tests.support.api_harness import InMemoryTenure, api_client

pytestmark = pytest.mark.timeout(60)

KEYS = "rita-key=rita:submitter,rob-key=rob:runner,rae-key=rae:runner,val-key=val:verifier"
RITA = {"Authorization": "Bearer rita-key"}
ROB = {"Authorization": "Bearer rob-key"}
RAE = {"Authorization": "Bearer rae-key"}
VAL = {"Authorization": "Bearer val-key"}


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[tuple[TestClient, InMemoryTenure]]:
    with api_client(tmp_path, api_keys=KEYS, decision_timeout_s=3.0) as pair:
        yield pair


_submitted = iter(range(10**6))


def submit(client: TestClient, tenant: str = "acme", **spec: Any) -> str:
    answer = client.post(
        "/runs",
        headers={**RITA, "Idempotency-Key": f"q-{next(_submitted)}"},
        json={"tenant": tenant, "executionSpec": spec, "timeoutSeconds": 600},
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["runId"])


def claim_next(client: TestClient, queue: str = "default", who: dict[str, str] = ROB, **body: Any) -> Any:
    return client.post(f"/queues/{queue}/claim", headers=who, json={"runnerId": "host-1", **body})


def test_the_queue_and_capabilities_of_a_run_come_from_its_spec_or_labels() -> None:
    assert queue_of({"executionSpec": {"queue": "gpu"}, "labels": {"queue": "x"}}) == "gpu"
    assert queue_of({"executionSpec": {}, "labels": {"queue": "nightly"}}) == "nightly"
    assert queue_of({"executionSpec": {"queue": 7}, "labels": {}}) == "default"
    assert required_capabilities({"executionSpec": {"requiredCapabilities": ["a", "b"]}}) == {"a", "b"}
    assert required_capabilities({"executionSpec": {"requiredCapabilities": "a"}}) == frozenset()


def test_fair_order_rotates_tenants_oldest_first_within_each() -> None:
    def run(tenant: str, at: int) -> dict[str, Any]:
        return {"runId": f"run_{tenant}_{at}", "tenant": tenant, "submittedAt": at}

    views = [run("big", 1), run("big", 2), run("big", 3), run("small", 9), run("mid", 5)]
    order = [v["runId"] for v in fair_order(views, None)]
    assert order == ["run_big_1", "run_mid_5", "run_small_9", "run_big_2", "run_big_3"]
    after_big = [v["runId"] for v in fair_order(views, "big")]
    assert after_big[:3] == ["run_mid_5", "run_small_9", "run_big_1"]


def test_claim_next_grants_the_oldest_run_of_the_queue_LEASE_1(
    api: tuple[TestClient, InMemoryTenure],
) -> None:
    client, _ = api
    first = submit(client, queue="q1")
    submit(client, queue="other")
    second = submit(client, queue="q1")
    answer = claim_next(client, "q1", capabilities=["checkpoint-v1"])
    assert answer.status_code == 201, answer.text
    grant = answer.json()
    assert grant["runId"] == first and grant["queue"] == "q1" and grant["epoch"] >= 1
    assert grant["assignment"]["executionSpec"] == {"queue": "q1"}
    assert answer.headers["location"] == f"/runs/{first}"
    assert claim_next(client, "q1").json()["runId"] == second
    assert claim_next(client, "q1").status_code == 204
    view = client.get(f"/runs/{first}", headers=RITA).json()
    assert view["lease"]["holder"] == "host-1"


def test_a_run_is_offered_only_to_a_runner_with_its_capabilities(
    api: tuple[TestClient, InMemoryTenure],
) -> None:
    client, _ = api
    gpu = submit(client, requiredCapabilities=["gpu"])
    assert claim_next(client, capabilities=["cpu"]).status_code == 204
    assert claim_next(client, capabilities=["cpu", "gpu"]).json()["runId"] == gpu


def test_tenants_take_turns_so_a_big_backlog_cannot_starve_a_small_one(
    api: tuple[TestClient, InMemoryTenure],
) -> None:
    client, _ = api
    big = [submit(client, "big") for _ in range(4)]
    small = [submit(client, "small") for _ in range(2)]
    served = [claim_next(client).json()["runId"] for _ in range(6)]
    assert served == [big[0], small[0], big[1], small[1], big[2], big[3]]


def test_a_lost_race_moves_on_to_the_next_candidate(api: tuple[TestClient, InMemoryTenure]) -> None:
    client, _ = api
    taken, free = submit(client), submit(client)
    # Another runner claims the oldest run directly (POST /runs/{id}/attempts).
    assert client.post(f"/runs/{taken}/attempts", headers=RAE, json={"runnerId": "rival"}).status_code == 201
    assert claim_next(client).json()["runId"] == free


def test_two_runners_racing_never_get_the_same_run(api: tuple[TestClient, InMemoryTenure]) -> None:
    client, _ = api
    runs = {submit(client, "t1") for _ in range(6)} | {submit(client, "t2") for _ in range(6)}
    got: list[str] = []
    lock = threading.Lock()

    def work(who: dict[str, str], name: str) -> None:
        while (answer := claim_next(client, who=who, runnerId=name)).status_code == 201:
            with lock:
                got.append(answer.json()["runId"])

    threads = [threading.Thread(target=work, args=(w, n)) for w, n in ((ROB, "rob-1"), (RAE, "rae-1"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(got) == sorted(runs)


def test_wait_seconds_long_polls_until_a_run_is_submitted(api: tuple[TestClient, InMemoryTenure]) -> None:
    client, _ = api
    submitted: list[str] = []
    timer = threading.Timer(0.6, lambda: submitted.append(submit(client, queue="late")))
    started = time.monotonic()
    timer.start()
    answer = claim_next(client, "late", waitSeconds=2)
    timer.join()
    assert answer.status_code == 201, answer.text
    assert answer.json()["runId"] == submitted[0]
    assert time.monotonic() - started >= 0.5
    # Nothing arrives: 204 after about the wait asked for (bounded by the request's deadline).
    started = time.monotonic()
    assert claim_next(client, "late", waitSeconds=1).status_code == 204
    assert 0.8 <= time.monotonic() - started < 3.0


def test_only_claiming_roles_claim_and_a_bad_queue_name_is_422(
    api: tuple[TestClient, InMemoryTenure],
) -> None:
    client, _ = api
    submit(client)
    assert claim_next(client, who=VAL).status_code == 403  # as POST /runs/{runId}/attempts
    assert claim_next(client, who={}).status_code == 401
    bad = claim_next(client, "no%20spaces")
    assert bad.status_code == 422 and bad.headers["content-type"].startswith("application/problem+json")
    assert claim_next(client, waitSeconds=61).status_code == 422
    assert claim_next(client, extra=1).status_code == 422


def test_a_repeat_under_the_same_idempotency_key_answers_the_same_grant(
    api: tuple[TestClient, InMemoryTenure],
) -> None:
    client, _ = api
    first, second = submit(client, queue="idem"), submit(client, queue="idem")
    keyed = {**ROB, "Idempotency-Key": "claim-1"}
    granted = client.post("/queues/idem/claim", headers=keyed, json={"runnerId": "host-1"})
    again = client.post("/queues/idem/claim", headers=keyed, json={"runnerId": "host-1"})
    assert granted.status_code == again.status_code == 201, again.text
    assert granted.json()["runId"] == again.json()["runId"] == first
    assert granted.json()["attemptId"] == again.json()["attemptId"]
    # The repeat claimed nothing more: the second run is still there for the next claim.
    assert claim_next(client, "idem").json()["runId"] == second


def test_the_grant_says_how_long_the_long_poll_waited_before_the_claim(
    api: tuple[TestClient, InMemoryTenure],
) -> None:
    client, _ = api
    submit(client, queue="now")
    assert 0 <= claim_next(client, "now").json()["waitedMs"] < 1000
    timer = threading.Timer(0.6, lambda: submit(client, queue="later"))
    timer.start()
    answer = claim_next(client, "later", waitSeconds=2)
    timer.join()
    assert answer.status_code == 201 and answer.json()["waitedMs"] >= 500
