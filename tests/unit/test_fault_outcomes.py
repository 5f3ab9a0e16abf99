"""Outcome classification of the fault-injection scoreboard (DUR-3), on audits of a real world.

Every case builds the environment's state by performing effects on a simulated World (as a
runner would), hand-builds what the runner reported, and checks that the outcome comes from the
audit: a runner saying "completed" does not make a trajectory completed, a runner forgetting a
turn across a kill is a lost committed turn (RPO), a resource nobody owns is an orphan, and an
escalation counts only with an incident that lists exactly what was left.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench.faults.outcomes import (
    AuditIndex,
    CommitReport,
    FinalReport,
    KillRecord,
    TrajectoryRecord,
    classify,
    incident_resources,
    percentile,
    recovery_times,
    summarize,
)
from bench.faults.workload import AgentPolicy, FaultProfile, TrajectorySpec, generate
from services.sim_environment.world import World

pytestmark = pytest.mark.timeout(30)

COMPENSATORS = {
    "vm.provision": ("vm.terminate", "vmId"),
    "ip.reserve": ("ip.release", "ipId"),
    "sandbox.compile": ("sandbox.clean", "buildId"),
    "firewall.write": ("firewall.unbind", "ruleId"),
    "payment.hold": ("payment.release", "holdId"),
    "cache.warm": ("cache.drop", "cacheId"),
}


@pytest.fixture
def spec() -> TrajectorySpec:
    """A quiet trajectory (the outcome, not the fault plan, is under test)."""
    return generate(21, 1, FaultProfile(0, 0, 0, 0), AgentPolicy(q_sem=0.0))[0]


class Runner:
    """Performs a spec's turns on a World and remembers what it would have reported."""

    def __init__(self, world: World, spec: TrajectorySpec, work: str | None = None) -> None:
        self.world, self.spec = world, spec
        self.work = work or spec.work_id
        self.vm: str | None = None
        self.outputs: dict[int, dict[str, Any]] = {}
        self.keys = 0

    def do(self, turn: int) -> dict[str, Any]:
        step = self.spec.steps[turn]
        self.keys += 1
        answer = self.world.perform(self.work, 1, f"{self.work}-k{self.keys}", step.tool, step.bind(self.vm))
        assert answer.status == 200, answer.body
        output: dict[str, Any] = answer.body["output"]
        if step.tool == "vm.provision":
            self.vm = output["vmId"]
        self.outputs[turn] = output
        return output

    def undo(self, turn: int) -> None:
        operation, field = COMPENSATORS[self.spec.steps[turn].tool]
        self.keys += 1
        payload = {field: self.outputs[turn][field]}
        assert self.world.perform(self.work, 1, f"{self.work}-k{self.keys}", operation, payload).ok

    def all_turns(self) -> None:
        for step in self.spec.steps:
            self.do(step.turn)

    def resources(self, turns: Any = None) -> tuple[str, ...]:
        chosen = self.outputs if turns is None else {t: self.outputs[t] for t in turns}
        return tuple(sorted(v for o in chosen.values() for k, v in o.items() if k.endswith("Id")))


def _record(spec: TrajectorySpec, final: FinalReport | None, **fields: Any) -> TrajectoryRecord:
    record = TrajectoryRecord(spec, final=final, **fields)
    record.add_work_id(spec.work_id)
    return record


def _outcome(world: World, record: TrajectoryRecord) -> Any:
    return classify(record, AuditIndex(world.audit()).for_work(record.work_ids))


# --------------------------------------------------------------------------- completed


def test_a_completed_trajectory_is_completed_when_the_world_agrees(spec: TrajectorySpec) -> None:
    world = World()
    runner = Runner(world, spec)
    runner.all_turns()
    final = FinalReport("completed", tuple(runner.outputs), runner.resources())
    outcome = _outcome(world, _record(spec, final))
    assert (outcome.outcome, outcome.reasons, outcome.orphans, outcome.duplicates) == ("completed", (), 0, 0)


