"""decide/evolve of the Trajectory aggregate, by example: the rules of SAGA-1..7 (REC-1..7 are in
test_trajectory_recovery_rules.py).

Each test drives the pure core the way the orchestrator does (services/saga_orchestrator): the
runner proposes, `pending_work` says what the executor must do, and the executor's reports come
back as commands. Nothing here touches I/O; time is a value.
"""

from __future__ import annotations

import json

import pytest

from services.common.contracts import (
    AbortTrajectory,
    ApprovePivot,
    CompensationCompleted,
    CompensationFailed,
    FinishTrajectory,
    PivotApproved,
    PivotGateEvaluated,
    ProposeStep,
    RecordCompensationOutcome,
    RecoveryDecided,
    StartTrajectory,
    StepCommitted,
    StepFailed,
    StepIntentRecorded,
    TrajectoryFrozen,
    TrajectoryRolledBack,
)
from services.common.ids import run_id_for
from services.saga_orchestrator.domain import (
    EvaluateGate,
    Rejection,
    RevokeLease,
    RunCompensator,
    SagaContext,
    evolve,
    fold,
)
from tests.support.trajectory_saga import (
    CATALOG,
    COMPENSATORS,
    PARAMS,
    UNCHECKED_CATALOG,
    S,
    Saga,
    T,
    names,
    of_type,
    started,
)

# --- SAGA-1 / SAGA-2: intent before action -----------------------------------------------------


def test_a_proposal_records_the_intent_with_an_orchestrator_key_before_any_dispatch_saga_1() -> None:
    saga = started()
    assert saga.work() is None, "nothing to dispatch before an intent is recorded"
    events = saga.propose("vm.provision", plan_step_id="", tokens_used=120)
    assert names(events) == ["StepIntentRecorded"]
    intent = events[0]
    assert isinstance(intent, StepIntentRecorded)
    assert intent.idempotency_key == f"{saga.run_id}/s0/d1"
    assert (intent.step_index, intent.dispatch, intent.status) == (0, 1, "pending")
    assert (intent.gateway_tool, intent.operation, intent.reversibility) == ("env", "vm.provision", "II")
    # only now may the executor dispatch, under exactly the recorded key
    work = saga.dispatch()
    assert work.idempotency_key == intent.idempotency_key
    assert work.params == PARAMS["vm.provision"]
    assert saga.s.budget_tokens == 200_000 - 120 and saga.s.budget_steps == 49


def test_the_idempotency_key_depends_on_run_step_and_dispatch_only_saga_1() -> None:
    """The runner cannot choose the key: other command ids, plan ids or parameters change nothing."""
    keys = set()
    for key, command_id in (("saga-1", "first"), ("saga-1", "other-command-id")):
        saga = Saga(key)
        saga.start()
        intent = saga.ok(ProposeStep, tool="vm.provision", params='{"name": "x"}', command_id=command_id)[0]
        keys.add(intent.idempotency_key)
    assert keys == {f"{run_id_for('acme', 'saga-1')}/s0/d1"}
    other = Saga("saga-2")
    other.start()
    assert other.propose("vm.provision")[0].idempotency_key == f"{other.run_id}/s0/d1"
    other.commit()
    assert other.propose("ip.reserve")[0].idempotency_key == f"{other.run_id}/s1/d1"


def test_parameters_are_validated_before_the_intent_saga_2() -> None:
    saga = started()
    assert saga.refused(ProposeStep, tool="vm.provision", params='{"name": ""}').code == "INVALID_PARAMETERS"
    assert saga.refused(ProposeStep, tool="vm.provision", params='{"nom": "x"}').code == "INVALID_PARAMETERS"
    assert saga.refused(ProposeStep, tool="vm.provision", params="[1]").code == "INVALID_PARAMETERS"
    assert saga.refused(ProposeStep, tool="vm.provision", params="{not json").code == "INVALID_PARAMETERS"
    assert saga.refused(ProposeStep, tool="rm.rf", params="{}").code == "UNKNOWN_TOOL"
    assert saga.s.steps == ()


