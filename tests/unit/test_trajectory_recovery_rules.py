"""decide/evolve of the Trajectory aggregate, by example: failures and recovery (REC-1..REC-7),
duplicates, late reports and fencing, incidents and their resolution, and regressions the
property tests found. Built with tests/support/trajectory_saga.py's `Saga`.
"""

from __future__ import annotations

import json

import pytest

from services.common.contracts import (
    AbortTrajectory,
    AdoptLease,
    ApprovePivot,
    FinishTrajectory,
    IncidentResolved,
    LeaseRevocationRecorded,
    ProposeStep,
    RecordCompensationOutcome,
    RecordLeaseRevocation,
    RecordPivotGate,
    RecordStepOutcome,
    RecoveryDecided,
    ResolveIncident,
    StartTrajectory,
    TrajectoryCompleted,
    TrajectoryFrozen,
    TrajectoryRolledBack,
    TrajectoryStarted,
)
from services.saga_orchestrator.domain import (
    EvaluateGate,
    Rejection,
    RepairStats,
    RevokeLease,
    RunCompensator,
    SagaContext,
    fold,
)
from services.saga_orchestrator.processor import repair_observation
from tests.support.trajectory_saga import (
    CATALOG,
    OUTPUTS,
    PARAMS,
    UNCHECKED_CATALOG,
    S,
    Saga,
    T,
    names,
    of_type,
    started,
)

# --- REC-1..REC-6: failures --------------------------------------------------------------------


def test_a_transient_failure_retries_with_a_new_dispatch_key_and_backoff_rec_2() -> None:
    saga = started()
    saga.propose("vm.provision")
    events = saga.fail("timeout", "read timeout after 5s")
    assert names(events) == ["StepFailed", "RecoveryDecided", "StepIntentRecorded"]
    failed, decided, retry = events
    assert failed.error_class == "transient"
    assert (decided.action, decided.gate) == ("TRANSIENT_RETRY", "gate-1-taxonomy")
    inputs = json.loads(decided.inputs)
    assert inputs["errorKind"] == "timeout" and inputs["transientRetries"] == "0"
    assert (retry.step_index, retry.dispatch) == (0, 2)
    assert retry.idempotency_key == f"{saga.run_id}/s0/d2"
    assert retry.params == json.dumps(PARAMS["vm.provision"], separators=(",", ":"), sort_keys=True)
    assert saga.now < retry.not_before < saga.now + saga.context.policy.backoff_base_ms
    work = saga.dispatch()
    assert work.dispatch == 2 and work.not_before == retry.not_before
    # the report of the first dispatch is late now and changes nothing
    assert saga.ok(RecordStepOutcome, step_index=0, dispatch=1, outcome="committed", output="{}") == ()
    saga.commit()
    assert saga.s.steps[0].status is S.COMMITTED and saga.s.steps[0].transient_retries == 1


def test_a_semantic_failure_asks_the_runner_for_a_repair_rec_4() -> None:
    saga = started(rerun_cost_ms=46_000, rerun_cost_money=0.162)
    saga.step("vm.provision")
    saga.propose("sandbox.compile")
    events = saga.fail("compile-error", "ImportError: no module named x", 422)
    decided = of_type(events, RecoveryDecided)[0]
    assert (decided.action, decided.gate) == ("FORWARD_REPAIR", "gate-3-economics")
    assert json.loads(decided.inputs)["pSource"].startswith("prior")
    assert saga.status() is T.AWAITING_REPAIR and saga.work() is None
    refusal = saga.refused(ProposeStep, tool="cache.warm", params=json.dumps(PARAMS["cache.warm"]))
    assert refusal.code == "REPAIR_EXPECTED"
    mismatch = saga.refused(
        ProposeStep, tool="cache.warm", params=json.dumps(PARAMS["cache.warm"]), repair_of=1
    )
    assert mismatch.code == "REPAIR_TOOL_MISMATCH"
    repair = saga.propose("sandbox.compile", {"vmId": "vm-1", "source": "fixed"}, repair_of=1)[0]
    assert (repair.dispatch, repair.idempotency_key, repair.repair_of) == (2, f"{saga.run_id}/s1/d2", 1)
    assert saga.status() is T.FORWARD and saga.s.steps[1].consecutive_repairs == 1
    saga.commit()
    assert saga.s.stack == (0, 1)