def test_saying_completed_does_not_make_it_so_a_missing_turn_is_corruption(spec: TrajectorySpec) -> None:
    world = World()
    runner = Runner(world, spec)
    for step in spec.steps[:-1]:
        runner.do(step.turn)
    final = FinalReport("completed", tuple(range(len(spec.steps))), runner.resources())
    outcome = _outcome(world, _record(spec, final))
    assert outcome.outcome == "corrupted" and outcome.reasons == ("missing-effect",)
    assert outcome.missing_turns == (len(spec.steps) - 1,)


def test_a_turn_applied_twice_is_a_duplicate_effect_and_its_twin_an_orphan(spec: TrajectorySpec) -> None:
    world = World()
    runner = Runner(world, spec)
    runner.all_turns()
    twin = dict(runner.outputs[0])
    runner.do(0)  # a naive retry with a fresh key after a lost answer: a second VM
    runner.outputs[0] = twin  # the runner only knows the first one
    final = FinalReport("completed", tuple(runner.outputs), runner.resources())
    outcome = _outcome(world, _record(spec, final))
    assert outcome.outcome == "corrupted"
    assert outcome.reasons == ("duplicate-effect", "orphaned-resource")
    assert (outcome.duplicates, outcome.orphans) == (1, 1)
    assert AuditIndex(world.audit()).for_work([spec.work_id]).semantic_duplicates == 1


def test_an_effect_of_another_work_is_not_this_trajectorys(spec: TrajectorySpec) -> None:
    world = World()
    runner = Runner(world, spec)
    runner.all_turns()
    Runner(world, spec, work="someone-else").do(0)
    final = FinalReport("completed", tuple(runner.outputs), runner.resources())
    assert _outcome(world, _record(spec, final)).outcome == "completed"


# --------------------------------------------------------------------------- aborted, failed


def test_every_committed_effect_compensated_is_cleanly_aborted(spec: TrajectorySpec) -> None:
    world = World()
    runner = Runner(world, spec)
    for turn in (0, 1, 2):
        runner.do(turn)
    for turn in (2, 1, 0):
        runner.undo(turn)
    outcome = _outcome(world, _record(spec, FinalReport("aborted")))
    assert (outcome.outcome, outcome.reasons) == ("cleanly-aborted", ())


def test_a_failure_that_changed_nothing_is_clean_too(spec: TrajectorySpec) -> None:
    outcome = _outcome(World(), _record(spec, FinalReport("failed", detail="gave up at turn 0")))
    assert outcome.outcome == "cleanly-aborted"


def test_a_runner_that_gives_up_and_leaves_resources_behind_orphans_them(spec: TrajectorySpec) -> None:
    world = World()
    runner = Runner(world, spec)
    for turn in (0, 1):
        runner.do(turn)
    final = FinalReport("failed", (0, 1), runner.resources())  # it knows them, nobody owns them
    outcome = _outcome(world, _record(spec, final))
    assert (outcome.outcome, outcome.reasons, outcome.orphans) == ("corrupted", ("orphaned-resource",), 2)


def test_no_report_at_all_is_judged_by_the_world_alone(spec: TrajectorySpec) -> None:
    world = World()
    Runner(world, spec).do(0)
    timed_out = _record(spec, None, timed_out=True)
    outcome = _outcome(world, timed_out)
    assert (outcome.outcome, outcome.reported) == ("corrupted", "timeout")
    assert _outcome(World(), _record(spec, None)).outcome == "cleanly-aborted"


def test_a_clean_rerun_after_a_rollback_is_not_a_duplicate(spec: TrajectorySpec) -> None:
    """Tenure re-runs a cleanly rolled-back trajectory as a new run: turn 0 is made twice, but
    the first was compensated before the second was made."""
    world = World()
    first = Runner(world, spec, work="run-r0")
    first.do(0)
    first.undo(0)
    second = Runner(world, spec, work="run-r1")
    second.all_turns()
    record = TrajectoryRecord(spec, final=FinalReport("completed", tuple(second.outputs), second.resources()))
    record.add_work_id("run-r0")
    record.add_work_id("run-r1")
    outcome = _outcome(world, record)
    assert (outcome.outcome, outcome.duplicates) == ("completed", 0)