def test_no_next_step_while_one_is_open_saga_2() -> None:
    saga = started()
    saga.propose("vm.provision")
    refusal = saga.refused(ProposeStep, tool="ip.reserve", params=json.dumps(PARAMS["ip.reserve"]))
    assert refusal.code == "STEP_IN_FLIGHT" and "step 0" in refusal.detail
    saga.unknown()  # DISPATCHED is still open
    assert saga.refused(ProposeStep, tool="ip.reserve", params='{"region": "x"}').code == "STEP_IN_FLIGHT"
    saga.commit()
    saga.propose("ip.reserve")
    assert [s.status for s in saga.s.steps] == [S.COMMITTED, S.PENDING]


def test_the_compensator_is_bound_from_the_output_and_pushed_in_the_commit_record_saga_2() -> None:
    saga = started()
    saga.propose("vm.provision")
    events = saga.commit({"vmId": "vm-42", "ip": "10.1.1.1"})
    assert names(events) == ["StepCommitted"], "COMMITTED and the push are one record"
    committed = events[0]
    assert isinstance(committed, StepCommitted)
    compensation = json.loads(committed.compensation)
    assert compensation["gatewayTool"] == "env"
    assert compensation["operation"] == "vm.terminate"
    assert compensation["params"] == {"vmId": "vm-42"}
    assert compensation["costMs"] == 45
    assert committed.stack_depth == 1
    # the single event alone moves the step to COMMITTED and onto the stack
    before = fold(saga.events[:-1])
    after = evolve(before, committed)
    assert after.stack == (0,) and after.steps[0].status is S.COMMITTED
    saga.propose("ip.reserve")
    assert saga.commit()[0].stack_depth == 2
    assert saga.s.stack == (0, 1)


def test_an_output_the_compensator_cannot_be_bound_from_freezes_saga_2() -> None:
    saga = Saga(context=SagaContext(UNCHECKED_CATALOG))
    saga.start()
    saga.propose("vm.provision")
    events = saga.commit({"id": "no-vmId-here"})
    assert names(events) == ["StepCommitted", "TrajectoryFrozen"]
    assert events[0].compensation == ""
    assert events[1].failure_mode == "COMPENSATOR_UNBOUND"
    assert saga.status() is T.FROZEN


# --- SAGA-3: unwind ----------------------------------------------------------------------------


def test_the_seed_deploy_fails_at_dns_and_unwinds_c4_to_c1_saga_3() -> None:
    saga = Saga()
    saga.deploy_until_pivot()
    events = saga.fail("conflict", "domain owned by another account", 409)
    assert names(events) == ["StepFailed", "RecoveryDecided"]
    decided = events[1]
    assert (decided.action, decided.gate) == ("BACKWARD_ROLLBACK", "gate-1-taxonomy")
    assert json.loads(decided.inputs)["errorKind"] == "conflict"
    assert saga.status() is T.UNWINDING and saga.s.stack == (0, 1, 2, 3)

    order = []
    while isinstance(work := saga.work(), RunCompensator):
        step = saga.s.steps[work.step_index]
        operation, params = COMPENSATORS[step.tool]
        assert (work.operation, work.params) == (operation, params)
        assert work.idempotency_key == f"{saga.run_id}/s{work.step_index}/c1"
        events = saga.compensate()
        assert isinstance(events[0], CompensationCompleted)
        assert events[0].step_index == work.step_index
        assert events[0].idempotency_key == work.idempotency_key
        assert work.step_index not in saga.s.stack, "popped by the same record that logs it"
        order.append(work.step_index)
    assert order == [3, 2, 1, 0]
    assert isinstance(events[-1], TrajectoryRolledBack)
    assert events[-1].compensated_steps == (3, 2, 1, 0)
    assert saga.status() is T.ROLLED_BACK and saga.s.compensated == (3, 2, 1, 0)
    assert [s.status for s in saga.s.steps[:4]] == [S.COMPENSATED] * 4
    assert saga.s.steps[4].status is S.FAILED
    assert saga.work() is None


def test_a_compensation_report_for_a_step_not_on_top_is_ignored_saga_3() -> None:
    saga = Saga()
    saga.deploy_until_pivot()
    saga.fail("conflict", status=409)
    for wrong in (0, 1, 2, 4):
        assert saga.ok(RecordCompensationOutcome, step_index=wrong, attempt=1, outcome="compensated") == ()
    assert saga.ok(RecordCompensationOutcome, step_index=3, attempt=2, outcome="compensated") == ()
    assert saga.s.stack == (0, 1, 2, 3)


