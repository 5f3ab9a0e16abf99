"""Who closes an idle HTTP connection first: always the client (services/common/http_serve.py).

A connection a client reuses just as the server closes it fails with a ReadError; for an effect
that is an outcome unknown. Tenure's servers keep idle connections longer than every client it
ships keeps them (the gateway's own client to tools, servers Tenure does not run, is in
tests/unit/test_gateway_tools.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from services.common import http_serve
from services.common.settings import TenureSettings

pytestmark = pytest.mark.timeout(30)

AIOHTTP_IDLE_S = 15.0  # aiohttp.TCPConnector's keepalive_timeout default (the bench's client)


def test_tenure_servers_keep_idle_connections_longer_than_its_clients_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served: dict[str, Any] = {}
    monkeypatch.setattr(http_serve, "freeze_startup_heap", lambda schedule: 0)
    monkeypatch.setattr(http_serve.uvicorn, "run", lambda app, **kwargs: served.update(kwargs))
    http_serve.serve_http(object(), "127.0.0.1", 0, TenureSettings())
    httpx_idle_s = httpx.Limits().keepalive_expiry
    assert httpx_idle_s is not None
    assert served["timeout_keep_alive"] == http_serve.KEEP_ALIVE_S
    assert max(httpx_idle_s, AIOHTTP_IDLE_S) < http_serve.KEEP_ALIVE_S
