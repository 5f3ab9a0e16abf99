"""P(success | error kind) of one forward repair (REC-4): measured from recorded outcomes, with the
policy's stated prior until enough samples exist; a fold that can be rebuilt from the log.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.saga_orchestrator.domain.policy import RecoveryPolicy
from services.saga_orchestrator.domain.repair_stats import (
    KindCounts,
    RepairEstimate,
    RepairStats,
    RepairStatsCorrupt,
)

POLICY = RecoveryPolicy(min_samples=4, prior_success=0.5)


def fold(outcomes: list[tuple[str, bool]]) -> RepairStats:
    stats = RepairStats()
    for kind, succeeded in outcomes:
        stats = stats.observe(kind, succeeded)
    return stats


def test_rec4_the_prior_answers_until_min_samples_exist() -> None:
    """REC-4: with fewer than min_samples repairs of a kind, p is the policy's stated prior."""
    stats = fold([("compile-error", False)] * 3)
    assert stats.p_success("compile-error", POLICY) == RepairEstimate(0.5, "prior", 3)
    assert stats.p_success("schema-invalid", POLICY) == (0.5, "prior", 0)


def test_rec4_measured_rate_is_laplace_smoothed_once_enough_samples_exist() -> None:
    """REC-4: from min_samples on, p = (successes + 1) / (attempts + 2), measured per error kind."""
    stats = fold([("compile-error", True), ("compile-error", False), ("compile-error", False)] * 2)
    estimate = stats.p_success("compile-error", POLICY)
    assert estimate.source == "measured" and estimate.samples == 6
    assert estimate.p == pytest.approx((2 + 1) / (6 + 2))
    never = fold([("not-found", False)] * 10).p_success("not-found", POLICY)
    assert 0 < never.p < 0.1, "a run of failures makes repair unlikely, not impossible"


def test_rec4_kinds_are_counted_apart_and_by_their_normalised_slug() -> None:
    stats = fold([("/problems/compile-error", True), ("compile-error", True), ("ImportError", False)])
    assert stats.counts == {"compile-error": KindCounts(2, 2), "importerror": KindCounts(1, 0)}
    assert stats.samples("Compile-Error") == 2


def test_observe_returns_a_new_value() -> None:
    empty = RepairStats()
    one = empty.observe("timeout", True)
    assert empty.counts == {} and one.counts == {"timeout": KindCounts(1, 1)}


def test_default_policy_is_used_when_none_is_given() -> None:
    default = RecoveryPolicy()
    assert RepairStats().p_success("x") == (default.prior_success, "prior", 0)


def test_stats_round_trip_through_json() -> None:
    stats = fold([("compile-error", True), ("compile-error", False), ("not-found", True)])
    data = stats.to_json()
    assert data == {
        "version": 1,
        "kinds": {
            "compile-error": {"attempts": 2, "successes": 1},
            "not-found": {"attempts": 1, "successes": 1},
        },
    }
    assert RepairStats.from_json(data) == stats


@pytest.mark.parametrize(
    "data",
    [
        None,
        {"version": 2, "kinds": {}},
        {"version": 1, "kinds": []},
        {"version": 1, "kinds": {"x": 3}},
        {"version": 1, "kinds": {"x": {"attempts": "2", "successes": 1}}},
        {"version": 1, "kinds": {"x": {"attempts": True, "successes": 0}}},
        {"version": 1, "kinds": {"x": {"attempts": 1, "successes": 2}}},
        {"version": 1, "kinds": {"x": {"attempts": -1, "successes": -1}}},
    ],
)
def test_corrupt_stored_stats_are_refused(data: object) -> None:
    with pytest.raises(RepairStatsCorrupt):
        RepairStats.from_json(data)


outcomes = st.lists(
    st.tuples(st.sampled_from(["compile-error", "not-found", "schema-invalid"]), st.booleans())
)


@given(outcomes, st.randoms(use_true_random=False))
def test_rec4_the_statistic_is_a_fold_independent_of_replay_order(
    history: list[tuple[str, bool]], random: object
) -> None:
    """REC-4: rebuilt from the log in any order, the statistic is the same, and p is a probability."""
    shuffled = list(history)
    random.shuffle(shuffled)  # type: ignore[attr-defined]
    stats = fold(history)
    assert fold(shuffled) == stats
    assert RepairStats.from_json(stats.to_json()) == stats
    for kind in ("compile-error", "not-found", "schema-invalid"):
        p, source, samples = stats.p_success(kind, POLICY)
        assert 0.0 <= p <= 1.0
        assert samples == sum(1 for k, _ in history if k == kind)
        assert source == ("measured" if samples >= POLICY.min_samples else "prior")
