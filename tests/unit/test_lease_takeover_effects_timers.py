"""The lease protocol of the Run aggregate, pure: takeover, effects and timers (the claim, renew
and report half is in test_lease_domain.py).

Proves, at the level of `decide` / `evolve` / `decide_timers` (no Kafka, no clock reads):
LEASE-6/LEASE-7 (takeover revokes, re-grants with epoch + 1 and keeps the evidence), LEASE-3
(effects only under the current held lease), LEASE-4/LEASE-5 (at-risk and expiry on the
coordinator's clock) and EXE-5 (lease loss interrupts; automatic retry only when retry-safe with
attempts left).
"""

from __future__ import annotations

from typing import Any

import pytest

from services.common.contracts import (
    EffectIntentRecorded,
    EffectOutcomeRecorded,
    LeaseAtRisk,
    LeaseExpired,
)
from services.lease_coordinator.domain import (
    DEFAULT_POLICY,
    LeaseCertainty,
    RejectionCode,
    RunStatus,
    attempt_id_for,
    decide_timers,
    next_timer_at,
)
from tests.support.lease_run import (
    T0,
    Run,
    intent_cmd,
    outcome_cmd,
    renew_cmd,
    report_cmd,
    takeover_cmd,
)

# --- takeover ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [{"reason": ""}, {"reason": "   "}, {"new_holder": " "}, {"holder_kind": "robot"}],
    ids=["no-reason", "blank-reason", "no-new-holder", "unknown-holder-kind"],
)
def test_takeover_needs_a_reason_and_a_new_holder_lease_7(changes: dict[str, Any]) -> None:
    run = Run().reach(RunStatus.RUNNING)
    run.refuse(takeover_cmd(run.run_id, **changes), RejectionCode.INVALID_COMMAND)


def test_takeover_revokes_and_regrants_with_epoch_plus_one_and_keeps_the_evidence_lease_6_lease_7() -> None:
    run = Run()
    first = run.claim("runner-a")
    run.at(T0 + 10_000)
    run.renew(1)
    run.accept(intent_cmd(run.run_id, first.attempt_id, 1, "eff-1"))
    run.accept(intent_cmd(run.run_id, first.attempt_id, 1, "eff-2"))
    run.at(T0 + 20_000)
    run.renew(2)
    run.at(T0 + 70_000)
    (at_risk,) = run.tick()
    assert isinstance(at_risk, LeaseAtRisk), "a takeover of a lease in jeopardy is the usual case"

    run.at(T0 + 75_000)
    taken = run.take_over(reason="heartbeats stopped; operator continues", new_holder="operator:olga")

    assert (taken.previous_epoch, taken.epoch) == (1, 2), "LEASE-3: bumped by exactly one"
    assert (taken.previous_attempt_id, taken.previous_lease_id) == (first.attempt_id, first.lease_id)
    assert taken.previous_holder == "runner-a"
    assert (taken.holder, taken.holder_kind) == ("operator:olga", "human")
    assert taken.reason == "heartbeats stopped; operator continues"
    assert (taken.last_renewal_at, taken.last_sequence) == (T0 + 20_000, 2)
    assert taken.effects_attempted == ("eff-1", "eff-2")
    assert taken.attempt_id == attempt_id_for(run.run_id, 2) and taken.lease_id != first.lease_id
    assert taken.expires_at == T0 + 75_000 + 90_000
    assert taken.actor == "user:olga", "who decided the takeover is kept"

    state = run.state
    assert state.status is RunStatus.RUNNING, "the work goes on under the new holder"
    assert state.epoch == 2 and state.attempts_used == 1
    assert state.lease is not None
    assert (state.lease.epoch, state.lease.holder, state.lease.certainty) == (
        2,
        "operator:olga",
        LeaseCertainty.ACTIVE,
    )
    assert (state.lease.issued_at, state.lease.last_sequence) == (T0 + 75_000, 0)
    # The old holder is fenced off everywhere; the new one works.
    run.refuse(renew_cmd(run.run_id, first.attempt_id, 1, 3), RejectionCode.STALE_EPOCH)
    run.refuse(report_cmd(run.run_id, first.attempt_id, 1, 3), RejectionCode.STALE_EPOCH)
    run.refuse(intent_cmd(run.run_id, first.attempt_id, 1, "eff-3"), RejectionCode.STALE_EPOCH)
    assert run.renew(1).run_started is False


def test_takeover_evidence_lists_only_the_effects_of_the_replaced_epoch_lease_6() -> None:
    run = Run()
    first = run.claim("runner-a")
    run.accept(intent_cmd(run.run_id, first.attempt_id, 1, "eff-a"))
    second = run.take_over(new_holder="runner-b", holder_kind="runner")
    run.accept(intent_cmd(run.run_id, second.attempt_id, 2, "eff-b"))
    third = run.take_over(new_holder="operator:olga")
    assert third.effects_attempted == ("eff-b",)
    assert (third.previous_holder, third.previous_epoch, third.epoch) == ("runner-b", 2, 3)


def test_takeover_while_preparing_keeps_preparing_until_the_new_holder_renews() -> None:
    run = Run()
    run.claim()
    run.take_over(new_holder="runner-b", holder_kind="runner", lease_seconds=30)
    assert run.state.status is RunStatus.PREPARING
    assert run.state.lease is not None and run.state.lease.lease_ms == 30_000
    assert run.renew(1).run_started is True
    assert run.state.status is RunStatus.RUNNING


@pytest.mark.parametrize(
    "status", [RunStatus.QUEUED, RunStatus.INTERRUPTED, RunStatus.SUCCEEDED, RunStatus.FAILED]
)
def test_takeover_needs_a_held_lease_lease_6(status: RunStatus) -> None:
    run = Run().reach(status)
    run.refuse(takeover_cmd(run.run_id), RejectionCode.TAKEOVER_NOT_POSSIBLE)


