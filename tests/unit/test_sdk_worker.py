"""The SDK's Worker and its async client over the real app (tests/support/api_harness.py): the
worker claims with claim-next, reports the function's outcome, confirms a cancel (EXE-7) and
holds its report while the lease is in jeopardy (LEASE-4); the async and sync clients share one
core, so the same answers mean the same thing to both (202 unknown, 204 nothing, BRK-2)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from services.runner_sdk import (
    AsyncTask,
    AsyncTenureClient,
    AsyncWorker,
    CircuitOpen,
    LeaseInJeopardy,
    Task,
    TaskFailed,
    TenureClient,
    TenureUnavailable,
    Worker,
)
from services.runner_sdk.certainty import JournalKind
from tests.support.api_harness import api_client

pytestmark = pytest.mark.timeout(60)

BASE = "http://testserver"


class Flaky(httpx.BaseTransport):
    """The app's transport, with heartbeats dropped (a partition) while `drop` is set."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner
        self.drop = threading.Event()
        self.lose_claim_answer = threading.Event()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.drop.is_set() and request.url.path.endswith("/heartbeat"):
            raise httpx.ConnectError("partitioned", request=request)
        answer = self.inner.handle_request(request)
        if self.lose_claim_answer.is_set() and request.url.path.endswith("/claim"):
            self.lose_claim_answer.clear()  # the claim was made; its answer never arrives
            raise httpx.ReadTimeout("answer lost", request=request)
        answer.read()
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[tuple[TestClient, Flaky]]:
    with api_client(tmp_path, decision_timeout_s=3.0) as (client, _):
        yield client, Flaky(client._transport)  # type: ignore[attr-defined]


def submit(client: TestClient, key: str, **spec: Any) -> str:
    answer = client.post(
        "/runs",
        headers={"Idempotency-Key": key},
        json={"tenant": "acme", "executionSpec": spec, "timeoutSeconds": 600},
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["runId"])


def worker_for(transport: httpx.BaseTransport, **options: Any) -> Worker:
    client = TenureClient(BASE, BASE, transport=transport, timeout_s=3.0)
    return Worker(client, "worker-1", lease_seconds=6, heartbeat_seconds=1, poll_s=0, **options)


def test_the_worker_claims_runs_the_function_and_reports_its_outcome(api: tuple[TestClient, Flaky]) -> None:
    client, transport = api
    ok, bad = submit(client, "w-1", queue="jobs", n=1), submit(client, "w-2", queue="jobs", fail=True)
    worker = worker_for(transport)
    seen: list[Any] = []

    @worker.task("jobs")
    def job(task: Task) -> list[dict[str, Any]]:
        seen.append(task.spec)
        assert task.attempt_context is None  # a fresh start, not a continuation (EXE-9)
        if task.spec.get("fail"):
            raise TaskFailed("NOPE", "asked to fail")
        return []

    done = worker.run(max_runs=2)
    assert [(o.run_id, o.outcome, o.error_code) for o in done] == [
        (ok, "succeeded", ""),
        (bad, "failed", "NOPE"),
    ]
    assert seen == [{"queue": "jobs", "n": 1}, {"queue": "jobs", "fail": True}]
    assert done[0].run_id == ok
    assert client.get(f"/runs/{ok}").json()["status"] == "succeeded"
    assert client.get(f"/runs/{bad}").json()["status"] == "failed"
    assert worker.run_once() is None  # nothing left: claim-next answered 204


def test_the_worker_confirms_a_cancel_whatever_the_function_returns_EXE_7(
    api: tuple[TestClient, Flaky],
) -> None:
    client, transport = api
    run_id = submit(client, "c-1")
    worker = worker_for(transport)
    started = threading.Event()

    @worker.task()
    def job(task: Task) -> list[dict[str, Any]]:
        started.set()
        assert task.wait_for_stop(20) is not None  # the stop comes on a renewal answer
        return []

    canceller = threading.Thread(
        target=lambda: started.wait(10) and client.post(f"/runs/{run_id}/cancel", json={"reason": "x"})
    )
    canceller.start()
    outcome = worker.run_once()
    canceller.join(10)
    assert outcome is not None and outcome.outcome == "cancelled"
    assert client.get(f"/runs/{run_id}").json()["status"] == "cancelled"


def test_in_jeopardy_effects_are_refused_and_the_report_waits_for_a_proven_lease_LEASE_4(
    api: tuple[TestClient, Flaky],
) -> None:
    client, transport = api
    run_id = submit(client, "j-1")
    worker = worker_for(transport)
    kept: list[Task] = []

    @worker.task()
    def job(task: Task) -> list[dict[str, Any]]:
        kept.append(task)
        transport.drop.set()  # renewals stop arriving: the keeper can no longer prove the lease
        for _ in range(200):
            if task.in_jeopardy:
                break
            task.wait_for_stop(0.05)
        assert task.in_jeopardy
        with pytest.raises(LeaseInJeopardy):
            task.effect("e-1", "ledger", "transfer", {"amount": 1})
        threading.Timer(0.5, transport.drop.clear).start()  # the partition heals after we return
        return []

    outcome = worker.run_once()
    assert outcome is not None and outcome.outcome == "succeeded", outcome
    kinds = [entry.kind for entry in kept[0].keeper.journal]
    assert JournalKind.EFFECT_REFUSED in kinds and JournalKind.REPORT_REFUSED in kinds
    assert client.get(f"/runs/{run_id}").json()["status"] == "succeeded"