def test_partial_effects_of_the_failed_step_are_compensated_first_saga_3() -> None:
    saga = started()
    saga.step("ip.reserve")
    saga.propose("vm.provision")
    events = saga.fail("auth-revoked", "token revoked", 403, partial_output='{"vmId": "vm-half"}')
    failed = of_type(events, StepFailed)[0]
    assert json.loads(failed.compensation)["params"] == {"vmId": "vm-half"}
    assert of_type(events, RecoveryDecided)[0].action == "BACKWARD_ROLLBACK"
    assert saga.s.stack == (0, 1)
    first = saga.compensator()
    assert (first.step_index, first.operation, first.params) == (1, "vm.terminate", {"vmId": "vm-half"})
    saga.compensate()
    assert saga.compensator().step_index == 0
    events = saga.compensate()
    assert names(events) == ["CompensationCompleted", "TrajectoryRolledBack"]
    assert saga.s.compensated == (1, 0)
    assert saga.s.steps[1].status is S.COMPENSATED


def test_a_failure_without_partial_effects_is_not_compensated_saga_3() -> None:
    saga = started()
    saga.step("ip.reserve")
    saga.propose("vm.provision")
    events = saga.fail("auth-revoked", "token revoked", 403)
    assert of_type(events, StepFailed)[0].compensation == ""
    assert saga.s.stack == (0,)
    assert saga.compensator().step_index == 0


def test_a_retriable_compensator_failure_backs_off_under_a_new_key_saga_3() -> None:
    saga = Saga()
    saga.deploy_until_pivot()
    saga.fail("conflict", status=409)
    first = saga.compensator()
    events = saga.compensate("retriable", error_kind="unavailable", error_message="503 from env")
    assert names(events) == ["CompensationFailed"]
    failed = events[0]
    assert (failed.severity, failed.attempt, failed.step_index) == ("retriable", 1, 3)
    now = saga.now
    assert failed.not_before > now, "full jitter backoff lies in the future"
    assert failed.not_before < now + saga.context.policy.backoff_cap_ms
    assert saga.status() is T.UNWINDING
    assert saga.s.steps[3].status is S.COMPENSATING
    again = saga.compensator()
    assert again.step_index == 3 and again.attempt == 2
    assert again.idempotency_key == f"{saga.run_id}/s3/c2" != first.idempotency_key
    assert again.not_before == failed.not_before
    assert again.params == first.params
    # the report for the superseded attempt is stale
    assert saga.ok(RecordCompensationOutcome, step_index=3, attempt=1, outcome="compensated") == ()
    assert names(saga.compensate()) == ["CompensationCompleted"]
    assert saga.s.steps[3].status.value == "compensated"
    assert saga.compensator().step_index == 2


def test_a_compensator_failing_retriably_too_often_is_fatal_saga_3() -> None:
    saga = Saga(context=SagaContext(CATALOG, max_compensation_attempts=2))
    saga.deploy_until_pivot()
    saga.fail("conflict", status=409)
    assert of_type(saga.compensate("retriable"), CompensationFailed)[0].severity == "retriable"
    events = saga.compensate("retriable")
    assert of_type(events, CompensationFailed)[0].severity == "fatal"
    assert of_type(events, TrajectoryFrozen)[0].failure_mode == "COMPENSATION_CORRUPTED"


