"""The lease benchmark's meters and HTTP helpers (bench/leases.py): where the CPU went, pools of
simulated runners, claims, releases and decision waits."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import httpx

from bench.foundation import (
    CpuMeter,
)
from services.common.kafka import TopicFollower
from services.common.topics import RUNS_EVENTS

__all__ = [
    "CLOCK_TICKS",
    "EXPIRY_LEASE_SECONDS",
    "HTTP_TIMEOUT_S",
    "LATE_MS",
    "MACHINE",
    "AiohttpPool",
    "Calls",
    "Headers",
    "Held",
    "HttpxPool",
    "MachineCpuMeter",
    "Pool",
    "ThreadMeter",
    "TransportError",
    "answer_key",
    "batch_results",
    "claim_all",
    "decision_wait",
    "end_offsets",
    "fan_out",
    "item_refusal",
    "machine_busy_seconds",
    "open_pool",
    "parse",
    "release_all",
    "renew_batch",
    "thread_cpu",
]


HTTP_TIMEOUT_S = 15.0  # above the decision timeout, so a slow decision shows up as a 202, not a timeout
EXPIRY_LEASE_SECONDS = 2
LATE_MS = 100.0  # a heartbeat sent this much after its slot means the runner fell behind its schedule


T = TypeVar("T")


# --- where the CPU went: the whole machine, and the services' threads ---------------------------

MACHINE = "all processes"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """Busy CPU-seconds of the whole machine so far (/proc/stat), whoever used them."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    # user..softirq; not steal (the hypervisor's), not guest (already counted in user)
    return (sum(ticks[:7]) - idle) / CLOCK_TICKS


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU-seconds of a process's threads by kind: its main thread (the event loop in every
    service here), librdkafka's threads (named rdk:*), and the other (Python) threads."""
    groups = {"main": 0.0, "librdkafka": 0.0, "other": 0.0}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return groups
    for task in tasks:
        try:
            raw = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        comm, fields = raw[raw.index("(") + 1 : raw.rindex(")")], raw.rsplit(")", 1)[1].split()
        kind = "main" if task.name == str(pid) else "librdkafka" if comm.startswith("rdk:") else "other"
        groups[kind] += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return groups


@dataclass
class ThreadMeter:
    pids: dict[str, int]
    phases: list[tuple[str, float, dict[str, dict[str, float]]]] = field(default_factory=list)

    def snapshot(self) -> dict[str, dict[str, float]]:
        return {name: thread_cpu(pid) for name, pid in self.pids.items()}

    def measure(self, phase: str, before: dict[str, dict[str, float]], wall_s: float) -> None:
        after = self.snapshot()
        self.phases.append(
            (phase, wall_s, {n: {k: after[n][k] - before[n][k] for k in after[n]} for n in after})
        )


@dataclass
class MachineCpuMeter(CpuMeter):
    """bench.foundation's per-process meter plus the machine's total, so other load shows, and
    the services' threads for the renewal windows."""

    threads: ThreadMeter = field(default_factory=lambda: ThreadMeter({}))

    def snapshot(self) -> dict[str, float]:
        return {**super().snapshot(), MACHINE: machine_busy_seconds()}


# --- HTTP helpers -----------------------------------------------------------------------------


@dataclass
class Calls:
    """Answers of a batch of HTTP calls: count per status (and problem type), latency of successes."""

    answers: Counter[str] = field(default_factory=Counter)
    ok_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.answers.values())


def answer_key(status: int, raw: bytes) -> str:
    """'200', or the status with the problem type's slug: '409 stale-epoch'."""
    if 200 <= status < 300:
        return str(status)
    body = parse(raw)
    problem = body.get("type", "") if isinstance(body, dict) else ""
    return f"{status} {problem.rsplit('/', 1)[-1]}".strip()


class TransportError(Exception):
    """No HTTP answer: connection failure or the client's timeout."""


Headers = dict[str, str] | None


class Pool:
    """One simulated runner's HTTP connection pool: (status, body) per call, else TransportError."""

    async def call(
        self, method: str, path: str, body: Any = None, headers: Headers = None
    ) -> tuple[int, bytes]:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class AiohttpPool(Pool):
    def __init__(self, base_url: str, connections: int) -> None:
        connector, timeout = aiohttp.TCPConnector(limit=connections), aiohttp.ClientTimeout(HTTP_TIMEOUT_S)
        self._session = aiohttp.ClientSession(base_url, connector=connector, timeout=timeout)

    async def call(
        self, method: str, path: str, body: Any = None, headers: Headers = None
    ) -> tuple[int, bytes]:
        try:
            async with self._session.request(method, path, json=body, headers=headers) as response:
                return response.status, await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransportError(type(exc).__name__) from exc

    async def close(self) -> None:
        await self._session.close()


