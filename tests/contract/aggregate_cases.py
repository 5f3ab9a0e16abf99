"""The aggregates the contract suite (test_aggregate_contract.py) runs: one `Case` each, with a
command generator that looks at the current states as the aggregate's real clients do.

A new aggregate adds its `Case` here and to `CASES`, and gets the whole suite."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from services.breakers.processor import BreakerProcessor
from services.common.aggregate import AggregateProcessor
from services.common.clock import ManualClock
from services.common.contracts import (
    AbortTrajectory,
    AcknowledgeRollback,
    ConfigureWatchdog,
    FinishTrajectory,
    ObserveStep,
    ProposeStep,
    RecordCompensationOutcome,
    RecordLeaseRevocation,
    RecordPivotGate,
    RecordStepOutcome,
    ResolveIncident,
    StartTrajectory,
)
from services.common.ids import action_hash, run_id_for
from services.common.messages import MessageCodec
from services.common.routing import partition_for_endpoint, partition_for_schedule
from services.common.topics import (
    BREAKERS_COMMANDS,
    PROGRESS_OBSERVATIONS,
    QUARANTINE_COMMANDS,
    RUNS_COMMANDS,
    SCHEDULES_COMMANDS,
    TRAJECTORIES_COMMANDS,
)
from services.lease_coordinator.domain import attempt_id_for
from services.lease_coordinator.processor import RunCommandProcessor
from services.quarantine.processor import QuarantineProcessor
from services.quarantine.routing import partition_for_aggregate
from services.saga_orchestrator.domain import (
    DispatchStep,
    EvaluateGate,
    RevokeLease,
    RunCompensator,
    pending_work,
)
from services.saga_orchestrator.processor import TrajectoryProcessor
from services.schedules.processor import ScheduleProcessor
from services.watchdog.processor import WatchdogProcessor
from tests.support.lease_run import claim_cmd, renew_cmd, report_cmd
from tests.support.trajectory_saga import CATALOG, OUTPUTS, PARAMS
from tests.unit.breakers import support as breaker
from tests.unit.quarantine import contract_case as quarantine
from tests.unit.schedules import contract_case as schedule
from tests.unit.strategies import SPEC_TEXTS, cancel_command, submit_command

__all__ = ["CASES", "CODEC", "PARTITIONS", "SEEDS", "T0", "Case", "Load"]

CODEC = MessageCodec()
PARTITIONS = 4
T0 = 1_767_225_600_000
SEEDS = (1, 2, 3)
Load = Callable[[str], Any]


@dataclass(frozen=True)
class Case:
    name: str
    commands_topic: str
    build: Callable[[Any, Any, ManualClock], AggregateProcessor[Any, Any, Any, Any]]
    commands: Callable[[random.Random, Load, int], list[Any]]
    fresh: Callable[[str], Any]  # a command creating a new aggregate (its key names it)
    # Command types the definition deduplicates by something else than their id, so that a
    # redelivery after they were accepted is refused (a second answer) instead of dropped. The
    # suite allows exactly that second refusal, nothing else: no event, no state change.
    answered_again: frozenset[str] = frozenset()
    # The partition a command's aggregate id routes to; None: a run id's (services.common.routing).
    route: Callable[[str], int] | None = None


# --- the Run -----------------------------------------------------------------------------------

RUN_SLOTS = tuple((tenant, f"r{i}") for tenant in ("acme", "globex", "initech") for i in range(3))
RUN_KINDS = ("submit",) * 3 + ("claim",) * 3 + ("renew",) * 4 + ("report", "cancel", "conflict")


def run_commands(rng: random.Random, load: Load, step: int) -> list[Any]:
    commands: list[Any] = []
    for i in range(rng.randint(1, 6)):
        tenant, key = rng.choice(RUN_SLOTS)
        run_id, state, tag = run_id_for(tenant, key), load(run_id_for(tenant, key)), f"{step}-{i}"
        lease = state.lease if state is not None else None
        attempt = lease.attempt_id if lease else attempt_id_for(run_id, 1)
        epoch, sequence = (lease.epoch, lease.last_sequence + 1) if lease else (1, 1)
        kind = rng.choice(RUN_KINDS)
        if kind == "submit":  # the same command id every time: a client retry
            commands.append(submit_command(tenant, key, retry_safe=True, command_id=f"s-{run_id}"))
        elif kind == "claim":
            commands.append(claim_cmd(run_id, command_id=f"c-{tag}"))
        elif kind == "renew":
            commands.append(renew_cmd(run_id, attempt, epoch, sequence, command_id=f"r-{tag}"))
        elif kind == "report":
            outcome = rng.choice(("succeeded", "failed"))
            commands.append(report_cmd(run_id, attempt, epoch, sequence, outcome, command_id=f"p-{tag}"))
        elif kind == "cancel":
            commands.append(cancel_command(run_id, command_id=f"k-{tag}"))
        else:  # a conflicting submit: refused once the run exists
            commands.append(submit_command(tenant, key, spec=SPEC_TEXTS[2], command_id=f"x-{tag}"))
    return commands


RUN = Case(
    "run",
    RUNS_COMMANDS.name,
    lambda log, store, clock: RunCommandProcessor(log, store, CODEC, clock),
    run_commands,
    lambda key: submit_command("acme", key, command_id=f"s-{key}"),
    # No answered_again: a redelivered renewal is dropped by its command id like every other
    # command (RunState.handled_renewals, issue 16), never refused after it was accepted.
)


# --- the Trajectory ----------------------------------------------------------------------------

TRAJECTORY_SLOTS = (("acme", "t1"), ("globex", "t2"), ("initech", "t3"))
TOOLS = ("vm.provision", "ip.reserve", "cache.warm", "sandbox.compile", "dns.publish")


def trajectory_command(kind: type[Any], run_id: str, command_id: str, **fields: Any) -> Any:
    if kind in (StartTrajectory, ProposeStep, FinishTrajectory, AbortTrajectory):
        fields.setdefault("attempt_id", "att-1")
        fields.setdefault("lease_epoch", 1)
    return kind(command_id=command_id, run_id=run_id, issued_at=0, correlation_id=run_id, actor="t", **fields)


def trajectory_commands(rng: random.Random, load: Load, step: int) -> list[Any]:
    commands: list[Any] = []
    for i in range(rng.randint(1, 4)):
        run_id = run_id_for(*rng.choice(TRAJECTORY_SLOTS))
        state, tag = load(run_id), f"{run_id}-{step}-{i}"
        if state is None or rng.random() < 0.1:  # the same command id every time: a retry
            commands.append(trajectory_command(StartTrajectory, run_id, f"start-{run_id}"))
            continue
        work = pending_work(state)
        if isinstance(work, DispatchStep):
            tool = state.steps[work.step_index].tool
            failed = rng.random() < 0.3
            outcome = (
                {"outcome": "failed", "error_kind": "conflict", "error_status": 409}
                if failed
                else {
                    "outcome": "committed",
                    "output": json.dumps(OUTPUTS[tool]),
                }
            )
            where = {"step_index": work.step_index, "dispatch": work.dispatch}
            commands.append(trajectory_command(RecordStepOutcome, run_id, tag, **where, **outcome))
        elif isinstance(work, EvaluateGate):
            checks = '[{"name":"lease","passed":true}]'
            where = {"step_index": work.step_index}
            commands.append(trajectory_command(RecordPivotGate, run_id, tag, **where, checks=checks))
        elif isinstance(work, RunCompensator):
            outcome = rng.choice(("compensated", "compensated", "fatal"))
            commands.append(
                trajectory_command(
                    RecordCompensationOutcome,
                    run_id,
                    tag,
                    step_index=work.step_index,
                    attempt=work.attempt,
                    outcome=outcome,
                    error_kind="corrupted" if outcome == "fatal" else "",
                )
            )
        elif isinstance(work, RevokeLease):
            commands.append(
                trajectory_command(
                    RecordLeaseRevocation, run_id, tag, incident_id=work.incident_id, revoked_epoch=work.epoch
                )
            )
        elif state.incident is not None and state.status.value == "frozen":
            commands.append(
                trajectory_command(
                    ResolveIncident, run_id, tag, incident_id=state.incident.incident_id, resolution="manual"
                )
            )
        elif rng.random() < 0.1:
            commands.append(trajectory_command(FinishTrajectory, run_id, tag))
        elif state.steps and rng.random() < 0.15:  # give up before the pivot: the saga unwinds
            commands.append(trajectory_command(AbortTrajectory, run_id, tag, reason="enough"))
        else:  # a known tool, or now and then an unknown one (refused)
            tool = rng.choice(TOOLS) if rng.random() < 0.9 else "rm.rf"
            params = json.dumps(PARAMS.get(tool, {}))
            commands.append(trajectory_command(ProposeStep, run_id, tag, tool=tool, params=params))
    return commands


TRAJECTORY = Case(
    "trajectory",
    TRAJECTORIES_COMMANDS.name,
    lambda log, store, clock: TrajectoryProcessor(log, store, CODEC, clock, CATALOG),
    trajectory_commands,
    lambda key: trajectory_command(StartTrajectory, run_id_for("acme", key), f"start-{key}"),
)


# --- the Watchdog ------------------------------------------------------------------------------

WATCHDOG_SLOTS = (("acme", "w1"), ("globex", "w2"), ("initech", "w3"))
# Few states and few actions, so that runs loop (cycles, repeated failures) and climb the ladder.
WATCHDOG_STATES = tuple(hashlib.sha256(name.encode()).hexdigest() for name in ("a", "b", "c", "d"))
WATCHDOG_ACTIONS = tuple(action_hash("fs.edit", {"line": i}) for i in range(3))


def watchdog_command(kind: type[Any], run_id: str, command_id: str, **fields: Any) -> Any:
    return kind(command_id=command_id, run_id=run_id, issued_at=0, correlation_id=run_id, actor="t", **fields)


def observation(run_id: str, command_id: str, seq: int, rng: random.Random) -> ObserveStep:
    return watchdog_command(
        ObserveStep,
        run_id,
        command_id,
        source="runner",
        step_seq=seq,
        tool="fs.edit",
        action_hash=rng.choice(WATCHDOG_ACTIONS),
        state_hash=rng.choice(WATCHDOG_STATES),
        metrics=(float(rng.choice((3, 4))),),
        error_kind=rng.choice(("none", "none", "application", "transient")),
    )


def watchdog_commands(rng: random.Random, load: Load, step: int) -> list[Any]:
    commands: list[Any] = []
    for i in range(rng.randint(1, 5)):
        run_id = run_id_for(*rng.choice(WATCHDOG_SLOTS))
        state, tag = load(run_id), f"{run_id}-{step}-{i}"
        seq = state.last_runner_seq + 1 if state is not None else 0
        roll = rng.random()
        if state is not None and state.pending_rollback and roll < 0.4:
            commands.append(
                watchdog_command(
                    AcknowledgeRollback,
                    run_id,
                    f"ack-{tag}",
                    intervention_id=state.pending_rollback,
                    checkpoint_step=-1,
                )
            )
        elif roll < 0.08:  # a retry of the first observation: the same command id every time
            commands.append(observation(run_id, f"obs-{run_id}-0", 0, random.Random(run_id)))
        elif roll < 0.14:
            # No rollback budget (level 3 at the second violation), or K=40, out of bounds: refused.
            override = rng.choice(({"rollback_budget": 0}, {"max_period": 2}, {"max_period": 40}))
            commands.append(watchdog_command(ConfigureWatchdog, run_id, f"cfg-{tag}", **override))
        elif roll < 0.2:  # refused: not a hash
            commands.append(replace(observation(run_id, f"bad-{tag}", seq, rng), action_hash="nope"))
        elif roll < 0.25:  # refused: no rollback awaited
            unknown = {"intervention_id": "itv_x", "checkpoint_step": 0}
            commands.append(watchdog_command(AcknowledgeRollback, run_id, f"ack-{tag}", **unknown))
        else:
            commands.append(observation(run_id, f"obs-{tag}", seq, rng))
    return commands


WATCHDOG = Case(
    "watchdog",
    PROGRESS_OBSERVATIONS.name,
    lambda log, store, clock: WatchdogProcessor(log, store, CODEC, clock),
    watchdog_commands,
    # A watchdog's first observation also records the thresholds in force (two events): a fresh
    # watchdog with one event is a ConfigureWatchdog that keeps the deployment's thresholds.
    lambda key: watchdog_command(ConfigureWatchdog, run_id_for("acme", key), f"cfg-{key}"),
)


# --- the Breaker (BRK-1, BRK-2) ------------------------------------------------------------------

BREAKER = Case(
    "breaker",
    BREAKERS_COMMANDS.name,
    lambda log, store, clock: BreakerProcessor(log, store, CODEC, clock, breaker.CONTRACT_POLICY),
    breaker.contract_commands,
    lambda key: breaker.outcome(1, "success", endpoint=key, command_id=f"o-{key}"),
    route=lambda endpoint: partition_for_endpoint(endpoint, PARTITIONS),
)


# --- the Schedule (EXE-14) -------------------------------------------------------------------------

SCHEDULE = Case(
    "schedule",
    SCHEDULES_COMMANDS.name,
    lambda log, store, clock: ScheduleProcessor(log, store, CODEC, clock),
    schedule.contract_commands,
    schedule.fresh,
    route=lambda schedule_id: partition_for_schedule(schedule_id, PARTITIONS),
)


# --- Quarantine and taint (QUA-1, QUA-2): runs' quarantines and a tenant's graph ---------------------

QUARANTINE = Case(
    "quarantine",
    QUARANTINE_COMMANDS.name,
    lambda log, store, clock: QuarantineProcessor(log, store, CODEC, clock),
    quarantine.contract_commands,
    quarantine.fresh,
    route=lambda aggregate_id: partition_for_aggregate(aggregate_id, PARTITIONS),
)


CASES = (RUN, TRAJECTORY, WATCHDOG, BREAKER, SCHEDULE, QUARANTINE)
