"""The gateway's requests to its tools (REC-6): the caller's text never changes the URL.

The probe used to put the idempotency key into the path as it was: a key with "/" probed another
path, "?" and "#" cut it short, so a committed effect could be reported as "not found" and sent
again. The verifier's name is the caller's text too.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
import uvicorn

from services.common.settings import TenureSettings
from services.effect_gateway.tools import KEEPALIVE_EXPIRY_S, ToolRegistry, parse_tools

pytestmark = pytest.mark.timeout(30)

KEY = "run_1/step 2?dry=1#frag%41"


def registry(seen: list[httpx.Request]) -> ToolRegistry:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(404, json={})

    return ToolRegistry({"ledger": "http://ledger.test/base"}, transport=httpx.MockTransport(answer))


def test_the_probe_percent_encodes_the_idempotency_key_rec_6() -> None:
    seen: list[httpx.Request] = []
    tools = registry(seen)
    answer = asyncio.run(tools.probe("ledger", KEY))
    assert answer.status == 404
    (request,) = seen
    assert request.url.raw_path == b"/base/effects/run_1%2Fstep%202%3Fdry%3D1%23frag%2541"
    assert request.url.query == b"" and request.url.fragment == ""
    asyncio.run(tools.close())


def test_the_verifier_name_is_percent_encoded_too() -> None:
    seen: list[httpx.Request] = []
    tools = registry(seen)
    asyncio.run(tools.verify("ledger", "../effects?x=1", "run_1", {}))
    (request,) = seen
    assert request.url.raw_path == b"/base/verifiers/..%2Feffects%3Fx%3D1"
    asyncio.run(tools.close())


def test_the_tools_come_from_the_settings_not_the_environment() -> None:
    settings = TenureSettings(tools="ledger=http://a:1/, env=http://b:2", tool_timeout_s=3)
    tools = ToolRegistry.from_settings(settings)
    assert tools.names() == ["env", "ledger"]
    assert parse_tools("ledger=http://a:1/") == {"ledger": "http://a:1"}
    with pytest.raises(ValueError):
        parse_tools("ledger")
    asyncio.run(tools.close())


def test_an_idle_connection_to_a_tool_is_dropped_before_the_tool_would_close_it() -> None:
    """A connection reused just as the tool's server closes it fails with a ReadError, an effect
    whose outcome is unknown. The gateway's keep-alive is well under uvicorn's (5 s, Node's too)."""
    server_keep_alive = uvicorn.Config(app=None).timeout_keep_alive
    assert server_keep_alive / 2 >= KEEPALIVE_EXPIRY_S
    registry = ToolRegistry({"ledger": "http://127.0.0.1:9"})
    pool = registry._client._transport._pool  # type: ignore[attr-defined]  # httpcore's, as configured
    assert pool._keepalive_expiry == KEEPALIVE_EXPIRY_S
