"""The timer tick scans from a floor, not from the start of the timer index (issue 11/16).

Every renewal deletes a timer entry; a scan from the start of the index steps over each delete
until compaction removes it, so a tick cost grew with the renewals. The processor now keeps, per
partition, a due time below which no live entry exists. These tests prove it changes nothing a
tick decides (a differential property against a tick that always scans from the start, LEASE-5,
EXE-12), and that on RocksDB its cost no longer grows with the deletes.
"""

from __future__ import annotations

import time
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from services.common.clock import ManualClock
from services.common.store import RocksStore
from tests.support.lease_run import T0, renew_cmd, report_cmd

from .test_lease_timers_processor import AT_RISK_MS, LEASE_MS, Coordinator, _claimed, _submitted

RUNS = 4
# one step: (run index, action, milliseconds to move the clock first)
STEPS = st.lists(
    st.tuples(
        st.integers(0, RUNS - 1),
        st.sampled_from(["renew", "tick", "report", "restart", "rewind"]),
        st.integers(0, LEASE_MS),
    ),
    max_size=30,
)


class SteppingClock(ManualClock):
    """The system clock a coordinator reads may step back (NTP, a failover to a host a little
    behind); ManualClock refuses to, so this one is for that case only."""

    def advance(self, ms: int) -> None:
        self._now += ms


class FullScanCoordinator(Coordinator):
    """The reference: a tick that forgets the floor first, so it scans the whole index."""

    def tick(self):  # type: ignore[no-untyped-def]
        self.processor._timer_floor.clear()
        return super().tick()


def _drive(coordinator: Coordinator, steps: list[tuple[int, str, int]]) -> list[tuple[str, str, int]]:
    run_ids = [_submitted(coordinator, f"k{i}") for i in range(RUNS)]
    claims = {r: _claimed(coordinator, r) for r in run_ids}
    renewals = dict.fromkeys(run_ids, 0)
    for index, action, advance in steps:
        run_id = run_ids[index]
        if action == "rewind":
            # a clock that steps back (a failover to a host a little behind): decisions then
            # index timers below the floor a tick left
            coordinator.at(coordinator.clock.now_ms() - advance)
            continue
        coordinator.at(coordinator.clock.now_ms() + advance)
        if action == "renew":
            renewals[run_id] += 1
            coordinator.send(renew_cmd(run_id, claims[run_id].attempt_id, 1, renewals[run_id]))
        elif action == "report":
            renewals[run_id] += 1
            coordinator.send(report_cmd(run_id, claims[run_id].attempt_id, 1, renewals[run_id]))
        elif action == "restart":
            # the same disk: the floor is forgotten, the index kept
            restarted = type(coordinator)(coordinator.log, coordinator.clock, coordinator.store)
            restarted._offsets = coordinator._offsets
            coordinator.processor = restarted.processor
            coordinator.own(*run_ids)
        else:
            coordinator.tick()
    coordinator.at(coordinator.clock.now_ms() + 10 * LEASE_MS).tick()
    coordinator.assert_consistent(*run_ids)
    return [(type(e).__name__, e.run_id, e.occurred_at) for e in coordinator.all_events()]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STEPS)
@example([(0, "tick", 44_000), (1, "rewind", 60_000), (1, "renew", 0), (0, "tick", 5_000)])
def test_a_tick_from_the_floor_decides_exactly_what_a_full_scan_decides_lease_5_exe_12(
    steps: list[tuple[int, str, int]],
) -> None:
    floor = _drive(Coordinator(clock=SteppingClock(T0)), steps)
    assert floor == _drive(FullScanCoordinator(clock=SteppingClock(T0)), steps)
    chunked = Coordinator(clock=SteppingClock(T0))
    chunked.processor._TICK_CHUNK = 1  # every due timer in a transaction of its own
    assert _drive(chunked, steps) == floor


def test_a_timer_indexed_below_the_floor_still_fires_lease_5() -> None:
    """A tick at T0 + 44 s leaves the floor there; the clock then steps back 60 s and a renewal
    indexes an at-risk time (T0 + 29 s) below it. The floor comes down to it, so later ticks
    decide it, as a full scan does (without the lowering, that lease never expired)."""
    steps = [(0, "tick", 44_000), (1, "rewind", 60_000), (1, "renew", 0), (0, "tick", 5_000)]
    from_floor = _drive(Coordinator(clock=SteppingClock(T0)), steps)
    assert from_floor == _drive(FullScanCoordinator(clock=SteppingClock(T0)), steps)
    expired = {run for name, run, _ in from_floor if name == "LeaseExpired"}
    assert len(expired) == RUNS, "every lease expired, the one renewed below the floor too"


def test_many_timers_due_at_once_are_committed_in_chunks() -> None:
    """10 leases running out on the same tick, 3 events per transaction: 4 transactions, every
    lease expired once, the index consistent (10,000 schedules on the minute, issue 15)."""
    coordinator = Coordinator()
    run_ids = [_submitted(coordinator, f"k{i}") for i in range(10)]
    for run_id in run_ids:
        _claimed(coordinator, run_id)
    coordinator.processor._TICK_CHUNK = 3
    commits: list[int] = []
    commit = coordinator.log.commit

    def counted(records):  # type: ignore[no-untyped-def]
        commits.append(len(records))
        return commit(records)

    coordinator.log.commit = counted  # type: ignore[method-assign]
    decided = coordinator.at(T0 + AT_RISK_MS).tick()
    assert len(decided) == 10 and {e.run_id for e in decided} == set(run_ids)
    assert len(commits) == 4
    coordinator.assert_consistent(*run_ids)
    assert coordinator.at(T0 + AT_RISK_MS + 1).tick() == []


def test_the_tick_no_longer_steps_over_every_deleted_timer(tmp_path: Path) -> None:
    """300 runs renewed 40 times each leave 12,000 deleted timer entries behind them."""
    store = RocksStore(tmp_path / "coordinator")
    coordinator = Coordinator(store=store)  # type: ignore[arg-type]
    run_ids = [_submitted(coordinator, f"k{i}") for i in range(300)]
    claims = {r: _claimed(coordinator, r) for r in run_ids}
    for n in range(1, 41):
        coordinator.at(T0 + n * 500)
        coordinator.send(*(renew_cmd(r, claims[r].attempt_id, 1, n) for r in run_ids))
    # The deleted entries' dues (each renewal's old at-risk time) are all behind `now`, the live
    # ones (the last renewal's, at T0 + 65 s) ahead of it.
    now = T0 + 20_000 + AT_RISK_MS - 200
    processor = coordinator.processor

    def tick_ms(ticks: int, *, full_scan: bool) -> float:
        started = time.perf_counter()
        for _ in range(ticks):
            if full_scan:
                processor._timer_floor.clear()
            coordinator.at(coordinator.clock.now_ms() + 1)
            assert processor.tick() == 0
        return (time.perf_counter() - started) / ticks * 1000

    coordinator.at(now)
    processor.tick()  # from the start once: the floor is set
    from_floor, full = tick_ms(50, full_scan=False), tick_ms(10, full_scan=True)
    assert from_floor < full / 3, f"a tick from the floor took {from_floor:.3f} ms, a full scan {full:.3f} ms"
    assert len(coordinator.timers()) == len(run_ids), "one live timer per run, whatever was deleted"
    store.close()
