"""One unit of work across the Run and the Trajectory, and the group commit over it (issue 11,
DUR-1, LEASE-3), on the in-memory twin (tests/integration/test_joint_unit_kill.py: real Kafka,
real RocksDB, SIGKILL).

What must hold: a step's intent and the effect's intent it leads to are one transaction; the
fence is the lease as the same unit leaves it; requests waiting together share one transaction
and each gets its own answer; a failed commit changes no store and the retry decides once; a
crash between the transaction and the participants' store writes is repaired by each one's
restore, and redelivery adds nothing.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future
from typing import Any

import pytest

from bench._owner_server import Owner
from services.common.aggregate.changes import Verdict
from services.common.aggregate.group_commit import Answer, Ask, NotOwned
from services.common.aggregate.joint import JointUnit
from services.common.clock import ManualClock
from services.common.eventlog import MemoryEventLog
from services.common.routing import partition_for_run
from services.common.store import MemoryStore
from services.common.topics import RUNS_EVENTS, TRAJECTORIES_EVENTS
from tests.contract.test_aggregate_contract import KillableStore, Killed
from tests.support.owner_flow import (
    CODEC,
    RUN,
    TRAJECTORY,
    Lease,
    claim,
    effect_intent_after,
    owner_of,
    propose,
    start,
    submit,
)

T0 = 1_767_225_600_000


class ClockAt(ManualClock):
    def __init__(self) -> None:
        super().__init__(T0)


def answers(future: Future[tuple[Answer, ...]]) -> tuple[Answer, ...]:
    return future.result(timeout=10)


def decided(owner: Owner, first: Ask, *then: Any) -> tuple[Answer, ...]:
    """One request, decided in a unit of its own."""
    future = owner.committer.submit(first, *then)
    owner.committer.start()
    try:
        return answers(future)
    finally:
        owner.committer.stop()


def opened(owner: Owner, key: str) -> Lease:
    """A run submitted and claimed, its trajectory opened."""
    (submitted,) = decided(owner, Ask(RUN, submit(key, T0)))
    run_id = submitted.state.run_id
    (claimed,) = decided(owner, Ask(RUN, claim(run_id, T0)))
    lease = Lease(run_id, claimed.state.lease.attempt_id, claimed.state.lease.epoch)
    (started,) = decided(owner, Ask(TRAJECTORY, start(lease, T0)))
    assert started.verdict.outcome == Verdict.ACCEPTED
    return lease


def events(log: MemoryEventLog, topic: str) -> list[Any]:
    return [
        CODEC.decode(r.value) for (name, _), rs in sorted(log.topics.items()) if name == topic for r in rs
    ]


def assert_each_store_is_the_fold(log: MemoryEventLog, owner: Owner) -> None:
    """DUR-1 for both participants: versions 1, 2, 3 ... and each state the fold of its events."""
    for processor in (owner.runs, owner.trajectories):
        definition = processor.definition
        by_id: dict[str, list[Any]] = {}
        for event in events(log, definition.events_topic):
            by_id.setdefault(definition.aggregate_id(event), []).append(event)
        for aggregate_id, history in by_id.items():
            assert [definition.event_version(e) for e in history] == list(range(1, len(history) + 1))
            state = None
            for event in history:
                state = definition.evolve(state, event)
            assert processor.load(aggregate_id) == state, aggregate_id


def test_a_step_and_the_effect_intent_it_leads_to_are_one_transaction_lease_3() -> None:
    log = MemoryEventLog()
    owner = owner_of(log, MemoryStore(), MemoryStore(), ClockAt())
    lease = opened(owner, "one")
    before = owner.log.transactions
    step, intent = decided(owner, Ask(TRAJECTORY, propose(lease, "s0", T0)), effect_intent_after(lease, T0))
    assert (step.verdict.outcome, intent.verdict.outcome) == (Verdict.ACCEPTED, Verdict.ACCEPTED)
    assert owner.log.transactions == before + 1, "the step's intent and the effect's intent: one transaction"
    assert type(events(log, TRAJECTORIES_EVENTS.name)[-1]).__name__ == "StepIntentRecorded"
    assert type(events(log, RUNS_EVENTS.name)[-1]).__name__ == "EffectIntentRecorded"
    assert intent.state.effects, "the answer carries the Run as the unit left it"
    assert_each_store_is_the_fold(log, owner)


def test_the_fence_is_the_lease_the_run_holds_as_the_same_unit_leaves_it_lease_3() -> None:
    """A proposal under an epoch the Run never granted: the Trajectory records the step (it
    takes a higher epoch for a takeover it has not heard of yet), and the Run, deciding the
    effect's intent in the same unit against its own lease, refuses it: no effect intent."""
    log = MemoryEventLog()
    owner = owner_of(log, MemoryStore(), MemoryStore(), ClockAt())
    lease = opened(owner, "fenced")
    ahead = lease.epoch + 1
    step, intent = decided(
        owner,
        Ask(TRAJECTORY, propose(lease, "s0", T0, epoch=ahead)),
        effect_intent_after(lease, T0, epoch=ahead),
    )
    assert step.verdict.outcome == Verdict.ACCEPTED
    assert intent.verdict.outcome == Verdict.REFUSED and intent.verdict.refusal is not None
    assert not any(type(e).__name__ == "EffectIntentRecorded" for e in events(log, RUNS_EVENTS.name))
    assert_each_store_is_the_fold(log, owner)