# --- effects -----------------------------------------------------------------------------------


def test_effect_intent_only_under_the_current_held_lease_lease_3() -> None:
    run = Run(retry_safe=True)
    run.refuse(intent_cmd(run.run_id, attempt_id_for(run.run_id, 1), 1, "e0"), RejectionCode.UNKNOWN_ATTEMPT)
    first = run.claim("runner-a")
    (intent,) = run.accept(intent_cmd(run.run_id, first.attempt_id, 1, "e1"))
    assert isinstance(intent, EffectIntentRecorded)
    assert (intent.epoch, intent.lease_id, intent.attempt_id) == (1, first.lease_id, first.attempt_id)
    assert (intent.idempotency_key, intent.tool, intent.operation) == ("idem-e1", "payments", "refund")
    assert [(e.effect_id, e.epoch, e.outcome) for e in run.state.effects] == [("e1", 1, "intended")]
    run.at(first.expires_at)  # expired on the clock, timer not run yet
    run.refuse(intent_cmd(run.run_id, first.attempt_id, 1, "e2"), RejectionCode.LEASE_EXPIRED)
    run.expire()
    run.refuse(intent_cmd(run.run_id, first.attempt_id, 1, "e2"), RejectionCode.LEASE_EXPIRED)
    second = run.claim("runner-b")
    run.refuse(intent_cmd(run.run_id, first.attempt_id, 1, "e2"), RejectionCode.STALE_EPOCH)
    run.accept(intent_cmd(run.run_id, second.attempt_id, 2, "e2"))


def test_a_duplicate_effect_id_is_refused_in_any_epoch() -> None:
    run = Run()
    first = run.claim()
    run.accept(intent_cmd(run.run_id, first.attempt_id, 1, "e1"))
    run.refuse(intent_cmd(run.run_id, first.attempt_id, 1, "e1"), RejectionCode.DUPLICATE_EFFECT)
    second = run.take_over()
    run.refuse(intent_cmd(run.run_id, second.attempt_id, 2, "e1"), RejectionCode.DUPLICATE_EFFECT)


def test_an_outcome_is_recorded_for_a_known_intent_even_after_a_takeover_lease_6() -> None:
    run = Run()
    first = run.claim("runner-a")
    run.accept(intent_cmd(run.run_id, first.attempt_id, 1, "e1"))
    run.take_over()
    (recorded,) = run.accept(outcome_cmd(run.run_id, first.attempt_id, 1, "e1", "committed"))
    assert isinstance(recorded, EffectOutcomeRecorded)
    assert (recorded.epoch, recorded.lease_id, recorded.outcome) == (1, first.lease_id, "committed")
    assert [(e.effect_id, e.epoch, e.outcome) for e in run.state.effects] == [("e1", 1, "committed")]
    assert run.state.epoch == 2, "recording a fact about the old epoch does not touch the lease"


def test_effect_outcome_rules() -> None:
    run = Run()
    first = run.claim()
    attempt = first.attempt_id
    run.refuse(outcome_cmd(run.run_id, attempt, 1, "nope"), RejectionCode.UNKNOWN_EFFECT)
    run.accept(intent_cmd(run.run_id, attempt, 1, "e1"))
    run.refuse(outcome_cmd(run.run_id, attempt, 2, "e1"), RejectionCode.UNKNOWN_EFFECT)
    run.refuse(outcome_cmd(run.run_id, attempt, 1, "e1", "maybe"), RejectionCode.INVALID_COMMAND)
    run.accept(outcome_cmd(run.run_id, attempt, 1, "e1", "unknown"))
    assert run.decide(outcome_cmd(run.run_id, attempt, 1, "e1", "unknown")) == (), "the same fact again"
    run.accept(outcome_cmd(run.run_id, attempt, 1, "e1", "committed"))  # unknown is resolved later
    run.refuse(outcome_cmd(run.run_id, attempt, 1, "e1", "failed"), RejectionCode.DUPLICATE_EFFECT)
    assert run.decide(outcome_cmd(run.run_id, attempt, 1, "e1", "committed")) == ()


# --- timers ------------------------------------------------------------------------------------


def test_timers_mark_at_risk_then_expire_on_the_coordinators_clock_lease_4_lease_5_exe_5() -> None:
    run = Run()
    claimed = run.claim()
    assert next_timer_at(run.state) == T0 + 45_000
    assert decide_timers(run.state, T0 + 44_999, DEFAULT_POLICY) == ()
    run.at(T0 + 45_000)
    (at_risk,) = run.tick()
    assert isinstance(at_risk, LeaseAtRisk) and at_risk.occurred_at == T0 + 45_000
    assert run.tick() == (), "at risk is recorded once"
    assert next_timer_at(run.state) == claimed.expires_at
    run.at(claimed.expires_at + 777)
    (expired,) = run.tick()
    assert isinstance(expired, LeaseExpired)
    assert expired.occurred_at == claimed.expires_at + 777 and expired.expires_at == claimed.expires_at
    assert (expired.epoch, expired.lease_id, expired.last_sequence) == (1, claimed.lease_id, 0)
    assert run.state.status is RunStatus.INTERRUPTED, "EXE-5: lease loss interrupts"
    # No lease timer is left; only the run's deadline (EXE-10) still has one.
    assert next_timer_at(run.state) == run.state.deadline_at == T0 + 3600 * 1000
    assert decide_timers(run.state, run.state.deadline_at - 1, DEFAULT_POLICY) == ()
