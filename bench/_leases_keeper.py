"""The lease benchmark's claim-phase keepalive (bench/leases.py): every lease the bench has
claimed is renewed while the claims go on, as a runner keeps what it claimed from the moment it
holds it.

Why: at the issue's load (100,000 runs) the claims take longer than a lease lives (about 120-150
claims/s on this machine: 11-14 minutes, against a 90 s lease), so a bench that claims everything
first and heartbeats after finds its first leases expired. The bench renews every lease once a
third of its TTL (or every H, if longer), enough to keep it and no more: renewing 100,000 at
H=20 s while claiming (2026-12-06 18:06) overloaded the machine, 301,065 renewals timed out and
154,778 found their lease gone. With 90 s leases that is every 30 s; the 100,000-run figures
claim with `--lease-seconds 1800` (one renewal each 10 minutes while claiming). These renewals are
not measured (the warm-up and the window are); their answers have a row of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from bench._leases_io import CLIENTS, Calls, Held, Pool, batch_results, item_refusal, renew_batch

__all__ = ["keep_alive"]

CONNECTIONS = 8


async def _renew(http: Pool, group: Sequence[Held], calls: Calls) -> None:
    key, answer = await renew_batch(http, group)
    if (results := batch_results(key, answer)) is None:
        calls.answers[f"keepalive: {key}"] += len(group)
        return
    for item in results:
        accepted = item.get("status") == "accepted"
        calls.answers[f"keepalive: {'accepted' if accepted else item_refusal(item)}"] += 1


async def keep_alive(
    client: str, base_url: str, held: list[Held], interval_s: int, batch: int, stop: asyncio.Event
) -> Calls:
    """Rounds, one every `interval_s`: each renews every lease in `held` at the round's start, in
    batches of `batch` spread evenly over the round. A round waits for all its answers before the
    next begins, so a lease never has two renewals in flight (its sequences stay in order). Once
    `stop` is set nothing more is sent, the answers to what was sent are awaited, and it returns:
    the caller's own heartbeats may then start. (A round spreads its batches over the interval,
    10 minutes at a 1800 s TTL: finishing it would hold the caller that long.)"""
    http = CLIENTS[client](base_url, CONNECTIONS)
    calls = Calls()
    loop = asyncio.get_running_loop()
    try:
        while not stop.is_set():
            started = loop.time()
            snapshot = list(held)  # claims append to it meanwhile: those are renewed next round
            groups = [snapshot[i : i + batch] for i in range(0, len(snapshot), batch)]
            sends = []
            for g, group in enumerate(groups):
                if (delay := started + interval_s * g / len(groups) - loop.time()) > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():  # the caller's heartbeats take over: the rest of the round is theirs
                    break
                sends.append(asyncio.create_task(_renew(http, group, calls)))
            await asyncio.gather(*sends)
            remaining = started + interval_s - loop.time()
            if remaining > 0:
                with contextlib.suppress(TimeoutError):  # the round's time is up: the next begins
                    await asyncio.wait_for(stop.wait(), remaining)
    finally:
        await http.close()
    return calls