def test_a_fatal_compensator_failure_panics_and_freezes_listing_the_remainder_saga_3_rec_7() -> None:
    saga = Saga()
    saga.deploy_until_pivot()
    saga.fail("conflict", status=409)
    saga.compensate()  # C4 ok
    events = saga.compensate("fatal", error_kind="corrupted", error_message="build cache is gone")
    assert names(events) == ["CompensationFailed", "TrajectoryFrozen"]
    assert events[0].severity == "fatal" and events[0].not_before == 0
    frozen = events[1]
    assert isinstance(frozen, TrajectoryFrozen)
    assert frozen.failure_mode == "COMPENSATION_CORRUPTED"
    assert (frozen.failed_step, frozen.failed_tool) == (2, "sandbox.compile")
    assert frozen.epoch == 1
    remainder = json.loads(frozen.uncompensated)
    assert [(r["stepIndex"], r["tool"], r["status"]) for r in remainder] == [
        (2, "sandbox.compile", "panic"),
        (1, "ip.reserve", "committed"),
        (0, "vm.provision", "committed"),
    ]
    assert remainder[0]["compensation"]["params"] == {"buildId": "build-1"}, "names the orphaned resource"
    context = json.loads(frozen.error_context)
    assert context["kind"] == "corrupted" and context["compensator"]["operation"] == "sandbox.clean"
    assert frozen.snapshot_ref.startswith(f"tenure://trajectories/{saga.run_id}?version=")
    assert saga.status() is T.FROZEN
    assert saga.s.steps[2].status is S.PANIC
    assert saga.s.incident is not None and saga.s.incident.incident_id == frozen.incident_id
    # REC-7: nothing is dispatched; the only work is revoking the lease
    work = saga.work()
    assert isinstance(work, RevokeLease) and work.incident_id == frozen.incident_id and work.epoch == 1


# --- SAGA-6: the pivot boundary ----------------------------------------------------------------


def test_a_pivot_waits_for_its_gate_and_is_prepared_before_dispatch_saga_6() -> None:
    saga = started()
    saga.step("vm.provision")
    intent = saga.propose("dns.publish")[0]
    assert intent.status == "awaiting-gate" and intent.reversibility == "III"
    assert saga.s.pivot_step == 1
    gate = saga.work()
    assert (
        isinstance(gate, EvaluateGate) and gate.tool == "dns.publish" and gate.params == PARAMS["dns.publish"]
    )
    events = saga.gate()
    assert names(events) == ["PivotGateEvaluated"] and events[0].verdict == "passed"
    assert saga.s.steps[1].status is S.PREPARING
    assert saga.dispatch().idempotency_key == f"{saga.run_id}/s1/d1"


def test_a_failed_gate_check_is_a_failure_of_the_pivot_saga_6() -> None:
    saga = started()
    saga.step("vm.provision")
    saga.propose("dns.publish")
    events = saga.gate(passed=False)
    assert names(events)[:3] == ["PivotGateEvaluated", "StepFailed", "RecoveryDecided"]
    assert events[0].verdict == "failed" and "dns.name-available" in events[0].detail
    assert events[1].error_kind == "gate-failed"
    assert saga.s.steps[1].status is S.FAILED
    assert not saga.s.pivot_committed


def test_the_pivot_commit_retires_the_stack_saga_6() -> None:
    saga = Saga()
    saga.deploy_until_pivot()
    events = saga.commit()
    assert names(events) == ["StepCommitted", "CompensationStackRetired"]
    assert events[0].compensation == "" and events[0].stack_depth == 4
    assert events[1].retired_steps == (0, 1, 2, 3) and events[1].pivot_step == 4
    assert saga.status() is T.POST_PIVOT and saga.s.stack == () and saga.s.pivot_committed
    refusal = saga.refused(AbortTrajectory, reason="changed my mind")
    assert refusal.code == "PIVOT_COMMITTED"


@pytest.mark.parametrize(
    ("kind", "status", "action"),
    [
        ("conflict", 409, "OPERATOR_ESCALATE"),
        ("auth-revoked", 403, "OPERATOR_ESCALATE"),
        ("corrupted", 422, "OPERATOR_ESCALATE"),
        ("schema-invalid", 422, "FORWARD_REPAIR"),
        ("compile-error", 422, "FORWARD_REPAIR"),
        ("timeout", 0, "TRANSIENT_RETRY"),
        ("rate-limited", 429, "TRANSIENT_RETRY"),
    ],
)
def test_after_the_pivot_failures_never_roll_back_saga_6(kind: str, status: int, action: str) -> None:
    saga = Saga()
    saga.deploy_until_pivot()
    saga.commit()
    saga.propose("cache.warm")
    events = saga.fail(kind, "post-pivot trouble", status)
    decided = of_type(events, RecoveryDecided)[0]
    assert decided.action == action
    assert json.loads(decided.inputs)["afterPivot"] == "true"
    assert not of_type(events, CompensationCompleted) and not of_type(events, CompensationFailed)
    assert saga.status() in (T.POST_PIVOT, T.AWAITING_REPAIR, T.FROZEN)
    if action == "OPERATOR_ESCALATE":
        assert of_type(events, TrajectoryFrozen)[0].failure_mode == "POST_PIVOT_STALLED"
        remainder = json.loads(of_type(events, TrajectoryFrozen)[0].uncompensated)
        assert {r["stepIndex"] for r in remainder} == {0, 1, 2, 3, 4}
    assert not isinstance(saga.work(), RunCompensator)


