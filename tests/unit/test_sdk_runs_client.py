"""The SDK's client for submitting services (RunsClient, AsyncRunsClient) over the real app
(tests/support/api_harness.py): submit idempotently, get, list, wait for the outcome a worker
reaches, cancel, retry; 404 and refusals as exceptions; sync and async read answers alike."""

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
    AsyncRunsClient,
    RequestRejected,
    RunNotFound,
    RunsClient,
    RunWaitTimeout,
    TenureClient,
    TenureUnavailable,
    Worker,
)
from tests.support.api_harness import api_client

pytestmark = pytest.mark.timeout(60)

BASE = "http://testserver"
MISSING = "run_" + "0" * 32


class Rebuffered(httpx.BaseTransport):
    """The app's in-process transport, its answers read into plain httpx responses."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self.inner.handle_request(request)
        answer.read()
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


@pytest.fixture()
def app(tmp_path: Path) -> Iterator[tuple[TestClient, Rebuffered]]:
    with api_client(tmp_path, decision_timeout_s=3.0) as (client, _):
        yield client, Rebuffered(client._transport)  # type: ignore[attr-defined]


def test_submit_get_list_wait_cancel_and_retry(app: tuple[TestClient, Rebuffered]) -> None:
    _, transport = app
    runs = RunsClient(BASE, transport=transport)
    first = runs.submit("acme", {"queue": "sdk"}, 600, idempotency_key="s-1")
    again = runs.submit("acme", {"queue": "sdk"}, 600, idempotency_key="s-1")
    assert again["runId"] == first["runId"] and first["status"] == "queued"  # idempotent by key
    assert runs.get(first["runId"])["executionSpec"] == {"queue": "sdk"}
    assert first["runId"] in [v["runId"] for v in runs.list("queued")["items"]]
    with pytest.raises(RunNotFound):
        runs.get(MISSING)
    with pytest.raises(RunWaitTimeout):
        runs.wait_for_outcome(first["runId"], timeout_s=0.3)

    worker = Worker(
        TenureClient(BASE, BASE, transport=transport), "w", lease_seconds=6, heartbeat_seconds=1, poll_s=0
    )
    worker.register("sdk", lambda task: [])
    thread = threading.Thread(target=worker.run_once)
    thread.start()
    done = runs.wait_for_outcome(first["runId"], timeout_s=10)
    thread.join(10)
    assert done["status"] == "succeeded"

    queued = runs.submit("acme", {"queue": "other"}, 600)
    cancelled = runs.cancel(queued["runId"], "not needed")
    assert cancelled["status"] == "cancelled"
    with pytest.raises(RequestRejected) as refused:
        runs.cancel(queued["runId"])
    assert refused.value.status == 409
    retried = runs.retry(queued["runId"], acknowledge_repeated_effects=True)
    assert retried["runId"] != queued["runId"]  # an ended run is retried as a new run


def test_the_async_runs_client_reads_answers_like_the_sync_one(app: tuple[TestClient, Rebuffered]) -> None:
    client, _ = app

    class Bridge(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            body = request.read()
            response = await asyncio.to_thread(
                client.request,
                request.method,
                str(request.url).removeprefix(BASE),
                content=body,
                headers=request.headers,
            )
            return httpx.Response(response.status_code, headers=response.headers, content=response.content)

    async def work() -> dict[str, Any]:
        async with AsyncRunsClient(BASE, transport=Bridge()) as runs:
            view = await runs.submit("acme", {"n": 1}, 600, idempotency_key="a-1")
            assert (await runs.get(view["runId"]))["runId"] == view["runId"]
            with pytest.raises(RunNotFound):
                await runs.get(MISSING)
            return await runs.cancel(view["runId"])

    assert asyncio.run(work())["status"] == "cancelled"


def test_an_unknown_submission_outcome_is_resent_under_the_same_key() -> None:
    keys: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["idempotency-key"])
        if len(keys) < 3:
            return httpx.Response(503, json={"type": "/problems/unavailable", "detail": "broker down"})
        return httpx.Response(201, json={"runId": "run_x", "status": "queued"})

    runs = RunsClient(BASE, transport=httpx.MockTransport(answer), sleep=lambda _: None)
    assert runs.submit("acme", {}, 60)["runId"] == "run_x"
    assert len(keys) == 3 and len(set(keys)) == 1
    pending = RunsClient(
        BASE,
        transport=httpx.MockTransport(lambda r: httpx.Response(202, json={"status": "pending"})),
        sleep=lambda _: None,
    )
    with pytest.raises(TenureUnavailable):  # still undecided after the retries: unknown, not refused
        pending.submit("acme", {}, 60, retries=1)
