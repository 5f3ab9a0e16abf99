"""The recovery policy D, pure: REC-1 (four outcomes, each with its gate and inputs), REC-2 (error
taxonomy, full-jitter backoff), REC-3 (budget), REC-4 (economics, the seed's worked example),
REC-5 (anti-spin: signatures and K_repair) and the pivot boundary of SAGA-6 (never roll back after
the pivot).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.saga_orchestrator.domain.policy import (
    Budget,
    ErrorClass,
    FailureContext,
    Gate,
    RecoveryAction,
    RecoveryPolicy,
    StepError,
    break_even,
    classify,
    decide_recovery,
    error_signature,
    expected_forward_cost,
    full_jitter_backoff_ms,
)
from services.saga_orchestrator.domain.tools import (
    CompensatorSpec,
    Cost,
    Reversibility,
    ToolDomain,
    ToolSpec,
)

# The seed's worked example (REC-4): a six-step migration fails at its last step.
REPAIR = Cost(4100, 0.010)  # one repair call: 4.1 s, $0.010
U = Cost(40_600, 0.0)  # compensators of T1..T5: 40.6 s, no model tokens
R = Cost(46_000, 0.162)  # re-running T1..T5: 46 s and $0.162 of tokens

DEPLOY = ToolSpec(
    name="deploy.apply",
    gateway_tool="env",
    operation="deploy.apply",
    reversibility=Reversibility.COMPENSABLE,
    domain=ToolDomain.INTERNAL,
    compensator=CompensatorSpec("deploy.remove", {"id": "output.id"}),
)
DNS = ToolSpec(
    name="dns.publish",
    gateway_tool="env",
    operation="dns.publish",
    reversibility=Reversibility.PIVOT,
    domain=ToolDomain.EXTERNAL,
)
PLENTY = Budget(tokens=200_000, steps=50, money=10.0)
POLICY = RecoveryPolicy()

# The seed's observable repair-spin trace (pytest validation failure).
SPIN_TRACE = (
    StepError("ImportError", "pytest", "cannot import name 'AsyncSession' from 'sqlalchemy.orm'"),
    StepError("AttributeError", "pytest", "'AsyncSession' object has no attribute 'sync_engine'"),
    StepError("TypeError", "pytest", "NoneType object cannot be interpreted as an integer"),
    StepError("ImportError", "pytest", "cannot import name 'AsyncSession' from 'sqlalchemy.orm'"),
)


def context(error: StepError, **changes: object) -> FailureContext:
    base = FailureContext(
        step_index=5,
        tool=DEPLOY,
        error=error,
        after_pivot=False,
        budget=PLENTY,
        consecutive_repairs=0,
        transient_retries=0,
        earlier_signatures=(),
        compensation_cost=U,
        rerun_cost=R,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


SCHEMA_ERROR = StepError("schema-invalid", "deploy.apply", "port must be an integer, got '8080'", 422)


# --- REC-4: the worked example ---------------------------------------------------------------------


def test_rec4_worked_example_break_even_is_5_percent_by_time_and_6_by_money() -> None:
    """REC-4: p* = c_r / (U + R) = 4.1 / 86.6 s = 4.73 % by time and 0.010 / 0.162 = 6.17 % by money."""
    by_time, by_money = break_even(REPAIR, U, R)
    assert by_time == pytest.approx(0.0473, abs=5e-5)
    assert by_money == pytest.approx(0.0617, abs=5e-5)
    assert by_time is not None and by_money is not None
    assert round(by_time * 100) == 5 and round(by_money * 100) == 6


def test_rec4_worked_example_expected_forward_cost_at_p_one_half() -> None:
    """REC-4: at p = 0.5 trying the repair first costs 47.4 s and $0.091 against 86.6 s and $0.162."""
    expected = expected_forward_cost(REPAIR, 0.5, U, R)
    assert expected.duration_ms == 47_400
    assert expected.money == pytest.approx(0.091)
    rollback = U + R
    assert rollback == Cost(86_600, 0.162)


def test_rec4_break_even_is_undefined_where_nothing_would_be_lost() -> None:
    by_time, by_money = break_even(REPAIR, Cost(500, 0.0), Cost(0, 0.0))
    assert by_time == pytest.approx(8.2) and by_money is None
    assert break_even(REPAIR, Cost.zero(), Cost.zero()) == (None, None)


def test_rec4_the_worked_example_repairs_at_p_one_half_and_says_why() -> None:
    """REC-1/REC-4: the decision names its gate and records U, R, p, p* and the expected cost."""
    decision = decide_recovery(context(SCHEMA_ERROR), 0.5, "prior", POLICY)
    assert decision.action is RecoveryAction.FORWARD_REPAIR
    assert decision.gate is Gate.ECONOMICS
    assert decision.error_class is ErrorClass.SEMANTIC
    inputs = decision.inputs
    assert inputs["U"] == "40600ms $0" and inputs["R"] == "46000ms $0.162"
    assert inputs["p"] == "0.5" and inputs["pSource"] == "prior"
    assert inputs["pStarTime"].startswith("0.0473") and inputs["pStarMoney"].startswith("0.0617")
    assert inputs["expectedForward"] == "47400ms $0.091"
    assert inputs["errorClass"] == "semantic" and inputs["signature"] == decision.signature
    assert all(isinstance(value, str) for value in inputs.values())
    assert decision.to_json()["gate"] == "gate-3-economics"


def test_rec4_a_repair_must_pay_off_in_both_time_and_money() -> None:
    """REC-4: at p = 5.5 % the repair beats rollback by time (p* 4.7 %) but not by money (p* 6.2 %)."""
    decision = decide_recovery(context(SCHEMA_ERROR), 0.055, "measured", POLICY)
    assert decision.action is RecoveryAction.BACKWARD_ROLLBACK
    assert decision.gate is Gate.ECONOMICS
    assert "money" in decision.reason and "time," not in decision.reason
    assert (
        decide_recovery(context(SCHEMA_ERROR), 0.07, "measured", POLICY).action
        is RecoveryAction.FORWARD_REPAIR
    )


def test_rec4_an_early_failure_with_nothing_to_lose_rolls_back() -> None:
    """REC-4: when U + R is zero, rolling back costs nothing, so the repair cannot pay off."""
    ctx = context(SCHEMA_ERROR, compensation_cost=Cost.zero(), rerun_cost=Cost.zero())
    decision = decide_recovery(ctx, 0.99, "measured", POLICY)
    assert (decision.action, decision.gate) == (RecoveryAction.BACKWARD_ROLLBACK, Gate.ECONOMICS)


# --- REC-5: anti-spin -------------------------------------------------------------------------------


def test_rec5_spin_trace_error_4_has_the_signature_of_error_1() -> None:
    """REC-5: H(err_4) == H(err_1) while errors 2 and 3 differ from everything else."""
    signatures = [error_signature(error) for error in SPIN_TRACE]
    assert signatures[3] == signatures[0]
    assert len(set(signatures[:3])) == 3
    assert all(len(signature) == 64 and int(signature, 16) >= 0 for signature in signatures)


def test_rec5_the_spin_trace_repairs_three_times_then_rolls_back_via_anti_spin() -> None:
    """REC-5: the seed's trace, replayed through D: errors 1-3 are repaired; error 4 repeats error 1,
    so the supervisor stops repairing at once and rolls back (gate anti-spin)."""
    history: tuple[str, ...] = ()
    decisions = []
    for repairs, error in enumerate(SPIN_TRACE):
        decision = decide_recovery(
            context(error, consecutive_repairs=repairs, earlier_signatures=history), 0.5, "prior", POLICY
        )
        decisions.append(decision)
        history = (*history, decision.signature)
    assert [d.action for d in decisions[:3]] == [RecoveryAction.FORWARD_REPAIR] * 3
    assert decisions[3].action is RecoveryAction.BACKWARD_ROLLBACK
    assert decisions[3].gate is Gate.ANTI_SPIN
    assert "repeats error 1" in decisions[3].reason
    assert decisions[3].inputs["signatureRepeated"] == "true"


def test_rec5_a_repeated_signature_stops_repair_even_below_k_repair() -> None:
    ctx = context(SPIN_TRACE[3], consecutive_repairs=1, earlier_signatures=(error_signature(SPIN_TRACE[0]),))
    decision = decide_recovery(ctx, 0.9, "measured", POLICY)
    assert (decision.action, decision.gate) == (RecoveryAction.BACKWARD_ROLLBACK, Gate.ANTI_SPIN)


def test_rec5_k_repair_exceeded_rolls_back() -> None:
    """REC-5: after K_repair consecutive repairs of one step, the next failure rolls back even when
    its signature is new."""
    ctx = context(SCHEMA_ERROR, consecutive_repairs=3, earlier_signatures=("a" * 64, "b" * 64, "c" * 64))
    decision = decide_recovery(ctx, 0.9, "measured", POLICY)
    assert (decision.action, decision.gate) == (RecoveryAction.BACKWARD_ROLLBACK, Gate.ANTI_SPIN)
    assert "K_repair=3" in decision.reason
    strict = RecoveryPolicy(k_repair=1)
    assert (
        decide_recovery(context(SCHEMA_ERROR, consecutive_repairs=1), 0.9, "m", strict).gate is Gate.ANTI_SPIN
    )


def test_rec5_k_repair_may_not_exceed_three() -> None:
    with pytest.raises(ValueError, match="K_repair <= 3"):
        RecoveryPolicy(k_repair=4)


def test_rec5_signatures_ignore_volatile_parts_but_not_the_error() -> None:
    """REC-5: normalisation drops case, whitespace, numbers, hex ids, uuids and timestamps."""
    first = StepError(
        "compile-error", "build", "main.go:12: undefined   Foo at 2024-05-01T10:00:00Z (req 7f3a9c0e1b2d)"
    )
    second = StepError(
        "/problems/compile-error",
        "Build",
        "main.go:97: undefined Foo at 2025-11-30T23:59:59.123+02:00 (req 0a1b2c3d4e5f)",
    )
    third = StepError("compile-error", "build", "main.go:12: undefined Bar at 2024-05-01T10:00:00Z")
    uuid_a = StepError("not-found", "env", "vm 123e4567-e89b-12d3-a456-426614174000 not found")
    uuid_b = StepError("not-found", "env", "vm 00000000-1111-2222-3333-444444444444 not found")
    assert error_signature(first) == error_signature(second)
    assert error_signature(first) != error_signature(third)
    assert error_signature(uuid_a) == error_signature(uuid_b)
    assert error_signature(uuid_a) != error_signature(dataclasses.replace(uuid_a, kind="timeout"))
    assert error_signature(uuid_a) != error_signature(dataclasses.replace(uuid_a, source="dns"))


# --- REC-2: taxonomy and backoff --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "status", "expected"),
    [
        ("timeout", None, ErrorClass.TRANSIENT),
        ("rate-limited", 429, ErrorClass.TRANSIENT),
        ("/problems/lock-contention", 423, ErrorClass.TRANSIENT),
        ("unavailable", 503, ErrorClass.TRANSIENT),
        ("outcome-unknown", None, ErrorClass.TRANSIENT),
        ("TimeoutError", None, ErrorClass.TRANSIENT),
        ("httpx.ReadTimeout", None, ErrorClass.TRANSIENT),
        ("schema-invalid", 422, ErrorClass.SEMANTIC),
        ("missing-parameter", 422, ErrorClass.SEMANTIC),
        ("compile-error", 422, ErrorClass.SEMANTIC),
        ("not-found", 404, ErrorClass.SEMANTIC),
        ("ImportError", None, ErrorClass.SEMANTIC),
        ("AttributeError", None, ErrorClass.SEMANTIC),
        ("TypeError", None, ErrorClass.SEMANTIC),
        ("FileNotFoundError", None, ErrorClass.SEMANTIC),
        ("auth-revoked", 403, ErrorClass.FATAL),
        ("exhausted", 507, ErrorClass.FATAL),
        ("corrupted", 422, ErrorClass.FATAL),
        ("sandbox-breach", 403, ErrorClass.FATAL),
        ("conflict", 409, ErrorClass.FATAL),
        ("stale-epoch", 409, ErrorClass.FATAL),
        ("fenced-by-recipient", 409, ErrorClass.FATAL),
        ("something-new", 429, ErrorClass.TRANSIENT),
        ("something-new", 504, ErrorClass.TRANSIENT),
        ("something-new", 400, ErrorClass.SEMANTIC),
        ("something-new", 404, ErrorClass.SEMANTIC),
        ("something-new", 500, ErrorClass.FATAL),
        ("something-new", None, ErrorClass.FATAL),
    ],
)
def test_rec2_taxonomy(kind: str, status: int | None, expected: ErrorClass) -> None:
    """REC-2: transient / deterministic semantic / fatal, by kind first and by status for unknown kinds."""
    assert classify(StepError(kind, "env", "detail", status)) is expected


def test_rec2_transient_errors_retry_until_the_allowance_is_spent() -> None:
    """REC-2: a transient error retries (with backoff) up to max_transient_retries, then rolls back."""
    timeout = StepError("timeout", "gateway", "no answer within 10s")
    for retries in range(POLICY.max_transient_retries):
        decision = decide_recovery(context(timeout, transient_retries=retries), 0.5, "prior", POLICY)
        assert (decision.action, decision.gate) == (RecoveryAction.TRANSIENT_RETRY, Gate.TAXONOMY)
    spent = decide_recovery(
        context(timeout, transient_retries=POLICY.max_transient_retries), 0.5, "p", POLICY
    )
    assert (spent.action, spent.gate) == (RecoveryAction.BACKWARD_ROLLBACK, Gate.TAXONOMY)
    after = decide_recovery(
        context(timeout, transient_retries=POLICY.max_transient_retries, after_pivot=True), 0.5, "p", POLICY
    )
    assert after.action is RecoveryAction.OPERATOR_ESCALATE


def test_rec2_fatal_errors_roll_back_at_once_before_the_pivot() -> None:
    """REC-2: the seed's DNS 409 ownership conflict is fatal: roll back, however good repair odds are."""
    conflict = StepError("conflict", "dns.publish", "domain owned by another account", 409)
    decision = decide_recovery(context(conflict, tool=DNS), 1.0, "measured", POLICY)
    assert (decision.action, decision.gate) == (RecoveryAction.BACKWARD_ROLLBACK, Gate.TAXONOMY)
    assert decision.error_class is ErrorClass.FATAL