def test_a_post_pivot_step_exhausting_its_retries_escalates_never_rolls_back_saga_6_rec_7() -> None:
    saga = Saga()
    saga.deploy_until_pivot()
    saga.commit()
    saga.propose("cache.warm")
    actions = []
    while saga.status() is T.POST_PIVOT:
        actions.append(of_type(saga.fail("timeout", "read timeout"), RecoveryDecided)[0])
    assert [a.action for a in actions] == ["TRANSIENT_RETRY"] * 3 + ["OPERATOR_ESCALATE"]
    assert saga.status() is T.FROZEN and saga.s.incident is not None
    assert saga.s.incident.failure_mode == "POST_PIVOT_STALLED"
    assert not of_type(saga.events, TrajectoryRolledBack)


def test_a_post_pivot_repair_returns_to_post_pivot_saga_6() -> None:
    saga = Saga()
    saga.deploy_until_pivot()
    saga.commit()
    saga.propose("cache.warm")
    saga.fail("schema-invalid", "name too long", 422)
    assert saga.status() is T.AWAITING_REPAIR
    saga.propose("cache.warm", {"name": "w"}, repair_of=5)
    assert saga.status() is T.POST_PIVOT
    saga.commit()
    assert saga.s.stack == () and saga.s.pivot_committed  # retired at the pivot: nothing pushed after it
    assert saga.refused(AbortTrajectory, reason="x").code == "PIVOT_COMMITTED"
    assert names(saga.ok(FinishTrajectory)) == ["TrajectoryCompleted"]
    assert saga.status() is T.COMPLETED


def test_a_second_pivot_is_refused_with_an_explanation_saga_6() -> None:
    saga = Saga()
    saga.deploy_until_pivot()
    saga.commit()
    refusal = saga.refused(ProposeStep, tool="notify.send", params=json.dumps(PARAMS["notify.send"]))
    assert refusal.code == "TWO_PIVOTS"
    assert "at most one pivot" in refusal.detail and "dns.publish" in refusal.detail
    assert "outbox" in refusal.detail
    # also while the first pivot still awaits its gate
    other = started()
    other.propose("dns.publish")
    other.gate()
    other.commit()
    assert (
        other.refused(ProposeStep, tool="dns.publish", params=json.dumps(PARAMS["dns.publish"])).code
        == "TWO_PIVOTS"
    )


def plan(*steps: tuple[str, str, list[str]]) -> str:
    return json.dumps(
        [{"stepId": i, "tool": tool, "params": PARAMS[tool], "after": after} for i, tool, after in steps]
    )


def test_a_plan_with_two_pivots_is_rejected_with_an_explanation_saga_7() -> None:
    saga = Saga()
    decision = saga.send(
        saga.command(StartTrajectory, plan=plan(("a", "dns.publish", []), ("b", "dns.publish", [])))
    )
    assert isinstance(decision, Rejection) and decision.code == "PLAN_REJECTED"
    assert "TWO_PIVOTS" in decision.detail and "at most one pivot" in decision.detail
    assert saga.state is None


def test_a_plan_is_compiled_and_followed_in_order_saga_7() -> None:
    saga = Saga()
    # proposed with the pivot first; the compiler moves the independent compensable step before it
    saga.start(plan=plan(("dns", "dns.publish", []), ("vm", "vm.provision", [])))
    compiled = saga.s.plan_value()
    assert [s["stepId"] for s in compiled["order"]] == ["vm", "dns"] and compiled["reordered"]
    refusal = saga.refused(ProposeStep, tool="dns.publish", params=json.dumps(PARAMS["dns.publish"]))
    assert refusal.code == "PLAN_MISMATCH" and "vm (vm.provision)" in refusal.detail
    wrong_id = saga.refused(
        ProposeStep, tool="vm.provision", params=json.dumps(PARAMS["vm.provision"]), plan_step_id="dns"
    )
    assert wrong_id.code == "PLAN_MISMATCH"
    assert saga.refused(FinishTrajectory).code == "PLAN_INCOMPLETE"
    saga.step("vm.provision")
    assert saga.s.steps[0].plan_step_id == "vm"
    assert saga.refused(FinishTrajectory).code == "PLAN_INCOMPLETE"
    saga.step("dns.publish")
    done = saga.refused(ProposeStep, tool="cache.warm", params=json.dumps(PARAMS["cache.warm"]))
    assert done.code == "PLAN_MISMATCH" and "the plan is done" in done.detail
    assert names(saga.ok(FinishTrajectory)) == ["TrajectoryCompleted"]


