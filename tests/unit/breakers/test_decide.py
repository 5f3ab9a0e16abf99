"""The breaker's rules, one by one (BRK-1, BRK-2): the window, fail-fast, the one canary, the
doubling cooldown, redeliveries, operators and hostile input."""

from __future__ import annotations

from dataclasses import replace

import pytest
from annotated_types import Ge, Le

from services.breakers.domain import (
    BOUNDS,
    MAX_INSTANCES,
    BreakerPolicy,
    BreakerStatus,
    Rejection,
    fold,
    out_of_bounds,
    outcome_for_status,
    verdict,
)
from services.common.contracts import (
    SLOW,
    SUCCESS,
    TRANSPORT_FAILURE,
    BreakerClosed,
    BreakerOpened,
    BreakerReopened,
    CallOutcomeRecorded,
    CanaryGranted,
)
from services.common.settings import TenureSettings

from .support import ENDPOINT, POLICY, Breaker, disable, force_open, outcome, report, request, reset

S = BreakerStatus


def _status(b: Breaker) -> str:
    assert b.state is not None
    return b.state.status.value


def _grant(b: Breaker, instance: str = "gw-a") -> CanaryGranted:
    answer = b.send(request(instance))
    assert not isinstance(answer, Rejection), answer
    (granted,) = answer
    assert isinstance(granted, CanaryGranted)
    return granted


# --- Closed: only transport failures count (BRK-1) ---------------------------------------------


def test_application_errors_count_as_successes_and_only_transport_failures_open_brk_1() -> None:
    b = Breaker(policy=POLICY)
    # 404s and validation errors are the endpoint answering: the gateway reports them as success.
    assert outcome_for_status(404) == SUCCESS and outcome_for_status(422) == SUCCESS
    assert outcome_for_status(200) == SUCCESS
    assert outcome_for_status(503) == TRANSPORT_FAILURE and outcome_for_status(429) == TRANSPORT_FAILURE
    b.outcomes([outcome_for_status(404)] * 30)
    assert _status(b) == "closed" and b.state is not None and b.state.failures == 0
    assert len(b.state.window) == POLICY.window  # the ring keeps the last W only


def test_the_rate_counts_only_after_min_calls_and_opens_strictly_above_tau_brk_1() -> None:
    b = Breaker(policy=POLICY)
    b.outcomes([TRANSPORT_FAILURE] * (POLICY.min_calls - 1))
    assert _status(b) == "closed", "9 failures of 9: below min_calls, the rate does not count yet"
    b = Breaker(policy=POLICY)
    b.outcomes([SUCCESS, TRANSPORT_FAILURE] * 10)  # 10 of 20: exactly tau, not above it
    assert _status(b) == "closed"
    (answer,) = b.outcomes([TRANSPORT_FAILURE])  # the oldest success leaves the ring: 11 of 20
    assert not isinstance(answer, Rejection)
    recorded, opened = answer
    assert isinstance(recorded, CallOutcomeRecorded) and recorded.counted and recorded.failure
    assert isinstance(opened, BreakerOpened)
    assert (opened.calls, opened.failures, opened.error_rate) == (20, 11, 0.55)
    assert opened.window == (*[False, True] * 10, True)[-20:]
    assert (opened.threshold, opened.min_calls, opened.cooldown_ms) == (0.5, 10, 30_000)
    assert opened.half_open_at == b.now + 30_000
    assert _status(b) == "open"


def test_slow_calls_fail_only_when_the_policy_counts_them() -> None:
    b = Breaker(policy=POLICY)  # slow_call_ms = 0: off
    b.outcomes([SLOW] * 15)
    assert _status(b) == "closed"
    slow = Breaker(policy=replace(POLICY, slow_call_ms=2_000))
    for seq in range(1, 6):
        slow.send(outcome(seq, SLOW))  # classified slow by the gateway
    for seq in range(6, 11):
        slow.send(outcome(seq, SUCCESS, duration_ms=2_500))  # answered, but too slowly
    assert _status(slow) == "open"


def test_a_redelivered_or_stale_outcome_is_dropped_per_instance() -> None:
    b = Breaker(policy=POLICY)
    first = b.send(outcome(5, TRANSPORT_FAILURE, instance="gw-a", command_id="o-5"))
    assert not isinstance(first, Rejection) and len(first) == 1
    assert b.send(outcome(5, TRANSPORT_FAILURE, instance="gw-a", command_id="o-5")) == ()
    assert b.send(outcome(4, TRANSPORT_FAILURE, instance="gw-a")) == ()  # behind a newer report
    assert len(b.send(outcome(5, TRANSPORT_FAILURE, instance="gw-b"))) == 1  # another instance
    assert b.state is not None and len(b.state.window) == 2