def test_saga6_fatal_after_the_pivot_escalates_instead_of_rolling_back() -> None:
    """SAGA-6/REC-2: after the pivot the compensation stack is retired; fatal errors escalate."""
    revoked = StepError("auth-revoked", "env", "token revoked", 403)
    decision = decide_recovery(context(revoked, after_pivot=True), 0.5, "prior", POLICY)
    assert (decision.action, decision.gate) == (RecoveryAction.OPERATOR_ESCALATE, Gate.TAXONOMY)
    assert "after the pivot" in decision.reason


def test_saga6_semantic_errors_after_the_pivot_repair_without_economics() -> None:
    """SAGA-6: with nothing to roll back to, a semantic error that passes gates 1-2 is repaired even
    where the economics (U + R = 0) would have rolled back."""
    ctx = context(SCHEMA_ERROR, after_pivot=True, compensation_cost=Cost.zero(), rerun_cost=Cost.zero())
    decision = decide_recovery(ctx, 0.01, "measured", POLICY)
    assert (decision.action, decision.gate) == (RecoveryAction.FORWARD_REPAIR, Gate.PIVOT)
    spin = decide_recovery(dataclasses.replace(ctx, consecutive_repairs=3), 0.9, "m", POLICY)
    assert (spin.action, spin.gate) == (RecoveryAction.OPERATOR_ESCALATE, Gate.ANTI_SPIN)


