"""The saga orchestrator on real processes and a real broker (SAGA-1..7, REC-1..7, DUR-1).

One system (lease coordinator, effect gateway, simulated environment, saga orchestrator) serves
the module; every test opens its own run and trajectory, and audits the environment itself: the
environment knows every resource and every effect it received, so no outcome is self-reported.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

from services.common.contracts import (
    AbortTrajectory,
    AdoptLease,
    ApprovePivot,
    CompensationCompleted,
    CompensationFailed,
    IncidentOpened,
    LeaseRevocationRecorded,
    RecordWatchdogIntervention,
    RecoveryDecided,
    ResolveIncident,
    StartTrajectory,
    StepCommitted,
    TakeOverLease,
    TrajectoryFrozen,
    TrajectoryRolledBack,
)
from services.common.kafka import PartitionReader
from services.common.messages import MessageCodec
from services.common.topics import INCIDENTS, TRAJECTORIES_EVENTS
from services.saga_orchestrator.domain import StepStatus, TrajectoryStatus
from tests.support.saga import Lease, SagaRunner, SagaSystem, of_run
from tests.support.system import read_topic, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

T = TrajectoryStatus
# The seed's re-run cost (46 s and $0.162 of forward work), so that a repair is worth trying.
RERUN = {"rerun_cost_ms": 46_000, "rerun_cost_money": 0.162}


@pytest.fixture(scope="module")
def saga(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SagaSystem]:
    system = SagaSystem(tenure_topics, tmp_path_factory.mktemp("saga")).start()
    try:
        yield system
    finally:
        system.stop()


@pytest.fixture(scope="module")
def runner(tenure_topics: str) -> Iterator[SagaRunner]:
    client = SagaRunner(tenure_topics)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(autouse=True)
def no_faults_left(saga: SagaSystem) -> Iterator[None]:
    saga.clear_faults()
    yield
    saga.clear_faults()


def commit_step(runner: SagaRunner, lease: Lease, tool: str, params: dict[str, Any]) -> int:
    before = runner.state(lease.run_id)
    index = len(before.steps) if before else 0
    command_id = runner.propose(lease, tool, params)
    state = runner.wait(
        lease.run_id,
        lambda s: s.step(index) is not None and s.steps[index].status is StepStatus.COMMITTED,
        f"{tool} to commit",
        command_id,
    )
    assert state.steps[index].tool == tool
    return index


def deploy_prefix(runner: SagaRunner, lease: Lease, name: str) -> list[int]:
    """T1..T4 of the seed's deploy: VM, IP, compile in the sandbox, firewall rules."""
    vm = commit_step(runner, lease, "vm.provision", {"name": name})
    vm_id = json.loads(runner.state(lease.run_id).steps[vm].output)["vmId"]  # type: ignore[union-attr]
    ip = commit_step(runner, lease, "ip.reserve", {"region": "eu-west"})
    build = commit_step(runner, lease, "sandbox.compile", {"vmId": vm_id, "source": "fn main() {}"})
    rule = commit_step(runner, lease, "firewall.write", {"vmId": vm_id, "port": 443})
    return [vm, ip, build, rule]


def live_of(saga: SagaSystem, run_id: str) -> list[dict[str, Any]]:
    return of_run(saga.audit()["live"], run_id)


def assert_no_duplicate_effects(saga: SagaSystem) -> None:
    audit = saga.audit()
    assert audit["duplicates"] == []
    assert all(e["applied"] <= 1 for e in audit["effects"]), audit["effects"]


def test_seed_deploy_failing_at_dns_409_compensates_c4_to_c1_and_restores_the_world(
    saga: SagaSystem, runner: SagaRunner
) -> None:
    """SAGA-2, SAGA-3, SAGA-4: the seed's 5-step deploy fails at the DNS pivot with 409; the
    compensators C4..C1 run in reverse order and the environment is semantically back at start."""
    lease = runner.claim_new_run("saga-deploy-409")
    runner.start(lease, **RERUN)
    steps = deploy_prefix(runner, lease, "deploy-409")
    assert len(live_of(saga, lease.run_id)) == 4
    saga.arm("dns.publish", status=409, problem="conflict", detail="the domain is owned by another tenant")
    runner.propose(lease, "dns.publish", {"name": "deploy-409.example.org", "address": "203.0.113.7"})
    state = runner.wait(lease.run_id, lambda s: s.status is T.ROLLED_BACK, "the rollback")
    assert state.compensated == tuple(reversed(steps))  # C4, C3, C2, C1
    decisions = [e for e in runner.history(lease.run_id) if isinstance(e, RecoveryDecided)]
    assert [(d.action, d.error_class) for d in decisions] == [("BACKWARD_ROLLBACK", "fatal")]
    assert all(state.steps[i].status is StepStatus.COMPENSATED for i in steps)
    assert live_of(saga, lease.run_id) == []
    assert of_run(saga.audit()["permanent"], lease.run_id) == []  # the pivot never happened
    assert_no_duplicate_effects(saga)


