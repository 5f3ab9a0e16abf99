"""LEASE-8 in the pure core: leases only where exclusive ownership is needed; no global mutex.

The lease is part of ONE run's aggregate: `decide(state, command, now)` is given that run's
state and nothing of any other run's lease. So, whatever the interleaving of several runs'
commands, each run gets exactly the decisions it gets alone, and holding one run's lease never
refuses anything of another run. Inside a run, only the commands that advance the work need the
lease (renewal, effect intent, report); submission and the cancel of a queued run need none,
and a second claimant of a held run is refused. The e2e counterpart, with concurrent requests on
real processes, is tests/e2e/test_lease_scope.py::test_leases_only_where_exclusive_ownership_is_
needed_no_global_mutex_LEASE_8.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.contracts import AttemptClaimed, CancelRun, RunCommand
from services.lease_coordinator.domain import (
    Decision,
    Rejection,
    RejectionCode,
    RunState,
    attempt_id_for,
    decide,
    evolve,
)
from tests.support.lease_run import T0, claim_cmd, intent_cmd, outcome_cmd, renew_cmd, report_cmd

from .strategies import submit_command

RUNS = 3


def _script(i: int) -> list[RunCommand]:
    """One run's life: submit, claim, renew, an effect's intent and outcome, the report."""
    submit = submit_command(f"tenant-{i}", f"key-{i}", command_id=f"cmd-submit-{i}")
    run_id = submit.run_id
    attempt = attempt_id_for(run_id, 1)
    return [
        submit,
        claim_cmd(run_id, f"runner-{i}", command_id=f"cmd-claim-{i}", lease_seconds=60),
        renew_cmd(run_id, attempt, 1, 1, command_id=f"cmd-renew-{i}"),
        intent_cmd(run_id, attempt, 1, f"eff-{i}", command_id=f"cmd-intent-{i}"),
        outcome_cmd(run_id, attempt, 1, f"eff-{i}", command_id=f"cmd-outcome-{i}"),
        report_cmd(run_id, attempt, 1, 2, command_id=f"cmd-report-{i}"),
    ]


SCRIPTS = [_script(i) for i in range(RUNS)]


def _apply(state: RunState | None, decision: Decision) -> RunState | None:
    if isinstance(decision, Rejection):
        return state
    for event in decision:
        state = evolve(state, event)
    return state


def _run(schedule: list[int]) -> dict[str, list[Decision]]:
    """Decide the scripts' commands in `schedule` order (run index per step), each at its own
    fixed time, so only the interleaving differs between schedules."""
    states: dict[str, RunState | None] = {}
    decisions: dict[str, list[Decision]] = {}
    steps = [0] * RUNS
    for i in schedule:
        command = SCRIPTS[i][steps[i]]
        now = T0 + 1_000 * steps[i]
        steps[i] += 1
        decision = decide(states.get(command.run_id), command, now)
        states[command.run_id] = _apply(states.get(command.run_id), decision)
        decisions.setdefault(command.run_id, []).append(decision)
    return decisions


ALONE = _run([i for i in range(RUNS) for _ in SCRIPTS[i]])


@settings(max_examples=60, deadline=None)
@given(st.permutations([i for i in range(RUNS) for _ in SCRIPTS[i]]))
def test_any_interleaving_of_runs_gives_each_run_its_own_decisions_LEASE_8(schedule: list[int]) -> None:
    """No global mutex: another run's lease, held or not, changes nothing of this run's."""
    # A permutation of the multiset keeps each run's commands in their own order.
    assert _run(list(schedule)) == ALONE


def test_every_run_is_granted_its_own_lease_while_the_others_are_held_LEASE_8() -> None:
    for run_id, decisions in ALONE.items():
        assert not [d for d in decisions if isinstance(d, Rejection)], (run_id, decisions)
        claimed = decisions[1]
        assert not isinstance(claimed, Rejection) and isinstance(claimed[0], AttemptClaimed)
        assert (claimed[0].run_id, claimed[0].epoch) == (run_id, 1)


def test_only_the_work_itself_needs_the_lease_LEASE_8() -> None:
    script = SCRIPTS[0]
    submit, claim = script[0], script[1]
    run_id = submit.run_id
    state = _apply(None, decide(None, submit, T0))
    assert state is not None and state.lease is None, "admitted and queued: no lease exists yet"
    # Cancelling a queued run needs no lease: nobody advances it.
    cancel = CancelRun(
        command_id="cmd-cancel-0",
        run_id=run_id,
        issued_at=T0,
        correlation_id="c",
        actor="user:alice",
        reason="changed plans",
    )
    assert not isinstance(decide(state, cancel, T0), Rejection)

    held = _apply(state, decide(state, claim, T0))
    assert held is not None and held.lease is not None
    # The same run's work needs its lease: a second claimant, and anyone without it, is refused.
    second = decide(held, claim_cmd(run_id, "runner-b", command_id="cmd-claim-b"), T0 + 1)
    assert isinstance(second, Rejection) and second.code is RejectionCode.RUN_NOT_CLAIMABLE
    foreign = attempt_id_for(SCRIPTS[1][0].run_id, 1)  # an attempt that holds another run
    for command in (
        renew_cmd(run_id, foreign, 1, 1, command_id="cmd-r-f"),
        intent_cmd(run_id, foreign, 1, "eff-f", command_id="cmd-i-f"),
        report_cmd(run_id, foreign, 1, 2, command_id="cmd-p-f"),
    ):
        refused = decide(held, command, T0 + 1)
        assert isinstance(refused, Rejection) and refused.code is RejectionCode.STALE_EPOCH, command
