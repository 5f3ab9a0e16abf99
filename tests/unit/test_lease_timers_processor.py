"""Lease timers in the Run command processor: at-risk, expiry and requeue on the coordinator's clock.

RunCommandProcessor runs over the in-memory twins (MemoryEventLog, MemoryStore, ManualClock);
commands arrive as InboundRecords of runs.commands and `tick()` is what the stream runtime calls
on its timer. Proves LEASE-4/LEASE-5 (jeopardy and expiry decided on the server's clock, from the
last confirmed renewal), EXE-5 (lease loss interrupts; retry-safe runs with attempts left are
requeued and claimed again with a higher epoch) and EXE-12 (stale leases are found after a
restart: the timers come back from the log, nothing is silently extended or dropped).
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Mapping

import pytest

from services.common.clock import ManualClock
from services.common.contracts import (
    AttemptClaimed,
    CommandRejected,
    LeaseAtRisk,
    LeaseExpired,
    LeaseRenewed,
    RunCommand,
    RunEvent,
    RunRequeued,
)
from services.common.eventlog import MemoryEventLog
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec
from services.common.store import MemoryStore
from services.common.topics import RUNS_COMMANDS, RUNS_EVENTS, RUNS_REJECTIONS
from services.lease_coordinator.domain import (
    LeaseCertainty,
    RunState,
    RunStatus,
    attempt_id_for,
    fold,
    next_timer_at,
)
from services.lease_coordinator.processor import RunCommandProcessor, state_key, timer_key
from services.lease_coordinator.state_codec import decode_state
from tests.support.lease_run import T0, claim_cmd, renew_cmd, report_cmd, takeover_cmd

from .strategies import submit_command

CODEC = MessageCodec()
PARTITIONS = RUNS_COMMANDS.partitions
LEASE_MS, AT_RISK_MS = 90_000, 45_000  # EXE-4 defaults; at risk after half the TTL


def partition_of(run_id: str) -> int:
    return zlib.crc32(run_id.encode("utf-8")) % PARTITIONS


class Coordinator:
    """One incarnation of the lease coordinator: a processor, its store, and the shared log."""

    def __init__(
        self,
        log: MemoryEventLog | None = None,
        clock: ManualClock | None = None,
        store: MemoryStore | None = None,
    ) -> None:
        self.log = log or MemoryEventLog(PARTITIONS)
        self.clock = clock or ManualClock(T0)
        self.store = store if store is not None else MemoryStore()
        self.processor = RunCommandProcessor(self.log, self.store, CODEC, self.clock)
        self._offsets: dict[int, int] = defaultdict(int)

    def restart(self, *, keep_store: bool = False) -> Coordinator:
        """A new process on the same log: with its old disk, or on a new machine (fresh store)."""
        return Coordinator(self.log, self.clock, self.store if keep_store else MemoryStore())

    def own(self, *run_ids: str) -> None:
        self.processor.restore_partitions({partition_of(r) for r in run_ids})

    def send(self, *commands: RunCommand) -> None:
        records = []
        for command in commands:
            partition = partition_of(command.run_id)
            out = CODEC.outbound(RUNS_COMMANDS.name, command.run_id, command, partition)
            records.append(InboundRecord(out.topic, partition, self._offsets[partition], out.key, out.value))
            self._offsets[partition] += 1
        self.processor.handle(records)

    def at(self, ms: int) -> Coordinator:
        self.clock.advance(ms - self.clock.now_ms())
        return self

    def tick(self) -> list[RunEvent]:
        seen = {e.event_id for e in self.all_events()}
        written = self.processor.tick()
        new = [e for e in self.all_events() if e.event_id not in seen]
        assert written == len(new)
        return new

    def _decoded(self, topic: str) -> list[object]:
        return [
            CODEC.decode(r.value)
            for (t, _), records in sorted(self.log.topics.items())
            if t == topic
            for r in records
        ]

    def all_events(self) -> list[RunEvent]:
        return self._decoded(RUNS_EVENTS.name)  # type: ignore[return-value]

    def events(self, run_id: str) -> list[RunEvent]:
        return [e for e in self.all_events() if e.run_id == run_id]

    def rejections(self, run_id: str) -> list[CommandRejected]:
        decoded = self._decoded(RUNS_REJECTIONS.name)
        return [r for r in decoded if isinstance(r, CommandRejected) and r.run_id == run_id]

    def state(self, run_id: str) -> RunState:
        raw = self.store.get(state_key(run_id))
        assert raw is not None, f"no stored state for {run_id}"
        return decode_state(raw)

    def timers(self) -> list[str]:
        return [key for key, _ in self.store.scan("timer/")]

    def assert_consistent(self, *run_ids: str) -> None:
        """The stored state is the log's fold and the timer index holds exactly its next timer."""
        expected_timers = []
        for run_id in run_ids:
            state = self.state(run_id)
            assert fold(self.events(run_id)) == state
            due = next_timer_at(state)
            if due is not None:
                expected_timers.append(timer_key(partition_of(run_id), due, run_id))
        assert self.timers() == sorted(expected_timers)