def test_the_repair_spin_trace_rolls_back_at_the_repeated_signature_rec_5() -> None:
    saga = started(rerun_cost_ms=46_000, rerun_cost_money=0.162)
    saga.step("vm.provision")
    saga.propose("sandbox.compile")
    trace = ["ImportError: x", "AttributeError: y", "TypeError: z", "ImportError: x"]
    actions = []
    for number, message in enumerate(trace):
        if number:
            saga.propose("sandbox.compile", {"vmId": "vm-1", "source": f"v{number}"}, repair_of=1)
        decided = of_type(saga.fail("compile-error", message, 422), RecoveryDecided)[0]
        actions.append((decided.action, decided.gate))
    assert actions == [("FORWARD_REPAIR", "gate-3-economics")] * 3 + [("BACKWARD_ROLLBACK", "anti-spin")]
    assert saga.status() is T.UNWINDING


def test_an_unknown_outcome_reconciles_under_the_same_key_then_freezes_rec_6_rec_7() -> None:
    saga = started()
    saga.propose("vm.provision")
    key = saga.dispatch().idempotency_key
    for lost in range(1, 4):
        events = saga.unknown()
        assert names(events) == ["StepOutcomeUnknown"]
        work = saga.dispatch()
        assert (work.idempotency_key, work.dispatch, work.unknown_outcomes) == (key, 1, lost)
        assert saga.s.steps[0].status is S.DISPATCHED
    events = saga.unknown()
    assert names(events) == ["StepOutcomeUnknown", "TrajectoryFrozen"]
    assert saga.context.max_unknown_outcomes == 4
    assert events[1].failure_mode == "OUTCOME_UNKNOWN" and events[1].failed_step == 0
    assert saga.status() is T.FROZEN
    assert isinstance(saga.work(), RevokeLease)


def test_an_unknown_outcome_then_a_reconciled_commit_is_one_effect_rec_6() -> None:
    saga = started()
    saga.propose("vm.provision")
    saga.unknown()
    events = saga.commit(reconciled=True)
    assert names(events) == ["StepCommitted"] and events[0].reconciled and events[0].dispatch == 1
    assert saga.s.steps[0].dispatch == 1 and saga.s.stack == (0,)


# --- duplicates, late reports, fencing ---------------------------------------------------------


def test_a_redelivered_command_decides_nothing() -> None:
    saga = started()
    propose = saga.command(ProposeStep, tool="vm.provision", params=json.dumps(PARAMS["vm.provision"]))
    first = saga.send(propose)
    assert not isinstance(first, Rejection) and names(first) == ["StepIntentRecorded"]
    assert saga.send(propose) == ()
    commit = saga.command(
        RecordStepOutcome, step_index=0, dispatch=1, outcome="committed", output='{"vmId":"vm-v"}'
    )
    first = saga.send(commit)
    assert not isinstance(first, Rejection) and names(first) == ["StepCommitted"]
    version = saga.s.version
    for again in (propose, commit):
        assert saga.send(again) == ()
    assert saga.s.version == version
    start = saga.events[0]
    assert saga.send(saga.command(StartTrajectory, command_id=start.causation_id)) == ()