def test_sigkill_of_the_orchestrator_during_unwind_resumes_at_the_same_compensator(
    saga: SagaSystem, runner: SagaRunner
) -> None:
    """SAGA-3, DUR-1: SIGKILL while C2 (ip.release) is in flight; the restarted orchestrator
    resumes at C2 under the same idempotency key and every compensator takes effect once."""
    lease = runner.claim_new_run("saga-kill-unwind")
    runner.start(lease, **RERUN)
    steps = deploy_prefix(runner, lease, "kill-unwind")
    # The release is applied at once, but its answer takes 1.5 s: the kill lands in between.
    saga.arm("ip.release", kind="timeout-after-commit", delayS=1.5)
    saga.arm("dns.publish", status=409, problem="conflict", detail="owned elsewhere")
    runner.propose(lease, "dns.publish", {"name": "kill-unwind.example.org", "address": "203.0.113.8"})

    def ip_released() -> bool:
        return any(r["kind"] == "ip" for r in of_run(saga.audit()["released"], lease.run_id))

    wait_until(ip_released, 45, "C2 (ip.release) to take effect")
    saga.orchestrator.sigkill()
    unwound = runner.state(lease.run_id)
    assert unwound is not None and unwound.status is T.UNWINDING
    saga.orchestrator.start()
    state = runner.wait(
        lease.run_id, lambda s: s.status is T.ROLLED_BACK, "the resumed rollback", timeout_s=90
    )
    assert state.compensated == tuple(reversed(steps))
    completions = [e for e in runner.history(lease.run_id) if isinstance(e, CompensationCompleted)]
    assert [c.step_index for c in completions] == list(reversed(steps))  # each logged exactly once
    assert live_of(saga, lease.run_id) == []
    releases = [e for e in saga.audit()["effects"] if e["key"].startswith(lease.run_id + "/s1/c")]
    assert [(e["applied"]) for e in releases] == [1], releases  # C2 took effect once, under one key
    assert_no_duplicate_effects(saga)


SPIN_TRACE = [
    ("ImportError", "cannot import name 'AsyncSession' from 'sqlalchemy.orm'"),
    ("AttributeError", "'AsyncSession' object has no attribute 'sync_engine'"),
    ("TypeError", "NoneType object cannot be interpreted as an integer"),
    ("ImportError", "cannot import name 'AsyncSession' from 'sqlalchemy.orm'"),
]


def _repair_until_rollback(
    saga: SagaSystem,
    runner: SagaRunner,
    key: str,
    trace: list[tuple[str, str]],
    problem: str = "compile-error",
) -> Any:
    lease = runner.claim_new_run(key)
    runner.start(lease, **RERUN)
    vm = commit_step(runner, lease, "vm.provision", {"name": key})
    vm_id = json.loads(runner.state(lease.run_id).steps[vm].output)["vmId"]  # type: ignore[union-attr]
    for kind, detail in trace:
        saga.arm(
            "sandbox.compile",
            status=422,
            problem=problem,
            detail=f"{kind}: {detail}",
            extensions={"errorType": kind},
        )
    runner.propose(lease, "sandbox.compile", {"vmId": vm_id, "source": "attempt 0"})

    def decided(count: int) -> Any:
        def enough(_: Any) -> bool:
            return sum(isinstance(e, RecoveryDecided) for e in runner.history(lease.run_id)) >= count

        return enough

    for attempt in range(1, len(trace) + 1):
        state = runner.wait(lease.run_id, decided(attempt), f"the decision after failure {attempt}")
        if state.status is not T.AWAITING_REPAIR:
            break
        source = {"vmId": vm_id, "source": f"attempt {attempt}"}
        runner.propose(lease, "sandbox.compile", source, repair_of=1)
    state = runner.wait(lease.run_id, lambda s: s.status is T.ROLLED_BACK, "the rollback")
    decisions = [e for e in runner.history(lease.run_id) if isinstance(e, RecoveryDecided)]
    assert live_of(saga, lease.run_id) == []
    return lease, state, decisions


