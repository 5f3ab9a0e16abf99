"""The lease bench's renewal mix (bench/_leases_system.keepalive_fraction; issue 16).

The issue's load is 100,000 runs at Tenure's default 20 s heartbeat and 90 s lease, where the
coordinator puts one renewal an hour on runs.events (one in 180; one in three before the evening
of 2026-12-06) and keeps the rest on runs.renewals. The bench compresses the heartbeat to 1-5 s
at the same 90 s lease; `--logged-every N` sets the keepalive fraction so that its shortest
heartbeat puts one in N there. These tests run the real processor on its in-memory twins to show
that the mixes are what the bench says they are.
"""

from __future__ import annotations

import pytest

from bench._leases_system import LEASE_SECONDS, keepalive_fraction
from services.common.clock import ManualClock
from services.common.contracts import LeaseRenewed
from services.common.eventlog import MemoryEventLog
from services.common.store import MemoryStore
from services.common.topics import RUNS_EVENTS
from services.lease_coordinator.domain import LeasePolicy
from services.lease_coordinator.processor import RunCommandProcessor
from tests.support.lease_run import claim_cmd, renew_cmd

from .strategies import submit_command
from .test_run_processor import CODEC, CommandTopic, log_records


def renewals_on_the_log(lease_s: int, heartbeat_s: int, fraction: float, renewals: int) -> int:
    """How many of `renewals` heartbeats, `heartbeat_s` apart after the one that starts the run,
    the processor puts on runs.events."""
    log, store, clock, topic = MemoryEventLog(), MemoryStore(), ManualClock(), CommandTopic()
    processor = RunCommandProcessor(log, store, CODEC, clock, LeasePolicy(keepalive_fraction=fraction))
    processor.handle([topic.record(submit_command("acme", "k1", command_id="s-1"))])
    run_id = next(key.removeprefix("run/") for key, _ in store.scan("run/"))
    claim = claim_cmd(run_id, command_id="c-1", lease_seconds=lease_s, heartbeat_seconds=heartbeat_s)
    processor.handle([topic.record(claim)])
    lease = processor.load(run_id).lease  # type: ignore[union-attr]
    assert lease is not None
    for sequence in range(1, renewals + 2):  # the first starts the run: always on the log
        renew = renew_cmd(run_id, lease.attempt_id, lease.epoch, sequence, command_id=f"r-{sequence}")
        assert processor.handle([topic.record(renew)]).accepted == 1
        clock.advance(heartbeat_s * 1000)
    on_log = [e for e in (CODEC.decode(r.value) for r in log_records(log, RUNS_EVENTS.name))]
    return sum(1 for e in on_log if isinstance(e, LeaseRenewed)) - 1


def test_tenures_defaults_put_one_renewal_an_hour_on_runs_events() -> None:
    # 40 TTLs of 90 s: at a 20 s heartbeat, one renewal in 180 (an hour), the rest on runs.renewals.
    assert renewals_on_the_log(90, 20, LeasePolicy().keepalive_fraction, renewals=400) == 2


def test_the_defaults_before_2026_12_06_evening_put_one_renewal_in_three_there() -> None:
    # `--logged-every 3` (the bench's figures at "the defaults' mix" until then) is this mix.
    assert renewals_on_the_log(90, 20, 0.5, renewals=30) == 10


@pytest.mark.parametrize(("heartbeat_s", "every"), [(1, 3), (2, 2), (5, 1)])
def test_the_bench_gives_its_shortest_heartbeat_the_same_mix_and_longer_ones_more(
    heartbeat_s: int, every: int
) -> None:
    fraction = keepalive_fraction(3, 1)  # --logged-every 3 at --heartbeat-seconds 5,2,1
    assert renewals_on_the_log(LEASE_SECONDS, heartbeat_s, fraction, renewals=30) == 30 // every