# --------------------------------------------------------------------------- escalated


def _incident(runner: Runner, turns: Any) -> dict[str, Any]:
    """An incident in the orchestrator's TrajectoryFrozen format (outputs as JSON text)."""
    import json

    return {
        "failureMode": "POST_PIVOT_STALLED",
        "uncompensated": [
            {"stepIndex": t, "tool": runner.spec.steps[t].tool, "output": json.dumps(runner.outputs[t])}
            for t in turns
        ],
    }


def test_an_escalation_listing_exactly_what_is_left_is_escalated(spec: TrajectorySpec) -> None:
    world = World()
    runner = Runner(world, spec)
    pivot = spec.pivot_turn
    for turn in range(pivot + 1):
        runner.do(turn)
    incident = _incident(runner, range(pivot + 1))
    assert incident_resources(incident) == set(runner.resources())
    final = FinalReport("escalated", tuple(range(pivot + 1)), runner.resources(), incident)
    outcome = _outcome(world, _record(spec, final))
    assert (outcome.outcome, outcome.reasons) == ("escalated", ())


def test_an_incident_that_misses_a_resource_is_incorrect_and_the_resource_orphaned(
    spec: TrajectorySpec,
) -> None:
    world = World()
    runner = Runner(world, spec)
    for turn in range(3):
        runner.do(turn)
    final = FinalReport("escalated", (0, 1, 2), runner.resources(), _incident(runner, [0, 1]))
    outcome = _outcome(world, _record(spec, final))
    assert outcome.outcome == "corrupted"
    assert set(outcome.reasons) == {"orphaned-resource", "incorrect-incident"} and outcome.orphans == 1


def test_an_incident_listing_a_compensated_resource_is_incorrect(spec: TrajectorySpec) -> None:
    world = World()
    runner = Runner(world, spec)
    for turn in range(2):
        runner.do(turn)
    runner.undo(1)
    final = FinalReport("escalated", (0,), runner.resources([0]), _incident(runner, [0, 1]))
    outcome = _outcome(world, _record(spec, final))
    assert outcome.reasons == ("incorrect-incident",)
    assert incident_resources({"resources": ["a", "b"]}) == {"a", "b"}
    assert incident_resources(None) == set()


# --------------------------------------------------------------------------- RPO


def test_a_turn_committed_before_a_kill_and_forgotten_after_it_is_lost(spec: TrajectorySpec) -> None:
    """The unmanaged runner's restart from scratch: turn 0's first VM is neither held nor undone."""
    world = World()
    before = Runner(world, spec)
    first_vm = before.do(0)
    after = Runner(world, spec)
    after.keys = 100
    after.all_turns()
    record = _record(
        spec,
        FinalReport("completed", tuple(after.outputs), after.resources()),
        commits=[CommitReport(1.0, 0, (first_vm["vmId"],), 0)],
        kills=[KillRecord(2.0, 1, "runner", "before-dispatch")],
    )
    outcome = _outcome(world, record)
    assert outcome.outcome == "corrupted" and outcome.lost_turns == 1
    assert set(outcome.reasons) == {"duplicate-effect", "orphaned-resource", "lost-committed-turn"}


def test_a_turn_held_or_compensated_after_a_kill_is_not_lost(spec: TrajectorySpec) -> None:
    world = World()
    runner = Runner(world, spec)
    runner.all_turns()
    commits = [CommitReport(1.0, t, runner.resources([t]), 0) for t in range(2)]
    kill = [KillRecord(2.0, 2, "runner", "after-effect")]
    final = FinalReport("completed", tuple(runner.outputs), runner.resources())
    held = _record(spec, final, commits=commits, kills=kill)
    assert _outcome(world, held).lost_turns == 0
    world2 = World()
    undone = Runner(world2, spec)
    undone.do(0)
    undone.do(1)
    undone.undo(1)
    undone.undo(0)
    commits2 = [CommitReport(1.0, t, undone.resources([t]), 0) for t in range(2)]
    outcome = _outcome(world2, _record(spec, FinalReport("aborted"), commits=commits2, kills=kill))
    assert (outcome.lost_turns, outcome.outcome) == (0, "cleanly-aborted")


