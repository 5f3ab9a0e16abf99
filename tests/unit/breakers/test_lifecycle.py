"""The breaker's lifecycle, exhaustively (BRK-1, BRK-2): every pair of statuses against the
transition table, and every situation x every command (and the timer) against decide/evolve.

The expectations are written out here by hand, independently of the table in services/breakers/
domain/lifecycle.py, so a change of either shows up as a failure of this file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from services.breakers.domain import (
    TRANSITIONS,
    BreakerStatus,
    IllegalTransition,
    Rejection,
    check_transition,
    evolve,
)
from services.common.contracts import SUCCESS, TRANSPORT_FAILURE, BreakerForcedOpen, BreakerHalfOpened

from .support import POLICY, Breaker, disable, force_open, outcome, report, request, reset

S = BreakerStatus
ALLOWED = {
    (S.CLOSED, S.CLOSED), (S.CLOSED, S.OPEN), (S.CLOSED, S.FORCED_OPEN), (S.CLOSED, S.DISABLED),
    (S.OPEN, S.OPEN), (S.OPEN, S.HALF_OPEN), (S.OPEN, S.CLOSED),
    (S.OPEN, S.FORCED_OPEN), (S.OPEN, S.DISABLED),
    (S.HALF_OPEN, S.HALF_OPEN), (S.HALF_OPEN, S.CLOSED), (S.HALF_OPEN, S.OPEN),
    (S.HALF_OPEN, S.FORCED_OPEN), (S.HALF_OPEN, S.DISABLED),
    (S.FORCED_OPEN, S.FORCED_OPEN), (S.FORCED_OPEN, S.CLOSED), (S.FORCED_OPEN, S.DISABLED),
    (S.DISABLED, S.DISABLED), (S.DISABLED, S.CLOSED), (S.DISABLED, S.FORCED_OPEN),
}  # fmt: skip
PAIRS = [(before, after) for before in S for after in S]


@pytest.mark.parametrize(("before", "after"), PAIRS, ids=[f"{b.value}->{a.value}" for b, a in PAIRS])
def test_every_pair_of_statuses_is_allowed_exactly_as_the_table_says_brk_1_brk_2(
    before: BreakerStatus, after: BreakerStatus
) -> None:
    assert (after in TRANSITIONS[before]) == ((before, after) in ALLOWED)
    if (before, after) in ALLOWED:
        assert check_transition(before, after) is after
    else:
        with pytest.raises(IllegalTransition):
            check_transition(before, after)


# --- situations x commands --------------------------------------------------------------------


def _closed(b: Breaker) -> None:
    # 4 successes and 5 failures: one failure more is 6/10 > 0.5 (opens), one success 5/10 (not above).
    b.outcomes([SUCCESS] * 4 + [TRANSPORT_FAILURE] * 5)


def _open_cooled(b: Breaker) -> None:
    b.open()
    assert b.state is not None
    b.now = b.state.half_open_at  # due, but the timer has not run yet


def _held(b: Breaker) -> None:
    b.half_open()
    assert not isinstance(b.send(request("gw-a", command_id="req-held")), Rejection)


def _lapsed(b: Breaker) -> None:
    _held(b)
    assert b.state is not None and b.state.canary is not None
    b.now = b.state.canary.expires_at  # run out, but the timer has not run yet


SITUATIONS: dict[str, Callable[[Breaker], None]] = {
    "new": lambda b: None,
    "closed": _closed,
    "open": Breaker.open,
    "open-cooled": _open_cooled,
    "half-open": Breaker.half_open,
    "half-open-held": _held,
    "half-open-lapsed": _lapsed,
    "forced-open": lambda b: b.outcomes([SUCCESS]) and b.send(force_open()),
    "disabled": lambda b: b.outcomes([SUCCESS]) and b.send(disable()),
}


def _canary_of(b: Breaker) -> str:
    canary = b.state.canary if b.state is not None else None
    return canary.canary_id if canary is not None else "cny_nothing"


COMMANDS: dict[str, Callable[[Breaker], Any]] = {
    "failure": lambda b: outcome(10_000, TRANSPORT_FAILURE, instance="gw-b"),
    "success": lambda b: outcome(10_000, SUCCESS, instance="gw-b"),
    "request": lambda b: request("gw-b"),
    "report-success": lambda b: report(_canary_of(b), SUCCESS, instance="gw-a"),
    "report-failure": lambda b: report(_canary_of(b), TRANSPORT_FAILURE, instance="gw-a"),
    "force": lambda b: force_open(),
    "disable": lambda b: disable(),
    "reset": lambda b: reset(),
    "timer": lambda b: None,
}

REC, NOT_HELD = "CallOutcomeRecorded", "!CANARY_NOT_HELD"
OPERATORS = {"force": "BreakerForcedOpen forced-open", "disable": "BreakerDisabled disabled"}
# situation -> command -> "<event types> <status after>", "!<rejection code>", or "-" (nothing).
EXPECTED: dict[str, dict[str, str]] = {
    "new": {
        "failure": f"{REC} closed", "success": f"{REC} closed", "request": "!BREAKER_CLOSED",
        "report-success": NOT_HELD, "report-failure": NOT_HELD, **OPERATORS,
        "reset": "!BREAKER_NOT_FOUND", "timer": "-",
    },
    "closed": {
        "failure": f"{REC},BreakerOpened open", "success": f"{REC} closed", "request": "!BREAKER_CLOSED",
        "report-success": NOT_HELD, "report-failure": NOT_HELD, **OPERATORS,
        "reset": "BreakerReset closed", "timer": "-",
    },
    "open": {
        "failure": f"{REC} open", "success": f"{REC} open", "request": "!BREAKER_OPEN",
        "report-success": NOT_HELD, "report-failure": NOT_HELD, **OPERATORS,
        "reset": "BreakerReset closed", "timer": "-",
    },
    "open-cooled": {
        "failure": f"{REC} open", "success": f"{REC} open", "request": "CanaryGranted half-open",
        "report-success": NOT_HELD, "report-failure": NOT_HELD, **OPERATORS,
        "reset": "BreakerReset closed", "timer": "BreakerHalfOpened half-open",
    },
    "half-open": {
        "failure": f"{REC} half-open", "success": f"{REC} half-open", "request": "CanaryGranted half-open",
        "report-success": NOT_HELD, "report-failure": NOT_HELD, **OPERATORS,
        "reset": "BreakerReset closed", "timer": "-",
    },
    "half-open-held": {
        "failure": f"{REC} half-open", "success": f"{REC} half-open", "request": "!CANARY_IN_FLIGHT",
        "report-success": "BreakerClosed closed", "report-failure": "BreakerReopened open", **OPERATORS,
        "reset": "BreakerReset closed", "timer": "-",
    },
    "half-open-lapsed": {
        "failure": f"{REC} half-open", "success": f"{REC} half-open", "request": "CanaryGranted half-open",
        "report-success": "BreakerClosed closed", "report-failure": "BreakerReopened open", **OPERATORS,
        "reset": "BreakerReset closed", "timer": "CanaryExpired half-open",
    },
    "forced-open": {
        "failure": f"{REC} forced-open", "success": f"{REC} forced-open", "request": "!BREAKER_FORCED_OPEN",
        "report-success": NOT_HELD, "report-failure": NOT_HELD, "force": "!BREAKER_FORCED_OPEN",
        "disable": "BreakerDisabled disabled", "reset": "BreakerReset closed", "timer": "-",
    },
    "disabled": {
        "failure": f"{REC} disabled", "success": f"{REC} disabled", "request": "!BREAKER_DISABLED",
        "report-success": NOT_HELD, "report-failure": NOT_HELD, "force": "BreakerForcedOpen forced-open",
        "disable": "!BREAKER_DISABLED", "reset": "BreakerReset closed", "timer": "-",
    },
}  # fmt: skip
CELLS = [(situation, command) for situation in SITUATIONS for command in COMMANDS]


def _answer(situation: str, command: str) -> tuple[str, BreakerStatus | None, BreakerStatus | None]:
    b = Breaker(policy=POLICY)
    SITUATIONS[situation](b)
    before = b.state.status if b.state is not None else None
    if command == "timer":
        events: Any = b.tick()
    else:
        events = b.send(COMMANDS[command](b))
    if isinstance(events, Rejection):
        return f"!{events.code.value}", before, before
    if not events:
        return "-", before, before
    after = b.state.status if b.state is not None else None
    assert after is not None
    return f"{','.join(type(e).__name__ for e in events)} {after.value}", before, after


@pytest.mark.parametrize(("situation", "command"), CELLS, ids=[f"{s}:{c}" for s, c in CELLS])
def test_every_situation_answers_every_command_as_specified_brk_1_brk_2(situation: str, command: str) -> None:
    answer, before, after = _answer(situation, command)
    assert answer == EXPECTED[situation][command]
    if before is not None and after is not None:
        assert after in TRANSITIONS[before], f"{before.value} -> {after.value}"


def test_the_matrix_walks_every_allowed_transition_of_the_table() -> None:
    walked = set()
    for situation, command in CELLS:
        _, before, after = _answer(situation, command)
        if before is not None and after is not None and EXPECTED[situation][command][0] not in "!-":
            walked.add((before, after))
    assert walked == ALLOWED


def test_evolve_refuses_an_event_its_status_cannot_have() -> None:
    b = Breaker(policy=POLICY)
    b.outcomes([SUCCESS])
    assert b.state is not None
    state = b.state
    half_open = BreakerHalfOpened(
        event_id="e", run_id=state.endpoint, version=state.version + 1, occurred_at=b.now,
        causation_id="timer", correlation_id="c", actor="a", opened_at=0, cooldown_ms=1,
    )  # fmt: skip
    with pytest.raises(IllegalTransition):
        evolve(state, half_open)
    with pytest.raises(ValueError, match="does not exist"):
        evolve(None, half_open)
    forced = BreakerForcedOpen(
        event_id="e", run_id=state.endpoint, version=state.version + 2, occurred_at=b.now,
        causation_id="c", correlation_id="c", actor="a", reason="r", previous_status="closed",
    )  # fmt: skip
    with pytest.raises(ValueError, match="does not follow"):
        evolve(state, forced)  # a gap in the versions
