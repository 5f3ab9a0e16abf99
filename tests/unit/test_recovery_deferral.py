"""Policy D and the tool protection's refusals (BRK-2, BRK-4, REC-2): a deferral, not a failure.

An effect the gateway refused with ERR_CIRCUIT_OPEN (`circuit-open`) or ERR_BULKHEAD_FULL
(`bulkhead-full`) was never recorded or sent. D classifies it transient and retries it after at
least the cooldown remaining (the wait the executor passes on at the head of the error message)
plus a full-jitter spread; it never spends the transient-retry allowance, a budget step or
K_repair, and never rolls back or escalates by itself, before or after the pivot. The executor
passes the refusal of a forward step on, and waits out the others itself (a compensator, a
pivot gate's verifier, a key that holds an unsettled effect) without reporting anything.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import httpx
import pytest

from services.common.contracts import (
    RecordCompensationOutcome,
    RecordStepOutcome,
    RecoveryDecided,
    StepFailed,
    StepIntentRecorded,
    TrajectoryFrozen,
    TrajectoryRolledBack,
)
from services.common.messages import MessageCodec
from services.saga_orchestrator.domain import (
    Budget,
    ErrorClass,
    FailureContext,
    RecoveryAction,
    RecoveryPolicy,
    RunCompensator,
    StepError,
    classify,
    decide_recovery,
    deferral_message,
    is_deferral,
    retry_after_ms,
)
from services.saga_orchestrator.domain.policy import _RETRY_AFTER
from tests.support.trajectory_saga import CATALOG, Saga, of_type, started

from .test_executor_backoff import RUN, Gateway, executor, step

pytestmark = pytest.mark.timeout(30)

COOLDOWN_MS = 30_000
COMMITTED = httpx.Response(200, json={"outcome": "committed", "toolResponse": {"output": {}}})
OPEN = deferral_message("the circuit breaker of env is open: failing fast", COOLDOWN_MS)


# --- the rule, pure ----------------------------------------------------------------------------


def test_deferrals_are_transient_and_carry_their_wait_in_the_message_brk_2() -> None:
    for kind in ("circuit-open", "bulkhead-full", "/problems/circuit-open"):
        assert is_deferral(kind)
        assert classify(StepError(kind, "env", "", 424)) is ErrorClass.TRANSIENT
    assert not is_deferral("timeout") and not is_deferral("conflict")
    assert OPEN.startswith("retry after 30000 ms: ")
    assert retry_after_ms(OPEN) == COOLDOWN_MS
    assert retry_after_ms("the breaker is open") == 0, "no wait named: none assumed"
    assert retry_after_ms(deferral_message("x", -5)) == 0
    assert retry_after_ms(deferral_message("x", 10**12)) == 24 * 3600 * 1000, "bounded"
    assert _RETRY_AFTER.pattern.startswith("^"), "read at the head only, never from the detail"


@pytest.mark.parametrize("after_pivot", [False, True])
def test_a_deferral_is_retried_even_with_every_allowance_spent_brk_2(after_pivot: bool) -> None:
    """The retry allowance and K_repair are both spent, the budget is nearly gone, the pivot may
    have committed: a deferral is still only a wait, never a rollback or an escalation."""
    policy = RecoveryPolicy()
    ctx = FailureContext(
        step_index=2,
        tool=CATALOG.get("vm.provision"),
        error=StepError("circuit-open", "vm.provision", OPEN, 424),
        after_pivot=after_pivot,
        budget=Budget(tokens=10, steps=0, money=0.0),
        consecutive_repairs=policy.k_repair,
        transient_retries=policy.max_transient_retries,
        earlier_signatures=("a" * 64,),
    )
    decision = decide_recovery(ctx, 0.0, "prior", policy)
    assert decision.action is RecoveryAction.TRANSIENT_RETRY
    assert decision.gate.value == "gate-1-taxonomy"
    assert decision.inputs["deferral"] == "true" and decision.inputs["retryAfterMs"] == str(COOLDOWN_MS)
    assert "not counted against the retry allowance or K_repair" in decision.reason
    # An ordinary transient error in the same position is not: its allowance is spent.
    timeout = decide_recovery(
        FailureContext(**{**ctx.__dict__, "error": StepError("timeout", "vm.provision", "late", 504)}),
        0.0,
        "prior",
        policy,
    )
    assert timeout.action is not RecoveryAction.TRANSIENT_RETRY


# --- through the trajectory --------------------------------------------------------------------


def test_a_circuit_open_step_waits_the_cooldown_and_costs_no_allowance_or_budget_brk_2() -> None:
    saga = started()
    saga.propose("vm.provision")
    budget = saga.s.budget_steps
    for _ in range(12):  # far more than the transient allowance (3)
        before = saga.now
        events = saga.fail("circuit-open", OPEN, 424)
        failed = of_type(events, StepFailed)
        decided = of_type(events, RecoveryDecided)
        retry = of_type(events, StepIntentRecorded)
        assert failed[0].error_class == "transient"
        assert decided[0].action == "TRANSIENT_RETRY" and json.loads(decided[0].inputs)["deferral"] == "true"
        (intent,) = retry
        assert intent.not_before >= before + COOLDOWN_MS, "at least the cooldown remaining"
        # The same dispatch and key: an earlier request under it may still land (no new key).
        assert intent.dispatch == 1 and intent.idempotency_key.endswith("/d1")
        step = saga.s.steps[0]
        assert step.transient_retries == 0 and step.consecutive_repairs == 0
        assert saga.s.budget_steps == budget, "a deferral is not a trajectory step"
    assert not of_type(saga.events, TrajectoryRolledBack) and not of_type(saga.events, TrajectoryFrozen)
    # The breaker closes: the same step commits, and a real transient error still gets its 3.
    saga.commit()
    saga.propose("ip.reserve")
    for _ in range(3):
        decided = of_type(saga.fail("timeout", "read timeout", 504), RecoveryDecided)
        assert decided[0].action == "TRANSIENT_RETRY"
    assert saga.s.steps[1].transient_retries == 3


def test_the_jitter_spreads_deferred_trajectories_beyond_the_cooldown_brk_3() -> None:
    waits = []
    for n in range(40):
        saga = Saga(f"herd-{n}")
        saga.start()
        saga.propose("vm.provision")
        before = saga.now
        (intent,) = of_type(saga.fail("circuit-open", OPEN, 424), StepIntentRecorded)
        waits.append(intent.not_before - before)
    assert min(waits) >= COOLDOWN_MS
    assert len(set(waits)) > 30, "not all back at the same instant the breaker half-opens"


def test_a_deferral_after_the_pivot_retries_and_never_escalates_saga_6_brk_2() -> None:
    saga = Saga()
    saga.deploy_until_pivot()
    saga.commit()  # the pivot
    saga.propose("cache.warm")
    full = deferral_message("External tool queue saturated; defer execution", 0)
    for _ in range(6):
        decided = of_type(saga.fail("bulkhead-full", full, 429), RecoveryDecided)
        assert decided[0].action == "TRANSIENT_RETRY"
    assert not of_type(saga.events, TrajectoryFrozen)
    assert saga.s.steps[-1].transient_retries == 0


def test_a_deferral_of_a_dispatch_whose_answers_were_lost_keeps_its_key() -> None:
    """Its effect may have happened: a new key could apply it twice. The report is ignored; the
    executor tries the same key again once the breaker lets it."""
    saga = started()
    saga.propose("vm.provision")
    saga.unknown()
    before = saga.s
    assert saga.fail("circuit-open", OPEN, 424) == ()
    assert saga.s == before and saga.dispatch().dispatch == 1


# --- the executor ------------------------------------------------------------------------------


def refusal(kind: str = "circuit-open", status: int = 424, **extra: Any) -> httpx.Response:
    body = {
        "type": f"/problems/{kind}",
        "status": status,
        "detail": f"{kind}: nothing was recorded or sent",
        "retryAfterMs": 1_500,
        "pendingIntent": False,
        **extra,
    }
    return httpx.Response(status, json=body, headers={"content-type": "application/problem+json"})


def reports(saga: Any) -> list[Any]:
    return [MessageCodec().decode(r.value) for r in saga._publisher.records]


def test_the_executor_passes_a_forward_steps_refusal_on_with_its_wait() -> None:
    waits: list[float] = []
    saga = executor(Gateway(down_for=0, answer=refusal()), waits)
    saga._run(step())
    (outcome,) = reports(saga)
    assert isinstance(outcome, RecordStepOutcome)
    assert (outcome.outcome, outcome.error_kind, outcome.error_status) == ("failed", "circuit-open", 424)
    assert retry_after_ms(outcome.error_message) == 1_500 and waits == []


@pytest.mark.parametrize("unsettled", ["pendingIntent", "answers-lost"])
def test_a_refused_key_with_an_unsettled_effect_is_waited_out_not_reported(unsettled: str) -> None:
    gateway = Gateway(down_for=0, answer=refusal(pendingIntent=unsettled == "pendingIntent"))
    waits: list[float] = []
    saga = executor(gateway, waits, draw=lambda: 0.5)

    def sleep(delay: float) -> None:
        waits.append(delay)
        if len(waits) == 3:
            gateway.answer = COMMITTED

    saga._sleep = sleep
    work = step() if unsettled == "pendingIntent" else replace(step(), unknown_outcomes=1)
    saga._run(work)
    assert all(w >= 1.5 for w in waits) and len(waits) == 3, waits
    assert [r.outcome for r in reports(saga)] == ["committed"], "the same key, nothing reported meanwhile"
    assert {json.loads(r.content)["idempotencyKey"] for r in gateway.requests} == {work.idempotency_key}


def test_a_compensator_refused_by_the_bulkhead_waits_and_spends_no_attempt() -> None:
    gateway = Gateway(down_for=0, answer=refusal("bulkhead-full", 429, retryAfterMs=0))
    waits: list[float] = []
    saga = executor(gateway, waits, draw=lambda: 0.5)

    def sleep(delay: float) -> None:
        waits.append(delay)
        gateway.answer = COMMITTED

    saga._sleep = sleep
    saga._run(
        RunCompensator(
            run_id=RUN,
            step_index=0,
            attempt=1,
            attempt_id="att-1",
            epoch=1,
            idempotency_key=f"{RUN}/c0/a1",
            gateway_tool="env",
            operation="vm.terminate",
            params={"vmId": "vm-1"},
            not_before=0,
        )
    )
    (report,) = reports(saga)
    assert isinstance(report, RecordCompensationOutcome) and report.outcome == "compensated"
    assert len(waits) == 1
