"""The lease bench's claim-phase keepalive (bench/_leases_keeper.py; issue 16): leases claimed
while the claims go on are renewed, never two renewals of one lease in flight, and once told to
stop it finishes its round and sends nothing more."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from bench import _leases_keeper
from bench._leases_io import Held, Pool


class RecordingPool(Pool):
    """Answers every batch renewal `accepted` after a short delay; records what was in flight."""

    calls: list[list[tuple[str, int]]] = []
    in_flight: set[str] = set()
    overlaps: list[str] = []
    closed = 0

    def __init__(self, base_url: str, connections: int) -> None:
        del base_url, connections

    async def call(self, method: str, path: str, body: Any = None, headers: Any = None) -> tuple[int, bytes]:
        assert (method, path) == ("POST", "/leases:renew")
        items = [(item["attemptId"], item["sequence"]) for item in body["renewals"]]
        for attempt, _ in items:
            if attempt in self.in_flight:
                self.overlaps.append(attempt)
            self.in_flight.add(attempt)
        self.calls.append(items)
        await asyncio.sleep(0.05)
        self.in_flight.difference_update(attempt for attempt, _ in items)
        return 200, json.dumps({"results": [{"status": "accepted"} for _ in items]}).encode()

    async def close(self) -> None:
        RecordingPool.closed += 1


@pytest.mark.timeout(30)
def test_claimed_leases_are_renewed_in_order_until_told_to_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(_leases_keeper.CLIENTS, "recording", RecordingPool)

    async def scenario() -> tuple[list[Held], Any, int]:
        held: list[Held] = []
        stop = asyncio.Event()
        keeper = asyncio.create_task(_leases_keeper.keep_alive("recording", "http://x", held, 1, 2, stop))
        for i in range(5):  # claims arrive while the keeper runs
            held.append(Held(f"run-{i}", f"att-{i}", 1, sequence=1))
            await asyncio.sleep(0.4)
        stop.set()
        calls = await keeper
        sent_when_it_returned = len(RecordingPool.calls)
        await asyncio.sleep(1.2)  # longer than a round
        return held, calls, sent_when_it_returned

    held, calls, sent_when_it_returned = asyncio.run(scenario())
    assert RecordingPool.overlaps == []
    assert RecordingPool.closed == 1
    assert calls.answers["keepalive: accepted"] == sum(len(c) for c in RecordingPool.calls) > 0
    renewed = {attempt for call in RecordingPool.calls for attempt, _ in call}
    assert renewed >= {"att-0", "att-1", "att-2"}, "each lease held when a whole round began is renewed"
    for lease in held:  # the sequences each lease was sent, in order, continuing from the claim's
        sent = [seq for call in RecordingPool.calls for attempt, seq in call if attempt == lease.attempt_id]
        assert sent == list(range(2, 2 + len(sent)))
        assert lease.sequence == 1 + len(sent)
    assert all(len(call) <= 2 for call in RecordingPool.calls), "batches of at most `batch`"
    assert sent_when_it_returned == len(RecordingPool.calls), "nothing is sent after it returned"


@pytest.mark.timeout(30)
def test_a_stop_in_the_middle_of_a_long_round_returns_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A round spreads its batches over the interval (10 minutes at a 1800 s TTL): once told to
    stop, the keeper sends no more of it and returns when what it sent is answered."""
    monkeypatch.setitem(_leases_keeper.CLIENTS, "recording", RecordingPool)
    RecordingPool.calls.clear()

    async def scenario() -> float:
        held = [Held(f"run-{i}", f"att-{i}", 1, sequence=1) for i in range(10)]
        stop = asyncio.Event()
        keeper = asyncio.create_task(_leases_keeper.keep_alive("recording", "http://x", held, 20, 1, stop))
        await asyncio.sleep(0.1)  # the round's first batch is sent at once, the next in 2 s
        loop = asyncio.get_running_loop()
        stopped_at = loop.time()
        stop.set()
        await keeper
        return loop.time() - stopped_at

    assert asyncio.run(scenario()) < 1.0
    assert [attempt for call in RecordingPool.calls for attempt, _ in call] == ["att-0"]