def test_repair_spin_where_error_4_repeats_error_1_rolls_back_at_once(
    saga: SagaSystem, runner: SagaRunner
) -> None:
    """REC-5: the seed's spin trace; H(err_4) == H(err_1) stops repairing and rolls back."""
    _, state, decisions = _repair_until_rollback(saga, runner, "saga-spin", SPIN_TRACE)
    assert [d.action for d in decisions] == ["FORWARD_REPAIR"] * 3 + ["BACKWARD_ROLLBACK"]
    assert decisions[-1].gate == "anti-spin"
    assert decisions[-1].signature == decisions[0].signature
    assert len({d.signature for d in decisions[:3]}) == 3
    assert state.compensated == (0,)


def test_k_repair_exceeded_rolls_back(saga: SagaSystem, runner: SagaRunner) -> None:
    """REC-5: at most K_repair = 3 consecutive repairs per step, even with all-new errors."""
    trace = [
        ("SchemaError", "field alpha is missing"),
        ("SchemaError", "field beta is missing"),
        ("SchemaError", "field gamma is missing"),
        ("SchemaError", "field delta is missing"),
    ]
    _, state, decisions = _repair_until_rollback(saga, runner, "saga-k-repair", trace, "schema-invalid")
    assert [d.action for d in decisions] == ["FORWARD_REPAIR"] * 3 + ["BACKWARD_ROLLBACK"]
    assert decisions[-1].gate == "anti-spin"
    assert json.loads(decisions[-1].inputs)["consecutiveRepairs"] == "3"
    assert len({d.signature for d in decisions}) == 4
    assert state.status is T.ROLLED_BACK


def _incidents(bootstrap: str, run_id: str) -> list[IncidentOpened]:
    codec = MessageCodec()
    found = [codec.decode(r.value) for r in read_topic(bootstrap, INCIDENTS.name, INCIDENTS.partitions)]
    return [i for i in found if isinstance(i, IncidentOpened) and i.run_id == run_id]


def _record_at(bootstrap: str, partition: int, offset: int) -> Any:
    reader = PartitionReader(bootstrap, client_id="test-incident-offset")
    try:
        record = next(
            r for r in reader.read(TRAJECTORIES_EVENTS.name, partition, offset) if r.offset == offset
        )
    finally:
        reader.close()
    return MessageCodec().decode(record.value)


def test_failure_after_the_pivot_retries_then_escalates_and_never_compensates(
    saga: SagaSystem, runner: SagaRunner, tenure_topics: str
) -> None:
    """SAGA-6, REC-7: after the pivot only retries (with backoff) and escalation; the stack is
    retired, the run's lease is revoked (epoch bump) and a POST_PIVOT_STALLED incident opens."""
    lease = runner.claim_new_run("saga-post-pivot")
    runner.start(lease, **RERUN)
    vm = commit_step(runner, lease, "vm.provision", {"name": "post-pivot"})
    commit_step(runner, lease, "dns.publish", {"name": "post-pivot.example.org", "address": "203.0.113.9"})
    assert runner.state(lease.run_id).stack == ()  # type: ignore[union-attr]  (retired at the pivot)
    saga.arm("cache.warm", status=429, problem="rate-limited", detail="slow down", times=10)
    runner.propose(lease, "cache.warm", {"name": "post-pivot"})
    state = runner.wait(
        lease.run_id,
        lambda s: s.status is T.FROZEN and s.incident is not None and s.incident.revoked_epoch > 0,
        "the escalation and lease revocation",
        timeout_s=90,
    )
    history = runner.history(lease.run_id)
    decisions = [e.action for e in history if isinstance(e, RecoveryDecided)]
    assert decisions == ["TRANSIENT_RETRY"] * 3 + ["OPERATOR_ESCALATE"]
    assert not any(isinstance(e, (CompensationCompleted, CompensationFailed)) for e in history)
    frozen = next(e for e in history if isinstance(e, TrajectoryFrozen))
    assert frozen.failure_mode == "POST_PIVOT_STALLED"
    assert frozen.failed_tool == "cache.warm"
    assert [u["tool"] for u in json.loads(frozen.uncompensated)] == ["vm.provision", "dns.publish"]
    # REC-7: the lease was revoked: a takeover bumped the epoch past the trajectory's.
    assert wait_until(lambda: runner.leases[lease.run_id].epoch > lease.epoch, 30, "the epoch bump")
    incidents = wait_until(lambda: _incidents(tenure_topics, lease.run_id), 30, "the incident")
    assert incidents[0].incident_id == frozen.incident_id
    assert incidents[0].failure_mode == "POST_PIVOT_STALLED"
    logged = _record_at(tenure_topics, incidents[0].log_partition, incidents[0].log_offset)
    assert isinstance(logged, TrajectoryFrozen) and logged.event_id == frozen.event_id
    assert len(live_of(saga, lease.run_id)) == 1 and state.steps[vm].status is StepStatus.COMMITTED
    # An operator resolves the incident (abandon: the VM stays, as the incident listed).
    resolve = runner.send(
        ResolveIncident(
            **runner.header(lease.run_id),
            incident_id=frozen.incident_id,
            resolution="abandon",
            note="left for the on-call",
        )
    )
    runner.wait(lease.run_id, lambda s: s.status is T.ABANDONED, "the resolution", resolve)