def test_late_and_repeated_outcome_reports_decide_nothing() -> None:
    saga = started()
    saga.propose("vm.provision")
    saga.commit()
    version = saga.s.version
    late = [
        dict(step_index=0, dispatch=1, outcome="committed", output='{"vmId": "other"}'),
        dict(step_index=0, dispatch=1, outcome="failed", error_kind="timeout"),
        dict(step_index=0, dispatch=1, outcome="unknown"),
        dict(step_index=0, dispatch=7, outcome="committed", output="{}"),
    ]
    for report in late:
        assert saga.ok(RecordStepOutcome, **report) == ()
    assert saga.s.version == version and saga.s.steps[0].output == json.dumps(OUTPUTS["vm.provision"])
    assert (
        saga.refused(RecordStepOutcome, step_index=9, dispatch=1, outcome="committed").code == "UNKNOWN_STEP"
    )
    # a gate verdict reported twice is decided once
    saga.propose("dns.publish")
    saga.gate()
    assert saga.ok(RecordPivotGate, step_index=1, checks="[]") == ()


def test_an_unknown_outcome_kind_is_refused() -> None:
    saga = started()
    saga.propose("vm.provision")
    assert (
        saga.refused(RecordStepOutcome, step_index=0, dispatch=1, outcome="maybe").code == "INVALID_COMMAND"
    )


def test_a_stale_epoch_is_fenced_off() -> None:
    saga = started(lease_epoch=3)
    saga.epoch = 3
    for fields in ({"lease_epoch": 2}, {"lease_epoch": 3, "attempt_id": "att-intruder"}):
        for kind, extra in (
            (ProposeStep, {"tool": "vm.provision", "params": json.dumps(PARAMS["vm.provision"])}),
            (FinishTrajectory, {}),
            (AbortTrajectory, {"reason": "x"}),
        ):
            refusal = saga.refused(kind, **fields, **extra)
            assert refusal.code == "STALE_EPOCH" and "epoch 3" in refusal.detail
    # a newer lease takes over and is from then on the only one accepted
    saga.ok(
        ProposeStep,
        tool="vm.provision",
        params=json.dumps(PARAMS["vm.provision"]),
        lease_epoch=4,
        attempt_id="att-2",
    )
    assert (saga.s.epoch, saga.s.attempt_id) == (4, "att-2")
    assert saga.dispatch().epoch == 4 and saga.dispatch().attempt_id == "att-2"
    saga.commit()
    assert saga.refused(FinishTrajectory).code == "STALE_EPOCH"


def test_commands_before_the_start_or_after_the_end_are_refused() -> None:
    saga = Saga()
    assert saga.refused(ProposeStep, tool="vm.provision", params="{}").code == "TRAJECTORY_NOT_FOUND"
    saga.start()
    assert saga.refused(StartTrajectory).code == "TRAJECTORY_EXISTS"
    saga.ok(FinishTrajectory)
    assert saga.status() is T.COMPLETED
    assert saga.refused(ProposeStep, tool="vm.provision", params="{}").code == "TRAJECTORY_ENDED"
    assert saga.refused(AbortTrajectory, reason="x").code == "TRAJECTORY_ENDED"


def test_invalid_starts_are_refused() -> None:
    saga = Saga()
    assert saga.refused(StartTrajectory, pivot_approval="sometimes").code == "INVALID_COMMAND"
    assert saga.refused(StartTrajectory, budget_steps=-1).code == "INVALID_COMMAND"
    assert saga.refused(StartTrajectory, plan='{"not": "a list"}').code == "PLAN_REJECTED"
    assert saga.refused(StartTrajectory, plan='[{"stepId": "a", "tool": "nope"}]').code == "PLAN_REJECTED"


def test_the_step_budget_is_enforced_rec_3() -> None:
    saga = started(budget_steps=1)
    saga.step("vm.provision")
    assert saga.refused(ProposeStep, tool="cache.warm", params=json.dumps(PARAMS["cache.warm"])).code == (
        "BUDGET_EXHAUSTED"
    )


