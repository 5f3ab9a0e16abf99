"""No request to the command API or the effect gateway hops to FastAPI's thread pool (issue 11).

FastAPI runs a plain `def` dependency or route in its thread pool: a hop to a worker thread and
back on every request that uses it. The command API's path-id check was one, on every route:
about 130 µs of CPU per request measured in process (230 -> 100 µs for GET /healthz through the
whole app, 2026-12-07), a tenth of what a request to the owner prototype costs in all
(bench/owner_path.py); the gateway's caller check was another. A check that does no I/O belongs
on the event loop. This drives requests through both apps with FastAPI's thread-pool entry
counted, so that a new synchronous dependency or route fails here. (Reads of RocksDB still go
to a thread on purpose, through `asyncio.to_thread`, which this does not count.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastapi.dependencies.utils
import fastapi.routing
import pytest
from fastapi.testclient import TestClient

from services.common.auth import Principal
from tests.support.api_harness import api_client
from tests.support.gateway import OfflineGateway, gateway_app
from tests.support.lease_run import Run

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every call FastAPI sends to its thread pool while the test runs, by name."""
    seen: list[str] = []
    for module in (fastapi.dependencies.utils, fastapi.routing):
        original = module.run_in_threadpool

        async def counted(func: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            seen.append(getattr(func, "__qualname__", repr(func)))
            return await _original(func, *args, **kwargs)

        monkeypatch.setattr(module, "run_in_threadpool", counted)
    yield seen


def test_the_command_api_answers_without_a_thread_pool_hop(tmp_path: Path, hops: list[str]) -> None:
    with api_client(tmp_path) as (client, _):
        assert client.get("/healthz").status_code == 200
        submitted = client.post(
            "/runs",
            json={"tenant": "t", "executionSpec": {"agent": "a"}, "timeoutSeconds": 60},
            headers={"Idempotency-Key": "hop-1"},
        )
        assert submitted.status_code in (201, 202), submitted.text
        run_id = submitted.json()["runId"]
        assert client.get(f"/runs/{run_id}").status_code == 200
        assert client.get("/runs/not-a-run").status_code == 404  # the path-id check refused it
    assert hops == []


def test_the_effect_gateway_answers_without_a_thread_pool_hop(hops: list[str]) -> None:
    run = Run()
    run.claim("runner-a")
    keys = {"runkey": Principal("runner:runner-a", "submitter")}
    with TestClient(gateway_app(OfflineGateway().fold(*run.events), keys)) as client:
        assert client.get("/breakers").status_code == 401  # the caller check refused it
        assert client.get("/breakers", headers={"Authorization": "Bearer runkey"}).status_code == 200
    assert hops == []