def test_fatal_compensator_panics_and_opens_a_compensation_corrupted_incident(
    saga: SagaSystem, runner: SagaRunner, tenure_topics: str
) -> None:
    """SAGA-3, REC-7: a compensator that fails fatally logs PANIC and escalates; the incident
    names the orphaned resource and the uncompensated remainder."""
    lease = runner.claim_new_run("saga-panic")
    runner.start(lease, **RERUN)
    commit_step(runner, lease, "vm.provision", {"name": "panic"})
    ip = commit_step(runner, lease, "ip.reserve", {"region": "eu-west"})
    ip_id = json.loads(runner.state(lease.run_id).steps[ip].output)["ipId"]  # type: ignore[union-attr]
    saga.arm("ip.release", status=403, problem="auth-revoked", detail="the cloud credentials were revoked")
    abort = runner.send(
        AbortTrajectory(
            **runner.header(lease.run_id),
            attempt_id=lease.attempt_id,
            lease_epoch=lease.epoch,
            reason="the runner gives up",
        )
    )
    state = runner.wait(lease.run_id, lambda s: s.status is T.FROZEN, "the panic", abort)
    assert state.steps[ip].status is StepStatus.PANIC
    frozen = next(e for e in runner.history(lease.run_id) if isinstance(e, TrajectoryFrozen))
    assert frozen.failure_mode == "COMPENSATION_CORRUPTED"
    remainder = json.loads(frozen.uncompensated)
    assert [u["tool"] for u in remainder] == ["ip.reserve", "vm.provision"]
    assert remainder[0]["output"] and json.loads(remainder[0]["output"])["ipId"] == ip_id
    incident = wait_until(lambda: _incidents(tenure_topics, lease.run_id), 30, "the incident")[0]
    assert incident.failure_mode == "COMPENSATION_CORRUPTED" and ip_id in incident.uncompensated
    assert {r["id"] for r in live_of(saga, lease.run_id)} >= {ip_id}