def test_abort_before_the_pivot_unwinds_what_committed_saga_3() -> None:
    saga = started()
    saga.step("vm.provision")
    saga.step("payment.hold")
    saga.propose("cache.warm")
    assert saga.refused(AbortTrajectory, reason="x").code == "STEP_IN_FLIGHT"
    saga.commit()
    events = saga.ok(AbortTrajectory, reason="user cancelled")
    assert names(events) == ["RecoveryDecided"]
    assert (events[0].gate, events[0].action, events[0].reason) == (
        "runner-abort",
        "BACKWARD_ROLLBACK",
        "user cancelled",
    )
    order = []
    for _ in range(3):
        order.append(saga.compensator().step_index)
        saga.compensate()
    assert order == [2, 1, 0] and saga.s.compensated == (2, 1, 0)
    assert saga.status() is T.ROLLED_BACK


def test_abort_with_nothing_committed_ends_at_once() -> None:
    saga = started()
    events = saga.ok(AbortTrajectory, reason="")
    assert names(events) == ["RecoveryDecided", "TrajectoryRolledBack"]
    assert saga.status() is T.ROLLED_BACK and saga.s.compensated == ()


# --- REC-7: incidents and their resolution -----------------------------------------------------


def frozen_mid_unwind() -> Saga:
    """C4 compensated, C3 failed fatally: PANIC on step 2, steps 1 and 0 still to compensate."""
    saga = Saga()
    saga.deploy_until_pivot()
    saga.fail("conflict", status=409)
    saga.compensate()
    saga.compensate("fatal", error_kind="corrupted")
    assert saga.status() is T.FROZEN
    return saga


def test_the_lease_revocation_is_recorded_once_rec_7() -> None:
    saga = frozen_mid_unwind()
    incident = saga.s.incident
    assert incident is not None
    assert saga.ok(RecordLeaseRevocation, incident_id="inc_other", revoked_epoch=2) == ()
    events = saga.ok(RecordLeaseRevocation, incident_id=incident.incident_id, revoked_epoch=2)
    assert names(events) == ["LeaseRevocationRecorded"] and isinstance(events[0], LeaseRevocationRecorded)
    assert saga.s.incident is not None and saga.s.incident.revoked_epoch == 2
    assert saga.work() is None
    assert saga.ok(RecordLeaseRevocation, incident_id=incident.incident_id, revoked_epoch=3) == ()


def test_a_frozen_trajectory_dispatches_and_accepts_nothing_rec_7() -> None:
    saga = frozen_mid_unwind()
    assert saga.refused(ProposeStep, tool="cache.warm", params=json.dumps(PARAMS["cache.warm"])).code == (
        "TRAJECTORY_FROZEN"
    )
    assert saga.ok(RecordCompensationOutcome, step_index=2, attempt=1, outcome="compensated") == ()
    assert saga.refused(FinishTrajectory).code == "TRAJECTORY_BUSY"


def test_resume_needs_a_lease_taken_after_the_freeze_rec_7() -> None:
    saga = frozen_mid_unwind()
    incident = saga.s.incident
    assert incident is not None and incident.epoch == 1
    refusal = saga.refused(
        ResolveIncident, incident_id=incident.incident_id, resolution="resume", lease_epoch=1
    )
    assert refusal.code == "LEASE_REQUIRED"
    assert saga.refused(ResolveIncident, incident_id=incident.incident_id, resolution="resume").code == (
        "LEASE_REQUIRED"
    )
    assert (
        saga.refused(ResolveIncident, incident_id="inc_nope", resolution="abandon").code
        == "INCIDENT_NOT_OPEN"
    )
    assert saga.refused(ResolveIncident, incident_id=incident.incident_id, resolution="shrug").code == (
        "INVALID_COMMAND"
    )
    events = saga.ok(
        ResolveIncident,
        incident_id=incident.incident_id,
        resolution="resume",
        attempt_id="att-2",
        lease_epoch=2,
    )
    assert names(events) == ["IncidentResolved"]
    assert isinstance(events[0], IncidentResolved) and (events[0].attempt_id, events[0].epoch) == ("att-2", 2)
    assert saga.status() is T.UNWINDING and saga.s.incident is None
    assert (saga.s.epoch, saga.s.attempt_id) == (2, "att-2")
    # the panicked compensator runs again under a NEW key: its old key failed for good
    again = saga.compensator()
    assert (again.step_index, again.attempt, again.epoch) == (2, 2, 2)
    assert again.idempotency_key == f"{saga.run_id}/s2/c2"
    saga.compensate()
    saga.compensate()
    events = saga.compensate()
    assert isinstance(events[-1], TrajectoryRolledBack)
    assert saga.s.compensated == (3, 2, 1, 0)


