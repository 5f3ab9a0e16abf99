"""decide/evolve of the Trajectory aggregate, by example: the rules of SAGA-1..7 and REC-1..7.

Each test drives the pure core the way the orchestrator does (services/saga_orchestrator): the
runner proposes, `pending_work` says what the executor must do, and the executor's reports come
back as commands. Nothing here touches I/O; time is a value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.common.contracts import (
    AbortTrajectory,
    AdoptLease,
    ApprovePivot,
    CompensationCompleted,
    CompensationFailed,
    FinishTrajectory,
    IncidentResolved,
    LeaseRevocationRecorded,
    PivotApproved,
    PivotGateEvaluated,
    ProposeStep,
    RecordCompensationOutcome,
    RecordLeaseRevocation,
    RecordPivotGate,
    RecordStepOutcome,
    RecoveryDecided,
    ResolveIncident,
    StartTrajectory,
    StepCommitted,
    StepFailed,
    StepIntentRecorded,
    TrajectoryCommand,
    TrajectoryCompleted,
    TrajectoryEvent,
    TrajectoryFrozen,
    TrajectoryRolledBack,
    TrajectoryStarted,
)
from services.common.ids import run_id_for
from services.saga_orchestrator.domain import (
    Decision,
    DispatchStep,
    EvaluateGate,
    Rejection,
    RepairStats,
    RevokeLease,
    RunCompensator,
    SagaContext,
    StepStatus,
    ToolCatalog,
    TrajectoryState,
    TrajectoryStatus,
    Work,
    decide,
    evolve,
    fold,
    load_catalog,
    pending_work,
)
from services.saga_orchestrator.processor import repair_observation

S = StepStatus
T = TrajectoryStatus
TOOLS_JSON = Path(__file__).resolve().parents[2] / "services" / "sim_environment" / "tools.json"
CATALOG = load_catalog(TOOLS_JSON)
# The same tools registered without output post-conditions (an author may leave them out): then a
# committed output is taken as it comes, and only the compensator's binding can object to it.
UNCHECKED_CATALOG = ToolCatalog.from_json(
    [{k: v for k, v in entry.items() if k != "output"} for entry in json.loads(TOOLS_JSON.read_text())]
)
T0 = 1_767_225_600_000
TICK_MS = 1_000

# Valid parameters and a plausible output of every reference tool (the seed's 5-step deploy and more).
PARAMS: dict[str, dict[str, Any]] = {
    "vm.provision": {"name": "web"},
    "ip.reserve": {"region": "eu-west"},
    "sandbox.compile": {"vmId": "vm-1", "source": "print('hi')"},
    "firewall.write": {"vmId": "vm-1", "port": 443},
    "dns.publish": {"name": "web.example.com", "address": "10.0.0.7"},
    "payment.hold": {"account": "acct-1", "amount": 12.5},
    "notify.send": {"to": "ops@example.com", "text": "deployed"},
    "cache.warm": {"name": "web"},
}
OUTPUTS: dict[str, dict[str, Any]] = {
    "vm.provision": {"vmId": "vm-1"},
    "ip.reserve": {"ipId": "ip-1", "address": "10.0.0.7"},
    "sandbox.compile": {"buildId": "build-1"},
    "firewall.write": {"ruleId": "rule-1"},
    "dns.publish": {"recordId": "record-1"},
    "payment.hold": {"holdId": "hold-1"},
    "notify.send": {"messageId": "message-1"},
    "cache.warm": {"cacheId": "cache-1"},
}
# The compensator each reversible tool binds from its output, as the catalog declares it.
COMPENSATORS: dict[str, tuple[str, dict[str, Any]]] = {
    "vm.provision": ("vm.terminate", {"vmId": "vm-1"}),
    "ip.reserve": ("ip.release", {"ipId": "ip-1"}),
    "sandbox.compile": ("sandbox.clean", {"buildId": "build-1"}),
    "firewall.write": ("firewall.unbind", {"ruleId": "rule-1"}),
    "payment.hold": ("payment.release", {"holdId": "hold-1"}),
    "cache.warm": ("cache.drop", {"cacheId": "cache-1"}),
}
DEPLOY = ("vm.provision", "ip.reserve", "sandbox.compile", "firewall.write")
RUNNER_COMMANDS = (StartTrajectory, ProposeStep, FinishTrajectory, AbortTrajectory)


def of_type(events: tuple[TrajectoryEvent, ...] | list[TrajectoryEvent], kind: type[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def names(events: tuple[TrajectoryEvent, ...] | list[TrajectoryEvent]) -> list[str]:
    return [type(e).__name__ for e in events]


class Saga:
    """One trajectory driven through decide/evolve, as the processor and the executor would."""

    def __init__(self, key: str = "saga-1", context: SagaContext | None = None) -> None:
        self.run_id = run_id_for("acme", key)
        self.context = context or SagaContext(CATALOG)
        self.state: TrajectoryState | None = None
        self.events: list[TrajectoryEvent] = []
        self.now = T0
        self.attempt_id = "att-1"
        self.epoch = 1
        self._issued = 0

    # --- commands -----------------------------------------------------------------------------

    def command(self, kind: type[Any], **fields: Any) -> Any:
        self._issued += 1
        if kind in RUNNER_COMMANDS:
            fields.setdefault("attempt_id", self.attempt_id)
            fields.setdefault("lease_epoch", self.epoch)
        fields.setdefault("command_id", f"cmd-{self._issued}")
        return kind(
            run_id=self.run_id, issued_at=self.now, correlation_id=self.run_id, actor="test", **fields
        )

    def send(self, command: TrajectoryCommand) -> Decision:
        self.now += TICK_MS
        decision = decide(self.state, command, self.now, self.context)
        if not isinstance(decision, Rejection):
            for event in decision:
                self.state = evolve(self.state, event)
                self.events.append(event)
        return decision

    def ok(self, kind: type[Any], **fields: Any) -> tuple[Any, ...]:
        decision = self.send(self.command(kind, **fields))
        assert not isinstance(decision, Rejection), decision
        return decision

    def refused(self, kind: type[Any], **fields: Any) -> Rejection:
        before = self.state
        decision = self.send(self.command(kind, **fields))
        assert isinstance(decision, Rejection), decision
        assert self.state is before, "a rejection changes nothing"
        return decision

    def status(self) -> TrajectoryStatus:
        """Read afresh on every call (a method, so a type checker does not narrow it across commands)."""
        return self.s.status

    @property
    def s(self) -> TrajectoryState:
        assert self.state is not None
        return self.state

    # --- the runner ---------------------------------------------------------------------------

    def start(self, **fields: Any) -> tuple[Any, ...]:
        return self.ok(StartTrajectory, **fields)

    def propose(self, tool: str, params: dict[str, Any] | None = None, **fields: Any) -> tuple[Any, ...]:
        return self.ok(
            ProposeStep, tool=tool, params=json.dumps(PARAMS[tool] if params is None else params), **fields
        )

    # --- the executor -------------------------------------------------------------------------

    def work(self) -> Work | None:
        return pending_work(self.s)

    def dispatch(self) -> DispatchStep:
        work = self.work()
        assert isinstance(work, DispatchStep), work
        return work

    def commit(self, output: dict[str, Any] | None = None, **fields: Any) -> tuple[Any, ...]:
        work = self.dispatch()
        tool = self.s.steps[work.step_index].tool
        return self.ok(
            RecordStepOutcome,
            step_index=work.step_index,
            dispatch=work.dispatch,
            outcome="committed",
            output=json.dumps(OUTPUTS[tool] if output is None else output),
            **fields,
        )

    def fail(self, kind: str, message: str = "it failed", status: int = 0, **fields: Any) -> tuple[Any, ...]:
        work = self.dispatch()
        return self.ok(
            RecordStepOutcome,
            step_index=work.step_index,
            dispatch=work.dispatch,
            outcome="failed",
            error_kind=kind,
            error_message=message,
            error_status=status,
            **fields,
        )

    def unknown(self) -> tuple[Any, ...]:
        work = self.dispatch()
        return self.ok(
            RecordStepOutcome,
            step_index=work.step_index,
            dispatch=work.dispatch,
            outcome="unknown",
            error_message="read timeout",
        )

    def gate(self, passed: bool = True) -> tuple[Any, ...]:
        work = self.work()
        assert isinstance(work, EvaluateGate), work
        checks = [{"name": "lease", "passed": True}, {"name": "dns.name-available", "passed": passed}]
        return self.ok(RecordPivotGate, step_index=work.step_index, checks=json.dumps(checks))

    def compensator(self) -> RunCompensator:
        work = self.work()
        assert isinstance(work, RunCompensator), work
        return work

    def compensate(self, outcome: str = "compensated", **fields: Any) -> tuple[Any, ...]:
        work = self.compensator()
        return self.ok(
            RecordCompensationOutcome,
            step_index=work.step_index,
            attempt=work.attempt,
            outcome=outcome,
            **fields,
        )

    def step(self, tool: str, output: dict[str, Any] | None = None) -> None:
        """A step that just works: proposed, gated if it is a pivot, committed."""
        self.propose(tool)
        if isinstance(self.work(), EvaluateGate):
            self.gate()
        self.commit(output)

    def deploy_until_pivot(self) -> None:
        """The seed's deploy: four committed class I/II steps, then the DNS pivot at its dispatch."""
        self.start()
        for tool in DEPLOY:
            self.step(tool)
        self.propose("dns.publish")
        self.gate()
        assert self.s.steps[4].status is S.PREPARING


def started(**fields: Any) -> Saga:
    saga = Saga()
    saga.start(**fields)
    return saga


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
