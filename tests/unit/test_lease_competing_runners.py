"""The lease protocol's certainty table (LEASE-2, LEASE-6) and its properties under competing
runners: no two runners ever share an epoch, stale holders are fenced (LEASE-3), replay equals
incremental (DUR-1), and every reachable state round-trips the state codec.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from services.lease_coordinator.domain import (
    LEASE_TRANSITIONS,
    LeaseCertainty,
    RunStatus,
    fold,
)
from services.lease_coordinator.domain.lifecycle import check_lease_transition
from services.lease_coordinator.state_codec import decode_state, encode_state
from tests.support.lease_run import (
    Run,
    report_cmd,
)
from tests.support.lease_simulation import (
    FAST_FINISH,
    SCENARIO,
    STALE_RUNNERS,
    UNCONFIRMED_CANCEL,
    Step,
    simulate,
)

# --- the lease certainty table -----------------------------------------------------------------

_A, _R, _E, _V, _L = (
    LeaseCertainty.ACTIVE,
    LeaseCertainty.AT_RISK,
    LeaseCertainty.EXPIRED,
    LeaseCertainty.REVOKED,
    LeaseCertainty.RELEASED,
)
# (source, target) -> the requirement that allows it; read from the spec, not from lifecycle.py.
SPEC_LEASE_EDGES = {
    (_A, _R): "LEASE-4/LEASE-5 no renewal for a fraction of the TTL: jeopardy",
    (_R, _A): "LEASE-5 a confirmed renewal restores certainty",
    (_A, _E): "LEASE-5/EXE-5 expiry on the coordinator's clock",
    (_R, _E): "LEASE-5/EXE-5 expiry on the coordinator's clock",
    (_A, _V): "LEASE-6/LEASE-7 takeover revokes",
    (_R, _V): "LEASE-6/LEASE-7 takeover revokes",
    (_A, _L): "EXE-4 a terminal report releases",
    (_R, _L): "EXE-4 a terminal report releases",
}


@pytest.mark.parametrize(
    "pair",
    list(itertools.product(LeaseCertainty, LeaseCertainty)),
    ids=lambda p: f"{p[0].value}->{p[1].value}",
)
def test_lease_certainty_transition_table_every_pair_lease_2(
    pair: tuple[LeaseCertainty, LeaseCertainty],
) -> None:
    source, target = pair
    assert (target in LEASE_TRANSITIONS[source]) == (pair in SPEC_LEASE_EDGES)
    if pair in SPEC_LEASE_EDGES or source is target:
        # Restating the current certainty (e.g. renewing an active lease) is not a transition.
        assert check_lease_transition(source, target) is target
    else:
        with pytest.raises(ValueError, match=f"{source.value} to {target.value}"):
            check_lease_transition(source, target)


def test_ended_leases_never_come_back_and_the_table_is_read_only_lease_6() -> None:
    for ended in (_E, _V, _L):
        assert LEASE_TRANSITIONS[ended] == frozenset()
    assert set(LEASE_TRANSITIONS) == set(LeaseCertainty)
    with pytest.raises(TypeError):
        LEASE_TRANSITIONS[_E] = frozenset({_A})  # type: ignore[index]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**SCENARIO)
@example(retry_safe=True, max_attempts=3, lease_seconds=0, steps=STALE_RUNNERS)
@example(retry_safe=True, max_attempts=3, lease_seconds=0, steps=FAST_FINISH)
@example(retry_safe=True, max_attempts=3, lease_seconds=0, steps=UNCONFIRMED_CANCEL)
def test_competing_runners_never_share_an_epoch_and_stale_holders_are_fenced_lease_3(
    retry_safe: bool, max_attempts: int, lease_seconds: int, steps: list[Step]
) -> None:
    """LEASE-3/EXE-4: over any interleaving of claims, renewals, reports, takeovers, effects and
    timer ticks by runners that each act on their own (possibly stale) idea of their epoch, no two
    events grant the same epoch, epochs grow by one, at most one lease is held at any moment,
    `decide` never yields an event `evolve` refuses, and a stale holder is always refused."""
    simulate(retry_safe, max_attempts, lease_seconds, steps, check=True)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**SCENARIO, cut=st.integers(min_value=0))
@example(retry_safe=True, max_attempts=3, lease_seconds=0, steps=STALE_RUNNERS, cut=5)
@example(retry_safe=True, max_attempts=3, lease_seconds=0, steps=FAST_FINISH, cut=5)
def test_lease_replay_equals_incremental_dur_1(
    retry_safe: bool, max_attempts: int, lease_seconds: int, steps: list[Step], cut: int
) -> None:
    """Replay: the fold of all lease events equals the incrementally evolved state, also from a
    snapshot taken at any point."""
    sim = simulate(retry_safe, max_attempts, lease_seconds, steps)
    events = sim.run.events
    assert fold(events) == sim.run.state
    cut %= len(events) + 1
    assert fold(events[cut:], fold(events[:cut])) == sim.run.state


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**SCENARIO)
@example(retry_safe=True, max_attempts=3, lease_seconds=0, steps=STALE_RUNNERS)
@example(retry_safe=True, max_attempts=3, lease_seconds=0, steps=FAST_FINISH)
def test_state_codec_round_trips_every_reachable_lease_state(
    retry_safe: bool, max_attempts: int, lease_seconds: int, steps: list[Step]
) -> None:
    """DUR-1 (the processor's store holds encode_state): every state the lease protocol can reach
    comes back from its bytes unchanged, leases, certainties and effects included."""
    sim = simulate(retry_safe, max_attempts, lease_seconds, steps)
    for state in sim.states:
        assert decode_state(encode_state(state)) == state


def test_a_success_without_a_verified_manifest_is_recorded_as_failed_exe_1() -> None:
    """EXE-1: exit code 0 alone never makes a success."""
    run = Run()
    claimed = run.claim("runner-a")
    command = dataclasses.replace(
        report_cmd(run.run_id, claimed.attempt_id, 1, 1),
        manifest_verified=False,
        manifest_problem="artifact a1: missing",
    )
    (reported,) = run.accept(command)
    assert reported.outcome == "failed" and reported.error_code == "MANIFEST_INVALID"
    assert "a1: missing" in reported.detail
    assert run.state.status is RunStatus.FAILED
