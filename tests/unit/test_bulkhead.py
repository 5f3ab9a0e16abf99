"""Bulkheads per tool domain (BRK-4): bounded pools that refuse at once, and a hung external
tool that saturates its pool without starving the local tools."""

from __future__ import annotations

import asyncio
import time
from functools import partial

import pytest

from services.common.bulkhead import (
    BULKHEAD_FULL,
    DEFAULT_LIMITS,
    BulkheadFull,
    Bulkheads,
    Domain,
    Limits,
    Pool,
    ToolRule,
    ToolTimedOut,
    parse_tool_rules,
)
from services.common.settings import TenureSettings


async def _hold(gate: asyncio.Event, started: list[int] | None = None, tag: int = 0) -> int:
    if started is not None:
        started.append(tag)
    await gate.wait()
    return tag


def test_a_full_pool_refuses_at_once_and_its_queue_is_bounded_brk_4() -> None:
    async def scenario() -> None:
        pool = Pool("external", Domain.EXTERNAL, Limits(concurrency=2, queue=2, timeout_ms=5_000))
        gate, started = asyncio.Event(), list[int]()
        calls = [asyncio.create_task(pool.run("search", partial(_hold, gate, started, i))) for i in range(4)]
        await asyncio.sleep(0.01)
        assert (pool.active, pool.queued, started) == (2, 2, [0, 1])
        began = time.perf_counter()
        with pytest.raises(BulkheadFull) as refused:
            await pool.run("search", lambda: _hold(gate))
        assert time.perf_counter() - began < 0.005, "refused at once, not after waiting"
        assert refused.value.code == BULKHEAD_FULL == "ERR_BULKHEAD_FULL"
        assert refused.value.message == "External tool queue saturated; defer execution"
        assert refused.value.observation()["code"] == "ERR_BULKHEAD_FULL"
        gate.set()
        assert await asyncio.gather(*calls) == [0, 1, 2, 3]
        assert started == [0, 1, 2, 3], "waiting calls run in arrival order"
        assert (pool.active, pool.queued, pool.refused, pool.completed) == (0, 0, 1, 4)

    asyncio.run(scenario())


def test_a_pool_without_a_queue_refuses_as_soon_as_its_slots_are_taken() -> None:
    async def scenario() -> None:
        pool = Pool("local", Domain.LOCAL, Limits(concurrency=1, queue=0, timeout_ms=500))
        gate = asyncio.Event()
        running = asyncio.create_task(pool.run("fs.read", lambda: _hold(gate)))
        await asyncio.sleep(0)
        with pytest.raises(BulkheadFull):
            await pool.run("fs.read", lambda: _hold(gate))
        gate.set()
        await running

    asyncio.run(scenario())


_NOT_BY_THE_POOL_S = 10  # an outer bound far past the pool's 50 ms: a regression fails, not hangs


def test_a_call_over_its_timeout_is_cancelled_and_a_wait_over_it_is_refused() -> None:
    """Each half on one timer of its own, so no two timers race (a hung `run` as the slot's holder
    would time out, and hand its slot over, on the same 50 ms as its waiter): a call that hangs past
    the pool's timeout is cancelled; a call that waits past it for a slot held through `slot()`
    (which the pool does not time out) is refused, without running, once it has waited that long."""

    async def scenario() -> None:
        pool = Pool("internal", Domain.INTERNAL, Limits(concurrency=1, queue=1, timeout_ms=50))
        loop = asyncio.get_running_loop()
        never = asyncio.Event()
        cancelled: list[str] = []

        async def hang() -> int:
            try:
                await never.wait()
            except asyncio.CancelledError:
                cancelled.append("vector.search")
                raise
            return 0

        began = loop.time()
        with pytest.raises(ToolTimedOut, match="longer than 50 ms"):
            async with asyncio.timeout(_NOT_BY_THE_POOL_S):
                await pool.run("vector.search", hang)
        assert loop.time() - began >= 0.049, "timed out after its timeout, not before"
        assert cancelled == ["vector.search"], "the call over its timeout was cancelled"
        assert (pool.active, pool.queued, pool.timed_out) == (0, 0, 1), "the slot came back"

        started: list[int] = []
        async with pool.slot("vector.search"):
            began = loop.time()
            with pytest.raises(BulkheadFull, match="no slot within 50 ms") as refused:
                async with asyncio.timeout(_NOT_BY_THE_POOL_S):
                    await pool.run("vector.search", lambda: _hold(never, started, 1))
            assert loop.time() - began >= 0.049, "refused after waiting its timeout, not at once"
            assert refused.value.code == BULKHEAD_FULL
            assert started == [], "the refused call never ran"
            assert (pool.active, pool.queued, pool.refused) == (1, 0, 1), "it left the queue, the slot held"
        assert (pool.active, pool.queued) == (0, 0)
        assert await pool.run("vector.search", lambda: asyncio.sleep(0, result=7)) == 7
        assert (pool.timed_out, pool.refused, pool.completed) == (1, 1, 3)

    asyncio.run(scenario())


