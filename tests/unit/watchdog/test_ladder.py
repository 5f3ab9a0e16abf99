"""The intervention ladder (WD-5): level 1 on a first violation, level 2 on a second one within
the 3-step epoch (rollback to the checkpoint before the cycle, looping turns truncated, action
tombstoned), level 3 once the rollback budget is spent (ERR_SEMANTIC_DEADLOCK)."""

from __future__ import annotations

from services.common.contracts import InterventionIssued, RollbackAcknowledged, WatchdogConfigured
from services.common.ids import action_hash
from services.watchdog.domain import DEADLOCK, INTERRUPT, ROLLBACK, Rejection, Thresholds, WatchdogStatus
from tests.unit.watchdog.support import Watchdog, acknowledge, observe, state_hash

W = WatchdogStatus
EDIT = {"line": 42, "text": "strict"}
REVERT = {"line": 42, "text": "lax"}


def seed_loop(turns: int, start: int = 1) -> list:
    """The seed's 2-state loop (WD-2): a read of the starting state, then edit, revert, edit..."""
    steps = [observe(start, "fs.read", {"path": "config.py"}, "A", mutating=False)]
    for i in range(1, turns):
        edit = i % 2 == 1
        steps.append(observe(start + i, "fs.edit", EDIT if edit else REVERT, "B" if edit else "A"))
    return steps


def test_the_seed_loop_climbs_the_ladder_one_level_per_violation_wd_5() -> None:
    watchdog = Watchdog().run(seed_loop(9))
    assert watchdog.levels() == [1, 2, 3]
    first, second, third = watchdog.interventions()
    # Level 1 at the first repeat (turn 4), with the period and the step it returned to.
    assert (first.turn, first.code, first.period, first.returned_to_step) == (4, INTERRUPT, 2, 2)
    assert first.action_hash == action_hash("fs.edit", EDIT)
    assert "STATE_OSCILLATION_DETECTED" in first.message and "k=2" in first.message
    # Level 2 at the next violation (turn 5, within 3 steps): back to before the orbit was
    # entered (the read at step 1), the orbit's turns truncated, the revert tombstoned.
    assert (second.turn, second.code, second.checkpoint_step) == (5, ROLLBACK, 1)
    assert second.checkpoint_state_hash == state_hash("A") and second.truncated_steps == (2, 3, 4, 5)
    assert second.action_hash == action_hash("fs.edit", REVERT) and second.rollbacks_used == 1
    # Level 3: the loop resumed after the rollback (window truncated, so it needs a full orbit
    # again: steps 6, 7, 8) and the budget of one rollback is spent.
    assert (third.turn, third.code, third.rollbacks_used, third.rollback_budget) == (8, DEADLOCK, 1, 1)
    assert watchdog.state is not None and watchdog.state.status is W.DEADLOCKED
    assert watchdog.state.tombstones == (second.action_hash, third.action_hash)


def test_every_intervention_answers_its_detection_and_each_level_is_issued_once_wd_5() -> None:
    watchdog = Watchdog().run(seed_loop(9))
    detections = {d.detection_id: d for d in watchdog.detections()}
    for intervention in watchdog.interventions():
        detection = detections[intervention.detection_id]
        assert (detection.turn, detection.detector) == (intervention.turn, intervention.detector)
    assert len({i.intervention_id for i in watchdog.interventions()}) == 3
    # After the deadlock the watchdog refuses more observations instead of escalating again.
    refused = watchdog.send(observe(10, "fs.edit", EDIT, "B"))
    assert isinstance(refused, Rejection) and refused.code == "WATCHDOG_DEADLOCKED"


def test_a_violation_after_a_quiet_epoch_starts_at_level_1_again_wd_5() -> None:
    steps = seed_loop(4)  # level 1 at step 4
    steps += [observe(4 + i, "fs.edit", {"new": i}, f"N{i}") for i in range(1, 5)]  # 4 quiet steps
    steps += [observe(9, "fs.edit", {"new": 4}, "N4")]  # the same edit again, nothing changed
    watchdog = Watchdog().run(steps)
    assert watchdog.levels() == [1, 1]
    assert watchdog.state is not None and watchdog.state.status is W.INTERRUPTED


def test_the_epoch_is_the_ladder_epoch_steps_after_the_intervention_wd_5() -> None:
    """With the seed's 3-step epoch a violation 3 steps after level 1 escalates, 4 steps after
    it does not (the epoch passed quietly)."""
    for quiet, levels in ((2, [1, 2]), (3, [1, 1])):
        steps = seed_loop(4)
        steps += [observe(4 + i, "fs.edit", {"new": i}, f"N{i}") for i in range(1, quiet + 1)]
        seq = 4 + quiet
        steps += [observe(seq + 1, "fs.edit", {"new": quiet}, f"N{quiet}")]  # a period-1 repeat
        assert Watchdog().run(steps).levels() == levels, quiet


