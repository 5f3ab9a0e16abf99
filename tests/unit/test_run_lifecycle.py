"""The Run lifecycle table against the spec: every one of the 81 (source, target) pairs is checked.

The expected edges are written out here from SPEC.md (and the Russian original execution.ru.md,
which wins where they differ), NOT copied from services/lease_coordinator/domain/lifecycle.py,
so a wrong or missing edge in the table fails a named pair below.
"""

from __future__ import annotations

import itertools

import pytest

from services.lease_coordinator.domain import (
    TERMINAL_STATUSES,
    TRANSITIONS,
    IllegalTransition,
    RunStatus,
    check_transition,
    is_allowed,
)

Q = RunStatus.QUEUED
P = RunStatus.PREPARING
R = RunStatus.RUNNING
C = RunStatus.CANCELLING
W = RunStatus.WAITING_INPUT
S = RunStatus.SUCCEEDED
F = RunStatus.FAILED
X = RunStatus.CANCELLED
I = RunStatus.INTERRUPTED  # noqa: E741 - the single letter mirrors the table below

# (source, target) -> the requirement that allows the edge.
SPEC_EDGES: dict[tuple[RunStatus, RunStatus], str] = {
    # EXE-2: the active slot is reserved and the Attempt claimed with its leaseEpoch -> preparing.
    (Q, P): "EXE-2 claim",
    # EXE-7: cancel of a queued Run releases the reservation and ends the Run at once.
    (Q, X): "EXE-7 cancel queued",
    # EXE-10: timeoutSeconds bounds the Run from first assignment "including input waits and
    # later queueing"; a continuation re-queued after waiting_input whose deadline passes holds
    # no process to stop, so it ends failed/DEADLINE_EXCEEDED straight from queued. The other
    # routes would be wrong: queued -> cancelled is a false cancel (EXE-7), and
    # queued -> preparing -> failed claims an active slot and a lease for a dead Run.
    (Q, F): "EXE-10 deadline passes while a continuation is queued",
    # EXE-11: preparation succeeds -> running; bounded retries exhausted -> failed.
    (P, R): "EXE-11 preparation done",
    (P, F): "EXE-11 preparation retries exhausted",
    # EXE-7: the claimed Attempt holds a lease, so a cancel must wait for the runner.
    (P, C): "EXE-7 cancel with a lease held",
    # EXE-5: lease loss -> interrupted.
    (P, I): "EXE-5 lease loss",
    # EXE-11: a preparation error without external effects sends the Run back to the queue for
    # another attempt while attempts remain.
    (P, Q): "EXE-11 preparation retried",
    # EXE-10: the runner confirms the stop it was asked for at the deadline -> failed.
    (C, F): "EXE-10 confirmed stop at the deadline",
    # EXE-10: the deadline bounds the whole Run, including the wait before a retry.
    (I, F): "EXE-10 deadline passes while interrupted",
    # EXE-1: succeeded only after the ResultManifest is verified (an event, not a table edge).
    (R, S): "EXE-1 verified result",
    # EXE-10: confirmed stop at the deadline -> failed DEADLINE_EXCEEDED (also harness failure).
    (R, F): "EXE-10 deadline / failure",
    (R, C): "EXE-7 cancel running",
    (R, W): "EXE-8 waiting_input with checkpoint-v1",
    # EXE-5 lease loss; EXE-10 unconfirmed stop at the deadline -> interrupted.
    (R, I): "EXE-5/EXE-10 lease loss or unconfirmed stop",
    # EXE-7: the runner's confirmation -> cancelled; without it -> interrupted, never cancelled.
    (C, X): "EXE-7 confirmed cancel",
    (C, I): "EXE-7 unconfirmed cancel",
    # EXE-8: the validated answer queues a continuation pinned to the original spec.
    (W, Q): "EXE-8 continuation",
    # EXE-10: inputRequest.expiresAt -> failed INPUT_EXPIRED; the deadline also applies.
    (W, F): "EXE-10 input expired / deadline",
    # EXE-8: the runner released its lease before waiting, so nothing runs: cancel ends at once.
    (W, X): "EXE-7/EXE-8 cancel while no lease is held",
    # EXE-5: retry (automatic if retrySafe and policy allow, else explicit) -> a new Attempt of
    # the same Run, which queues again.
    (I, Q): "EXE-5 retry as a new Attempt",
    # An interrupted Run holds no lease and no process Tenure still controls; the user may close
    # it. (EXE-7 forbids only *automatic* retry after an accepted cancel.)
    (I, X): "EXE-5/EXE-7 close an interrupted run",
}

