"""The lease protocol of the Run aggregate, pure: claim, renew and report (takeover, effects and
timers are in test_lease_takeover_effects_timers.py).

Proves, at the level of `decide` / `evolve` / `decide_timers` (no Kafka, no clock reads):
LEASE-2 (the lease state holds holder, issue time, expiry, certainty, epoch and effects),
LEASE-3 (epochs only grow, one per change of holder, and a stale holder is refused everywhere),
LEASE-4/LEASE-5 (at-risk and expiry on the coordinator's clock), LEASE-6/LEASE-7 (takeover
revokes, re-grants with epoch + 1 and keeps the evidence), EXE-3 (attempt ids name their run),
EXE-4 (defaults 90 s / 20 s, fenced heartbeats and reports, stale epoch changes nothing) and
EXE-5 (lease loss interrupts; automatic retry only when retry-safe with attempts left).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.contracts import (
    AttemptClaimed,
    AttemptReported,
    LeaseAtRisk,
    LeaseExpired,
    LeaseRenewed,
    RunFailed,
    RunInterrupted,
    RunRequeued,
)
from services.common.ids import run_id_for
from services.lease_coordinator.domain import (
    DEFAULT_POLICY,
    LeaseCertainty,
    LeasePolicy,
    Rejection,
    RejectionCode,
    RunStatus,
    attempt_id_for,
    decide,
    decide_timers,
    fold,
    next_timer_at,
    run_id_of_attempt,
)
from tests.support.lease_run import (
    T0,
    Run,
    claim_cmd,
    command_id_for,
    events_of,
    intent_cmd,
    rejection_of,
    renew_cmd,
    report_cmd,
)

from .strategies import cancel_command

# --- claim -------------------------------------------------------------------------------------


def test_claim_of_a_queued_run_grants_epoch_one_with_the_exe_4_defaults_lease_2_lease_3() -> None:
    run = Run()
    run.at(T0 + 1_234)
    claimed = run.claim("runner-a")

    assert (claimed.epoch, claimed.attempt_number, claimed.version) == (1, 1, 2)
    assert claimed.attempt_id == attempt_id_for(run.run_id, 1)
    assert run_id_of_attempt(claimed.attempt_id) == run.run_id, "EXE-3: the attempt id names its run"
    # EXE-4: lease 90 s, heartbeat every 20 s, from the policy; expiry on the coordinator's clock.
    assert DEFAULT_POLICY.default_lease_ms == 90_000 and DEFAULT_POLICY.default_heartbeat_ms == 20_000
    assert (claimed.lease_seconds, claimed.heartbeat_seconds) == (90, 20)
    assert claimed.at_risk_after_ms == int(90_000 * DEFAULT_POLICY.at_risk_fraction)
    assert claimed.occurred_at == run.now
    assert claimed.expires_at == run.now + 90_000
    assert (claimed.holder, claimed.holder_kind) == ("runner-a", "runner")
    assert claimed.capabilities == ("checkpoint-v1",)

    state = run.state
    assert state.status is RunStatus.PREPARING
    assert (state.epoch, state.attempts_used) == (1, 1)
    lease = state.lease
    assert lease is not None and lease.held
    assert (lease.attempt_id, lease.lease_id, lease.epoch) == (claimed.attempt_id, claimed.lease_id, 1)
    assert (lease.holder, lease.issued_at, lease.last_renewal_at) == ("runner-a", run.now, run.now)
    assert (lease.lease_ms, lease.heartbeat_ms, lease.expires_at) == (90_000, 20_000, run.now + 90_000)
    assert (lease.last_sequence, lease.certainty) == (0, LeaseCertainty.ACTIVE)


def _fresh(run: Run) -> None:
    pass


def _after_one_expiry(run: Run) -> None:
    run.claim("runner-a")
    run.expire()


def _after_takeover_and_expiry(run: Run) -> None:
    run.claim("runner-a")
    run.take_over()
    run.expire()


@pytest.mark.parametrize(
    ("history", "previous_epoch"),
    [(_fresh, 0), (_after_one_expiry, 1), (_after_takeover_and_expiry, 2)],
    ids=["fresh", "after-expiry", "after-takeover-and-expiry"],
)
def test_claim_epoch_is_the_previous_epoch_plus_one_lease_3(history: Any, previous_epoch: int) -> None:
    run = Run(retry_safe=True, max_attempts=3)
    history(run)
    assert run.state.status is RunStatus.QUEUED
    assert run.state.epoch == previous_epoch
    claimed = run.claim("runner-z")
    assert claimed.epoch == previous_epoch + 1
    assert claimed.attempt_id == attempt_id_for(run.run_id, previous_epoch + 1)
    assert claimed.lease_id not in {e.lease_id for e in run.events[:-1] if hasattr(e, "lease_id")}


@settings(max_examples=60, deadline=None)
@given(
    tenant=st.text(min_size=1, max_size=12),
    key=st.text(min_size=1, max_size=12),
    epoch=st.integers(min_value=1, max_value=10**6),
)
def test_attempt_ids_name_their_run_round_trip_exe_3(tenant: str, key: str, epoch: int) -> None:
    run_id = run_id_for(tenant, key)
    attempt_id = attempt_id_for(run_id, epoch)
    assert run_id_of_attempt(attempt_id) == run_id
    assert attempt_id.endswith(f"_{epoch}")


@pytest.mark.parametrize("bad", ["", "att", "att_abc", "run_abc_1", "att_abc_x", "att_a_b_1", "att_abc_-1"])
def test_malformed_attempt_ids_name_no_run_exe_3(bad: str) -> None:
    assert run_id_of_attempt(bad) is None


@pytest.mark.parametrize(
    ("lease_seconds", "heartbeat_seconds", "granted"),
    [
        (30, 10, (30, 10, 15_000)),
        (60, 0, (60, 20, 30_000)),  # the default heartbeat fits
        (30, 0, (30, 10, 15_000)),  # the default heartbeat is capped at a third of a short lease
        (3600, 600, (3600, 600, 1_800_000)),  # the upper bound itself
        (90, 45, (90, 30, 45_000)),  # half is allowed, then capped at a third
    ],
)
def test_per_run_lease_terms_within_bounds_are_granted_exe_4(
    lease_seconds: int, heartbeat_seconds: int, granted: tuple[int, int, int]
) -> None:
    run = Run()
    claimed = run.claim(lease_seconds=lease_seconds, heartbeat_seconds=heartbeat_seconds)
    assert (claimed.lease_seconds, claimed.heartbeat_seconds, claimed.at_risk_after_ms) == granted
    assert claimed.expires_at == run.now + lease_seconds * 1000


@pytest.mark.parametrize(
    "changes",
    [
        {"lease_seconds": 3601},
        {"lease_seconds": 10**6},
        {"lease_seconds": 30, "heartbeat_seconds": 16},
        {"lease_seconds": 10, "heartbeat_seconds": 6},
        {"lease_seconds": 90, "heartbeat_seconds": 90},
        {"runner": ""},
        {"runner": "   "},
        {"holder_kind": "robot"},
    ],
    ids=[
        "above-max",
        "far-above-max",
        "heartbeat-over-half",
        "heartbeat-over-half-short",
        "heartbeat=lease",
        "no-runner",
        "blank-runner",
        "unknown-holder-kind",
    ],
)
def test_claims_outside_the_bounds_are_invalid_exe_4(changes: dict[str, Any]) -> None:
    run = Run()
    runner = changes.pop("runner", "runner-a")
    run.refuse(claim_cmd(run.run_id, runner, **changes), RejectionCode.INVALID_COMMAND)


def test_default_terms_come_from_the_policy_passed_in_exe_4() -> None:
    policy = LeasePolicy(default_lease_ms=60_000, default_heartbeat_ms=15_000, at_risk_fraction=0.25)
    run = Run(policy=policy)
    claimed = run.claim()
    assert (claimed.lease_seconds, claimed.heartbeat_seconds, claimed.at_risk_after_ms) == (60, 15, 15_000)
    assert claimed.expires_at == run.now + 60_000


@pytest.mark.parametrize("lease_seconds", [*range(1, 13), 89, 90, 3600])
def test_every_accepted_claim_grants_a_heartbeat_interval_a_runner_can_use_exe_4(lease_seconds: int) -> None:
    """EXE-4: the grant tells the runner its heartbeat interval in whole seconds. It must be at
    least 1 s (the runner SDK's LeaseKeeper refuses 0, and 0 means "deployment default" in a
    ClaimRun) and at most half the lease (one lost heartbeat must not lose the lease). A lease the
    coordinator cannot pair with such an interval must be refused, not granted with 0."""
    run = Run()
    decision = run.decide(claim_cmd(run.run_id, lease_seconds=lease_seconds))
    if isinstance(decision, Rejection):
        assert decision.code is RejectionCode.INVALID_COMMAND
        return
    (claimed,) = decision
    assert isinstance(claimed, AttemptClaimed)
    assert claimed.heartbeat_seconds >= 1, (
        f"leaseSeconds={lease_seconds} was granted heartbeatSeconds={claimed.heartbeat_seconds}"
    )
    assert claimed.heartbeat_seconds * 2 <= claimed.lease_seconds


@pytest.mark.parametrize(
    "status",
    [RunStatus.PREPARING, RunStatus.RUNNING, RunStatus.INTERRUPTED, RunStatus.SUCCEEDED, RunStatus.FAILED],
)
def test_claim_of_a_non_queued_run_is_run_not_claimable_exe_2(status: RunStatus) -> None:
    run = Run().reach(status)  # not retry-safe: an expiry leaves the run interrupted
    epoch = run.state.epoch
    run.refuse(claim_cmd(run.run_id, "runner-b"), RejectionCode.RUN_NOT_CLAIMABLE)
    assert run.state.epoch == epoch, "a refused claim issues no epoch"


def test_the_last_attempt_is_not_requeued_and_cannot_be_claimed_exe_5() -> None:
    run = Run(retry_safe=True, max_attempts=2)
    run.claim("runner-a")
    first = run.expire()
    assert [type(e) for e in first] == [LeaseExpired, RunRequeued]
    run.claim("runner-b")
    second = run.expire()
    assert [type(e) for e in second] == [LeaseExpired], "no attempts left: no automatic retry"
    assert run.state.status is RunStatus.INTERRUPTED
    run.refuse(claim_cmd(run.run_id, "runner-c"), RejectionCode.RUN_NOT_CLAIMABLE)


def test_claim_of_a_queued_run_with_no_attempts_left_is_attempts_exhausted_exe_5() -> None:
    # Not reachable through the timers (they requeue only with attempts left); this guards the
    # rule itself, e.g. for a future explicit retry that queues an exhausted run.
    run = Run(retry_safe=True, max_attempts=1)
    exhausted = dataclasses.replace(run.state, attempts_used=1)
    rejection = rejection_of(decide(exhausted, claim_cmd(run.run_id), run.now))
    assert rejection.code is RejectionCode.ATTEMPTS_EXHAUSTED


# --- renew -------------------------------------------------------------------------------------


def test_renewal_with_the_current_epoch_and_next_sequence_extends_from_now_lease_5() -> None:
    run = Run()
    claimed = run.claim()
    run.at(T0 + 30_000)
    renewed = run.renew(1)
    assert (renewed.epoch, renewed.sequence, renewed.attempt_id) == (1, 1, claimed.attempt_id)
    assert renewed.lease_id == claimed.lease_id
    assert renewed.expires_at == T0 + 30_000 + 90_000, "from now, not from the old expiry"
    assert renewed.occurred_at == T0 + 30_000
    lease = run.state.lease
    assert lease is not None
    assert (lease.last_sequence, lease.last_renewal_at, lease.expires_at) == (1, T0 + 30_000, T0 + 120_000)
    assert lease.issued_at == T0, "a renewal does not re-issue the lease"
    run.at(T0 + 31_000)
    assert run.renew(5).expires_at == T0 + 121_000, "sequences may skip, they only have to grow"


def test_renewal_expiry_is_on_the_coordinators_clock_not_the_commands_exe_4_lease_5() -> None:
    run = Run()
    claimed = run.claim()
    run.at(T0 + 10_000)
    for issued_at in (T0 - 10**9, T0 + 10**9):
        decision = run.decide(renew_cmd(run.run_id, claimed.attempt_id, 1, 1, issued_at=issued_at))
        (renewed,) = events_of(decision)
        assert isinstance(renewed, LeaseRenewed)
        assert renewed.expires_at == T0 + 10_000 + 90_000
        assert renewed.occurred_at == T0 + 10_000


def test_first_renewal_moves_preparing_to_running_later_ones_do_not() -> None:
    run = Run()
    run.claim()
    assert run.state.status is RunStatus.PREPARING
    assert run.renew(1).run_started is True
    assert run.state.status is RunStatus.RUNNING
    assert run.renew(2).run_started is False
    assert run.state.status is RunStatus.RUNNING


def test_renewal_of_an_at_risk_lease_makes_it_active_again_lease_4() -> None:
    run = Run()
    run.claim()
    run.at(T0 + 45_000)
    (at_risk,) = run.tick()
    assert isinstance(at_risk, LeaseAtRisk)
    assert run.state.lease is not None and run.state.lease.certainty is LeaseCertainty.AT_RISK
    assert run.state.lease.held, "at risk is jeopardy, not loss"
    run.at(T0 + 50_000)
    run.renew(1)
    assert run.state.lease is not None and run.state.lease.certainty is LeaseCertainty.ACTIVE


def test_renewal_with_a_stale_epoch_is_refused_and_changes_nothing_exe_4_lease_3() -> None:
    run = Run(retry_safe=True)
    first = run.claim("runner-a")
    run.renew(1)
    run.take_over()
    run.refuse(renew_cmd(run.run_id, first.attempt_id, 1, 2), RejectionCode.STALE_EPOCH)
    # The old attempt id with the new epoch number is still not the holder.
    run.refuse(renew_cmd(run.run_id, first.attempt_id, 2, 2), RejectionCode.STALE_EPOCH)
    run.expire()
    third = run.claim("runner-c")
    assert third.epoch == 3
    run.refuse(renew_cmd(run.run_id, attempt_id_for(run.run_id, 2), 2, 1), RejectionCode.STALE_EPOCH)
    run.refuse(renew_cmd(run.run_id, first.attempt_id, 1, 99), RejectionCode.STALE_EPOCH)


def test_renewal_of_a_never_issued_epoch_is_unknown_attempt_exe_4() -> None:
    run = Run()
    run.refuse(renew_cmd(run.run_id, attempt_id_for(run.run_id, 1), 1, 1), RejectionCode.UNKNOWN_ATTEMPT)
    run.claim()
    run.refuse(renew_cmd(run.run_id, attempt_id_for(run.run_id, 2), 2, 1), RejectionCode.UNKNOWN_ATTEMPT)
    run.refuse(renew_cmd(run.run_id, attempt_id_for(run.run_id, 7), 7, 1), RejectionCode.UNKNOWN_ATTEMPT)


def test_repeated_last_sequence_is_duplicate_and_a_lower_one_is_not_increasing_exe_4() -> None:
    run = Run()
    claimed = run.claim()
    # The claim itself is sequence 0.
    run.refuse(renew_cmd(run.run_id, claimed.attempt_id, 1, 0), RejectionCode.DUPLICATE_SEQUENCE)
    run.renew(3)
    run.refuse(renew_cmd(run.run_id, claimed.attempt_id, 1, 3), RejectionCode.DUPLICATE_SEQUENCE)
    run.refuse(renew_cmd(run.run_id, claimed.attempt_id, 1, 2), RejectionCode.SEQUENCE_NOT_INCREASING)
    run.refuse(renew_cmd(run.run_id, claimed.attempt_id, 1, -1), RejectionCode.SEQUENCE_NOT_INCREASING)


def test_renewal_at_or_after_expires_at_before_the_timer_ran_is_lease_expired_lease_5() -> None:
    run = Run()
    claimed = run.claim()
    run.at(claimed.expires_at - 1)
    assert isinstance(events_of(run.decide(renew_cmd(run.run_id, claimed.attempt_id, 1, 1)))[0], LeaseRenewed)
    run.at(claimed.expires_at)
    run.refuse(renew_cmd(run.run_id, claimed.attempt_id, 1, 1), RejectionCode.LEASE_EXPIRED)
    run.at(claimed.expires_at + 60_000)
    run.refuse(renew_cmd(run.run_id, claimed.attempt_id, 1, 1), RejectionCode.LEASE_EXPIRED)
    assert run.state.lease is not None and run.state.lease.certainty is LeaseCertainty.ACTIVE, (
        "precondition: the timer has not run yet"
    )
    run.tick()
    run.refuse(renew_cmd(run.run_id, claimed.attempt_id, 1, 1), RejectionCode.LEASE_EXPIRED)


# --- report ------------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["succeeded", "failed"])
def test_report_ends_the_run_and_releases_the_lease_exe_4(outcome: str) -> None:
    run = Run()
    claimed = run.claim()
    run.renew(1)
    run.at(T0 + 5_000)
    (reported,) = run.accept(report_cmd(run.run_id, claimed.attempt_id, 1, 2, outcome, error_code="E"))
    assert isinstance(reported, AttemptReported)
    assert (reported.outcome, reported.epoch, reported.sequence) == (outcome, 1, 2)
    assert (reported.lease_id, reported.attempt_id, reported.error_code) == (
        claimed.lease_id,
        claimed.attempt_id,
        "E",
    )
    assert run.state.status is RunStatus(outcome)
    lease = run.state.lease
    assert lease is not None and not lease.held
    assert (lease.certainty, lease.last_sequence) == (LeaseCertainty.RELEASED, 2)
    assert next_timer_at(run.state) is None, "a released lease (of an ended run) needs no timer"
    assert decide_timers(run.state, claimed.expires_at + 1, DEFAULT_POLICY) == ()
    # A further report under the released lease is refused; the same command again is a no-op.
    run.refuse(report_cmd(run.run_id, claimed.attempt_id, 1, 3, outcome), RejectionCode.LEASE_RELEASED)
    same = report_cmd(run.run_id, claimed.attempt_id, 1, 2, outcome, command_id=reported.causation_id)
    assert run.decide(same) == ()


def test_report_failed_while_preparing_fails_the_run_exe_11() -> None:
    run = Run()
    claimed = run.claim()
    run.accept(report_cmd(run.run_id, claimed.attempt_id, 1, 1, "failed"))
    assert run.state.status is RunStatus.FAILED


def test_a_preparation_failure_releases_the_lease_and_requeues_while_attempts_remain_exe_11() -> None:
    run = Run(max_attempts=2)
    first = run.claim("runner-a")
    reported, requeued = run.accept(report_cmd(run.run_id, first.attempt_id, 1, 1, "preparation_failed"))
    assert isinstance(reported, AttemptReported) and isinstance(requeued, RunRequeued)
    assert run.state.lease is not None and run.state.lease.certainty is LeaseCertainty.RELEASED
    assert run.state.status is RunStatus.QUEUED
    second = run.claim("runner-b")
    assert (second.epoch, second.attempt_number) == (2, 2)
    run.refuse(renew_cmd(run.run_id, first.attempt_id, 1, 2), RejectionCode.STALE_EPOCH)
    reported, failed = run.accept(report_cmd(run.run_id, second.attempt_id, 2, 1, "preparation_failed"))
    assert isinstance(failed, RunFailed) and run.state.status is RunStatus.FAILED
    assert run.state.lease is not None and not run.state.lease.held


def test_a_lease_revoked_by_an_unconfirmed_stop_refuses_its_holder_lease_3_exe_7() -> None:
    """Force-stop by fencing: the runner never confirmed the cancel, so its lease is revoked in
    place (no new holder, no new epoch) and nothing it sends is accepted any more."""
    run = Run()
    claimed = run.claim()
    run.renew(1)
    run.accept(cancel_command(run.run_id, command_id=command_id_for("cancel")))
    assert run.state.status is RunStatus.CANCELLING
    assert run.state.lease is not None and run.state.lease.held, "the holder may still confirm"
    assert run.state.stop is not None
    run.at(run.state.stop.grace_until)
    (interrupted,) = run.tick()
    assert isinstance(interrupted, RunInterrupted) and interrupted.epoch == 1
    assert run.state.status is RunStatus.INTERRUPTED and run.state.epoch == 1
    assert run.state.lease is not None and run.state.lease.certainty is LeaseCertainty.REVOKED
    attempt = claimed.attempt_id
    for late in (
        renew_cmd(run.run_id, attempt, 1, 2),
        report_cmd(run.run_id, attempt, 1, 2),
        intent_cmd(run.run_id, attempt, 1, "e-late"),
    ):
        run.refuse(late, RejectionCode.LEASE_REVOKED)


def test_decide_never_returns_a_report_that_evolve_refuses_exe_4() -> None:
    """A runner whose task finishes before its first heartbeat reports "succeeded" while the run
    is still `preparing`. Whatever the answer, `decide` must not return an event that `evolve`
    cannot apply: in the processor that event makes every retry of the batch raise, so the
    command partition stops (a poison pill). Refusing the report is fine; accepting it must
    fold to a run that ended."""
    run = Run()
    claimed = run.claim()
    decision = run.decide(report_cmd(run.run_id, claimed.attempt_id, 1, 1, "succeeded"))
    if isinstance(decision, Rejection):
        assert decision.code is RejectionCode.INVALID_TRANSITION
        return
    after = fold(decision, run.state)  # raises IllegalTransition if decide and evolve disagree
    assert after is not None and after.status is RunStatus.SUCCEEDED


def test_report_with_a_stale_epoch_changes_nothing_exe_4() -> None:
    run = Run()
    first = run.claim("runner-a")
    run.renew(1)
    run.take_over()
    before = run.state
    for outcome in ("succeeded", "failed"):
        run.refuse(report_cmd(run.run_id, first.attempt_id, 1, 2, outcome), RejectionCode.STALE_EPOCH)
    assert run.state == before
    assert run.state.status is RunStatus.RUNNING


def test_report_needs_a_sequence_above_the_last_renewal_and_a_known_outcome_exe_4() -> None:
    run = Run()
    claimed = run.claim()
    run.renew(4)
    for sequence in (4, 3):
        run.refuse(
            report_cmd(run.run_id, claimed.attempt_id, 1, sequence), RejectionCode.SEQUENCE_NOT_INCREASING
        )
    run.refuse(report_cmd(run.run_id, claimed.attempt_id, 1, 5, "done"), RejectionCode.INVALID_COMMAND)
    run.at(claimed.expires_at + 1)  # renewed at T0, so this is past its expiry
    run.refuse(report_cmd(run.run_id, claimed.attempt_id, 1, 5), RejectionCode.LEASE_EXPIRED)
