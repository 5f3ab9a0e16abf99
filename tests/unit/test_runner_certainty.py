"""The runner's lease certainty state machine (LEASE-4, LEASE-5, EXE-4).

The expected edges below are written out from the brief and SPEC LEASE-4 ("jeopardy is a state":
a holder that cannot tell whether its renewal took effect is quiescent until it can tell again,
or until the lease is gone), NOT copied from services/runner_sdk/certainty.py, so a wrong or
missing edge there fails a named pair here.

All times are local monotonic milliseconds; server times are epoch ms on the coordinator's clock.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.runner_sdk import (
    TERMINAL_CERTAINTIES,
    Certainty,
    CertaintyTracker,
    InvalidCertaintyTransition,
    JournalKind,
    check_transition,
    is_allowed,
)

V, J, L, R = Certainty.VALID, Certainty.JEOPARDY, Certainty.LOST, Certainty.RELEASED

EXPECTED_EDGES: dict[tuple[Certainty, Certainty], str] = {
    (V, J): "LEASE-4: a renewal's outcome is unknown, or the proven lease is within the safety margin",
    (J, V): "LEASE-4: a confirmed renewal proves the lease again",
    (V, L): "EXE-4: a 409 refusal (stale epoch), or the proven bound passed",
    (J, L): "LEASE-4: jeopardy ends in loss when no renewal is confirmed before the bound",
    (V, R): "the terminal report was accepted",
    (J, R): "a report whose outcome was unknown turned out accepted",
}

LEASE_MS = 90_000.0
MARGIN_MS = 30_000.0
SERVER_OFFSET_MS = 1_767_225_600_000  # server epoch ms minus local monotonic ms, arbitrary


@pytest.mark.parametrize(
    ("source", "target"), list(itertools.product(Certainty, Certainty)), ids=lambda c: c.value
)
def test_every_transition_pair_matches_the_table(source: Certainty, target: Certainty) -> None:
    """LEASE-4: all 16 (source, target) pairs; LOST and RELEASED are terminal."""
    if (source, target) in EXPECTED_EDGES:
        assert is_allowed(source, target), EXPECTED_EDGES[(source, target)]
        check_transition(source, target)
    else:
        assert not is_allowed(source, target)
        with pytest.raises(InvalidCertaintyTransition, match=f"{source.value} -> {target.value}"):
            check_transition(source, target)


def test_terminal_states_are_lost_and_released() -> None:
    assert frozenset({L, R}) == TERMINAL_CERTAINTIES


def _tracker(started_at: float = 0.0) -> CertaintyTracker:
    return CertaintyTracker(LEASE_MS, started_at=started_at, safety_margin_ms=MARGIN_MS)


def _confirm(
    t: CertaintyTracker, seq: int, sent_at: float, received_at: float, processing_ms: int = 0
) -> Certainty:
    """A coordinator that extends the lease by LEASE_MS from the moment the request arrived."""
    server_receive = int(sent_at) + SERVER_OFFSET_MS + 5  # 5 ms on the way up
    return t.renewal_confirmed(
        seq, sent_at, server_receive + int(LEASE_MS), server_receive + processing_ms, received_at
    )


def test_tracker_starts_in_jeopardy_until_a_renewal_is_confirmed() -> None:
    """LEASE-4: before anything proves the lease, the holder cannot tell, so it is quiescent."""
    t = _tracker()
    assert t.state is J
    assert t.valid_until_local is None
    assert not t.can_send_effects(0)
    assert _confirm(t, 0, sent_at=-50, received_at=10) is V
    assert t.valid_until_local == -50 + LEASE_MS
    assert t.can_send_effects(10)
    assert [(e.previous, e.state) for e in t.transitions] == [(None, J), (J, V)]


def test_unproven_start_is_lost_once_a_whole_lease_passed() -> None:
    t = _tracker(started_at=1_000)
    assert t.evaluate(1_000 + LEASE_MS - 1) is J
    assert t.evaluate(1_000 + LEASE_MS) is L


def test_bound_is_the_send_time_plus_the_granted_duration_whatever_the_clock_offset() -> None:
    """LEASE-5: only the server-side difference expiresAt - serverTime is used, never its clock."""
    for offset in (-(10**12), 0, 7, 10**12):
        t = _tracker()
        t.renewal_confirmed(1, 100.0, server_expires_at=offset + 90_000, server_time=offset + 200, now=300)
        # the coordinator had 89_800 ms left when it answered; our send was earlier than that.
        assert t.valid_until_local == 100 + 89_800


def test_granted_duration_is_capped_at_the_lease() -> None:
    t = _tracker()
    t.renewal_confirmed(1, 100.0, server_expires_at=10**9, server_time=0, now=300)
    assert t.valid_until_local == 100 + LEASE_MS


def test_repeated_sequence_answer_with_an_older_expiry_never_extends_beyond_it() -> None:
    """An idempotent repeat is answered with the CURRENT expiry, which may be older than our send."""
    t = _tracker()
    _confirm(t, 0, sent_at=0, received_at=10)
    # A repeat at local 50_000 answered with an expiry set at server receive time of local 0.
    t.renewal_confirmed(
        1,
        50_000.0,
        server_expires_at=SERVER_OFFSET_MS + 90_005,
        server_time=SERVER_OFFSET_MS + 50_010,
        now=50_020,
    )
    # proven by the repeat: 50_000 + (90_005 - 50_010); the claim's own bound (90_000) stays.
    assert t.valid_until_local == LEASE_MS  # never 50_000 + LEASE_MS


def test_time_alone_moves_valid_to_jeopardy_at_the_margin_then_to_lost_at_the_bound() -> None:
    """LEASE-4: jeopardy begins a safety margin BEFORE the proven bound, loss at the bound."""
    t = _tracker()
    _confirm(t, 0, sent_at=0, received_at=10)
    assert t.evaluate(LEASE_MS - MARGIN_MS - 1) is V
    assert t.evaluate(LEASE_MS - MARGIN_MS) is J
    assert "safety margin" in t.last_transition.reason
    assert t.evaluate(LEASE_MS - 1) is J
    assert t.evaluate(LEASE_MS) is L
    assert [(e.previous, e.state) for e in t.transitions][1:] == [(J, V), (V, J), (J, L)]


def test_jeopardy_is_never_lifted_by_time_only_by_a_confirmation() -> None:
    t = _tracker()
    _confirm(t, 0, sent_at=0, received_at=10)
    t.renewal_sent(1, 1_000)
    assert t.renewal_unknown(1, 8_500, "ReadTimeout") is J
    assert t.evaluate(8_600) is J  # nothing new is known
    assert "renewal 1 outcome unknown (ReadTimeout)" in t.last_transition.reason
    t.renewal_sent(2, 20_000)
    assert _confirm(t, 2, sent_at=20_000, received_at=20_040) is V
    assert t.last_transition.reason.startswith("renewal 2 confirmed")


def test_a_confirmation_older_than_the_unknown_renewal_does_not_lift_jeopardy() -> None:
    t = _tracker()
    _confirm(t, 0, sent_at=0, received_at=10)
    t.renewal_sent(1, 1_000)
    t.renewal_sent(2, 2_000)
    t.renewal_unknown(2, 3_000)
    assert _confirm(t, 1, sent_at=1_000, received_at=3_100) is J
    assert _confirm(t, 2, sent_at=2_000, received_at=3_200) is V


def test_a_confirmation_whose_bound_is_within_the_margin_keeps_jeopardy() -> None:
    """Back to VALID only if the new bound is beyond now + margin (a very slow answer is not)."""
    t = _tracker()
    _confirm(t, 0, sent_at=0, received_at=10)
    t.renewal_sent(1, 20_000)
    t.renewal_unknown(1, 27_500)
    t.renewal_sent(2, 40_000)
    # sent at 40 s, answered at 105 s: proven until 130 s, less than 105 + 30.
    assert _confirm(t, 2, sent_at=40_000, received_at=105_000) is J
    assert t.valid_until_local == 40_000 + LEASE_MS


def test_a_confirmation_arriving_after_the_bound_is_lost() -> None:
    t = _tracker()
    _confirm(t, 0, sent_at=0, received_at=10)
    t.renewal_sent(1, 80_000)
    assert t.evaluate(90_000) is L
    assert _confirm(t, 1, sent_at=80_000, received_at=90_100) is L
    assert t.journal[-1].kind is JournalKind.IGNORED


def test_a_refusal_loses_the_lease_immediately_from_valid_or_jeopardy() -> None:
    """EXE-4: a 409 (stale epoch) is final; no time is waited."""
    for make_jeopardy in (False, True):
        t = _tracker()
        _confirm(t, 0, sent_at=0, received_at=10)
        if make_jeopardy:
            t.renewal_unknown(1, 20)
        assert t.renewal_refused("stale-epoch: run is at epoch 4", 30) is L
        assert t.last_transition.reason == "refused: stale-epoch: run is at epoch 4"
        assert not t.can_send_effects(31)


@pytest.mark.parametrize("terminal", [L, R])
def test_terminal_states_ignore_every_later_input_and_journal_it(terminal: Certainty) -> None:
    t = _tracker()
    _confirm(t, 0, sent_at=0, received_at=10)
    if terminal is L:
        t.renewal_refused("lease-revoked", 20)
    else:
        t.released(20)
    before = len(t.transitions)
    assert _confirm(t, 3, sent_at=30, received_at=40) is terminal
    assert t.renewal_unknown(4, 50) is terminal
    assert t.renewal_refused("stale-epoch", 60) is terminal
    assert t.released(70) is terminal
    assert t.evaluate(10**9) is terminal
    assert len(t.transitions) == before
    assert [e.kind for e in t.journal[-4:]] == [JournalKind.IGNORED] * 4


def test_release_from_jeopardy() -> None:
    t = _tracker()
    _confirm(t, 0, sent_at=0, received_at=10)
    t.renewal_unknown(5, 100)
    assert t.released(200, "terminal report accepted (sequence 5)") is R


def test_renewal_sequences_must_strictly_increase() -> None:
    """EXE-4: every heartbeat carries a strictly increasing sequence."""
    t = _tracker()
    t.renewal_sent(1, 0)
    with pytest.raises(ValueError, match="not above the last sent 1"):
        t.renewal_sent(1, 1)
    t.renewal_sent(2, 2)


def test_evidence_records_carry_the_current_state() -> None:
    t = _tracker()
    entry = t.record(5, JournalKind.CHECKPOINT, "checkpoint sha256:ab", {"digest": "sha256:ab"})
    assert (entry.state, entry.attributes["digest"]) == (J, "sha256:ab")
    with pytest.raises(ValueError, match="journaled by the tracker"):
        t.record(6, JournalKind.TRANSITION, "forged")


def test_invalid_configuration_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        CertaintyTracker(0, started_at=0)
    with pytest.raises(ValueError, match="safety margin"):
        CertaintyTracker(1_000, started_at=0, safety_margin_ms=1_000)
    assert CertaintyTracker(90_000, started_at=0).safety_margin_ms == 30_000


# --- the safety property ----------------------------------------------------------------------
#
# A model world: local time is real time; the coordinator's clock is real time + an arbitrary
# offset. Each renewal travels up, is processed, and its answer travels down; or its outcome is
# unknown (timed out), having been applied by the coordinator or not. The coordinator extends the
# lease from the moment it received the request, by at most the lease (contract: expiresAt on its
# own clock), or answers a repeat with the current expiry. The tracker is told only what a real
# runner would know.


@dataclass(frozen=True)
class Renewal:
    waits: tuple[int, ...]  # local pauses before sending, with an evaluation after each
    up_ms: int
    processing_ms: int
    down_ms: int
    fate: str  # confirmed | repeat | applied-unknown | dropped-unknown
    granted_ms: int
    timeout_ms: int


def renewals(lease_ms: int) -> st.SearchStrategy[Renewal]:
    delay = st.integers(0, lease_ms // 2)
    return st.builds(
        Renewal,
        waits=st.lists(st.integers(0, lease_ms), max_size=3).map(tuple),
        up_ms=delay,
        processing_ms=st.integers(0, 2_000),
        down_ms=delay,
        fate=st.sampled_from(["confirmed", "confirmed", "repeat", "applied-unknown", "dropped-unknown"]),
        granted_ms=st.integers(1, lease_ms),
        timeout_ms=st.integers(1, lease_ms),
    )


@st.composite
def worlds(draw: st.DrawFn) -> tuple[int, int | None, int, list[Renewal]]:
    lease_ms = draw(st.integers(3_000, 120_000))
    margin = draw(st.one_of(st.none(), st.integers(0, lease_ms - 1)))
    offset = draw(st.integers(-(10**13), 10**13))
    return lease_ms, margin, offset, draw(st.lists(renewals(lease_ms), min_size=1, max_size=25))


@settings(max_examples=300, deadline=None)
@given(worlds(), st.integers(0, 60_000), st.integers(0, 60_000), st.integers(0, 2_000))
def test_tracker_never_says_valid_past_the_true_server_expiry(
    world: tuple[int, int | None, int, list[Renewal]], claim_up: int, claim_down: int, claim_processing: int
) -> None:
    """LEASE-4/LEASE-5: whatever the delays and clock offset, VALID implies the lease still lives.

    Checked at every instant the tracker is consulted: each evaluation, send and answer.
    """
    lease_ms, margin, offset, steps = world
    applied: list[tuple[int, int]] = []  # (local real time the coordinator applied it, expiresAt)

    def true_expiry_local(at: int) -> int:
        return max(expires for applied_at, expires in applied if applied_at <= at) - offset

    def check(tracker: CertaintyTracker, at: int) -> None:
        if tracker.state is Certainty.VALID:
            assert at < true_expiry_local(at), "VALID after the coordinator's expiry"
            assert at < tracker.valid_until_local - tracker.safety_margin_ms  # type: ignore[operator]
        if tracker.valid_until_local is not None:
            assert tracker.valid_until_local <= true_expiry_local(at)

    # The claim: sent at local 0, the lease starts when the coordinator receives it.
    received = claim_up
    expires = received + offset + lease_ms
    applied.append((received, expires))
    now = claim_up + claim_processing + claim_down
    tracker = CertaintyTracker(lease_ms, started_at=now, safety_margin_ms=margin)
    tracker.renewal_confirmed(0, 0, expires, received + offset + claim_processing, now)
    check(tracker, now)

    for sequence, step in enumerate(steps, start=1):
        for wait in step.waits:
            now += wait
            tracker.evaluate(now)
            check(tracker, now)
        if tracker.state in TERMINAL_CERTAINTIES:
            return
        sent_at = now
        tracker.renewal_sent(sequence, sent_at)
        check(tracker, now)
        received = sent_at + step.up_ms
        server_now = received + offset
        # The coordinator answers from what it has applied by the time this request arrives; an
        # earlier renewal still in flight (sent before, arriving later) is not part of it yet.
        current = max(e for applied_at, e in applied if applied_at <= received)
        if step.fate in ("confirmed", "applied-unknown"):
            current = max(current, server_now + step.granted_ms)
            applied.append((received, current))
        if step.fate in ("confirmed", "repeat"):
            now = received + step.processing_ms + step.down_ms
            tracker.renewal_confirmed(sequence, sent_at, current, server_now + step.processing_ms, now)
        else:
            now = sent_at + step.timeout_ms
            tracker.renewal_unknown(sequence, now, "ReadTimeout")
        check(tracker, now)


def test_prompt_confirmed_renewals_keep_the_lease_valid_indefinitely() -> None:
    """EXE-4 defaults (lease 90 s, heartbeat 20 s): healthy renewals never leave VALID."""
    t = _tracker()
    _confirm(t, 0, sent_at=0, received_at=30)
    for seq in range(1, 500):
        sent = seq * 20_000.0
        assert t.evaluate(sent) is V
        t.renewal_sent(seq, sent)
        assert _confirm(t, seq, sent_at=sent, received_at=sent + 250, processing_ms=40) is V
    assert [e.state for e in t.transitions] == [J, V]
