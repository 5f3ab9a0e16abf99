"""A request cut by shutdown answers 503 problem+json with Retry-After, never uvicorn's text 500
(services/common/http_serve.CutAtShutdown; the real process: tests/integration/
test_http_shutdown_grace.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from services.common.http_serve import CutAtShutdown

pytestmark = pytest.mark.timeout(30)

SCOPE = {"type": "http", "method": "POST", "path": "/effects", "headers": []}


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


def _serve(app: Any, scope: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(CutAtShutdown(app)(scope, _receive, send))
    return sent


def test_a_request_cut_before_its_answer_started_is_a_503_problem() -> None:
    async def held(scope: Any, receive: Any, send: Any) -> None:
        raise asyncio.CancelledError  # what uvicorn's shutdown does to a request past its grace

    start, body = _serve(held, SCOPE)
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    assert start["status"] == 503
    assert headers["content-type"] == "application/problem+json"
    assert headers["retry-after"] == "1" and headers["connection"] == "close"
    problem = json.loads(body["body"])
    assert problem["type"] == "/problems/unavailable" and problem["instance"] == "/effects"


def test_a_request_cut_mid_answer_is_still_cancelled() -> None:
    async def streaming(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        _serve(streaming, SCOPE)


def test_answers_and_other_scopes_pass_through_unchanged() -> None:
    async def ok(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    assert [m.get("status") for m in _serve(ok, SCOPE)] == [204, None]
    seen: list[str] = []

    async def lifespan(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        _serve(lifespan, {"type": "lifespan"})
    assert seen == ["lifespan"]