def test_compensated_manually_rolls_back_the_remainder_rec_7() -> None:
    saga = frozen_mid_unwind()
    assert saga.s.incident is not None
    events = saga.ok(
        ResolveIncident, incident_id=saga.s.incident.incident_id, resolution="compensated-manually"
    )
    assert names(events) == ["IncidentResolved"]
    assert saga.status() is T.ROLLED_BACK
    assert [s.status for s in saga.s.steps[:4]] == [S.COMPENSATED] * 4
    assert saga.s.compensated == (3, 2, 1, 0) and saga.s.stack == ()
    assert saga.work() is None


def test_abandon_ends_the_trajectory_as_it_is_rec_7() -> None:
    saga = frozen_mid_unwind()
    assert saga.s.incident is not None
    saga.ok(
        ResolveIncident, incident_id=saga.s.incident.incident_id, resolution="abandon", note="by hand later"
    )
    assert saga.status() is T.ABANDONED and saga.status().is_terminal
    assert [s.status for s in saga.s.steps[:3]] == [S.COMMITTED, S.COMMITTED, S.PANIC]
    assert saga.refused(ResolveIncident, incident_id="x", resolution="abandon").code == "TRAJECTORY_ENDED"


def test_compensated_manually_after_the_pivot_abandons_rec_7() -> None:
    saga = Saga()
    saga.deploy_until_pivot()
    saga.commit()
    saga.propose("cache.warm")
    saga.fail("auth-revoked", status=403)
    assert saga.s.incident is not None
    saga.ok(ResolveIncident, incident_id=saga.s.incident.incident_id, resolution="compensated-manually")
    assert saga.status() is T.ABANDONED


def test_resume_of_a_post_pivot_failure_awaits_a_repair_rec_7() -> None:
    saga = Saga()
    saga.deploy_until_pivot()
    saga.commit()
    saga.propose("cache.warm")
    saga.fail("auth-revoked", status=403)
    assert saga.s.incident is not None
    saga.ok(ResolveIncident, incident_id=saga.s.incident.incident_id, resolution="resume", lease_epoch=2)
    assert saga.status() is T.AWAITING_REPAIR
    saga.propose("cache.warm", repair_of=5, lease_epoch=2)
    assert saga.status() is T.POST_PIVOT
    saga.commit()
    assert saga.s.steps[5].status is S.COMMITTED


# --- REC-4: the repair statistics' observations ------------------------------------------------


def test_repair_observation_reports_only_repair_dispatches_rec_4() -> None:
    saga = started(rerun_cost_ms=46_000, rerun_cost_money=0.162)
    saga.propose("vm.provision")
    before = saga.state
    committed = saga.commit()[0]
    assert repair_observation(before, committed) is None, "a plain commit is no repair"
    saga.propose("sandbox.compile")
    before = saga.state
    failed = saga.fail("compile-error", "SyntaxError: 1", 422)
    assert repair_observation(before, failed[0]) is None, "the original failure is no repair"
    saga.propose("sandbox.compile", {"vmId": "vm-1", "source": "b"}, repair_of=1)
    before = saga.state
    failed = saga.fail("compile-error", "NameError: q", 422)
    assert repair_observation(before, failed[0]) == ("compile-error", False)
    for event in failed[1:]:
        assert repair_observation(before, event) is None
    saga.propose("sandbox.compile", {"vmId": "vm-1", "source": "c"}, repair_of=1)
    before = saga.state
    committed = saga.commit()[0]
    assert repair_observation(before, committed) == ("compile-error", True)
    assert repair_observation(None, committed) is None
    # a transient retry's outcome is no repair either
    saga.propose("cache.warm")
    saga.fail("timeout")
    before = saga.state
    assert repair_observation(before, saga.commit()[0]) is None