def deadline_timer(coordinator: Coordinator, run_id: str) -> str:
    """The timer a run keeps when it holds no lease: its deadline (EXE-10)."""
    deadline = coordinator.state(run_id).deadline_at
    assert deadline is not None
    return timer_key(partition_of(run_id), deadline, run_id)


def _submitted(coordinator: Coordinator, key: str = "k1", **kwargs: object) -> str:
    submit = submit_command("acme", key, command_id=f"submit-{key}", **kwargs)  # type: ignore[arg-type]
    coordinator.own(submit.run_id)
    coordinator.send(submit)
    return submit.run_id


def _claimed(coordinator: Coordinator, run_id: str, runner: str = "runner-a") -> AttemptClaimed:
    coordinator.send(claim_cmd(run_id, runner))
    claimed = coordinator.events(run_id)[-1]
    assert isinstance(claimed, AttemptClaimed)
    return claimed


def test_no_renewal_for_the_at_risk_fraction_of_the_ttl_marks_the_lease_at_risk_lease_4_lease_5() -> None:
    coordinator = Coordinator()
    run_id = _submitted(coordinator)
    coordinator.at(T0 + 1_000)
    claimed = _claimed(coordinator, run_id)
    coordinator.assert_consistent(run_id)
    assert coordinator.timers() == [timer_key(partition_of(run_id), T0 + 1_000 + AT_RISK_MS, run_id)]

    assert coordinator.at(T0 + 1_000 + AT_RISK_MS - 1).tick() == []
    (at_risk,) = coordinator.at(T0 + 1_000 + AT_RISK_MS).tick()
    assert isinstance(at_risk, LeaseAtRisk)
    assert at_risk.occurred_at == T0 + 1_000 + AT_RISK_MS, "decided on the coordinator's clock"
    assert (at_risk.epoch, at_risk.lease_id, at_risk.expires_at) == (1, claimed.lease_id, claimed.expires_at)
    assert at_risk.last_renewal_at == T0 + 1_000
    state = coordinator.state(run_id)
    assert state.lease is not None and state.lease.certainty is LeaseCertainty.AT_RISK
    assert state.status is RunStatus.PREPARING, "jeopardy is not loss"
    assert coordinator.tick() == [], "recorded once"
    coordinator.assert_consistent(run_id)