def test_a_cancelled_caller_gives_its_slot_or_its_place_back() -> None:
    async def scenario() -> None:
        pool = Pool("external", Domain.EXTERNAL, Limits(concurrency=1, queue=2, timeout_ms=5_000))
        gate = asyncio.Event()
        running = asyncio.create_task(pool.run("t", lambda: _hold(gate, None, 1)))
        waiting = asyncio.create_task(pool.run("t", lambda: _hold(gate, None, 2)))
        behind = asyncio.create_task(pool.run("t", lambda: _hold(gate, None, 3)))
        await asyncio.sleep(0.01)
        waiting.cancel()
        running.cancel()
        await asyncio.sleep(0.01)
        assert (pool.active, pool.queued) == (1, 0), "the slot went to the one still waiting"
        gate.set()
        assert await behind == 3
        assert (pool.active, pool.queued) == (0, 0)

    asyncio.run(scenario())


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[int(len(ordered) * 0.99) - 1]


async def _local_latencies(bulkheads: Bulkheads, calls: int = 640) -> list[float]:
    async def one() -> float:
        began = time.perf_counter()
        await bulkheads.run("fs.read", lambda: asyncio.sleep(0.001))
        return time.perf_counter() - began

    latencies: list[float] = []
    for _ in range(calls // 32):  # 32 local calls at once, within the local pool's 64
        latencies += await asyncio.gather(*(one() for _ in range(32)))
    return latencies


def test_a_hung_external_tool_saturates_its_pool_while_local_tools_keep_their_latency_brk_4() -> None:
    """The seed's 256-agent scenario, scaled: 256 agents call a hung external index (16 run, 16
    wait, 224 are refused at once with ERR_BULKHEAD_FULL) while local calls go on. Stated bound:
    local p99 with the external pool saturated stays within 20 ms of local p99 alone."""

    async def scenario() -> tuple[float, float, int, int]:
        bulkheads = Bulkheads(tools={"fs.read": ToolRule(Domain.LOCAL), "index": ToolRule(Domain.EXTERNAL)})
        alone = _p99(await _local_latencies(bulkheads))
        hung = asyncio.Event()
        agents = [asyncio.create_task(bulkheads.run("index", lambda: _hold(hung))) for _ in range(256)]
        await asyncio.sleep(0.01)
        external = bulkheads.pool_for("index")
        assert (external.active, external.queued) == (16, 16)
        saturated = _p99(await _local_latencies(bulkheads))
        hung.set()
        results = await asyncio.gather(*agents, return_exceptions=True)
        refused = sum(isinstance(r, BulkheadFull) for r in results)
        return alone, saturated, refused, sum(r == 0 for r in results)

    alone, saturated, refused, served = asyncio.run(scenario())
    assert refused == 256 - 32 and served == 32
    assert saturated <= alone + 0.020, f"local p99 {saturated * 1000:.1f} ms vs {alone * 1000:.1f} ms alone"


def test_limits_are_configurable_per_domain_and_per_tool() -> None:
    rules = parse_tool_rules("env=internal, search=external:4/8/3000 ,fs.read=local")
    assert rules == {
        "env": ToolRule(Domain.INTERNAL),
        "search": ToolRule(Domain.EXTERNAL, Limits(4, 8, 3000)),
        "fs.read": ToolRule(Domain.LOCAL),
    }
    bulkheads = Bulkheads(DEFAULT_LIMITS, rules, default_domain=Domain.EXTERNAL)
    assert bulkheads.pool_for("search").name == "tool:search", "a tool with its own limits, its own pool"
    assert bulkheads.pool_for("env").name == "internal"
    assert bulkheads.pool_for("vector.db") is bulkheads.pool_for("ledger"), "unlisted: the default domain"
    assert bulkheads.domain_of("unknown") is Domain.EXTERNAL
    assert bulkheads.connection_limit() == 64 + 32 + 16 + 4
    assert {p["pool"] for p in bulkheads.snapshot()} == {"local", "internal", "external", "tool:search"}
    defaults = Bulkheads.from_settings(TenureSettings())
    assert defaults.pool_for("x").limits == Limits(16, 16, 5_000)
    assert defaults.pool_for("x").domain is Domain.EXTERNAL


@pytest.mark.parametrize(
    "text",
    [
        "env=remote",
        "=local",
        "env=local:64/64/501",
        "env=internal:0/1/100",
        "env=internal:1/2",
        "env=external:a/b/c",
    ],
)
def test_malformed_or_out_of_bounds_tool_rules_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="bulkhead rule"):
        parse_tool_rules(text)


def test_a_local_pool_may_not_wait_longer_than_500_ms() -> None:
    with pytest.raises(ValueError, match="local tools"):
        Pool("local", Domain.LOCAL, Limits(64, 64, 501))
    with pytest.raises(ValueError, match="missing"):
        Bulkheads({Domain.LOCAL: Limits(1, 1, 1)})