def test_rec2_full_jitter_backoff() -> None:
    """REC-2: t_wait = floor(u * min(cap, base * 2^attempt)); u is the injected random draw."""
    assert full_jitter_backoff_ms(0, 100, 10_000, 0.5) == 50
    assert full_jitter_backoff_ms(3, 100, 10_000, 0.5) == 400
    assert full_jitter_backoff_ms(20, 100, 10_000, 0.999) == 9_990
    assert full_jitter_backoff_ms(5, 100, 10_000, 0.0) == 0
    with pytest.raises(ValueError):
        full_jitter_backoff_ms(1, 100, 1000, 1.0)
    with pytest.raises(ValueError):
        full_jitter_backoff_ms(-1, 100, 1000, 0.5)


@given(
    st.integers(0, 200), st.integers(0, 10_000), st.integers(0, 100_000), st.floats(0, 1, exclude_max=True)
)
def test_rec2_full_jitter_stays_under_the_capped_ceiling(attempt: int, base: int, cap: int, u: float) -> None:
    wait = full_jitter_backoff_ms(attempt, base, cap, u)
    ceiling = min(cap, base * 2**attempt)
    assert 0 <= wait <= ceiling and (wait < ceiling or ceiling == 0)


# --- REC-3: budget ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("budget", "shortfall"),
    [
        (Budget(tokens=POLICY.repair_tokens + POLICY.token_reserve - 1, steps=5, money=10.0), "tokens"),
        (
            Budget(tokens=200_000, steps=5, money=POLICY.repair_cost.money + POLICY.money_reserve - 1e-6),
            "money",
        ),
        (Budget(tokens=200_000, steps=0, money=10.0), "steps"),
    ],
)
def test_rec3_budget_refuses_a_repair_it_cannot_pay_for(budget: Budget, shortfall: str) -> None:
    """REC-3: remaining tokens / money below E[repair] + reserve, or no step left: no repair."""
    decision = decide_recovery(context(SCHEMA_ERROR, budget=budget), 0.9, "measured", POLICY)
    assert (decision.action, decision.gate) == (RecoveryAction.BACKWARD_ROLLBACK, Gate.BUDGET)
    assert shortfall in decision.reason
    after = decide_recovery(context(SCHEMA_ERROR, budget=budget, after_pivot=True), 0.9, "measured", POLICY)
    assert (after.action, after.gate) == (RecoveryAction.OPERATOR_ESCALATE, Gate.BUDGET)


