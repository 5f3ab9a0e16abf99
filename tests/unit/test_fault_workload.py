"""The fault-injection scoreboard's workload (DUR-3): seeded trajectories, agent and fault plan.

Proves that a seed fixes everything a run injects (the same seed gives the same specs, mistakes
and faults in every configuration), that the fault mix over many turns is DUR-3's profile (8%
network drops, 6% tool exceptions, 4% host kills, 2% format corruption), that the trajectories
have the shape the issue asks for, that the agent's mistakes are told apart by the recovery
policy's error signatures (REC-5) while an oscillation repeats the first one exactly, and that
the planned environment faults do what they say against the real simulated world.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from bench.faults.workload import (
    FAULT_PROCESSES,
    MISTAKES,
    POST_PIVOT_TOOLS,
    PRE_PIVOT_TOOLS,
    VM_BINDING,
    AgentPolicy,
    FaultKind,
    FaultProfile,
    MalformedProposal,
    TrajectorySpec,
    env_fault,
    fault_counts,
    generate,
    make_spec,
    mistakes_of_turn,
    propose,
    turn_of_plan_step,
)
from services.saga_orchestrator.domain import StepError, compile_plan, error_signature, load_catalog
from services.saga_orchestrator.domain.plan import PlanStep
from services.sim_environment import TOOLS_JSON
from services.sim_environment.world import Fault, World

pytestmark = pytest.mark.timeout(60)

MANY = 3000  # ~24,000 turns: binomial noise on an 8% share is about 0.18 percentage points


@pytest.fixture(scope="module")
def many() -> list[TrajectorySpec]:
    return generate(11, MANY)


# --------------------------------------------------------------------------- determinism


def test_the_same_seed_gives_the_same_specs_and_fault_plans_dur3() -> None:
    first, second = generate(7, 200), generate(7, 200)
    assert [s.to_json() for s in first] == [s.to_json() for s in second]
    assert [s.faults for s in first] == [s.faults for s in second]
    for spec in first[:50]:
        for turn in range(len(spec.steps)):
            assert mistakes_of_turn(spec, turn) == mistakes_of_turn(spec, turn)
            assert propose(spec, turn, 1, "vm-1") == propose(spec, turn, 1, "vm-1")


def test_another_seed_gives_another_workload() -> None:
    assert [s.to_json() for s in generate(7, 50)] != [s.to_json() for s in generate(8, 50)]
    assert generate(7, 5)[3].to_json() == make_spec(7, 3).to_json()  # specs do not depend on the count


def test_a_spec_survives_its_json_round_trip() -> None:
    for spec in generate(3, 40):
        again = TrajectorySpec.from_json(json.loads(json.dumps(spec.to_json())))
        assert again == spec


# --------------------------------------------------------------------------- the fault profile


def test_the_fault_mix_over_many_turns_is_durs3_profile(many: list[TrajectorySpec]) -> None:
    counts = fault_counts(many)
    turns = counts["turns"]
    assert turns > 20_000

    def share(*kinds: FaultKind) -> float:
        return sum(counts.get(kind.value, 0) for kind in kinds) / turns

    assert share(FaultKind.REQUEST_LOST, FaultKind.ANSWER_LOST) == pytest.approx(0.08, abs=0.006)
    assert share(FaultKind.TRANSIENT_ERROR, FaultKind.FATAL_ERROR) == pytest.approx(0.06, abs=0.005)
    assert share(FaultKind.KILL) == pytest.approx(0.04, abs=0.004)
    assert share(FaultKind.CORRUPT_ANSWER, FaultKind.MALFORMED_PROPOSAL) == pytest.approx(0.02, abs=0.003)
    assert counts["none"] / turns == pytest.approx(0.80, abs=0.008)


def test_the_splits_inside_each_category_follow_the_brief(many: list[TrajectorySpec]) -> None:
    faults = [f for spec in many for f in spec.faults if f is not None]
    by_kind = Counter(f.kind for f in faults)
    drops = by_kind[FaultKind.REQUEST_LOST] + by_kind[FaultKind.ANSWER_LOST]
    assert by_kind[FaultKind.REQUEST_LOST] / drops == pytest.approx(0.5, abs=0.05)
    exceptions = by_kind[FaultKind.TRANSIENT_ERROR] + by_kind[FaultKind.FATAL_ERROR]
    assert by_kind[FaultKind.TRANSIENT_ERROR] / exceptions == pytest.approx(2 / 3, abs=0.05)
    transient = {(f.problem, f.status) for f in faults if f.kind is FaultKind.TRANSIENT_ERROR}
    fatal = {(f.problem, f.status) for f in faults if f.kind is FaultKind.FATAL_ERROR}
    assert transient == {("rate-limited", 429), ("unavailable", 503)}
    assert fatal == {("auth-revoked", 403), ("exhausted", 507)}
    kills = [f for f in faults if f.kind is FaultKind.KILL]
    assert {f.point for f in kills} == {"before-dispatch", "after-effect"}
    tenure = [f for f in kills if f.tenure_process]
    assert len(tenure) / len(kills) == pytest.approx(0.25, abs=0.05)
    assert {f.tenure_process for f in tenure} == set(FAULT_PROCESSES)
    format_faults = by_kind[FaultKind.CORRUPT_ANSWER] + by_kind[FaultKind.MALFORMED_PROPOSAL]
    assert by_kind[FaultKind.CORRUPT_ANSWER] / format_faults == pytest.approx(0.5, abs=0.08)
    malformed = {f.malformed for f in faults if f.kind is FaultKind.MALFORMED_PROPOSAL}
    assert malformed == {"invalid-json", "schema-violation"}


def test_a_custom_profile_is_honoured_and_an_impossible_one_refused() -> None:
    quiet = generate(5, 100, FaultProfile(0, 0, 0, 0))
    assert fault_counts(quiet)["none"] == fault_counts(quiet)["turns"]
    only_kills = generate(5, 100, FaultProfile(0, 0, 1.0, 0))
    assert all(f is not None and f.kind is FaultKind.KILL for s in only_kills for f in s.faults)
    with pytest.raises(ValueError, match="sum to at most 1"):
        FaultProfile(0.5, 0.5, 0.5, 0)
    with pytest.raises(ValueError, match="probability"):
        FaultProfile(tenure_process_share=1.5)


# --------------------------------------------------------------------------- trajectories


def test_trajectories_have_the_issues_shape(many: list[TrajectorySpec]) -> None:
    lengths = Counter(len(spec.steps) for spec in many)
    assert set(lengths) == set(range(6, 11))
    catalog = load_catalog(TOOLS_JSON)
    for spec in many[:500]:
        tools = [step.tool for step in spec.steps]
        assert tools[0] == "vm.provision" and [s.turn for s in spec.steps] == list(range(len(tools)))
        assert tools.count("dns.publish") == 1
        pivot = spec.pivot_turn
        assert pivot in (len(tools) - 1, len(tools) - 2)
        assert set(tools[1:pivot]) <= set(PRE_PIVOT_TOOLS)
        assert set(tools[pivot + 1 :]) <= set(POST_PIVOT_TOOLS)
        # Each turn's payload is unique within the trajectory, so the audit can map effects to turns.
        identities = [json.dumps(step.identity, sort_keys=True) for step in spec.steps]
        assert len(set(zip(tools, identities, strict=True))) == len(tools)
        assert all(VM_BINDING in step.params.values() for step in spec.steps if "vmId" in step.params)
        # The plan compiles around the single pivot; a notify.send after it goes to the outbox (SAGA-7).
        plan = spec.plan()
        assert [turn_of_plan_step(item["stepId"]) for item in plan] == list(range(len(tools)))
        compiled = compile_plan(
            [PlanStep(i["stepId"], i["tool"], i["params"], tuple(i["after"])) for i in plan], catalog
        )
        assert [s.tool for s in compiled.outbox] == [t for t in tools[pivot + 1 :] if t == "notify.send"]


def test_bound_steps_take_the_vm_from_the_provisioning_turn() -> None:
    spec = next(s for s in generate(7, 50) if any(step.tool == "firewall.write" for step in s.steps))
    step = next(step for step in spec.steps if step.tool == "firewall.write")
    assert step.bind("vm-123")["vmId"] == "vm-123"
    assert step.bind(None)["vmId"] == VM_BINDING


# --------------------------------------------------------------------------- the agent


def test_mistakes_follow_q_sem_and_every_sequence_is_well_formed(many: list[TrajectorySpec]) -> None:
    sequences = [mistakes_of_turn(spec, turn) for spec in many for turn in range(len(spec.steps))]
    wrong_first = [s for s in sequences if s[0] is not None]
    assert len(wrong_first) / len(sequences) == pytest.approx(0.15, abs=0.01)
    oscillations = 0
    for sequence in wrong_first:
        assert sequence[-1] is None or len(sequence) == AgentPolicy().max_attempts
        body = [m for m in sequence if m is not None]
        assert len(body) == len(sequence) - (sequence[-1] is None)
        for index, mistake in enumerate(body[1:], start=1):
            if mistake == body[0]:
                oscillations += 1  # the first error reintroduced
            else:
                assert mistake not in body[:index]  # otherwise a new error
    repairs = sum(len(s) - 1 for s in wrong_first)
    assert oscillations / repairs == pytest.approx(0.10, abs=0.03)
    fixed_on_first_repair = sum(1 for s in wrong_first if s[1] is None) / len(wrong_first)
    assert fixed_on_first_repair == pytest.approx(0.8, abs=0.04)


def test_policy_knobs_are_honoured() -> None:
    perfect = generate(9, 50, policy=AgentPolicy(q_sem=0.0))
    assert all(mistakes_of_turn(s, t) == (None,) for s in perfect for t in range(len(s.steps)))
    always = generate(9, 50, policy=AgentPolicy(q_sem=1.0, p_fix=1.0, p_osc=0.0))
    assert all(len(mistakes_of_turn(s, t)) == 2 for s in always for t in range(len(s.steps)))
    with pytest.raises(ValueError):
        AgentPolicy(p_fix=0.95, p_osc=0.1)


def _first_wrong(tool: str) -> tuple[TrajectorySpec, int, str]:
    policy = AgentPolicy(q_sem=1.0, p_fix=0.0, p_osc=0.5)
    for spec in generate(13, 200, policy=policy):
        for step in spec.steps:
            mistakes = mistakes_of_turn(spec, step.turn)
            if step.tool == tool and len(set(mistakes)) >= 2:
                return spec, step.turn, str(mistakes[0])
    raise AssertionError(f"no {tool} turn with two different mistakes")


def test_a_mistake_reaches_the_tool_and_the_repair_is_the_planned_payload() -> None:
    spec, turn, mistake = _first_wrong("payment.hold")
    wrong = propose(spec, turn, 0, "vm-1")
    assert wrong.mistake == mistake and not wrong.correct
    (fault,) = wrong.faults
    assert fault["problem"] == "schema-invalid" and fault["match"] == {"account": wrong.params()["account"]}
    assert mistake in fault["detail"] and wrong.params()["account"] != spec.steps[turn].params["account"]
    fixed = propose(_fixed_on_first_repair(spec), turn, 1, "vm-1")
    assert fixed.correct and fixed.params() == spec.steps[turn].bind("vm-1") and fixed.faults == ()


def _fixed_on_first_repair(spec: TrajectorySpec) -> TrajectorySpec:
    """The same spec with an agent whose first repair always fixes the mistake."""
    return replace(spec, policy=replace(spec.policy, p_fix=1.0, p_osc=0.0))


def _signature(answer_body: dict[str, Any], tool: str) -> str:
    return error_signature(StepError(answer_body["type"], tool, answer_body["detail"], answer_body["status"]))


@pytest.mark.parametrize("tool", ["sandbox.compile", "firewall.write", "vm.provision", "dns.publish"])
def test_mistakes_reach_the_real_world_and_repeat_signatures_only_when_repeated_rec5(tool: str) -> None:
    """The world refuses each mistake; two different mistakes have different error signatures, the
    same mistake proposed again has the same one (what anti-spin must catch)."""
    spec, turn, _ = _first_wrong(tool)
    world = World()
    vm = world.perform(spec.work_id, 1, "vm", "vm.provision", {"name": "the-vm"}).body["output"]["vmId"]
    signatures: dict[str, str] = {}
    mistakes = mistakes_of_turn(spec, turn)
    for attempt, mistake in enumerate(mistakes):
        if mistake is None:
            continue
        proposal = propose(spec, turn, attempt, vm)
        for body in proposal.faults:
            world.arm(
                Fault(
                    body["operation"],
                    "error",
                    times=body["times"],
                    problem=body["problem"],
                    detail=body["detail"],
                    match=body["match"],
                    work_id=spec.work_id,
                )
            )
        answer = world.perform(spec.work_id, 1, f"a{attempt}", tool, proposal.params())
        assert answer.status == 422, answer.body
        signature = _signature(answer.body, tool)
        assert signatures.setdefault(mistake, signature) == signature
    assert len(set(signatures.values())) == len(signatures) >= 2
    good = propose(spec, turn, len(mistakes), vm)  # past the last mistake: still wrong or fixed
    if good.correct:
        assert world.perform(spec.work_id, 1, "good", tool, good.params()).status == 200


def test_malformed_proposals() -> None:
    spec = generate(7, 1)[0]
    broken = propose(spec, 0, 0, None, malformed="invalid-json")
    assert broken.malformed == "invalid-json" and not broken.correct
    with pytest.raises(MalformedProposal):
        broken.params()
    partial = propose(spec, 0, 0, None, malformed="schema-violation")
    assert "name" not in partial.params()
    answer = World().perform(spec.work_id, 1, "k", "vm.provision", partial.params())
    assert answer.status == 422 and answer.body["type"] == "/problems/missing-parameter"
    with pytest.raises(ValueError, match="unknown malformation"):
        propose(spec, 0, 0, None, malformed="garbled")


# --------------------------------------------------------------------------- environment faults


def _spec_with(kind: FaultKind, problem: str = "") -> tuple[TrajectorySpec, int]:
    for spec in generate(17, 400):
        for turn, fault in enumerate(spec.faults):
            simple = spec.steps[turn].tool in ("vm.provision", "ip.reserve", "payment.hold")
            if (
                simple
                and fault is not None
                and fault.kind is kind
                and (not problem or fault.problem == problem)
            ):
                return spec, turn
    raise AssertionError(f"no {kind} fault on a VM, IP or payment turn")


def _arm(world: World, body: dict[str, Any]) -> None:
    world.arm(
        Fault(
            body["operation"],
            body["kind"],
            times=body.get("times", 1),
            status=body.get("status"),
            problem=body.get("problem", "unavailable"),
            delay_s=body.get("delayS", 10.0),
            match=body["match"],
            work_id=body["workId"],
        )
    )


def test_planned_environment_faults_fire_on_their_turn_of_their_work_only_dur3() -> None:
    spec, turn = _spec_with(FaultKind.ANSWER_LOST)
    body = env_fault(spec, turn, "run-1", delay_s=2.5)
    assert body is not None and body["kind"] == "timeout-after-commit" and body["delayS"] == 2.5
    world = World()
    _arm(world, body)
    payload = spec.steps[turn].bind("vm-x")
    assert world.perform("run-2", 1, "other-work", spec.steps[turn].tool, payload).delay_s == 0
    late = world.perform("run-1", 1, "mine", spec.steps[turn].tool, payload)
    assert late.status == 200 and late.delay_s == 2.5  # applied, answered too late
    assert world.faults() == []


@pytest.mark.parametrize(
    ("kind", "problem", "status", "times"),
    [
        (FaultKind.REQUEST_LOST, "", 503, 1),
        (FaultKind.TRANSIENT_ERROR, "", 0, 1),
        (FaultKind.FATAL_ERROR, "", 0, 1000),
        (FaultKind.CORRUPT_ANSWER, "", 200, 1),
    ],
)
def test_each_planned_fault_becomes_the_environment_fault_it_names(
    kind: FaultKind, problem: str, status: int, times: int
) -> None:
    spec, turn = _spec_with(kind, problem)
    body = env_fault(spec, turn, spec.work_id)
    assert body is not None and body.get("times", 1) == times and body["workId"] == spec.work_id
    world = World()
    _arm(world, body)
    answer = world.perform(spec.work_id, 1, "k", spec.steps[turn].tool, spec.steps[turn].bind("vm-x"))
    fault = spec.fault(turn)
    assert fault is not None
    expected = fault.status if kind in (FaultKind.TRANSIENT_ERROR, FaultKind.FATAL_ERROR) else status
    assert answer.status == expected
    assert (answer.raw_body is not None) == (kind is FaultKind.CORRUPT_ANSWER)


def test_kills_and_malformed_proposals_arm_nothing_in_the_environment() -> None:
    for kind in (FaultKind.KILL, FaultKind.MALFORMED_PROPOSAL):
        spec, turn = _spec_with(kind)
        assert env_fault(spec, turn, spec.work_id) is None
    quiet = next(s for s in generate(7, 20) if s.fault(0) is None)
    assert env_fault(quiet, 0, quiet.work_id) is None


def test_every_mistake_is_a_word_without_digits_rec5() -> None:
    assert len(set(MISTAKES)) == len(MISTAKES) >= 8
    assert not any(ch.isdigit() for mistake in MISTAKES for ch in mistake)