def test_a_claim_whose_answer_was_lost_is_resent_under_its_key_and_claims_nothing_more(
    api: tuple[TestClient, Flaky],
) -> None:
    client, transport = api
    first, second = submit(client, "k-1", queue="k"), submit(client, "k-2", queue="k")
    worker = worker_for(transport)
    worker.register("k", lambda task: [])
    transport.lose_claim_answer.set()
    assert worker.run_once() is None  # unknown outcome: retried after a full-jitter wait
    outcome = worker.run_once()
    assert outcome is not None and (outcome.run_id, outcome.outcome) == (first, "succeeded")
    assert client.get(f"/runs/{second}").json()["status"] == "queued"  # not claimed by the repeat
    assert len(client.get(f"/runs/{first}").json()["attempts"]) == 1


# --- one core, two shells ---------------------------------------------------------------------

ANSWERS: dict[str, tuple[int, Any]] = {
    "/queues/empty/claim": (204, None),
    "/queues/slow/claim": (202, {"status": "pending"}),
    "/breakers/ledger": (
        503,
        {"type": "/problems/circuit-open", "detail": "open", "cooldownRemainingMs": 60_000},
    ),
}


def _answer(request: httpx.Request) -> httpx.Response:
    status, body = ANSWERS[request.url.path]
    return httpx.Response(status) if body is None else httpx.Response(status, json=body)


def test_the_async_and_sync_clients_read_answers_by_the_same_rules() -> None:
    sync = TenureClient(BASE, BASE, transport=httpx.MockTransport(_answer))
    assert sync.claim_next("empty", "r") is None
    with pytest.raises(TenureUnavailable):
        sync.claim_next("slow", "r")
    with pytest.raises(CircuitOpen):
        sync.breaker("ledger")
    with pytest.raises(CircuitOpen) as local:
        sync.breaker("ledger")  # refused unsent until the cooldown (BRK-2)
    assert local.value.local

    async def the_same() -> None:
        async with AsyncTenureClient(BASE, BASE, transport=httpx.MockTransport(_answer)) as client:
            assert await client.claim_next("empty", "r") is None
            with pytest.raises(TenureUnavailable):
                await client.claim_next("slow", "r")
            with pytest.raises(CircuitOpen):
                await client.breaker("ledger")
            with pytest.raises(CircuitOpen) as again:
                await client.breaker("ledger")
            assert again.value.local
            assert set(client.open_circuits()) == set(sync.open_circuits())

    asyncio.run(the_same())


def test_the_async_client_claims_renews_and_reports_over_the_app(api: tuple[TestClient, Flaky]) -> None:
    client, _ = api
    run_id = submit(client, "a-1", queue="async")

    class Bridge(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            body = request.read()
            response = await asyncio.to_thread(
                client.request, request.method, request.url.path, content=body, headers=request.headers
            )
            return httpx.Response(response.status_code, headers=response.headers, content=response.content)

    async def work() -> str:
        async with AsyncTenureClient(BASE, BASE, transport=Bridge()) as sdk:
            lease = await sdk.claim_next("async", "async-1", lease_seconds=6, heartbeat_seconds=1)
            assert lease is not None and lease.run_id == run_id
            renewal = await sdk.heartbeat(lease, 1)
            assert renewal.epoch == lease.epoch
            view = await sdk.report(lease, 2, "succeeded", manifest=[])
            return str(view["status"])

    assert asyncio.run(work()) == "succeeded"


def test_the_async_worker_runs_async_functions_concurrently_each_run_once(
    api: tuple[TestClient, Flaky],
) -> None:
    client, transport = api
    runs = {submit(client, f"as-{i}", queue="aq", n=i) for i in range(4)}
    failing = submit(client, "as-f", queue="aq", fail=True)
    worker = AsyncWorker(
        TenureClient(BASE, BASE, transport=transport, timeout_s=3.0),
        "async-1",
        concurrency=2,
        lease_seconds=6,
        heartbeat_seconds=1,
        poll_s=0,
    )
    running = 0
    most = 0

    @worker.task("aq")
    async def job(task: AsyncTask) -> list[dict[str, Any]]:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.3)
        running -= 1
        if task.spec.get("fail"):
            raise TaskFailed("ASYNC_NOPE")
        assert await task.wait_for_stop_async(0) is None
        return []

    done = asyncio.run(worker.run(idle_exit_s=0.5))
    by_run = {o.run_id: (o.outcome, o.error_code) for o in done}
    assert len(done) == 5 and set(by_run) == runs | {failing}
    assert by_run.pop(failing) == ("failed", "ASYNC_NOPE")
    assert set(by_run.values()) == {("succeeded", "")}
    assert most == 2  # two runs at a time, on one event loop