def test_expiry_is_recorded_at_the_ticks_now_and_interrupts_a_run_that_is_not_retry_safe_exe_5() -> None:
    coordinator = Coordinator()
    run_id = _submitted(coordinator, retry_safe=False)
    claimed = _claimed(coordinator, run_id)
    coordinator.send(renew_cmd(run_id, claimed.attempt_id, 1, 1))  # running now
    (at_risk,) = coordinator.at(claimed.expires_at - 1).tick()
    assert isinstance(at_risk, LeaseAtRisk)
    assert coordinator.tick() == []
    late = claimed.expires_at + 4_321  # the tick came a little after the deadline
    (expired,) = coordinator.at(late).tick()
    assert isinstance(expired, LeaseExpired)
    assert expired.occurred_at == late >= expired.expires_at == claimed.expires_at
    assert (expired.attempt_id, expired.epoch, expired.last_sequence) == (claimed.attempt_id, 1, 1)
    assert coordinator.state(run_id).status is RunStatus.INTERRUPTED
    assert coordinator.at(late + LEASE_MS).tick() == [], "no requeue, no second expiry"
    assert coordinator.timers() == [deadline_timer(coordinator, run_id)], "no lease timer is left"
    coordinator.send(claim_cmd(run_id, "runner-b"))
    assert [r.code for r in coordinator.rejections(run_id)] == ["RUN_NOT_CLAIMABLE"]
    coordinator.assert_consistent(run_id)


def test_a_retry_safe_run_with_attempts_left_is_requeued_and_claimed_again_with_epoch_2_exe_5() -> None:
    coordinator = Coordinator()
    run_id = _submitted(coordinator, retry_safe=True, max_attempts=3)
    first = _claimed(coordinator, run_id, "runner-a")
    events = coordinator.at(first.expires_at).tick()
    assert [type(e) for e in events] == [LeaseExpired, RunRequeued], "one tick, one atomic commit"
    expired, requeued = events
    assert requeued.version == expired.version + 1 and requeued.occurred_at == expired.occurred_at
    assert isinstance(requeued, RunRequeued)
    assert (requeued.reason, requeued.attempts_used, requeued.attempts_remaining) == ("LEASE_EXPIRED", 1, 2)
    assert coordinator.state(run_id).status is RunStatus.QUEUED
    assert coordinator.timers() == [deadline_timer(coordinator, run_id)], "no lease timer is left"

    coordinator.at(first.expires_at + 5_000)
    second = _claimed(coordinator, run_id, "runner-b")
    assert (second.epoch, second.attempt_number) == (2, 2)
    assert second.attempt_id == attempt_id_for(run_id, 2) != first.attempt_id
    assert second.expires_at == first.expires_at + 5_000 + LEASE_MS
    # The first runner comes back and is refused: its epoch is stale (EXE-4, LEASE-3).
    coordinator.send(renew_cmd(run_id, first.attempt_id, 1, 1), report_cmd(run_id, first.attempt_id, 1, 2))
    assert [r.code for r in coordinator.rejections(run_id)] == ["STALE_EPOCH", "STALE_EPOCH"]
    state = coordinator.state(run_id)
    assert (state.epoch, state.status) == (2, RunStatus.PREPARING)
    coordinator.assert_consistent(run_id)


def test_a_retry_safe_run_without_attempts_left_stays_interrupted_exe_5() -> None:
    coordinator = Coordinator()
    run_id = _submitted(coordinator, retry_safe=True, max_attempts=1)
    claimed = _claimed(coordinator, run_id)
    assert [type(e) for e in coordinator.at(claimed.expires_at).tick()] == [LeaseExpired]
    assert coordinator.state(run_id).status is RunStatus.INTERRUPTED
    coordinator.assert_consistent(run_id)


def test_a_renewal_moves_the_timer_no_expiry_at_the_old_time_lease_5() -> None:
    coordinator = Coordinator()
    run_id = _submitted(coordinator)
    claimed = _claimed(coordinator, run_id)  # at T0: at risk at T0+45 s, expiry at T0+90 s
    coordinator.at(T0 + 30_000).send(renew_cmd(run_id, claimed.attempt_id, 1, 1))
    renewed = coordinator.events(run_id)[-1]
    assert isinstance(renewed, LeaseRenewed) and renewed.expires_at == T0 + 30_000 + LEASE_MS
    coordinator.assert_consistent(run_id)
    assert coordinator.at(T0 + AT_RISK_MS).tick() == [], "the old at-risk time passed quietly"
    (at_risk,) = coordinator.at(claimed.expires_at).tick()
    assert isinstance(at_risk, LeaseAtRisk), "at the old expiry the lease is only at risk"
    assert at_risk.last_renewal_at == T0 + 30_000

    coordinator.at(T0 + 100_000).send(renew_cmd(run_id, claimed.attempt_id, 1, 2))
    assert coordinator.state(run_id).lease.certainty is LeaseCertainty.ACTIVE  # type: ignore[union-attr]
    assert coordinator.at(renewed.expires_at).tick() == [], "nor at the second-oldest"
    coordinator.assert_consistent(run_id)
    (late_risk,) = coordinator.at(T0 + 100_000 + AT_RISK_MS).tick()
    assert isinstance(late_risk, LeaseAtRisk)
    assert coordinator.at(T0 + 100_000 + LEASE_MS - 1).tick() == []
    (expired,) = coordinator.at(T0 + 100_000 + LEASE_MS).tick()
    assert isinstance(expired, LeaseExpired) and expired.expires_at == T0 + 100_000 + LEASE_MS
    coordinator.assert_consistent(run_id)


