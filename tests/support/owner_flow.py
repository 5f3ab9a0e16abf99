"""The commands of a durable step as an owner of the Run and the Trajectory decides them (issue
11): a run submitted and claimed, its trajectory opened, then per step the intent and, from the
step the Trajectory recorded, the effect's intent the Run fences (services/common/aggregate/
group_commit.py decides both in one unit). Used by the joint unit's tests, in process and in a
process that is SIGKILLed (tests/support/owner_worker.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.common.aggregate.group_commit import Answer, Ask, GroupCommitter, as_inbound
from services.common.aggregate.joint import JointUnit
from services.common.clock import Clock
from services.common.contracts import (
    ClaimRun,
    ProposeStep,
    RecordEffectIntent,
    RecordEffectOutcome,
    RecordStepOutcome,
    StartTrajectory,
    SubmitRun,
)
from services.common.eventlog import EventLog
from services.common.ids import derived_id, run_id_for
from services.common.messages import MessageCodec
from services.common.routing import command_record, trajectory_command_record
from services.common.settings import repo_root
from services.common.store import KeyValueStore
from services.lease_coordinator.processor import RunCommandProcessor
from services.saga_orchestrator.domain import load_catalog
from services.saga_orchestrator.processor import TrajectoryProcessor

__all__ = [
    "RUN",
    "TRAJECTORY",
    "Lease",
    "Owner",
    "claim",
    "effect_intent_after",
    "outcome_and_commit",
    "propose",
    "start",
    "submit",
]

RUN, TRAJECTORY = "run", "trajectory"
CATALOG = repo_root() / "services" / "sim_environment" / "tools.json"
TENANT = "owner-flow"
CODEC = MessageCodec()


@dataclass(frozen=True)
class Lease:
    run_id: str
    attempt_id: str
    epoch: int


def _header(run_id: str, command_id: str, now_ms: int) -> dict[str, Any]:
    return {
        "command_id": command_id,
        "run_id": run_id,
        "issued_at": now_ms,
        "correlation_id": run_id,
        "actor": "owner-flow",
    }


def submit(key: str, now_ms: int, tenant: str = TENANT) -> SubmitRun:
    run_id = run_id_for(tenant, key)
    return SubmitRun(
        **_header(run_id, derived_id("cmd", run_id, "submit"), now_ms),
        tenant=tenant,
        idempotency_key=key,
        execution_spec=json.dumps({"agent": "owner-flow", "key": key}),
        timeout_seconds=3600,
    )


def claim(run_id: str, now_ms: int) -> ClaimRun:
    return ClaimRun(
        **_header(run_id, derived_id("cmd", run_id, "claim"), now_ms), runner_id="runner", lease_seconds=600
    )


def start(lease: Lease, now_ms: int) -> StartTrajectory:
    return StartTrajectory(
        **_header(lease.run_id, derived_id("cmd", lease.attempt_id, "start"), now_ms),
        attempt_id=lease.attempt_id,
        lease_epoch=lease.epoch,
    )


def propose(lease: Lease, name: str, now_ms: int, *, epoch: int | None = None) -> ProposeStep:
    params = json.dumps({"name": name})
    return ProposeStep(
        **_header(lease.run_id, derived_id("cmd", lease.attempt_id, "propose", params), now_ms),
        attempt_id=lease.attempt_id,
        lease_epoch=lease.epoch if epoch is None else epoch,
        tool="cache.warm",
        params=params,
    )


def effect_intent_after(
    lease: Lease, now_ms: int, *, epoch: int | None = None
) -> Callable[[Answer], Ask | None]:
    """What the step's answer leads to: the effect's intent on the Run, fenced by the lease the
    proposal carried; nothing if the Trajectory did not record the step."""

    def then(answer: Answer) -> Ask | None:
        if not answer.verdict.handled:
            return None
        step = answer.state.steps[-1]
        effect_id = derived_id("eff", step.idempotency_key)
        return Ask(
            RUN,
            RecordEffectIntent(
                **_header(lease.run_id, derived_id("cmd", effect_id, "intent"), now_ms),
                attempt_id=lease.attempt_id,
                lease_epoch=lease.epoch if epoch is None else epoch,
                effect_id=effect_id,
                idempotency_key=step.idempotency_key,
                tool=step.gateway_tool,
                operation=step.operation,
            ),
        )

    return then


def outcome_and_commit(lease: Lease, step: Any, now_ms: int) -> tuple[Ask, Callable[[Answer], Ask | None]]:
    """The effect's outcome on the Run and the step's commit on the Trajectory, one unit: the
    (trivial, not made) effect committed, with what the simulated cache.warm answers."""
    effect_id = derived_id("eff", step.idempotency_key)
    outcome = RecordEffectOutcome(
        **_header(lease.run_id, derived_id("cmd", effect_id, "outcome"), now_ms),
        attempt_id=lease.attempt_id,
        lease_epoch=lease.epoch,
        effect_id=effect_id,
        outcome="committed",
    )
    commit = RecordStepOutcome(
        **_header(lease.run_id, derived_id("cmd", step.idempotency_key, "committed"), now_ms),
        step_index=step.index,
        dispatch=step.dispatch,
        lease_epoch=lease.epoch,
        outcome="committed",
        output=json.dumps({"cacheId": f"cache-{effect_id}"}),
    )
    return Ask(RUN, outcome), lambda _answer: Ask(TRAJECTORY, commit)


class Owner:
    """The Run and the Trajectory of every partition, on one log, in one group committer."""

    def __init__(
        self,
        log: EventLog,
        runs: KeyValueStore,
        trajectories: KeyValueStore,
        clock: Clock,
        *,
        max_batch: int = 500,
    ) -> None:
        self.runs = RunCommandProcessor(log, runs, CODEC, clock)
        self.trajectories = TrajectoryProcessor(log, trajectories, CODEC, clock, load_catalog(CATALOG))
        partitions = frozenset(range(4))
        self.joint = JointUnit(log, [self.runs, self.trajectories], owned=partitions)
        self.committer = GroupCommitter(
            self.joint,
            {
                RUN: lambda command: as_inbound(command_record(CODEC, command)),
                TRAJECTORY: lambda command: as_inbound(trajectory_command_record(CODEC, command)),
            },
            max_batch=max_batch,
        )