def test_the_instances_remembered_are_bounded() -> None:
    b = Breaker(policy=POLICY)
    for i in range(MAX_INSTANCES + 10):
        b.send(outcome(1, SUCCESS, instance=f"gw-{i}"))
    assert b.state is not None and len(b.state.instances) == MAX_INSTANCES
    assert b.state.instances[-1] == (f"gw-{MAX_INSTANCES + 9}", 1)


# --- Open: fail fast, then half-open (BRK-2) ----------------------------------------------------


def test_open_fails_fast_with_the_cooldown_remaining_and_half_opens_by_its_timer_brk_2() -> None:
    b = Breaker(policy=POLICY)
    b.open()
    assert b.state is not None
    seen = verdict(b.state, b.now + 10_000, 30_000)
    assert (seen.open, seen.cooldown_remaining_ms, seen.canary_free) == (True, 20_000, False)
    refused = b.send(request("gw-b"))
    assert isinstance(refused, Rejection) and refused.code.value == "BREAKER_OPEN"
    assert "30000 ms" in refused.detail
    assert b.tick(29_999) == ()
    (half,) = b.tick(1)
    assert type(half).__name__ == "BreakerHalfOpened" and _status(b) == "half-open"
    assert half.causation_id.startswith("timer/")
    seen = verdict(b.state, b.now, 30_000)
    assert (seen.open, seen.cooldown_remaining_ms, seen.canary_free) == (True, 0, True)


def test_outcomes_of_calls_still_in_flight_do_not_count_while_open() -> None:
    b = Breaker(policy=POLICY)
    b.open()
    assert b.state is not None
    window = b.state.window
    answers = b.outcomes([SUCCESS] * 5, instance="gw-b")
    assert all(not e.counted for a in answers if not isinstance(a, Rejection) for e in a)
    assert b.state.window == window and _status(b) == "open"


# --- Half-open: exactly one canary (BRK-2) ------------------------------------------------------


def test_exactly_one_canary_is_granted_and_its_success_closes_and_resets_the_window_brk_2() -> None:
    b = Breaker(policy=POLICY)
    b.half_open()
    granted = _grant(b, "gw-a")
    assert granted.expires_at == b.now + POLICY.canary_lease_ms and granted.granted_from == "half-open"
    for instance in ("gw-b", "gw-c", "gw-a"):
        refused = b.send(request(instance))
        assert isinstance(refused, Rejection) and refused.code.value == "CANARY_IN_FLIGHT"
    assert verdict(b.state, b.now, 0).canary_holder == "gw-a"
    (closed,) = b.send(report(granted.canary_id, SUCCESS, instance="gw-a"))  # type: ignore[misc]
    assert isinstance(closed, BreakerClosed) and closed.open_for_ms == 30_000
    assert _status(b) == "closed" and b.state is not None
    assert (b.state.window, b.state.cooldown_ms, b.state.canary) == ((), 0, None)
    b.open()  # a new episode starts from the base cooldown again
    assert b.state.cooldown_ms == POLICY.cooldown_ms


def test_a_failed_canary_reopens_with_the_cooldown_doubled_up_to_its_max_brk_2() -> None:
    b = Breaker(policy=POLICY)
    b.half_open()
    cooldowns = []
    for _ in range(4):
        granted = _grant(b)
        (reopened,) = b.send(report(granted.canary_id, TRANSPORT_FAILURE))  # type: ignore[misc]
        assert isinstance(reopened, BreakerReopened)
        cooldowns.append((reopened.previous_cooldown_ms, reopened.cooldown_ms))
        assert reopened.half_open_at == b.now + reopened.cooldown_ms and _status(b) == "open"
        assert b.tick(reopened.cooldown_ms - 1) == () and b.tick(1)
    assert cooldowns == [(30_000, 60_000), (60_000, 120_000), (120_000, 120_000), (120_000, 120_000)]


def test_a_canary_requested_once_the_cooldown_ran_out_half_opens_the_breaker_with_the_grant() -> None:
    b = Breaker(policy=POLICY)
    b.open()
    assert b.state is not None
    b.now = b.state.half_open_at
    granted = _grant(b, "gw-b")
    assert granted.granted_from == "open" and _status(b) == "half-open"
    assert b.tick() == (), "the cooldown timer has nothing left to do"