def test_a_takeover_replaces_the_timer_the_old_lease_never_fires_lease_6() -> None:
    coordinator = Coordinator()
    run_id = _submitted(coordinator)
    claimed = _claimed(coordinator, run_id)
    coordinator.at(T0 + 10_000).send(takeover_cmd(run_id, lease_seconds=30))
    coordinator.assert_consistent(run_id)
    (at_risk,) = coordinator.at(T0 + 10_000 + 15_000).tick()
    assert isinstance(at_risk, LeaseAtRisk) and at_risk.epoch == 2
    (expired,) = coordinator.at(T0 + 10_000 + 30_000).tick()
    assert isinstance(expired, LeaseExpired) and expired.epoch == 2
    assert coordinator.at(claimed.expires_at).tick() == [], "the revoked lease has no timer left"
    coordinator.assert_consistent(run_id)


def test_a_reported_run_leaves_no_timer_behind_exe_4() -> None:
    coordinator = Coordinator()
    run_id = _submitted(coordinator)
    claimed = _claimed(coordinator, run_id)
    coordinator.send(
        renew_cmd(run_id, claimed.attempt_id, 1, 1), report_cmd(run_id, claimed.attempt_id, 1, 2)
    )
    assert coordinator.state(run_id).status is RunStatus.SUCCEEDED
    assert coordinator.timers() == []
    assert coordinator.at(claimed.expires_at + LEASE_MS).tick() == []
    coordinator.assert_consistent(run_id)


@pytest.mark.parametrize("keep_store", [False, True], ids=["fresh-store", "same-store"])
@pytest.mark.parametrize("at_risk_before_restart", [False, True], ids=["active", "at-risk"])
def test_a_restarted_coordinator_restores_the_timers_from_the_log_lease_5_exe_12(
    keep_store: bool, at_risk_before_restart: bool
) -> None:
    """Nothing silently extended or dropped: the new incarnation expires the lease at exactly the
    expiry the old one granted, on its own clock, and marks it at risk at the same time too."""
    old = Coordinator()
    run_id = _submitted(old)
    claimed = _claimed(old, run_id)
    old.at(T0 + 20_000).send(renew_cmd(run_id, claimed.attempt_id, 1, 1))
    expires_at, at_risk_at = T0 + 20_000 + LEASE_MS, T0 + 20_000 + AT_RISK_MS
    if at_risk_before_restart:
        assert len(old.at(at_risk_at).tick()) == 1
    logged = old.all_events()

    new = old.restart(keep_store=keep_store)  # the old process is gone; nothing was acknowledged since
    new.own(run_id)
    assert new.all_events() == logged
    restored = new.state(run_id)
    assert restored == fold(logged), "the restore is the log's fold"
    assert restored.lease is not None and restored.lease.expires_at == expires_at, "not extended"
    new.assert_consistent(run_id)
    if not at_risk_before_restart:
        assert new.at(at_risk_at - 1).tick() == []
        (at_risk,) = new.at(at_risk_at).tick()
        assert isinstance(at_risk, LeaseAtRisk)
    assert new.at(expires_at - 1).tick() == [], "not expired early"
    (expired,) = new.at(expires_at).tick()
    assert isinstance(expired, LeaseExpired) and expired.occurred_at == expires_at == expired.expires_at
    assert [e.version for e in new.events(run_id)] == list(range(1, len(new.events(run_id)) + 1))
    new.assert_consistent(run_id)