def test_no_rollback_budget_means_level_3_at_the_second_violation_wd_5() -> None:
    watchdog = Watchdog(Thresholds(rollback_budget=0)).run(seed_loop(6))
    assert watchdog.levels() == [1, 3]


def test_a_budget_of_two_gives_two_rollbacks_before_the_deadlock_wd_5() -> None:
    watchdog = Watchdog(Thresholds(rollback_budget=2)).run(seed_loop(14))
    assert watchdog.levels() == [1, 2, 2, 3]
    assert [i.rollbacks_used for i in watchdog.interventions()] == [0, 1, 2, 2]


def test_the_rollback_is_acknowledged_then_probation_then_watching_wd_5() -> None:
    watchdog = Watchdog().run(seed_loop(5))
    rollback = watchdog.interventions()[-1]
    assert watchdog.state is not None and watchdog.state.status is W.ROLLBACK_REQUESTED
    assert watchdog.state.pending_rollback == rollback.intervention_id
    [acked] = watchdog.send(acknowledge(rollback.intervention_id, rollback.checkpoint_step))
    assert isinstance(acked, RollbackAcknowledged) and watchdog.state.status is W.ROLLED_BACK
    assert watchdog.send(acknowledge(rollback.intervention_id)) == ()  # a redelivery: nothing new
    # Back at the checkpoint (state A), the run now does something else: probation passes.
    watchdog.run(observe(5 + i, "fs.edit", {"other": i}, f"O{i}") for i in range(1, 5))
    assert watchdog.state.status is W.WATCHING and watchdog.levels() == [1, 2]


def test_while_a_rollback_is_unacknowledged_every_violation_escalates_wd_5() -> None:
    steps = seed_loop(5)  # level 2 at step 5
    steps += [observe(5 + i, "fs.edit", {"n": i}, f"Q{i}") for i in range(1, 6)]  # 5 quiet steps
    steps += [observe(11, "fs.edit", {"n": 5}, "Q5")]  # a repeat, long after the epoch
    assert Watchdog().run(steps).levels() == [1, 2, 3]


def test_an_acknowledgement_for_another_intervention_is_refused() -> None:
    watchdog = Watchdog().run(seed_loop(4))
    refused = watchdog.send(acknowledge("itv_not-this-one"))
    assert isinstance(refused, Rejection) and refused.code == "NO_ROLLBACK_PENDING"


def test_a_rollback_restores_the_checkpoint_so_the_restored_state_is_no_evidence_wd_5() -> None:
    """After level 2 the turns after the checkpoint are gone from the ring: returning to the
    checkpoint's state, and going on from there, is not a return to an earlier state."""
    steps = [observe(1, "fs.edit", {"setup": 1}, "S")]  # a mutating step: the checkpoint
    steps += [
        observe(2 + i, "fs.edit", EDIT if i % 2 == 0 else REVERT, "B" if i % 2 == 0 else "S")
        for i in range(4)
    ]
    watchdog = Watchdog().run(steps)
    assert watchdog.levels() == [1, 2]
    rollback = watchdog.interventions()[-1]
    assert (rollback.checkpoint_step, rollback.checkpoint_state_hash) == (1, state_hash("S"))
    assert rollback.truncated_steps == (2, 3, 4, 5)
    assert watchdog.state is not None and [m.step_seq for m in watchdog.state.marks] == [1]
    watchdog.send(acknowledge(rollback.intervention_id, 1))
    watchdog.run([observe(6, "fs.edit", {"different": 1}, "D"), observe(7, "fs.edit", {"more": 1}, "E")])
    assert watchdog.levels() == [1, 2]


def test_stagnation_blames_the_last_edit_never_the_verifier_wd_5() -> None:
    """A metric verdict arrives with the test run; tombstoning the test run would leave the run
    unable to verify anything, so the intervention names the mutation before it."""
    steps = [observe(1, "pytest", {}, "S0", metrics=[4], mutating=False)]
    for i in range(1, 9):
        steps.append(observe(2 * i, "fs.edit", {"try": i}, f"S{i}"))
        steps.append(observe(2 * i + 1, "pytest", {}, f"S{i}", metrics=[4], mutating=False))
    watchdog = Watchdog(Thresholds(epoch_steps=3)).run(steps)
    first, second = watchdog.interventions()[:2]
    assert first.detector == "stagnation" and first.action_hash == action_hash("fs.edit", {"try": 3})
    assert second.level == 2 and second.action_hash == action_hash("fs.edit", {"try": 4})
    assert action_hash("pytest", {}) not in (watchdog.state.tombstones if watchdog.state else ())


def test_thresholds_are_recorded_first_so_a_replay_never_reads_the_deployment() -> None:
    watchdog = Watchdog(Thresholds(max_period=4, window=10)).run(seed_loop(2))
    first = watchdog.events[0]
    assert isinstance(first, WatchdogConfigured) and (first.max_period, first.window) == (4, 10)
    assert first.origin == "deployment"
    assert all(isinstance(e, InterventionIssued) is False for e in watchdog.events)