def test_rec3_exactly_enough_budget_allows_a_repair() -> None:
    budget = Budget(
        POLICY.repair_tokens + POLICY.token_reserve, 1, POLICY.repair_cost.money + POLICY.money_reserve
    )
    assert decide_recovery(context(SCHEMA_ERROR, budget=budget), 0.9, "m", POLICY).gate is Gate.ECONOMICS


def test_rec1_probability_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="probability"):
        decide_recovery(context(SCHEMA_ERROR), 1.5, "measured", POLICY)


# --- properties over random contexts ----------------------------------------------------------------

KINDS = [
    "timeout", "rate-limited", "lock-contention", "schema-invalid", "compile-error", "not-found",
    "ImportError", "auth-revoked", "exhausted", "corrupted", "sandbox-breach", "conflict", "stale-epoch",
    "mystery",
]  # fmt: skip
SEMANTIC_KINDS = ["schema-invalid", "compile-error", "not-found", "ImportError", "TypeError"]
errors = st.builds(
    StepError,
    # semantic errors weighted up: they are the ones that reach the anti-spin, budget and economics gates
    st.one_of(st.sampled_from(KINDS), st.sampled_from(SEMANTIC_KINDS)),
    st.sampled_from(["env", "pytest", "gateway"]),
    st.text(max_size=30),
    st.one_of(st.none(), st.sampled_from([400, 404, 408, 409, 422, 423, 429, 500, 503, 504, 507])),
)
costs = st.builds(Cost, st.integers(0, 10**7), st.floats(0, 100, allow_nan=False))