SPEC_TERMINAL = frozenset({S, F, X})
ALL_PAIRS = list(itertools.product(RunStatus, RunStatus))


def _pair_id(pair: tuple[RunStatus, RunStatus]) -> str:
    return f"{pair[0].value}->{pair[1].value}"


def test_the_table_has_nine_statuses_and_81_pairs() -> None:
    assert len(RunStatus) == 9
    assert len(ALL_PAIRS) == 81
    assert set(TRANSITIONS) == set(RunStatus), "every status needs a row, even terminal ones"


@pytest.mark.parametrize("pair", ALL_PAIRS, ids=_pair_id)
def test_every_pair_matches_the_spec_reading(pair: tuple[RunStatus, RunStatus]) -> None:
    """EXE-2, EXE-5, EXE-7, EXE-8, EXE-10, EXE-11: one pair of the 81, allowed iff the spec says so."""
    source, target = pair
    expected = pair in SPEC_EDGES
    assert is_allowed(source, target) is expected, (
        f"{_pair_id(pair)}: spec says {'allowed (' + SPEC_EDGES[pair] + ')' if expected else 'forbidden'}"
    )
    if expected:
        assert check_transition(source, target) is target
    else:
        with pytest.raises(IllegalTransition) as raised:
            check_transition(source, target)
        assert raised.value.source is source
        assert raised.value.target is target


def test_terminal_statuses_are_exactly_succeeded_failed_cancelled() -> None:
    assert TERMINAL_STATUSES == SPEC_TERMINAL


@pytest.mark.parametrize("terminal", sorted(SPEC_TERMINAL, key=lambda s: s.value), ids=lambda s: s.value)
def test_terminal_states_have_no_exits(terminal: RunStatus) -> None:
    """EXE-7: a late success after a cancel (or anything else) never leaves a terminal status."""
    assert TRANSITIONS[terminal] == frozenset()
    for target in RunStatus:
        assert not is_allowed(terminal, target)
        with pytest.raises(IllegalTransition):
            check_transition(terminal, target)


def _reachable_from(start: RunStatus) -> set[RunStatus]:
    seen = {start}
    frontier = [start]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return seen


def test_every_status_is_reachable_from_queued() -> None:
    assert _reachable_from(RunStatus.QUEUED) == set(RunStatus)


@pytest.mark.parametrize(
    "status",
    [s for s in RunStatus if s not in SPEC_TERMINAL],
    ids=lambda s: s.value,
)
def test_a_terminal_status_is_reachable_from_every_live_status(status: RunStatus) -> None:
    """No live status is a trap: every Run can still end (EXE-12's reconciler relies on it)."""
    assert _reachable_from(status) & SPEC_TERMINAL


def test_no_status_transitions_to_itself() -> None:
    """EXE-11's retry inside `preparing` is not a status change; a self-edge would bump nothing."""
    assert all(not is_allowed(s, s) for s in RunStatus)


def test_illegal_transition_message_names_both_states() -> None:
    with pytest.raises(IllegalTransition) as raised:
        check_transition(RunStatus.CANCELLED, RunStatus.RUNNING)
    message = str(raised.value)
    assert "cancelled" in message
    assert "running" in message
    assert message.index("cancelled") < message.index("running"), "source first, then target"


def test_transitions_table_is_read_only() -> None:
    with pytest.raises(TypeError):
        TRANSITIONS[RunStatus.SUCCEEDED] = frozenset({RunStatus.QUEUED})  # type: ignore[index]