def test_a_canary_whose_holder_died_expires_and_the_slot_is_granted_once_more_brk_2() -> None:
    b = Breaker(policy=POLICY)
    b.half_open()
    first = _grant(b, "gw-a")
    (expired,) = b.tick(POLICY.canary_lease_ms)
    assert type(expired).__name__ == "CanaryExpired" and expired.canary_id == first.canary_id
    assert _status(b) == "half-open" and b.state is not None and b.state.canary is None
    second = _grant(b, "gw-b")
    assert second.canary_id != first.canary_id
    late = b.send(report(first.canary_id, SUCCESS, instance="gw-a"))
    assert isinstance(late, Rejection) and late.code.value == "CANARY_NOT_HELD"
    wrong_holder = b.send(report(second.canary_id, SUCCESS, instance="gw-a"))
    assert isinstance(wrong_holder, Rejection) and wrong_holder.code.value == "CANARY_NOT_HELD"


def test_a_request_taking_over_a_lapsed_slot_names_the_slot_it_replaces() -> None:
    b = Breaker(policy=POLICY)
    b.half_open()
    first = _grant(b, "gw-a")
    b.now = first.expires_at
    second = _grant(b, "gw-b")
    assert second.expired_canary_id == first.canary_id


def test_a_redelivered_canary_request_or_report_gets_no_second_answer() -> None:
    b = Breaker(policy=POLICY)
    b.half_open()
    ask = request("gw-a", command_id="ask-1")
    (granted,) = b.send(ask)  # type: ignore[misc]
    assert b.send(ask) == ()
    done = report(granted.canary_id, SUCCESS, command_id="done-1")
    assert len(b.send(done)) == 1  # type: ignore[arg-type]
    assert b.send(done) == ()
    assert b.send(ask) == ()


# --- operators ------------------------------------------------------------------------------------


def test_operators_force_open_disable_and_reset_with_their_reasons_recorded() -> None:
    b = Breaker(policy=POLICY)
    (forced,) = b.send(force_open("INC-77", endpoint=ENDPOINT))  # type: ignore[misc]
    assert (forced.reason, forced.previous_status, _status(b)) == ("INC-77", "", "forced-open")
    assert verdict(b.state, b.now, 45_000).cooldown_remaining_ms == 45_000
    b.outcomes([TRANSPORT_FAILURE] * 30)
    assert _status(b) == "forced-open", "a forced-open breaker does not half-open by itself"
    assert b.tick(10**9) == ()
    (disabled,) = b.send(disable("false alarms"))  # type: ignore[misc]
    assert disabled.previous_status == "forced-open" and _status(b) == "disabled"
    b.outcomes([TRANSPORT_FAILURE] * 30)
    assert _status(b) == "disabled" and not verdict(b.state, b.now, 0).open
    (done,) = b.send(reset("vendor recovered"))  # type: ignore[misc]
    assert done.previous_status == "disabled" and _status(b) == "closed"
    assert b.state is not None and b.state.reason == "vendor recovered"


# --- hostile input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        outcome(1, endpoint="not an endpoint"),
        outcome(1, endpoint=""),
        outcome(1, endpoint="x" * 201),
        outcome(1, "timeout"),
        outcome(-1),
        outcome(1, duration_ms=-5),
        outcome(1, detail="x" * 201),
        outcome(1, instance=""),
        request(""),
        force_open("   "),
        reset("x" * 1001),
    ],
    ids=lambda c: type(c).__name__,
)
def test_malformed_commands_are_refused_invalid_command(command: object) -> None:
    b = Breaker(policy=POLICY)
    b.outcomes([SUCCESS])
    answer = b.send(command)
    assert isinstance(answer, Rejection) and answer.code.value == "INVALID_COMMAND", answer
    assert answer.detail


# --- the policy and its settings --------------------------------------------------------------------


def test_the_policy_bounds_and_the_settings_bounds_agree() -> None:
    fields = TenureSettings.model_fields
    for name, (low, high) in BOUNDS.items():
        field = fields[f"breaker_{name}"]
        ge = next(m.ge for m in field.metadata if isinstance(m, Ge))
        le = next(m.le for m in field.metadata if isinstance(m, Le))
        assert (ge, le) == (low, high), name
        assert low <= field.default <= high
    assert out_of_bounds(BreakerPolicy()) == []
    assert out_of_bounds(
        BreakerPolicy(window=19, min_calls=30, cooldown_ms=60_000, cooldown_max_ms=30_000)
    ) == [
        "window=19 is outside [20, 1000]",
        "min_calls=30 exceeds window=19: the rate would never count",
        "cooldown_max_ms=30000 is below cooldown_ms=60000",
    ]


def test_the_fold_of_the_events_is_the_state() -> None:
    b = Breaker(policy=POLICY)
    b.half_open()
    granted = _grant(b)
    b.send(report(granted.canary_id, TRANSPORT_FAILURE))
    b.tick(60_000)
    assert fold(b.events) == b.state
    assert [e.version for e in b.events] == list(range(1, len(b.events) + 1))
