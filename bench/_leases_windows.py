"""The lease benchmark's renewal windows (bench/leases.py): one heartbeat schedule per step, a
warm-up and then the measured window, and what each records.

Why a warm-up: a claimed run is PREPARING, and its first heartbeat starts it (a LeaseRenewed with
runStarted, a state change that always goes on runs.events). Without a warm-up every run of the
step starts within the window's first H: R run starts at once, which is not what R concurrent
runs renewing look like (at 100,000 runs of an hour, about 28 start each second). So the
schedule begins `warm-up` seconds before the window, the heartbeats sent then (each run's first
among them) are recorded on a row of their own, and the window's figures are steady renewals.
The schedule does not pause between the two: a pause would let short leases go at risk.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bench._leases_io import (
    CLIENTS,
    Calls,
    Held,
    TransportError,
    answer_key,
    batch_results,
    item_refusal,
    parse,
    renew_batch,
)

if TYPE_CHECKING:  # the expiry probe's result is the bench's own (bench/leases.py)
    from bench.leases import ExpiryResult

__all__ = [
    "StepResult",
    "batch_window",
    "heartbeat_window",
]

LEAD_S = 0.5  # from the call to the schedule's first slot


@dataclass
class StepResult:
    heartbeat_s: int
    runs: int
    runners: int
    duration_s: float
    claims: Calls
    scheduled: int = 0  # heartbeat slots in the window (R/H per second)
    heartbeats: Calls = field(default_factory=Calls)
    from_slot_ms: list[float] = field(default_factory=list)  # slot -> 200: includes falling behind
    late_ms: list[float] = field(default_factory=list)  # send time - slot, every heartbeat
    # (seconds after the window's start when sent, ack ms) of every 200: where in the window the
    # tail is (a burst of first heartbeats starting runs, a collection, a commit that stalls).
    ok_timeline: list[tuple[float, float]] = field(default_factory=list)
    # Split of each acknowledged heartbeat at `serverTime` (the coordinator's clock when it decided;
    # same host, so comparable with the bench's wall clock): (seconds after the window's start
    # when sent, send -> decided ms, decided -> ack ms), so a slow slice shows which leg lost it.
    legs_timeline: list[tuple[float, float, float]] = field(default_factory=list)
    decision_ms: float = float("nan")  # mean publish -> decision inside the API (its /metrics)
    events: int = 0
    markers: int = 0
    expiry: ExpiryResult | None = None
    release: Calls | None = None
    warm_up: StepResult | None = None  # the heartbeats before the window (--warm-up-seconds)
    started_at_claim: bool = False  # each run's first heartbeat was sent right after its claim
    kept_alive: Calls | None = None  # renewals while the claims went on (bench/_leases_keeper.py)
    gc: str = ""  # the services' garbage-collector passes in the window (_leases_system.gc_summary)

    @property
    def offered(self) -> float:
        return self.runs / self.heartbeat_s

    @property
    def acked(self) -> int:
        return self.heartbeats.answers.get("200", 0)

    @property
    def achieved(self) -> float:
        return self.acked / self.heartbeats.seconds if self.heartbeats.seconds else 0.0

    @property
    def to_decision_ms(self) -> list[float]:
        return [to_decision for _, to_decision, _ in self.legs_timeline]

    @property
    def after_decision_ms(self) -> list[float]:
        return [after_decision for _, _, after_decision in self.legs_timeline]


class _Schedule:
    """One step's slots: the warm-up's from `start`, the window's from `t0` to `end`. Each
    heartbeat is recorded in the phase its slot falls in."""

    def __init__(self, step: StepResult, loop: asyncio.AbstractEventLoop) -> None:
        self.step, self.loop = step, loop
        self.warm_up = step.warm_up
        self.start = loop.time() + LEAD_S
        self.t0 = self.start + (self.warm_up.duration_s if self.warm_up else 0.0)
        self.end = self.t0 + step.duration_s
        self.interval = float(step.heartbeat_s)
        self.last_answer = {id(step): self.t0, id(self.warm_up): self.start}

    def phase(self, slot: float) -> tuple[StepResult, float]:
        """Where a heartbeat of this slot is recorded, and that phase's start."""
        if self.warm_up is not None and slot < self.t0:
            return self.warm_up, self.start
        return self.step, self.t0

    def first_slot(self, i: int, of: int, leases: int = 1) -> float:
        """The i-th of `of` schedules' first slot; counts its slots, `leases` renewals each, into
        each phase's `scheduled` (with the same float steps as `due`)."""
        slot = due = self.start + self.interval * i / of
        while due < self.end:
            self.phase(due)[0].scheduled += leases
            due += self.interval
        return slot

    async def until(self, slot: float) -> tuple[float, float]:
        """Sleeps until the slot; the send time on the loop's clock and the wall clock (ms)."""
        if (delay := slot - self.loop.time()) > 0:
            await asyncio.sleep(delay)
        return self.loop.time(), time.time() * 1000

    def answered(self, into: StepResult, done: float) -> None:
        self.last_answer[id(into)] = max(self.last_answer[id(into)], done)

    def next_slot(self, slot: float) -> float:
        # A whole interval behind: that slot is skipped rather than queued, so a run never
        # catches up in a burst and the window ends on time; skipped slots show as Slots - Sent.
        slot += self.interval
        while slot < self.loop.time() - self.interval:
            slot += self.interval
        return slot

    def close(self) -> None:
        self.step.heartbeats.seconds = self.last_answer[id(self.step)] - self.t0
        if self.warm_up is not None:
            self.warm_up.heartbeats.seconds = self.last_answer[id(self.warm_up)] - self.start

    def call_at_window(self, at_window: Callable[[], None] | None) -> None:
        if at_window is not None:
            self.loop.call_at(self.t0, at_window)


