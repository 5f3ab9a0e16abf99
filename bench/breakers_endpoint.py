"""A tool endpoint for bench/breakers_herd.py that notes when every call arrives (BRK-2, BRK-3).

`python -m bench.breakers_endpoint PORT` serves, as the gateway's tools expect:

  POST /effects          503 ("unavailable") in mode "fail", 200 in mode "ok"; in mode "hold" the
                         503 waits for POST /release, so every held call fails at the same
                         instant ("they fail together"). The arrival time (time.monotonic():
                         CLOCK_MONOTONIC, one clock for every process on the host) and the
                         Idempotency-Key are noted first
  GET  /effects/{key}    404: the gateway's probe finds nothing (nothing was applied)
  POST /mode?set=fail|ok|hold switch (leaving "hold" releases nothing: POST /release does)
  POST /release          answer every held call now
  GET  /arrivals         {"arrivals": [[t, key], ...]}; ?clear=1 forgets them after answering

A bare ASGI app on uvloop and httptools: the endpoint must not be what smooths a herd out.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import uvicorn

__all__ = ["app", "main"]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_state: dict[str, Any] = {"mode": "fail", "arrivals": [], "release": None}


async def _answer(send: Send, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    arrived = time.monotonic()
    method, path = scope["method"], scope["path"]
    more = True
    while more:  # drain the body
        message = await receive()
        more = bool(message.get("more_body"))
    if method == "POST" and path == "/effects":
        headers = dict(scope["headers"])
        _state["arrivals"].append((arrived, headers.get(b"idempotency-key", b"").decode()))
        if _state["mode"] == "hold":
            if _state["release"] is None:
                _state["release"] = asyncio.Event()
            await _state["release"].wait()
            await _answer(send, 503, {"type": "/problems/unavailable", "status": 503, "detail": "down"})
        elif _state["mode"] == "fail":
            await _answer(send, 503, {"type": "/problems/unavailable", "status": 503, "detail": "down"})
        else:
            await _answer(send, 200, {"operation": "call", "output": {"ok": True}})
    elif method == "GET" and path.startswith("/effects/"):
        await _answer(send, 404, {"type": "/problems/effect-not-found", "status": 404})
    elif method == "POST" and path == "/mode":
        _state["mode"] = parse_qs(scope["query_string"].decode()).get("set", ["fail"])[0]
        await _answer(send, 200, {"mode": _state["mode"]})
    elif method == "POST" and path == "/release":
        held, _state["release"] = _state["release"], None
        if held is not None:
            held.set()
        await _answer(send, 200, {"released": held is not None})
    elif method == "GET" and path == "/arrivals":
        arrivals = list(_state["arrivals"])
        if parse_qs(scope["query_string"].decode()).get("clear"):
            _state["arrivals"] = []
        await _answer(send, 200, {"arrivals": arrivals})
    elif path == "/healthz":
        await _answer(send, 200, {"status": "ok", "mode": _state["mode"]})
    else:
        await _answer(send, 404, {"type": "/problems/not-found", "status": 404})


def main() -> None:
    uvicorn.run(
        app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", loop="uvloop", http="httptools"
    )


if __name__ == "__main__":
    main()
