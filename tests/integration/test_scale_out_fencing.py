"""A lost owner cannot decide: the generation fence (issue 16; LEASE-3, DUR-1).

Coordinator A owns every partition and grants leases; then it is frozen (SIGSTOP) as in a long
pause. B joins, the group evicts A after its session timeout, B takes every partition over and
expires the leases when they run out. Then A is thawed (SIGCONT): its store still holds those
leases as live and its timer work finds them due at once. Its transactional id is its own, so
nothing of Kafka's transactional fencing stops it; what does is the generation check: each
transaction commits its command offsets under the group generation of the assignment it decided
under (services/common/kafka/_group.py), and the group coordinator refuses an evicted member's.
So no expiry is decided twice, the log keeps one event per version, and B's state stays the fold.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from services.common.contracts import ClaimRun
from services.common.ids import run_id_for
from services.common.kafka import CommandPublisher
from services.common.messages import MessageCodec
from services.common.routing import command_record, partition_for_run
from services.common.store import RocksStore
from services.common.topics import RUNS_COMMANDS, RUNS_EVENTS
from services.lease_coordinator.domain import fold
from services.lease_coordinator.state_codec import decode_state
from tests.support.scale import ProcessorFleet
from tests.support.system import decode_all, read_topic, submit_command, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(150)]

LEASE_S = 8


def _events(bootstrap: str, runs: set[str]) -> list[Any]:
    records = read_topic(bootstrap, RUNS_EVENTS.name, RUNS_EVENTS.partitions)
    return [e for e in decode_all(records) if e.run_id in runs]


def _publish_claimed_runs(bootstrap: str, tag: str) -> set[str]:
    """Two runs per partition, each submitted and claimed once with an 8 s lease."""
    codec, runs = MessageCodec(), set()
    publisher = CommandPublisher(bootstrap, client_id="scale-fencing-load")
    per_partition: Counter[int] = Counter()
    try:
        for i in range(1000):
            tenant = f"{tag}-t{i}"
            partition = partition_for_run(run_id_for(tenant, "k"))
            if per_partition[partition] == 2:
                continue
            per_partition[partition] += 1
            submit = submit_command(tenant, f"{tag}-{i}")
            claim = ClaimRun(
                command_id=f"{tag}-claim-{i}",
                run_id=submit.run_id,
                issued_at=int(time.time() * 1000),
                correlation_id=submit.run_id,
                actor="scale-test",
                runner_id="runner-a",
                lease_seconds=LEASE_S,
                heartbeat_seconds=1,
            )
            publisher.publish(command_record(codec, submit)).result(10)
            publisher.publish(command_record(codec, claim)).result(10)
            runs.add(submit.run_id)
            if len(runs) == 2 * RUNS_COMMANDS.partitions:
                break
    finally:
        publisher.close()
    return runs


def test_an_owner_the_group_evicted_cannot_commit_a_decision_LEASE_3_DUR_1(
    tenure_topics: str, tmp_path: Path
) -> None:
    bootstrap = tenure_topics
    fleet = ProcessorFleet(
        "lease-coordinator",
        "services.lease_coordinator",
        "TENURE_COORDINATOR_HEALTH_PORT",
        bootstrap,
        tmp_path,
        RUNS_COMMANDS.partitions,
        TENURE_SESSION_TIMEOUT_S="6",
    )
    runs: set[str] = set()
    outcome = "still running"
    try:
        a = fleet.add("0")
        fleet.wait_covered(60, members=1)
        runs = _publish_claimed_runs(bootstrap, f"fence-{time.time_ns()}")

        def granted() -> bool:
            claimed = {e.run_id for e in _events(bootstrap, runs) if type(e).__name__ == "AttemptClaimed"}
            return claimed == runs

        wait_until(granted, 30, "every lease to be granted by A", poll_s=0.3)
        assert a.process.process is not None
        os.killpg(a.process.process.pid, signal.SIGSTOP)  # A: a long pause, leases still live in its store
        try:
            del fleet.instances["0"]  # B alone has to cover the partitions now
            fleet.add("1")
            owned, took_s = fleet.wait_covered(60, members=1)
            print(f"B took every partition over from the frozen A after {took_s:.1f} s: {dict(owned)}")

            def expired_by_b() -> bool:
                expired = {e.run_id for e in _events(bootstrap, runs) if type(e).__name__ == "LeaseExpired"}
                return expired == runs

            wait_until(expired_by_b, 30, "B to expire every lease", poll_s=0.3)
        finally:
            os.killpg(a.process.process.pid, signal.SIGCONT)
        # A wakes with every lease due in its store; give it time to try.
        try:
            a.process.process.wait(15)
            outcome = f"exited with {a.process.process.returncode}"
        except Exception:
            outcome = "still running (it rejoined before deciding)"
        print(f"A after the thaw: {outcome}")
        fleet.instances["0"] = a
        time.sleep(2)
    except BaseException:
        fleet.stop_all()
        print(fleet.log_tails())
        raise
    finally:
        fleet.stop_all()

    events = _events(bootstrap, runs)
    assert len({e.event_id for e in events}) == len(events), "an event was committed twice"
    expiries = Counter((e.run_id, e.epoch) for e in events if type(e).__name__ == "LeaseExpired")
    assert set(r for r, _ in expiries) == runs
    assert max(expiries.values()) == 1, f"an expiry was decided twice: {expiries}"
    by_run: dict[str, list[Any]] = defaultdict(list)
    for event in events:
        by_run[event.run_id].append(event)
    for run_id, run_events in by_run.items():
        assert [e.version for e in run_events] == list(range(1, len(run_events) + 1)), run_id
    store = RocksStore(fleet.store_path("1", "lease_coordinator") / "runs")
    try:
        stored = {k.removeprefix("run/"): decode_state(v) for k, v in store.scan("run/")}
    finally:
        store.close()
    for run_id in runs:
        assert stored[run_id] == fold(by_run[run_id]), run_id
    fenced = "fenced" in (tmp_path / "lease-coordinator-0.log").read_text(errors="replace")
    print(f"A's log says it was fenced: {fenced}")