def test_a_plan_with_two_pivots_is_rejected_and_an_outbound_message_goes_to_the_outbox(
    saga: SagaSystem, runner: SagaRunner
) -> None:
    """SAGA-6, SAGA-7: two irreversible steps are refused with an explanation; an outbound
    message is staged and released with the pivot; the plan is reordered so every I/II step
    runs first; the pivot waits for a human approval where the policy says so."""
    lease = runner.claim_new_run("saga-plans")
    two_pivots = [
        {
            "stepId": "dns-a",
            "tool": "dns.publish",
            "params": {"name": "a.example.org", "address": "203.0.113.1"},
        },
        {
            "stepId": "dns-b",
            "tool": "dns.publish",
            "params": {"name": "b.example.org", "address": "203.0.113.2"},
        },
    ]
    refused = runner.send(
        StartTrajectory(
            **runner.header(lease.run_id),
            attempt_id=lease.attempt_id,
            lease_epoch=lease.epoch,
            plan=json.dumps(two_pivots),
        )
    )
    rejection = runner.rejection(refused)
    assert rejection.code == "PLAN_REJECTED" and "TWO_PIVOTS" in rejection.detail
    assert "dns-a" in rejection.detail and "dns-b" in rejection.detail
    plan = [
        {
            "stepId": "dns",
            "tool": "dns.publish",
            "params": {"name": "plan.example.org", "address": "203.0.113.3"},
        },
        {"stepId": "notify", "tool": "notify.send", "params": {"to": "ops@example.org", "text": "live"}},
        {"stepId": "vm", "tool": "vm.provision", "params": {"name": "plan"}},
    ]
    runner.start(lease, plan=plan, pivot_approval="human", **RERUN)
    compiled = json.loads(runner.state(lease.run_id).plan)  # type: ignore[union-attr]
    assert [s["stepId"] for s in compiled["order"]] == ["vm", "dns"] and compiled["pivot"] == "dns"
    assert [s["stepId"] for s in compiled["outbox"]] == ["notify"]
    commit_step(runner, lease, "vm.provision", {"name": "plan"})
    runner.propose(lease, "dns.publish", {"name": "plan.example.org", "address": "203.0.113.3"})
    runner.wait(lease.run_id, lambda s: s.status is T.AWAITING_APPROVAL, "the approval gate")
    assert of_run(saga.audit()["permanent"], lease.run_id) == []  # nothing sent before approval
    runner.send(ApprovePivot(**runner.header(lease.run_id), step_index=1, decision="approve", note="ok"))
    state = runner.wait(
        lease.run_id,
        lambda s: len(s.steps) == 3 and s.steps[2].status is StepStatus.COMMITTED,
        "the pivot and the released outbox",
    )
    assert state.steps[1].status is StepStatus.COMMITTED and state.steps[2].tool == "notify.send"
    assert {r["kind"] for r in of_run(saga.audit()["permanent"], lease.run_id)} == {"dns-record", "message"}


def test_a_timeout_after_the_effect_is_reconciled_by_the_probe_and_never_dispatched_twice(
    saga: SagaSystem, runner: SagaRunner
) -> None:
    """REC-6: the tool applies the effect but its answer is lost (timeout); the gateway probes
    with the same idempotency key, finds it, and nothing is dispatched twice."""
    lease = runner.claim_new_run("saga-probe")
    runner.start(lease, **RERUN)
    saga.arm("ip.reserve", kind="timeout-after-commit", delayS=8)
    index = commit_step(runner, lease, "ip.reserve", {"region": "eu-west"})
    committed = next(e for e in runner.history(lease.run_id) if isinstance(e, StepCommitted))
    assert committed.reconciled is True
    effects = [e for e in saga.audit()["effects"] if e["key"] == f"{lease.run_id}/s{index}/d1"]
    assert effects and effects[0]["applied"] == 1
    assert len(live_of(saga, lease.run_id)) == 1


def test_partial_effects_of_the_failed_step_are_compensated_first(
    saga: SagaSystem, runner: SagaRunner
) -> None:
    """SAGA-3: T_k left a resource behind before failing: its own C_k runs before C_{k-1}."""
    lease = runner.claim_new_run("saga-partial")
    runner.start(lease, **RERUN)
    vm = commit_step(runner, lease, "vm.provision", {"name": "partial"})
    vm_id = json.loads(runner.state(lease.run_id).steps[vm].output)["vmId"]  # type: ignore[union-attr]
    saga.arm("firewall.write", status=409, problem="conflict", detail="port taken", partialOutput=True)
    runner.propose(lease, "firewall.write", {"vmId": vm_id, "port": 8443})
    state = runner.wait(lease.run_id, lambda s: s.status is T.ROLLED_BACK, "the rollback")
    assert state.compensated == (1, 0)
    assert live_of(saga, lease.run_id) == []
    assert_no_duplicate_effects(saga)


def test_bad_proposals_are_refused_with_a_specific_reason_and_change_nothing(runner: SagaRunner) -> None:
    """SAGA-1: the orchestrator validates parameters against the tool's registered schema."""
    lease = runner.claim_new_run("saga-bad-input")
    state = runner.start(lease)
    cases = [
        ("vm.provision", {"nom": "x"}, "INVALID_PARAMETERS"),
        ("rm.rf", {}, "UNKNOWN_TOOL"),
    ]
    for tool, params, code in cases:
        rejection = runner.rejection(runner.propose(lease, tool, params))
        assert rejection.code == code, rejection.detail
    stale = runner.rejection(
        runner.propose(Lease(lease.run_id, lease.attempt_id, 0), "vm.provision", {"name": "x"})
    )
    assert stale.code == "STALE_EPOCH"
    assert runner.state(lease.run_id).version == state.version  # type: ignore[union-attr]