def test_requests_waiting_together_share_one_transaction_each_with_its_own_answer() -> None:
    log = MemoryEventLog()
    owner = owner_of(log, MemoryStore(), MemoryStore(), ClockAt())
    leases = [opened(owner, f"k{i}") for i in range(6)]
    before = owner.log.transactions
    futures = [
        owner.committer.submit(Ask(TRAJECTORY, propose(lease, "s0", T0)), effect_intent_after(lease, T0))
        for lease in leases
    ]
    owner.committer.start()
    try:
        results = [answers(f) for f in futures]
    finally:
        owner.committer.stop()
    assert owner.log.transactions == before + 1, "six requests, one unit, one transaction"
    assert [r[0].state.run_id for r in results] == [lease.run_id for lease in leases]
    assert all(r[1].verdict.outcome == Verdict.ACCEPTED for r in results)
    # Each lease was opened by three requests of a unit each; then one unit of six requests.
    assert (owner.committer.units, owner.committer.requests) == (3 * 6 + 1, 3 * 6 + 6)


def test_a_malformed_or_unowned_command_fails_its_own_request_only() -> None:
    owner = owner_of(MemoryEventLog(), MemoryStore(), MemoryStore(), ClockAt())
    lease = opened(owner, "ok")
    malformed = owner.committer.submit(Ask(RUN, claim("not-a-run", T0)))
    unknown = owner.committer.submit(Ask("nobody", claim(lease.run_id, T0)))
    good = owner.committer.submit(Ask(TRAJECTORY, propose(lease, "s0", T0)), effect_intent_after(lease, T0))
    owner.committer.start()
    try:
        with pytest.raises(ValueError, match="not a run id"):
            answers(malformed)
        with pytest.raises(ValueError, match="nobody"):
            answers(unknown)
        assert [a.verdict.outcome for a in answers(good)] == [Verdict.ACCEPTED, Verdict.ACCEPTED]
    finally:
        owner.committer.stop()


def test_a_command_of_a_partition_the_unit_did_not_restore_is_not_decided_here() -> None:
    """An owner restores its assignment before each unit; a command of another partition (one a
    `then` made, say) belongs to another owner and fails its request with NotOwned."""
    owner = owner_of(MemoryEventLog(), MemoryStore(), MemoryStore(), ClockAt())
    owner.joint.owned = frozenset({0})
    tenants = [submit("k", T0, tenant=f"tenant-{i}") for i in range(200)]
    here = next(c for c in tenants if partition_for_run(c.run_id) == 0)
    away = next(c for c in tenants if partition_for_run(c.run_id) != 0)
    moved = owner.committer.submit(Ask(RUN, here), lambda _answer: Ask(RUN, away))
    owner.committer.start()
    try:
        with pytest.raises(NotOwned):
            answers(moved)
    finally:
        owner.committer.stop()
    assert owner.runs.load(here.run_id) is not None, "the request's first command was decided"
    assert owner.runs.load(away.run_id) is None