def test_commits_after_the_last_kill_are_not_at_risk(spec: TrajectorySpec) -> None:
    world = World()
    runner = Runner(world, spec)
    runner.do(0)
    record = _record(
        spec,
        FinalReport("failed"),
        commits=[CommitReport(5.0, 0, runner.resources([0]), 1)],
        kills=[KillRecord(2.0, 0, "runner", "before-dispatch")],
    )
    outcome = _outcome(world, record)
    assert outcome.lost_turns == 0 and outcome.reasons == ("orphaned-resource",)


# --------------------------------------------------------------------------- times and totals


def test_rto_is_the_first_progress_at_or_past_the_killed_turn_and_mttr_falls_back_to_the_end(
    spec: TrajectorySpec,
) -> None:
    record = _record(
        spec,
        FinalReport("completed"),
        commits=[CommitReport(1.0, 0, ()), CommitReport(10.5, 0, ()), CommitReport(11.0, 3, ())],
        kills=[KillRecord(10.0, 3, "runner"), KillRecord(20.0, 5, "saga-orchestrator", restart_s=0.8)],
        ended_at=24.0,
    )
    rto, mttr = recovery_times(record)
    assert rto == [1.0]  # the redo of turn 0 at 10.5 s is not progress past turn 3
    assert mttr == [1.0, 4.0]  # the second kill never saw progress: until the end


def test_percentile_is_nearest_rank() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert percentile([5.0], 99) == 5.0
    assert math.isnan(percentile([], 50))


def test_summarize_counts_outcomes_rates_and_recovery(spec: TrajectorySpec) -> None:
    world = World()
    done = Runner(world, spec)
    done.all_turns()
    specs = generate(21, 3, FaultProfile(0, 0, 0, 0), AgentPolicy(q_sem=0.0))
    left = Runner(world, specs[1])
    left.do(0)
    records = [
        _record(
            spec,
            FinalReport("completed", tuple(done.outputs), done.resources()),
            commits=[CommitReport(1.0, 0, ())],
            kills=[KillRecord(0.5, 0, "runner")],
        ),
        _record(specs[1], FinalReport("failed")),
        _record(specs[2], FinalReport("aborted", runner_error="boom")),
    ]
    result = summarize("unmanaged", records, AuditIndex(world.audit()), wall_s=12.0)
    assert result.counts == {"completed": 1, "cleanly-aborted": 1, "escalated": 0, "corrupted": 1}
    assert result.completion_rate == pytest.approx(100 / 3)
    assert result.clean_rate == pytest.approx(200 / 3)
    assert (result.orphans, result.duplicates, result.rpo_turns) == (1, 0, 0)
    assert (result.runner_kills, result.tenure_kills, result.turns, result.runner_errors) == (1, 0, 1, 1)
    assert result.rto == (0.5,) and result.rto_median == 0.5 and result.mttr_mean == 0.5
    assert result.reported == {"completed": 1, "failed": 1, "aborted": 1}
    assert result.to_json()["completionRate"] == pytest.approx(100 / 3)


def test_the_world_itself_names_the_works_of_a_trajectory(spec: TrajectorySpec) -> None:
    """A run id the runner never reported is found by the VM its first turn provisioned, so the
    audit covers every run of the trajectory whatever the runner says."""
    world = World()
    aborted = Runner(world, spec, work="run-0001")
    aborted.do(0)
    aborted.undo(0)
    rerun = Runner(world, spec, work="run-0002")
    rerun.all_turns()
    Runner(world, generate(99, 1)[0], work="run-other").do(0)
    index = AuditIndex(world.audit())
    assert index.works_of(spec) == ["run-0001", "run-0002"]
    silent = TrajectoryRecord(spec, final=FinalReport("completed", tuple(rerun.outputs), rerun.resources()))
    result = summarize("tenure", [silent], index, wall_s=1.0)
    assert result.counts["completed"] == 1 and result.duplicates == 0