def test_the_outbox_is_released_with_the_pivot_commit_saga_7() -> None:
    saga = Saga()
    saga.start(
        plan=plan(
            ("vm", "vm.provision", []),
            ("dns", "dns.publish", ["vm"]),
            ("mail", "notify.send", ["vm"]),
        )
    )
    compiled = saga.s.plan_value()
    assert compiled["pivot"] == "dns" and [s["stepId"] for s in compiled["outbox"]] == ["mail"]
    saga.step("vm.provision")
    saga.propose("dns.publish")
    saga.gate()
    assert len(saga.s.steps) == 2, "nothing outbound before the pivot"
    events = saga.commit()
    assert names(events) == ["StepCommitted", "CompensationStackRetired", "StepIntentRecorded"]
    released = events[2]
    assert (released.tool, released.step_index, released.plan_step_id) == ("notify.send", 2, "mail")
    assert released.status == "pending" and released.idempotency_key == f"{saga.run_id}/s2/d1"
    assert json.loads(released.params) == PARAMS["notify.send"]
    assert saga.s.pivot_step == 1, "the released message is not a second pivot"
    work = saga.dispatch()
    assert work.step_index == 2 and work.operation == "notify.send"
    saga.commit()
    assert names(saga.ok(FinishTrajectory)) == ["TrajectoryCompleted"]


def test_a_human_approves_the_pivot_saga_6() -> None:
    saga = started(pivot_approval="human")
    saga.step("vm.provision")
    saga.propose("dns.publish")
    events = saga.gate()
    assert events[0].verdict == "waiting-approval"
    assert saga.status() is T.AWAITING_APPROVAL
    assert saga.work() is None, "the gate passed but a human has not approved"
    assert saga.refused(ApprovePivot, step_index=0, decision="approve").code == "NO_PIVOT_PENDING"
    assert saga.refused(ApprovePivot, step_index=1, decision="maybe").code == "INVALID_COMMAND"
    events = saga.ok(ApprovePivot, step_index=1, decision="approve", note="looks right")
    assert names(events) == ["PivotApproved", "PivotGateEvaluated"]
    assert isinstance(events[0], PivotApproved) and events[0].approver == "test"
    assert isinstance(events[1], PivotGateEvaluated) and events[1].verdict == "passed"
    assert saga.status() is T.FORWARD and saga.s.steps[1].status is S.PREPARING
    saga.commit()
    assert saga.status() is T.POST_PIVOT


def test_an_approval_before_the_gate_lets_the_gate_pass_at_once_saga_6() -> None:
    saga = started(pivot_approval="human")
    saga.propose("dns.publish")
    assert names(saga.ok(ApprovePivot, step_index=0, decision="approve")) == ["PivotApproved"]
    assert saga.gate()[0].verdict == "passed"
    assert saga.s.steps[0].status is S.PREPARING


def test_a_human_refuses_the_pivot_and_the_saga_rolls_back_saga_6() -> None:
    saga = started(pivot_approval="human")
    saga.step("vm.provision")
    saga.propose("dns.publish")
    saga.gate()
    events = saga.ok(ApprovePivot, step_index=1, decision="refuse", note="not today")
    assert names(events)[:3] == ["PivotApproved", "StepFailed", "RecoveryDecided"]
    assert events[1].error_kind == "approval-refused" and events[1].error_message == "not today"
    assert events[2].action == "BACKWARD_ROLLBACK"
    assert saga.status() is T.UNWINDING
    saga.compensate()
    assert saga.status() is T.ROLLED_BACK