def test_a_failed_commit_changes_no_store_and_every_request_learns_of_it_then_the_retry_decides_once() -> (
    None
):
    log = MemoryEventLog()
    runs, trajectories = MemoryStore(), MemoryStore()
    owner = owner_of(log, runs, trajectories, ClockAt())
    lease = opened(owner, "retry")
    stores_before = (dict(runs.scan("")), dict(trajectories.scan("")))
    log.fail_next_commit = True
    with pytest.raises(ConnectionError):
        decided(owner, Ask(TRAJECTORY, propose(lease, "s0", T0)), effect_intent_after(lease, T0))
    assert (dict(runs.scan("")), dict(trajectories.scan(""))) == stores_before
    step, intent = decided(owner, Ask(TRAJECTORY, propose(lease, "s0", T0)), effect_intent_after(lease, T0))
    assert (step.verdict.outcome, intent.verdict.outcome) == (Verdict.ACCEPTED, Verdict.ACCEPTED)
    again = decided(owner, Ask(TRAJECTORY, propose(lease, "s0", T0)), effect_intent_after(lease, T0))
    assert [a.verdict.outcome for a in again] == [Verdict.DUPLICATE, Verdict.DUPLICATE]
    assert sum(type(e).__name__ == "StepIntentRecorded" for e in events(log, TRAJECTORIES_EVENTS.name)) == 1
    assert sum(type(e).__name__ == "EffectIntentRecorded" for e in events(log, RUNS_EVENTS.name)) == 1
    assert_each_store_is_the_fold(log, owner)


@pytest.mark.parametrize("dies_before", ["run", "trajectory"])
def test_a_crash_between_the_transaction_and_a_store_write_is_repaired_by_the_restore_dur_1(
    dies_before: str,
) -> None:
    """SIGKILL after the joint transaction, before one participant's store write (the Run's
    is first: the names' order): a new incarnation restores both from the log, and the
    redelivered request finds both decisions made."""
    log = MemoryEventLog()
    runs, trajectories = KillableStore(), KillableStore()
    owner = owner_of(log, runs, trajectories, ClockAt())
    lease = opened(owner, "crash")
    (runs if dies_before == "run" else trajectories).kill_on_next_write = True
    with contextlib.suppress(Killed):
        decided(owner, Ask(TRAJECTORY, propose(lease, "s0", T0)), effect_intent_after(lease, T0))
    survivor = owner_of(log, runs, trajectories, ClockAt())  # restored from the log
    assert_each_store_is_the_fold(log, survivor)
    redelivered = decided(survivor, Ask(TRAJECTORY, propose(lease, "s0", T0)), effect_intent_after(lease, T0))
    assert [a.verdict.outcome for a in redelivered] == [Verdict.DUPLICATE, Verdict.DUPLICATE]
    assert sum(type(e).__name__ == "EffectIntentRecorded" for e in events(log, RUNS_EVENTS.name)) == 1


def test_participants_must_share_one_log_and_own_distinct_topics() -> None:
    owner = owner_of(MemoryEventLog(), MemoryStore(), MemoryStore(), ClockAt())
    with pytest.raises(ValueError, match="does not write through"):
        JointUnit(MemoryEventLog(), [owner.runs, owner.trajectories])
    twin = owner_of(owner.runs.event_log, MemoryStore(), MemoryStore(), ClockAt())
    with pytest.raises(ValueError, match="distinct definitions"):
        JointUnit(owner.runs.event_log, [owner.runs, twin.runs])