@st.composite
def contexts(draw: st.DrawFn) -> FailureContext:
    error = draw(errors)
    earlier = draw(st.lists(st.text(alphabet="0123456789abcdef", min_size=64, max_size=64), max_size=3))
    if draw(st.integers(0, 3)) == 0:
        earlier.append(error_signature(error))
    return FailureContext(
        step_index=draw(st.integers(0, 20)),
        tool=draw(st.sampled_from([DEPLOY, DNS])),
        error=error,
        after_pivot=draw(st.booleans()),
        budget=Budget(draw(st.integers(0, 20_000)), draw(st.integers(0, 5)), draw(st.floats(0, 2))),
        consecutive_repairs=draw(st.integers(0, 3)),
        transient_retries=draw(st.integers(0, 5)),
        earlier_signatures=tuple(earlier),
        compensation_cost=draw(costs),
        rerun_cost=draw(costs),
    )


policies = st.builds(
    RecoveryPolicy,
    k_repair=st.one_of(st.just(3), st.integers(0, 3)),
    repair_cost=st.builds(Cost, st.integers(0, 10_000), st.floats(0, 0.05)),
    max_transient_retries=st.integers(0, 4),
    token_reserve=st.integers(0, 5000),
    money_reserve=st.floats(0, 0.5),
)


@settings(max_examples=300, deadline=None)
@given(contexts(), st.floats(0, 1), policies)
def test_saga6_rec1_d_never_rolls_back_after_the_pivot_nor_repairs_a_fatal_error(
    ctx: FailureContext, p: float, policy: RecoveryPolicy
) -> None:
    """SAGA-6/REC-1/REC-2: over random contexts, after the pivot D never returns BACKWARD_ROLLBACK;
    a FATAL error never gets FORWARD_REPAIR (nor a retry); a repeated signature never gets a repair."""
    decision = decide_recovery(ctx, p, "prior", policy)
    assert decision.action in set(RecoveryAction)
    if ctx.after_pivot:
        assert decision.action is not RecoveryAction.BACKWARD_ROLLBACK
    if decision.error_class is ErrorClass.FATAL:
        assert decision.action not in (RecoveryAction.FORWARD_REPAIR, RecoveryAction.TRANSIENT_RETRY)
    if decision.signature in ctx.earlier_signatures:
        assert decision.action is not RecoveryAction.FORWARD_REPAIR
    if decision.action is RecoveryAction.FORWARD_REPAIR:
        assert ctx.consecutive_repairs < policy.k_repair
        assert decision.error_class is ErrorClass.SEMANTIC
    assert decision.inputs["errorClass"] == decision.error_class.value