def test_measured_repair_statistics_feed_the_policy_rec_4() -> None:
    """With enough failed repairs of this kind recorded, P(success) is measured and repair loses."""
    stats = RepairStats()
    for _ in range(20):
        stats = stats.observe("compile-error", False)
    saga = Saga(context=SagaContext(CATALOG, stats=stats))
    saga.start(rerun_cost_ms=46_000, rerun_cost_money=0.162)
    saga.step("vm.provision")
    saga.propose("sandbox.compile")
    decided = of_type(saga.fail("compile-error", "ImportError: x", 422), RecoveryDecided)[0]
    assert (decided.action, decided.gate) == ("BACKWARD_ROLLBACK", "gate-3-economics")
    assert "measured" in json.loads(decided.inputs)["pSource"]


def test_the_events_of_a_saga_replay_to_its_state() -> None:
    saga = frozen_mid_unwind()
    assert fold(saga.events) == saga.state
    assert [e.version for e in saga.events] == list(range(1, len(saga.events) + 1))
    assert isinstance(saga.events[0], TrajectoryStarted) and saga.events[0].epoch == 1
    assert len({e.event_id for e in saga.events}) == len(saga.events)
    assert isinstance(saga.events[-1], TrajectoryFrozen) and not of_type(saga.events, TrajectoryCompleted)


# --- once bugs: each of these reproduced a defect the property tests found; kept as regressions ----


def test_unbound_compensator_names_the_orphan_in_the_incident_rec_7() -> None:
    """REC-7: the incident lists the uncompensated remainder, including a step whose compensator
    could not be bound from its output (it committed a resource nobody can undo automatically)."""
    saga = Saga(context=SagaContext(UNCHECKED_CATALOG))
    saga.start()
    saga.step("ip.reserve")
    saga.propose("vm.provision")
    frozen = saga.commit({"id": "no-vmId"})[-1]
    assert isinstance(frozen, TrajectoryFrozen) and frozen.failure_mode == "COMPENSATOR_UNBOUND"
    assert [r["stepIndex"] for r in json.loads(frozen.uncompensated)] == [1, 0]


def test_unbound_compensator_then_abort_panics_instead_of_rolling_back_clean_saga_3() -> None:
    """SAGA-3: TrajectoryRolledBack means every committed effect was compensated. After
    COMPENSATOR_UNBOUND, resume + abort unwinds to the unbound step and stops there: PANIC and a
    COMPENSATION_CORRUPTED incident, never a clean rollback with the step still COMMITTED."""
    saga = Saga(context=SagaContext(UNCHECKED_CATALOG))
    saga.start()
    saga.propose("vm.provision")
    saga.commit({"id": "no-vmId"})
    assert saga.s.incident is not None
    saga.ok(ResolveIncident, incident_id=saga.s.incident.incident_id, resolution="resume", lease_epoch=2)
    saga.epoch = 2
    assert names(saga.ok(AbortTrajectory, reason="give up")) == ["RecoveryDecided"]
    work = saga.work()
    assert isinstance(work, RunCompensator) and work.operation == ""  # nothing bound
    frozen = saga.compensate("fatal", error_kind="compensator-unbound")[-1]
    assert isinstance(frozen, TrajectoryFrozen) and frozen.failure_mode == "COMPENSATION_CORRUPTED"
    assert saga.s.steps[0].status is S.PANIC