def _accepted(
    into: StepResult,
    t_phase: float,
    sent: float,
    slot: float,
    done: float,
    sent_wall_ms: float,
    done_wall_ms: float,
    decided_ms: Any,
) -> None:
    into.heartbeats.answers["200"] += 1
    into.heartbeats.ok_ms.append((done - sent) * 1000)
    into.ok_timeline.append((sent - t_phase, (done - sent) * 1000))
    into.from_slot_ms.append((done - slot) * 1000)
    if isinstance(decided_ms, int):
        into.legs_timeline.append((sent - t_phase, decided_ms - sent_wall_ms, done_wall_ms - decided_ms))


async def heartbeat_window(
    client: str,
    base_url: str,
    held: list[Held],
    step: StepResult,
    runners: int,
    at_window: Callable[[], None] | None = None,
) -> None:
    """Every run heartbeats at its slots start + H*i/R + k*H until the window's end, one
    coroutine per run; `at_window` is called when the window begins (after the warm-up).

    A run never has two heartbeats in flight (a runner waits for its answer, as a real one
    would, so sequences stay in order): when answers take longer than H the next heartbeat goes
    late, the offered rate is not reached, and `late_ms` and `from_slot_ms` show it.
    """
    # Connections per runner: enough for its share of the runs at once, so the pool never
    # queues requests the server could have taken.
    clients = [CLIENTS[client](base_url, max(8, len(held) // runners + 1)) for _ in range(runners)]
    schedule = _Schedule(step, asyncio.get_running_loop())
    schedule.call_at_window(at_window)

    async def run(i: int, lease: Held) -> None:
        http, slot = clients[i % runners], schedule.first_slot(i, len(held))
        while slot < schedule.end:
            sent, sent_wall_ms = await schedule.until(slot)
            into, t_phase = schedule.phase(slot)
            into.late_ms.append((sent - slot) * 1000)
            lease.sequence += 1
            body = {"leaseEpoch": lease.epoch, "sequence": lease.sequence}
            try:
                status, answer = await http.call("POST", f"/attempts/{lease.attempt_id}/heartbeat", body)
                key = answer_key(status, answer)
            except TransportError as exc:
                key, answer = f"0 {exc}", b""
            done, done_wall_ms = schedule.loop.time(), time.time() * 1000
            schedule.answered(into, done)
            if key == "200":
                decided_ms = (parse(answer) or {}).get("serverTime")
                _accepted(into, t_phase, sent, slot, done, sent_wall_ms, done_wall_ms, decided_ms)
            else:
                into.heartbeats.answers[key] += 1
            slot = schedule.next_slot(slot)

    try:
        await asyncio.gather(*(run(i, lease) for i, lease in enumerate(held)))
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    schedule.close()


async def batch_window(
    client: str,
    base_url: str,
    held: list[Held],
    step: StepResult,
    runners: int,
    batch: int,
    at_window: Callable[[], None] | None = None,
) -> None:
    """As heartbeat_window, but each simulated runner host renews its leases in batches of up
    to `batch` (POST /leases:renew, issue 16): every lease still renews every H seconds, one
    request carries `batch` of them, and the requests are spread evenly over H.

    Each lease's ack latency is its request's; an accepted item counts as a "200", any other
    item by its status and problem type ("item refused stale-epoch"), so the figures compare
    with the single-heartbeat mode's lease for lease."""
    clients = [CLIENTS[client](base_url, 8) for _ in range(runners)]
    groups = [held[i : i + batch] for i in range(0, len(held), batch)]
    schedule = _Schedule(step, asyncio.get_running_loop())
    schedule.call_at_window(at_window)

    async def run(g: int, group: list[Held]) -> None:
        http, slot = clients[g % runners], schedule.first_slot(g, len(groups), len(group))
        while slot < schedule.end:
            sent, sent_wall_ms = await schedule.until(slot)
            into, t_phase = schedule.phase(slot)
            into.late_ms.extend([(sent - slot) * 1000] * len(group))
            key, answer = await renew_batch(http, group)
            done, done_wall_ms = schedule.loop.time(), time.time() * 1000
            schedule.answered(into, done)
            if (results := batch_results(key, answer)) is None:
                into.heartbeats.answers[key] += len(group)
            else:
                for item in results:
                    if item.get("status") != "accepted":
                        into.heartbeats.answers[item_refusal(item)] += 1
                        continue
                    decided_ms = item.get("serverTime")
                    _accepted(into, t_phase, sent, slot, done, sent_wall_ms, done_wall_ms, decided_ms)
            slot = schedule.next_slot(slot)

    try:
        await asyncio.gather(*(run(g, group) for g, group in enumerate(groups)))
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    schedule.close()
