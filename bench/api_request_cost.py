"""The command API's own CPU per request, in process, against a bare FastAPI app (issue 11).

Calls the ASGI app directly (no sockets, no uvicorn): the command API as `create_app` builds
it, every middleware and dependency included, over the in-memory stand-in for Kafka and the
processors (tests/support/api_harness.py), beside a bare FastAPI app with one route, its limit.
Per route, the process's CPU (all threads: FastAPI's thread pool included) per request over N
calls, best of --repeats. It isolates what Tenure's middleware and dependency stack costs per
request from what the broker and the processors cost, which bench/durable_steps.py mixes.

    PYTHONPATH=. .venv/bin/python -m bench.api_request_cost [--n 3000] [--repeats 3]

A script, not a test: it measures and reports, it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from services.command_api.app import create_app
from tests.support.api_harness import InMemoryTenure

__all__ = ["main"]

Message = MutableMapping[str, Any]
App = Callable[
    [Message, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]
]
MISSING_RUN = "/runs/run_0123456789abcdef0123456789abcdef"


async def _call(app: App, path: str) -> int:
    scope: Message = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"bench")],
        "client": ("127.0.0.1", 1),
        "server": ("bench", 80),
        "state": {},
    }
    delivered = False
    status: list[int] = []

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # never: the request is complete
        return {}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            status.append(int(message["status"]))

    await app(scope, receive, send)
    return status[0]


class Lifespan:
    """The app's lifespan, driven as a server would: startup before the requests, shutdown after
    (the command API opens and closes its dependencies there)."""

    def __init__(self, app: App) -> None:
        self._app = app
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._outbox: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def _send(self, message: Message) -> None:
        await self._outbox.put(message)

    async def _step(self, kind: str) -> None:
        await self._inbox.put({"type": f"lifespan.{kind}"})
        answer = await self._outbox.get()
        if answer["type"] != f"lifespan.{kind}.complete":
            raise RuntimeError(f"the command API's {kind}: {answer}")

    async def __aenter__(self) -> None:
        scope: Message = {"type": "lifespan", "asgi": {"version": "3.0"}}
        self._task = asyncio.ensure_future(self._app(scope, self._inbox.get, self._send))
        await self._step("startup")

    async def __aexit__(self, *_: object) -> None:
        await self._step("shutdown")
        if self._task is not None:
            await self._task


async def _per_request_us(app: App, path: str, n: int, repeats: int) -> tuple[int, float]:
    status = await _call(app, path)
    best = float("inf")
    for _ in range(repeats):
        began = time.process_time()
        for _ in range(n):
            await _call(app, path)
        best = min(best, (time.process_time() - began) / n * 1e6)
    return status, best


async def measure(n: int, repeats: int, workdir: Path) -> list[tuple[str, int, float]]:
    bare = FastAPI()

    @bare.get("/runs/{run_id}")
    async def run(run_id: str) -> dict[str, str]:
        return {"runId": run_id}

    system = InMemoryTenure()
    api = create_app(lambda: system.dependencies(workdir, "", 1.0))
    async with Lifespan(api):
        return [
            ("bare FastAPI, GET /runs/{id}", *await _per_request_us(bare, MISSING_RUN, n, repeats)),
            ("command API, GET /healthz", *await _per_request_us(api, "/healthz", n, repeats)),
            (
                "command API, GET /runs/{id} (no such run)",
                *await _per_request_us(api, MISSING_RUN, n, repeats),
            ),
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3000, help="requests per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per route (the best is kept)")
    args = parser.parse_args(argv)
    if not (100 <= args.n <= 1_000_000 and 1 <= args.repeats <= 20):
        parser.error("--n 100-1,000,000, --repeats 1-20")
    with tempfile.TemporaryDirectory(prefix="tenure-api-cost-") as workdir:
        rows = asyncio.run(measure(args.n, args.repeats, Path(workdir)))
    limit = rows[0][2]
    print("| request | status | CPU µs per request | x the bare app |\n|---|---:|---:|---:|")
    for name, status, micros in rows:
        print(f"| {name} | {status} | {micros:.1f} | {micros / limit:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
