"""The commands of a durable step as an owner of the Run and the Trajectory decides them (issue
11): a run submitted and claimed, its trajectory opened, then per step the intent and, from the
step the Trajectory recorded, the effect's intent the Run fences (services/common/aggregate/
group_commit.py decides both in one unit). Used by the joint unit's tests, in process and in a
process that is SIGKILLed (tests/support/owner_worker.py); the commands are built as the owner
prototype that bench/owner_path.py measures builds them."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench._owner_server import CountingLog, Owner, command_header, effect_intent, outcome_and_commit
from services.common.aggregate.group_commit import Answer, Ask
from services.common.clock import Clock
from services.common.contracts import (
    ClaimRun,
    ProposeStep,
    StartTrajectory,
    SubmitRun,
)
from services.common.eventlog import EventLog
from services.common.ids import derived_id, run_id_for
from services.common.messages import MessageCodec
from services.common.settings import repo_root
from services.common.store import KeyValueStore

__all__ = [
    "RUN",
    "TRAJECTORY",
    "Lease",
    "claim",
    "effect_intent_after",
    "owner_of",
    "propose",
    "start",
    "step_done",
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
    return command_header(run_id, command_id, now_ms, run_id)


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
        fenced_by = lease.epoch if epoch is None else epoch
        return Ask(
            RUN, effect_intent(lease.run_id, lease.attempt_id, fenced_by, answer.state.steps[-1], now_ms)
        )

    return then


def step_done(lease: Lease, step: Any, now_ms: int) -> tuple[Ask, Callable[[Answer], Ask | None]]:
    """The effect's outcome on the Run and then the step's commit on the Trajectory, one unit."""
    outcome, commit = outcome_and_commit(lease.run_id, lease.attempt_id, lease.epoch, step, now_ms)
    return Ask(RUN, outcome), lambda _answer: Ask(TRAJECTORY, commit)


def owner_of(log: EventLog, runs: KeyValueStore, trajectories: KeyValueStore, clock: Clock) -> Owner:
    """The owner prototype's Run and Trajectory of every partition, on `log` (counted), restored;
    its committer not started."""
    return Owner(CountingLog(log), runs, trajectories, set(range(4)), clock=clock, start=False)
