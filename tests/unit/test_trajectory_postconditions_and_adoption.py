"""Post-conditions of a committed step (SAGA-1) and a new lease holder adopting a trajectory
(LEASE-6), on the pure core."""

from __future__ import annotations

import json
from itertools import count
from typing import Any

import pytest

from services.common.contracts import (
    AdoptLease,
    LeaseAdopted,
    ProposeStep,
    RecordStepOutcome,
    StartTrajectory,
    StepCommitted,
    StepFailed,
)
from services.common.settings import repo_root
from services.saga_orchestrator.domain import (
    RegistrationRefused,
    Rejection,
    SagaContext,
    StepStatus,
    ToolCatalog,
    TrajectoryState,
    TrajectoryStatus,
    decide,
    evolve,
    load_catalog,
    pending_work,
)
from services.saga_orchestrator.domain.tools import check_postcondition
from services.saga_orchestrator.domain.work import DispatchStep

RUN = "run_ab" + "0" * 28
CATALOG = load_catalog(repo_root() / "services" / "sim_environment" / "tools.json")
CONTEXT = SagaContext(CATALOG)
_ids = count(1)


def command(kind: type[Any], **fields: Any) -> Any:
    return kind(
        command_id=f"cmd-{next(_ids)}", run_id=RUN, issued_at=0, correlation_id="c", actor="t", **fields
    )


def apply(
    state: TrajectoryState | None, cmd: Any, now: int = 1_000
) -> tuple[TrajectoryState, tuple[Any, ...]]:
    decision = decide(state, cmd, now, CONTEXT)
    assert not isinstance(decision, Rejection), decision
    for event in decision:
        state = evolve(state, event)
    assert state is not None
    return state, decision


def started() -> TrajectoryState:
    state, _ = apply(
        None,
        command(
            StartTrajectory, attempt_id="att-1", lease_epoch=1, rerun_cost_ms=46_000, rerun_cost_money=0.162
        ),
    )
    return state


def test_an_output_that_breaks_the_post_condition_is_a_failure_with_effects_saga_1() -> None:
    """SAGA-1: the output is checked against the tool's post-condition before COMMITTED; a
    violation keeps the effect's compensator (bound from that output) and goes to policy D."""
    state, _ = apply(
        started(),
        command(ProposeStep, attempt_id="att-1", lease_epoch=1, tool="vm.provision", params='{"name":"web"}'),
    )
    state, events = apply(
        state,
        command(
            RecordStepOutcome,
            step_index=0,
            dispatch=1,
            outcome="committed",
            output='{"vmId":"not-a-vm-id"}',
            lease_epoch=1,
        ),
    )
    assert not any(isinstance(e, StepCommitted) for e in events)
    failed = next(e for e in events if isinstance(e, StepFailed))
    assert failed.error_kind == "postcondition-failed" and "vmId" in failed.error_message
    assert json.loads(failed.compensation)["params"] == {"vmId": "not-a-vm-id"}
    assert state.stack == (0,)  # its own compensator runs first on the unwind
    # A semantic error would be a repair candidate, but a repair in place would cover the effect
    # already made: with effects left behind, D rolls back (SAGA-3).
    assert state.status is TrajectoryStatus.UNWINDING


def test_a_valid_output_commits_and_pushes_the_bound_compensator() -> None:
    state, _ = apply(
        started(),
        command(ProposeStep, attempt_id="att-1", lease_epoch=1, tool="vm.provision", params='{"name":"web"}'),
    )
    state, events = apply(
        state,
        command(
            RecordStepOutcome,
            step_index=0,
            dispatch=1,
            outcome="committed",
            output='{"vmId":"vm-0a1b2c"}',
            lease_epoch=1,
        ),
    )
    assert isinstance(events[0], StepCommitted)
    assert state.steps[0].status is StepStatus.COMMITTED and state.stack == (0,)


def test_post_conditions_are_checked_at_registration_and_report_each_problem() -> None:
    spec = CATALOG.get("ip.reserve")
    assert check_postcondition(spec, {"ipId": "ip-1"}) == ()
    assert check_postcondition(spec, {"ipId": 7}) and check_postcondition(spec, {})
    entry = {**spec.to_json(), "output": {"type": "object", "properties": {"x": {"type": "no-such-type"}}}}
    with pytest.raises(RegistrationRefused) as refused:
        ToolCatalog.from_json([entry])
    assert refused.value.rule == "output"


def test_a_new_holder_adopts_and_the_step_in_flight_is_redone_under_its_epoch_lease_6() -> None:
    """LEASE-6: after a takeover, AdoptLease moves the work in flight to the new epoch, same key;
    a report of the old dispatch under the replaced lease is ignored."""
    state, _ = apply(
        started(),
        command(ProposeStep, attempt_id="att-1", lease_epoch=1, tool="vm.provision", params='{"name":"web"}'),
    )
    before = pending_work(state)
    assert isinstance(before, DispatchStep) and before.epoch == 1
    state, events = apply(state, command(AdoptLease, attempt_id="att-2", lease_epoch=2))
    assert isinstance(events[0], LeaseAdopted) and events[0].previous_epoch == 1
    after = pending_work(state)
    assert isinstance(after, DispatchStep)
    assert (after.epoch, after.idempotency_key) == (2, before.idempotency_key)
    assert after.key != before.key  # the executor schedules the redo at once
    stale = decide(
        state,
        command(
            RecordStepOutcome,
            step_index=0,
            dispatch=1,
            outcome="failed",
            error_kind="stale-epoch",
            error_status=409,
            lease_epoch=1,
        ),
        2_000,
        CONTEXT,
    )
    assert stale == ()
    again = decide(state, command(AdoptLease, attempt_id="att-2", lease_epoch=2), 2_000, CONTEXT)
    assert again == ()
    older = decide(state, command(AdoptLease, attempt_id="att-1", lease_epoch=1), 2_000, CONTEXT)
    assert isinstance(older, Rejection) and older.code == "STALE_EPOCH"
    proposal = decide(
        state,
        command(ProposeStep, attempt_id="att-1", lease_epoch=1, tool="ip.reserve", params='{"region":"eu"}'),
        2_000,
        CONTEXT,
    )
    assert isinstance(proposal, Rejection) and proposal.code == "STALE_EPOCH"