class HttpxPool(Pool):
    def __init__(self, base_url: str, connections: int) -> None:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self._client = httpx.AsyncClient(base_url=base_url, timeout=HTTP_TIMEOUT_S, limits=limits)

    async def call(
        self, method: str, path: str, body: Any = None, headers: Headers = None
    ) -> tuple[int, bytes]:
        try:
            response = await self._client.request(method, path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise TransportError(type(exc).__name__) from exc
        return response.status_code, response.content

    async def close(self) -> None:
        await self._client.aclose()


def parse(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


CLIENTS: dict[str, Callable[[str, int], Pool]] = {"aiohttp": AiohttpPool, "httpx": HttpxPool}


@asynccontextmanager
async def open_pool(client: str, base_url: str, connections: int) -> AsyncIterator[Pool]:
    pool = CLIENTS[client](base_url, connections)
    try:
        yield pool
    finally:
        await pool.close()


async def fan_out(items: Iterable[T], concurrency: int, work: Callable[[T], Awaitable[None]]) -> float:
    """`work` on every item, `concurrency` at a time; the seconds it took."""
    pending = iter(items)

    async def worker() -> None:
        for item in pending:  # one shared iterator: each item goes to exactly one worker
            await work(item)

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.monotonic() - started


def end_offsets(bootstrap: str) -> dict[int, int]:
    probe = TopicFollower(bootstrap, [RUNS_EVENTS.name], "end", client_id="tenure-bench-probe")
    try:
        return probe.end_offsets(RUNS_EVENTS.name)
    finally:
        probe.close()


@dataclass
class Held:
    """A lease the bench holds: what a runner needs to heartbeat it."""

    run_id: str
    attempt_id: str
    epoch: int
    sequence: int = 0


async def claim_all(
    http: Pool,
    run_ids: list[str],
    runner: str,
    lease_s: int,
    heartbeat_s: int | None,
    concurrency: int,
    *,
    start: bool = False,
    into: list[Held] | None = None,
) -> tuple[list[Held], Calls]:
    """Claim each run; `start`: then send its first heartbeat at once, which starts it (a run
    start goes on runs.events), so runs start at the claim rate, as a runner starts work on
    what it claimed, and not all in the first second of the heartbeat schedule. A claim whose
    start was not answered 200 counts as not held. Each lease is appended to `into` (a new list
    if None) the moment it is held, so a keepalive can renew it while the claims go on."""
    held: list[Held] = [] if into is None else into
    calls = Calls()
    body: dict[str, Any] = {"runnerId": runner, "leaseSeconds": lease_s, "heartbeatSeconds": heartbeat_s}

    async def claim(run_id: str) -> None:
        began = time.perf_counter()
        try:
            status, grant = await http.call(
                "POST", f"/runs/{run_id}/attempts", body, {"Idempotency-Key": f"claim-{run_id}"}
            )
        except TransportError as exc:
            calls.answers[f"0 {exc}"] += 1
            return
        calls.answers[answer_key(status, grant)] += 1
        if status != 201:
            return
        calls.ok_ms.append((time.perf_counter() - began) * 1000)
        granted = parse(grant)
        lease = Held(run_id, granted["attemptId"], granted["epoch"])
        if start:
            lease.sequence = 1
            try:
                status, answer = await http.call(
                    "POST",
                    f"/attempts/{lease.attempt_id}/heartbeat",
                    {"leaseEpoch": lease.epoch, "sequence": lease.sequence},
                )
            except TransportError as exc:
                calls.answers[f"start: 0 {exc}"] += 1
                return
            if status != 200:
                calls.answers[f"start: {answer_key(status, answer)}"] += 1
                return
        held.append(lease)

    calls.seconds = await fan_out(run_ids, concurrency, claim)
    return held, calls


async def renew_batch(http: Pool, group: Sequence[Held]) -> tuple[str, bytes]:
    """One POST /leases:renew for `group`, each lease's sequence advanced first: the answer's key
    ("200", "429 ...", "0 TimeoutError") and body; `batch_results` reads it (after the caller
    has taken its time, so that parsing is not counted in the ack latency)."""
    items = []
    for lease in group:
        lease.sequence += 1
        items.append({"attemptId": lease.attempt_id, "leaseEpoch": lease.epoch, "sequence": lease.sequence})
    try:
        status, answer = await http.call("POST", "/leases:renew", {"renewals": items})
    except TransportError as exc:
        return f"0 {exc}", b""
    return answer_key(status, answer), answer


def batch_results(key: str, answer: bytes) -> list[dict[str, Any]] | None:
    """A batch renewal's per-lease results, if it was answered 200 with them."""
    results = (parse(answer) or {}).get("results") if key == "200" else None
    return results if isinstance(results, list) else None


def item_refusal(item: dict[str, Any]) -> str:
    """How a batch result that was not accepted is counted: "item refused stale-epoch"."""
    slug = str((item.get("problem") or {}).get("type", "")).rsplit("/", 1)[-1]
    return f"item {item.get('status')} {slug}".strip()


async def release_all(http: Pool, held: list[Held], concurrency: int) -> Calls:
    """Report every attempt succeeded: its lease ends, so no timer of it fires in a later step."""
    calls = Calls()

    async def release(lease: Held) -> None:
        lease.sequence += 1
        body = {"leaseEpoch": lease.epoch, "sequence": lease.sequence, "outcome": "succeeded"}
        began = time.perf_counter()
        try:
            status, answer = await http.call("POST", f"/attempts/{lease.attempt_id}/report", body)
        except TransportError as exc:
            calls.answers[f"0 {exc}"] += 1
            return
        calls.answers[answer_key(status, answer)] += 1
        if status == 200:
            calls.ok_ms.append((time.perf_counter() - began) * 1000)

    calls.seconds = await fan_out(held, concurrency, release)
    return calls


async def decision_wait(http: Pool, command: str) -> tuple[float, int]:
    """(sum of seconds, count) of the API's tenure_api_decision_seconds for one command type."""
    text = (await http.call("GET", "/metrics"))[1].decode()
    values = []
    for suffix in ("sum", "count"):
        match = re.search(rf'^tenure_api_decision_seconds_{suffix}{{command="{command}"}} (\S+)$', text, re.M)
        values.append(float(match.group(1)) if match else 0.0)
    return values[0], int(values[1])