@pytest.mark.parametrize("output", ['{"recordId": "record-1"}', "{}"], ids=["valid", "post-condition-failed"])
def test_a_late_pivot_commit_leaves_the_trajectory_frozen_for_an_operator_rec_7(output: str) -> None:
    """REC-7: frozen means no further dispatch until an operator resolves the incident. A late
    "committed" report of the pivot (its answer was lost 4 times, then the probe found it) is
    recorded, the trajectory stays FROZEN, the lease revocation is still owed, and a resume would
    continue past the pivot."""
    saga = started()
    saga.step("vm.provision")
    saga.propose("dns.publish")
    saga.gate()
    for _ in range(saga.context.max_unknown_outcomes):
        saga.unknown()
    assert saga.status() is T.FROZEN
    saga.ok(RecordStepOutcome, step_index=1, dispatch=1, outcome="committed", output=output, reconciled=True)
    assert saga.status() is T.FROZEN
    assert saga.s.steps[1].status is S.COMMITTED
    assert isinstance(saga.work(), RevokeLease)
    assert saga.s.incident is not None and saga.s.incident.resume_to is T.POST_PIVOT


def test_a_gate_report_after_an_abort_is_decided_as_nothing() -> None:
    """decide is total: the gate verdict the executor was computing when the runner aborted
    arrives during the unwind and changes nothing (it used to raise: a poison command)."""
    saga = started()
    saga.step("vm.provision")
    saga.propose("dns.publish")
    gate = saga.work()
    assert isinstance(gate, EvaluateGate)
    saga.ok(AbortTrajectory, reason="stop")
    assert saga.status() is T.UNWINDING
    decision = saga.send(
        saga.command(RecordPivotGate, step_index=1, checks='[{"name": "lease", "passed": true}]')
    )
    assert decision == ()


def test_an_approval_after_an_abort_is_refused() -> None:
    saga = started(pivot_approval="human")
    saga.step("vm.provision")
    saga.propose("dns.publish")
    saga.gate()
    assert saga.status() is T.AWAITING_APPROVAL
    saga.ok(AbortTrajectory, reason="stop")
    decision = saga.send(saga.command(ApprovePivot, step_index=1, decision="approve"))
    assert isinstance(decision, Rejection) and decision.code == "NO_PIVOT_PENDING"


def test_a_partial_effect_is_undone_before_anything_else_never_retried_over_saga_3() -> None:
    """SAGA-3: a failed dispatch that left effects is not retried in place (a second effect would
    cover the first): policy D's retry becomes a rollback, and the partial effect's own
    compensator runs first."""
    saga = started()
    saga.step("ip.reserve")
    saga.propose("vm.provision")
    events = saga.fail("timeout", "read timeout", partial_output='{"vmId": "vm-half"}')
    decision = next(e for e in events if isinstance(e, RecoveryDecided))
    assert decision.action == "BACKWARD_ROLLBACK" and "partial" in decision.reason
    terminated = []
    while isinstance(work := saga.work(), RunCompensator):
        terminated.append(work.operation)
        saga.compensate()
    assert terminated == ["vm.terminate", "ip.release"]
    assert saga.status() is T.ROLLED_BACK


def test_reports_made_under_a_replaced_lease_are_ignored_lease_6() -> None:
    """Fencing of the executor's reports: after a new holder adopted the trajectory, an answer
    obtained under the old epoch is not decided; the same key is dispatched under the new one."""
    saga = started()
    saga.propose("vm.provision")
    old = saga.dispatch()
    assert saga.refused(AdoptLease, attempt_id="att-0", lease_epoch=0).code == "STALE_EPOCH"
    assert saga.ok(AdoptLease, attempt_id="att-1", lease_epoch=1) == ()
    assert names(saga.ok(AdoptLease, attempt_id="att-2", lease_epoch=2)) == ["LeaseAdopted"]
    new = saga.dispatch()
    assert (new.idempotency_key, new.epoch, new.attempt_id) == (old.idempotency_key, 2, "att-2")
    stale = {"step_index": 0, "dispatch": 1, "outcome": "committed", "output": '{"vmId": "vm-1"}'}
    assert saga.ok(RecordStepOutcome, lease_epoch=1, **stale) == ()
    assert saga.s.steps[0].status is S.PENDING
    assert names(saga.ok(RecordStepOutcome, lease_epoch=2, **stale)) == ["StepCommitted"]