def test_a_lease_that_ran_out_while_no_coordinator_was_running_expires_on_the_first_tick_exe_12() -> None:
    old = Coordinator()
    runs = [_submitted(old, f"k{i}", retry_safe=True) for i in range(3)]
    claims = [_claimed(old, run_id, f"runner-{i}") for i, run_id in enumerate(runs)]
    down_until = T0 + 10 * LEASE_MS
    new = old.restart()
    new.clock.advance(down_until - new.clock.now_ms())
    new.own(*runs)
    events = new.tick()
    assert {(type(e).__name__, e.run_id) for e in events} == {
        (kind, r) for r in runs for kind in ("LeaseExpired", "RunRequeued")
    }, "every stale lease is found, none dropped"
    for expired in (e for e in events if isinstance(e, LeaseExpired)):
        assert expired.occurred_at == down_until, "recorded when it was decided"
        assert expired.expires_at == next(c.expires_at for c in claims if c.run_id == expired.run_id)
    new.assert_consistent(*runs)


class LosingStore(MemoryStore):
    """A store whose next write is lost: the process died after the commit, before step 4."""

    def __init__(self) -> None:
        super().__init__()
        self.lose_next_write = False

    def write(self, puts: Mapping[str, bytes], deletes: tuple[str, ...] = ()) -> None:
        if self.lose_next_write:
            self.lose_next_write = False
            raise RuntimeError("killed between the Kafka commit and the store write")
        super().write(puts, deletes)


def test_a_tick_whose_store_write_was_lost_is_not_decided_twice_dur_1() -> None:
    store = LosingStore()
    coordinator = Coordinator(store=store)
    run_id = _submitted(coordinator)
    claimed = _claimed(coordinator, run_id)
    coordinator.at(T0 + AT_RISK_MS)
    store.lose_next_write = True
    with pytest.raises(RuntimeError):
        coordinator.processor.tick()
    assert isinstance(coordinator.events(run_id)[-1], LeaseAtRisk), "the commit landed"
    assert coordinator.tick() == [], "the next tick restores first and finds nothing new to decide"
    coordinator.assert_consistent(run_id)
    assert [type(e) for e in coordinator.at(claimed.expires_at).tick()] == [LeaseExpired]
    assert sum(isinstance(e, LeaseAtRisk) for e in coordinator.events(run_id)) == 1
    coordinator.assert_consistent(run_id)


def test_a_processor_ticks_only_the_partitions_it_owns() -> None:
    coordinator = Coordinator()
    run_id = _submitted(coordinator)
    claimed = _claimed(coordinator, run_id)
    coordinator.processor.forget_assignment()
    assert coordinator.at(claimed.expires_at).tick() == [], "a revoked partition is someone else's"
    coordinator.own(run_id)
    assert [type(e) for e in coordinator.tick()] == [LeaseExpired]


def test_a_success_report_before_the_first_heartbeat_does_not_wedge_the_partition_exe_4() -> None:
    """A short task can finish before its first heartbeat. Whatever the coordinator answers, the
    batch must be decided: if `handle` raises, the stream runtime (services/common/streams)
    retries and then exits the process so the batch is redelivered to the next incarnation, which
    raises again. That crash loop stops every run the coordinator owns, commands and timers."""
    coordinator = Coordinator()
    run_id = _submitted(coordinator)
    claimed = _claimed(coordinator, run_id)
    coordinator.send(report_cmd(run_id, claimed.attempt_id, 1, 1, "succeeded"))  # must not raise
    answered = [r.code for r in coordinator.rejections(run_id)] or [coordinator.state(run_id).status.value]
    assert answered in (["INVALID_TRANSITION"], ["succeeded"])
    coordinator.assert_consistent(run_id)