def test_a_new_holder_adopts_the_trajectory_and_the_step_in_flight_commits_once(
    saga: SagaSystem, runner: SagaRunner
) -> None:
    """LEASE-6, REC-6: the runner's lease is taken over while its step is in flight; the new
    holder adopts the trajectory, the step is redone under the new epoch with the same key, and
    the environment applied it once."""
    lease = runner.claim_new_run("saga-adopt")
    runner.start(lease, **RERUN)
    saga.arm("vm.provision", kind="timeout-after-commit", delayS=1.0)
    runner.propose(lease, "vm.provision", {"name": "adopt"})
    wait_until(lambda: of_run(saga.audit()["live"], lease.run_id), 30, "the VM to be created")
    takeover = TakeOverLease(
        **runner.header(lease.run_id), reason="runner crashed", new_holder="runner-b", lease_seconds=600
    )
    runner.publish_run_command(takeover)
    new = wait_until(lambda: (g := runner.leases[lease.run_id]).epoch > lease.epoch and g, 30, "the takeover")
    adopt = runner.send(
        AdoptLease(**runner.header(lease.run_id), attempt_id=new.attempt_id, lease_epoch=new.epoch)
    )
    state = runner.wait(
        lease.run_id,
        lambda s: s.epoch == new.epoch and s.steps[0].status is StepStatus.COMMITTED,
        "the step to commit under the new lease",
        adopt,
    )
    assert json.loads(state.steps[0].output)["vmId"] == of_run(saga.audit()["live"], lease.run_id)[0]["id"]
    effects = [e for e in saga.audit()["effects"] if e["key"] == f"{lease.run_id}/s0/d1"]
    assert effects and effects[0]["applied"] == 1
    assert len(live_of(saga, lease.run_id)) == 1
    stale = runner.rejection(runner.propose(lease, "ip.reserve", {"region": "eu-west"}))
    assert stale.code == "STALE_EPOCH"


def test_a_semantic_deadlock_before_the_pivot_unwinds_then_revokes_the_lease_once(
    saga: SagaSystem, runner: SagaRunner
) -> None:
    """WD-5 level 3 before the pivot: the compensators run LIFO under the runner's epoch, and only
    then is the run's lease revoked (a takeover bumps the epoch), once, through the executor."""
    lease = runner.claim_new_run("saga-deadlock-revoke")
    runner.start(lease, **RERUN)
    vm = commit_step(runner, lease, "vm.provision", {"name": "deadlock"})
    ip = commit_step(runner, lease, "ip.reserve", {"region": "eu-west"})
    intervention = f"itv_{lease.run_id[-12:]}"
    runner.send(
        RecordWatchdogIntervention(
            **runner.header(lease.run_id),
            intervention_id=intervention,
            level=3,
            code="ERR_SEMANTIC_DEADLOCK",
            action_hash="",
            period=2,
            checkpoint_step=-1,
            detector="cycle",
            detail="period-2 orbit past the rollback budget",
            message="ERR_SEMANTIC_DEADLOCK",
        )
    )
    state = runner.wait(
        lease.run_id,
        lambda s: s.status is T.ROLLED_BACK and s.deadlock_revoked_epoch > 0,
        "the unwind and the lease revocation",
        timeout_s=90,
    )
    assert state.compensated == (ip, vm) and state.deadlock_revoked_epoch == lease.epoch
    assert live_of(saga, lease.run_id) == []  # the compensators were not fenced out
    assert wait_until(lambda: runner.leases[lease.run_id].epoch > lease.epoch, 30, "the epoch bump")
    history = runner.history(lease.run_id)
    kinds = [type(e) for e in history]
    assert kinds.index(TrajectoryRolledBack) < kinds.index(LeaseRevocationRecorded)
    revoked = [e for e in history if isinstance(e, LeaseRevocationRecorded)]
    assert [e.incident_id for e in revoked] == [intervention]
    assert_no_duplicate_effects(saga)
