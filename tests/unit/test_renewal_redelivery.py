"""A redelivered renewal is dropped by its command id, not refused (issue 16; LEASE-1, LEASE-5, DUR-1).

A consumer-group handover redelivers the commands consumed since the last offset commit. Every
command the Run accepted is dropped on redelivery (`decide` answers `()`); renewals are
remembered in a short window of their own (`RunState.handled_renewals`, RECENT_RENEWALS_KEPT),
so a long run's state stays small. A renewal with a NEW command id and an old sequence is a
client resending and is still refused DUPLICATE_SEQUENCE (the heartbeat routes answer it as a
replay). The state codec carries the window and reads states stored before it existed.
"""

from __future__ import annotations

import dataclasses
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.contracts import LeaseRenewed, RenewLease
from services.lease_coordinator.domain import RejectionCode, RunStatus, decide, fold
from services.lease_coordinator.domain.state import RECENT_COMMANDS_KEPT, RECENT_RENEWALS_KEPT
from services.lease_coordinator.state_codec import decode_state, encode_state, state_record
from tests.support.lease_run import Run, claim_cmd, renew_cmd, report_cmd


def _renew(run: Run, sequence: int, command_id: str) -> RenewLease:
    lease = run.state.lease
    assert lease is not None
    return renew_cmd(run.run_id, lease.attempt_id, lease.epoch, sequence, command_id=command_id)


def test_a_redelivered_accepted_renewal_is_dropped_not_refused_lease_5_dur_1() -> None:
    """LEASE-5 / DUR-1: the same RenewLease again after it was accepted: no event, no refusal,
    no state change; a renewal is answered once."""
    run = Run()
    run.claim()
    command = _renew(run, 1, "renew-once")
    (renewed,) = run.accept(command)
    assert isinstance(renewed, LeaseRenewed)
    assert run.state.handled_renewals == ("renew-once",)
    assert "renew-once" not in run.state.handled_commands, "renewals do not crowd the other ids out"
    before = run.state
    run.at(run.now + 5_000)
    assert run.decide(command) == ()
    assert run.state == before


def test_a_new_command_with_the_last_sequence_is_still_duplicate_sequence_lease_5() -> None:
    """LEASE-5: a client resending a used sequence under a new command id is refused
    DUPLICATE_SEQUENCE as before (the API answers it as a replay), and changes nothing."""
    run = Run()
    run.claim()
    run.accept(_renew(run, 1, "renew-first"))
    run.refuse(_renew(run, 1, "renew-resent"), RejectionCode.DUPLICATE_SEQUENCE)
    run.refuse(_renew(run, 0, "renew-older"), RejectionCode.SEQUENCE_NOT_INCREASING)
    assert run.state.handled_renewals == ("renew-first",), "a refused renewal is not remembered"


def test_a_redelivered_renewal_after_the_attempt_ended_is_still_dropped_lease_1() -> None:
    """LEASE-1: once the lease ended (report), a redelivered earlier renewal is dropped rather
    than refused LEASE_RELEASED: it was answered when it was accepted."""
    run = Run()
    claimed = run.claim()
    command = _renew(run, 1, "renew-before-report")
    run.accept(command)
    run.accept(report_cmd(run.run_id, claimed.attempt_id, claimed.epoch, 2, "failed"))
    assert run.state.status is RunStatus.FAILED
    assert run.decide(command) == ()


def test_the_renewal_window_is_bounded_and_keeps_the_most_recent_lease_5() -> None:
    """LEASE-5: a long run's renewals never grow its state past RECENT_RENEWALS_KEPT ids; an id
    that left the window is refused by its sequence, as a resend is."""
    run = Run()
    run.claim()
    ids = [f"renew-{n}" for n in range(1, RECENT_RENEWALS_KEPT * 3 + 1)]
    for sequence, command_id in enumerate(ids, start=1):
        run.at(run.now + 1_000).accept(_renew(run, sequence, command_id))
    assert run.state.handled_renewals == tuple(ids[-RECENT_RENEWALS_KEPT:])
    assert len(run.state.handled_commands) == 2, "submit and claim only"
    for recent in ids[-RECENT_RENEWALS_KEPT:]:
        assert run.decide(_renew(run, ids.index(recent) + 1, recent)) == ()
    oldest = ids[0]
    run.refuse(_renew(run, 1, oldest), RejectionCode.SEQUENCE_NOT_INCREASING)


@settings(max_examples=60, deadline=None)
@given(
    renewals=st.integers(min_value=1, max_value=3 * RECENT_RENEWALS_KEPT),
    redelivered_from=st.integers(min_value=0, max_value=3 * RECENT_RENEWALS_KEPT),
)
def test_any_redelivered_recent_renewal_is_dropped_and_the_window_stays_bounded_lease_5(
    renewals: int, redelivered_from: int
) -> None:
    """LEASE-5 / DUR-1, as a property: after any number of accepted renewals, redelivering the
    last ones (up to RECENT_RENEWALS_KEPT back) decides nothing, the window never holds more than
    RECENT_RENEWALS_KEPT ids, and the replayed state (the one fold) equals the incremental one."""
    run = Run()
    run.claim()
    commands = [_renew(run, n, f"renew-{n}") for n in range(1, renewals + 1)]
    for command in commands:
        run.at(run.now + 1_000).accept(command)
        assert len(run.state.handled_renewals) <= RECENT_RENEWALS_KEPT
    tail = commands[max(redelivered_from, renewals - RECENT_RENEWALS_KEPT) :]
    for command in tail:
        assert decide(run.state, command, run.now) == ()
    assert fold(run.events) == run.state


def test_many_renewals_do_not_push_other_commands_out_of_the_handled_window_dur_1() -> None:
    """DUR-1: the claim stays deduplicated by its id however many renewals follow it."""
    run = Run()
    claim = claim_cmd(run.run_id, command_id="claim-once")
    run.accept(claim)
    for sequence in range(1, RECENT_COMMANDS_KEPT + 10):
        run.at(run.now + 1_000).accept(_renew(run, sequence, f"renew-{sequence}"))
    assert run.decide(claim) == ()


# --- the state codec ----------------------------------------------------------------------------


def test_the_state_codec_round_trips_the_renewal_window_dur_1() -> None:
    """DUR-1: the RocksDB state (and the view's embedded state) keeps the window across a restart."""
    run = Run()
    run.claim()
    for sequence in (1, 2, 3):
        run.accept(_renew(run, sequence, f"renew-{sequence}"))
    state = run.state
    assert state.handled_renewals == ("renew-1", "renew-2", "renew-3")
    assert decode_state(encode_state(state)) == state
    assert json.loads(encode_state(state))["handled_renewals"] == ["renew-1", "renew-2", "renew-3"]


def test_a_state_stored_before_the_renewal_window_existed_decodes_with_none_remembered_dur_1() -> None:
    """DUR-1: states written before `handled_renewals` existed still decode, remembering none."""
    run = Run()
    run.claim()
    run.accept(_renew(run, 1, "renew-1"))
    record = state_record(run.state)
    record.pop("handled_renewals")
    decoded = decode_state(json.dumps(record).encode())
    assert decoded == dataclasses.replace(run.state, handled_renewals=())
    # Such a state refuses the redelivery by its sequence, as the coordinator did before.
    assert run.decide(_renew(run, 1, "renew-1")) == ()
    refused = decide(decoded, _renew(run, 1, "renew-1"), run.now)
    assert not isinstance(refused, tuple) and refused.code is RejectionCode.DUPLICATE_SEQUENCE
