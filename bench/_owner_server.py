"""A measuring prototype of the owner-per-partition design: requests decided in the process
that owns the Run's partitions, with a group commit (bench/owner_path.py drives it).

`python -m bench._owner_server PORT BOOTSTRAP STATE_DIR [--separate] [--no-group] [--per-partition]`
serves the benchmark's workflow (submit, claim, open the trajectory, k steps, finish, report).
Each route builds the same commands the command API and the effect gateway build and hands them
to Tenure's group committer (services/common/aggregate/group_commit.py): both aggregates run by
the one aggregate runtime unchanged (`RunCommandProcessor`, `TrajectoryProcessor`) over one real
`KafkaEventLog` and real RocksDB. One thread decides every request waiting when it is free as
one joint unit, one transaction (a group commit across workflows, with no linger). A step is two
requests, each one unit: the step's intent and the effect's intent fenced by the Run; the
(trivial, not made) effect's outcome and the step's commit. What is not here: no command topic,
no stream consumer, no decision follower.

`--separate` decides each of a step's commands as a request of its own (intent, then the
effect's intent, then the outcome and the commit side by side: three serial units per step, as
before the joint unit); `--no-group` takes one request per unit as well, so that each command is
a transaction of its own.

This is not a Tenure service: it has no authentication, no routing of a request to the
partition's owner, no rebalance, no views; it exists to measure what the design's core costs
on this machine (docs/architecture.md, "The owner's core, measured").
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from services.common.aggregate.group_commit import Answer, Ask, GroupCommitter, as_inbound
from services.common.aggregate.joint import JointUnit
from services.common.clock import Clock, SystemClock
from services.common.contracts import (
    ClaimRun,
    FinishTrajectory,
    ProposeStep,
    RecordEffectIntent,
    RecordEffectOutcome,
    RecordStepOutcome,
    ReportAttempt,
    StartTrajectory,
    SubmitRun,
)
from services.common.eventlog import EventLog, KafkaEventLog
from services.common.http_serve import serve_http
from services.common.ids import command_id_for, derived_id, run_id_for
from services.common.kafka import InboundRecord, OutboundRecord
from services.common.messages import MessageCodec
from services.common.routing import command_record, partition_for_run, trajectory_command_record
from services.common.settings import TenureSettings, repo_root
from services.common.store import KeyValueStore, RocksStore
from services.common.topics import RUNS_COMMANDS
from services.lease_coordinator.processor import RunCommandProcessor
from services.saga_orchestrator.domain import load_catalog
from services.saga_orchestrator.processor import TrajectoryProcessor

__all__ = [
    "CountingLog",
    "Owner",
    "Sharded",
    "command_header",
    "create_app",
    "effect_intent",
    "main",
    "outcome_and_commit",
]

ACTOR = "bench-owner"
TENANT = "bench-owner"
CATALOG = repo_root() / "services" / "sim_environment" / "tools.json"
RUN, TRAJECTORY = "run", "trajectory"


class CountingLog:
    """An event log that counts the transactions and the records they carry (what the broker
    is paid for), around Kafka's or the in-memory twin."""

    def __init__(self, inner: EventLog) -> None:
        self._inner = inner
        self.markers_per_commit = int(getattr(inner, "markers_per_commit", 0))
        self.transactions = 0
        self.records = 0
        self.partitions = 0
        self.commit_ms: list[float] = []  # each transaction: begin, produce, flush, commit

    def commit(self, records: Sequence[OutboundRecord]) -> dict[tuple[str, int], int]:
        began = time.monotonic()
        written = self._inner.commit(records)
        if records:
            self.transactions += 1
            self.records += len(records)
            self.partitions += len(written)
            self.commit_ms.append(1000 * (time.monotonic() - began))
        return written

    def read(self, topic: str, partition: int, start_offset: int) -> Iterator[InboundRecord]:
        return self._inner.read(topic, partition, start_offset)

    def end_offset(self, topic: str, partition: int) -> int:
        return self._inner.end_offset(topic, partition)


class Owner:
    """Both aggregates of `partitions` on one log, restored, behind one group committer."""

    def __init__(
        self,
        log: CountingLog,
        runs: KeyValueStore,
        trajectories: KeyValueStore,
        partitions: set[int],
        *,
        clock: Clock | None = None,
        group: bool = True,
        changelog_every_ms: int = 0,
        start: bool = True,
    ) -> None:
        codec, clock = MessageCodec(), clock or SystemClock()
        self.log = log
        self.runs = RunCommandProcessor(log, runs, codec, clock, changelog_every_ms=changelog_every_ms)
        self.trajectories = TrajectoryProcessor(log, trajectories, codec, clock, load_catalog(CATALOG))
        for processor in (self.runs, self.trajectories):
            processor.restore_partitions(partitions)
        self.joint = JointUnit(log, [self.runs, self.trajectories], owned=frozenset(partitions))
        self.committer = GroupCommitter(
            self.joint,
            {
                RUN: lambda command: as_inbound(command_record(codec, command)),
                TRAJECTORY: lambda command: as_inbound(trajectory_command_record(codec, command)),
            },
            max_batch=500 if group else 1,
        )
        if start:
            self.committer.start()


class Sharded:
    """The owners by partition: one for all (one producer), or one per partition (a producer,
    processors and stores each), so that commits of different partitions overlap."""

    def __init__(self, by_partition: dict[int, Owner]) -> None:
        self._by_partition = by_partition
        self.owners = list({id(o): o for o in by_partition.values()}.values())

    @classmethod
    def single(cls, owner: Owner) -> Sharded:
        return cls({p: owner for p in range(RUNS_COMMANDS.partitions)})

    async def decide(self, first: Ask, *then: Any) -> tuple[Answer, ...]:
        run_id = str(getattr(first.command, "run_id", ""))
        try:
            partition = partition_for_run(run_id, RUNS_COMMANDS.partitions)
        except ValueError:
            partition = 0  # its committer answers it with the same error
        return await asyncio.wrap_future(self._by_partition[partition].committer.submit(first, *then))


class Submit(BaseModel):
    key: str = Field(min_length=1, max_length=200)
    tenant: str = Field(default=TENANT, min_length=1, max_length=200)


class Claim(BaseModel):
    runnerId: str = Field(min_length=1, max_length=200)
    leaseSeconds: int = Field(ge=0, le=86_400)
    openTrajectory: bool = False  # and open the trajectory under the lease granted, in the same unit


class Lease(BaseModel):
    attemptId: str = Field(min_length=1, max_length=200)
    leaseEpoch: int = Field(ge=0, le=2**31 - 1)


class Finish(Lease):
    reportSucceeded: bool = False  # and report the attempt succeeded, in the same unit


class Effect(Lease):
    effectId: str = Field(min_length=1, max_length=200)


class Proposal(Lease):
    tool: str = Field(min_length=1, max_length=200)
    params: dict[str, Any] = Field(default_factory=dict)


def _header(run_id: str, command_id: str, clock: SystemClock, correlation: str) -> dict[str, Any]:
    return command_header(run_id, command_id, clock.now_ms(), correlation)


def command_header(run_id: str, command_id: str, now_ms: int, correlation: str) -> dict[str, Any]:
    return {
        "command_id": command_id,
        "run_id": run_id,
        "issued_at": now_ms,
        "correlation_id": correlation,
        "actor": ACTOR,
    }


def effect_intent(run_id: str, attempt_id: str, epoch: int, step: Any, now_ms: int) -> RecordEffectIntent:
    """The gateway's intent for the effect of `step` (a step the Trajectory recorded)."""
    effect_id = derived_id("eff", step.idempotency_key)
    return RecordEffectIntent(
        **command_header(run_id, derived_id("cmd", effect_id, "intent"), now_ms, attempt_id),
        attempt_id=attempt_id,
        lease_epoch=epoch,
        effect_id=effect_id,
        idempotency_key=step.idempotency_key,
        tool=step.gateway_tool,
        operation=step.operation,
    )


def outcome_and_commit(
    run_id: str, attempt_id: str, epoch: int, step: Any, now_ms: int
) -> tuple[RecordEffectOutcome, RecordStepOutcome]:
    """The (trivial, not made) effect's outcome on the Run and the step's commit, with what the
    simulated environment's cache.warm answers."""
    effect_id = derived_id("eff", step.idempotency_key)
    outcome = RecordEffectOutcome(
        **command_header(run_id, derived_id("cmd", effect_id, "outcome"), now_ms, attempt_id),
        attempt_id=attempt_id,
        lease_epoch=epoch,
        effect_id=effect_id,
        outcome="committed",
    )
    commit = RecordStepOutcome(
        **command_header(run_id, derived_id("cmd", step.idempotency_key, "committed"), now_ms, run_id),
        step_index=step.index,
        dispatch=step.dispatch,
        lease_epoch=epoch,
        outcome="committed",
        output=json.dumps({"cacheId": f"cache-{effect_id}"}),
    )
    return outcome, commit


def _state(answer: Answer, command: str) -> Any:
    """The state after a handled command; a 409 naming `command` (its type's name) otherwise."""
    if not answer.verdict.handled:
        raise HTTPException(409, f"{command} {answer.verdict.outcome}")
    return answer.state


def _both(answers: tuple[Answer, ...], first: str, then: str) -> tuple[Any, Any]:
    """The states after a request of two commands; a 409 naming the one that was not handled."""
    state = _state(answers[0], first)
    if len(answers) < 2:
        raise HTTPException(409, f"{first} led to no {then}")
    return state, _state(answers[1], then)


def create_app(owners: Sharded, clock: SystemClock, *, separate: bool = False) -> FastAPI:
    app = FastAPI()

    async def decided(aggregate: str, command: Any) -> Any:
        (answer,) = await owners.decide(Ask(aggregate, command))
        return _state(answer, type(command).__name__)

    @app.post("/runs", status_code=201)
    async def submit(body: Submit) -> dict[str, Any]:
        run_id = run_id_for(body.tenant, body.key)
        spec = json.dumps({"agent": "bench-owner", "key": body.key}, sort_keys=True)
        state = await decided(
            RUN,
            SubmitRun(
                **_header(run_id, command_id_for(run_id, "SubmitRun", body.key), clock, run_id),
                tenant=body.tenant,
                idempotency_key=body.key,
                execution_spec=spec,
                timeout_seconds=3600,
            ),
        )
        return {"runId": run_id, "version": state.version}

    @app.post("/runs/{run_id}/attempts", status_code=201)
    async def claim(run_id: str, body: Claim) -> dict[str, Any]:
        """The claim; with `openTrajectory`, the trajectory opened under the lease it granted, in
        the same unit (a runner opens one right after every claim)."""
        command_id = derived_id("cmd", run_id, "claim", body.runnerId)
        claim = ClaimRun(
            **_header(run_id, command_id, clock, run_id),
            runner_id=body.runnerId,
            lease_seconds=body.leaseSeconds,
        )
        if not body.openTrajectory:
            state = await decided(RUN, claim)
            assert state.lease is not None
            return {"attemptId": state.lease.attempt_id, "epoch": state.lease.epoch, "version": state.version}

        def opened(answer: Answer) -> Ask | None:
            lease = answer.state.lease if answer.verdict.handled else None
            return (
                None
                if lease is None
                else Ask(TRAJECTORY, holder_command(StartTrajectory, run_id, lease.attempt_id, lease.epoch))
            )

        state, trajectory = _both(await owners.decide(Ask(RUN, claim), opened), "ClaimRun", "StartTrajectory")
        return {
            "attemptId": state.lease.attempt_id,
            "epoch": state.lease.epoch,
            "version": state.version,
            "trajectory": {"status": trajectory.status.value, "version": trajectory.version},
        }

    def holder_command(
        kind: type[StartTrajectory | FinishTrajectory], run_id: str, attempt_id: str, epoch: int
    ) -> StartTrajectory | FinishTrajectory:
        """A trajectory command that carries nothing but the holder's lease."""
        header = _header(run_id, derived_id("cmd", attempt_id, kind.__name__), clock, attempt_id)
        return kind(**header, attempt_id=attempt_id, lease_epoch=epoch)

    async def holder_decided(kind: type[StartTrajectory | FinishTrajectory], run_id: str, body: Lease) -> Any:
        state = await decided(TRAJECTORY, holder_command(kind, run_id, body.attemptId, body.leaseEpoch))
        return {"status": state.status.value, "version": state.version}

    def succeeded(run_id: str, body: Lease) -> ReportAttempt:
        return ReportAttempt(
            **_header(run_id, derived_id("cmd", body.attemptId, "report"), clock, body.attemptId),
            attempt_id=body.attemptId,
            lease_epoch=body.leaseEpoch,
            sequence=1,
            outcome="succeeded",
            manifest_verified=True,
        )

    @app.post("/runs/{run_id}/trajectory", status_code=201)
    async def open_trajectory(run_id: str, body: Lease) -> dict[str, Any]:
        answer: dict[str, Any] = await holder_decided(StartTrajectory, run_id, body)
        return answer

    @app.post("/runs/{run_id}/trajectory/steps")
    async def propose(run_id: str, body: Proposal) -> dict[str, Any]:
        """The step's intent and the gateway's fenced effect intent (one unit), the (trivial)
        effect, its outcome on the Run and the step's commit (one unit): answered once the
        commit is durable."""
        params = json.dumps(body.params, sort_keys=True)
        proposal = ProposeStep(
            **_header(
                run_id, derived_id("cmd", body.attemptId, "propose", body.tool, params), clock, body.attemptId
            ),
            attempt_id=body.attemptId,
            lease_epoch=body.leaseEpoch,
            tool=body.tool,
            params=params,
        )

        def intent_of(answer: Answer) -> Ask | None:
            if not answer.verdict.handled:
                return None
            step = answer.state.steps[-1]
            return Ask(RUN, effect_intent(run_id, body.attemptId, body.leaseEpoch, step, clock.now_ms()))

        if separate:
            (step_answer,) = await owners.decide(Ask(TRAJECTORY, proposal))
            intent = intent_of(step_answer)
            answers = (step_answer, *(await owners.decide(intent) if intent else ()))
        else:
            answers = await owners.decide(Ask(TRAJECTORY, proposal), intent_of)
        if len(answers) < 2:
            raise HTTPException(409, f"ProposeStep {answers[0].verdict.outcome}")
        step = _state(answers[0], "ProposeStep").steps[-1]
        _state(answers[1], "RecordEffectIntent")
        outcome, commit = outcome_and_commit(run_id, body.attemptId, body.leaseEpoch, step, clock.now_ms())
        if separate:
            _, after = await asyncio.gather(decided(RUN, outcome), decided(TRAJECTORY, commit))
        else:
            done = await owners.decide(Ask(RUN, outcome), lambda _answer: Ask(TRAJECTORY, commit))
            _state(done[0], "RecordEffectOutcome")
            after = _state(done[-1], "RecordStepOutcome")
        return {"stepIndex": step.index, "status": after.steps[step.index].status.value}

    @app.post("/runs/{run_id}/trajectory/finish")
    async def finish(run_id: str, body: Finish) -> dict[str, Any]:
        """The trajectory finished; with `reportSucceeded`, the attempt reported succeeded on the
        Run in the same unit (a runner reports right after it finishes)."""
        if not body.reportSucceeded:
            answer: dict[str, Any] = await holder_decided(FinishTrajectory, run_id, body)
            return answer
        finished = holder_command(FinishTrajectory, run_id, body.attemptId, body.leaseEpoch)
        answers = await owners.decide(
            Ask(TRAJECTORY, finished),
            lambda answer: Ask(RUN, succeeded(run_id, body)) if answer.verdict.handled else None,
        )
        trajectory, run = _both(answers, "FinishTrajectory", "ReportAttempt")
        return {
            "status": trajectory.status.value,
            "version": trajectory.version,
            "run": {"status": run.status.value, "version": run.version},
        }

    @app.post("/runs/{run_id}/report")
    async def report(run_id: str, body: Lease) -> dict[str, Any]:
        state = await decided(RUN, succeeded(run_id, body))
        return {"status": state.status.value, "version": state.version}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        took = sorted(ms for o in owners.owners for ms in o.committer.unit_ms)
        committing = sorted(ms for o in owners.owners for ms in o.log.commit_ms)
        for owner in owners.owners:
            owner.committer.unit_ms.clear()
            owner.log.commit_ms.clear()
        return {
            "handle_p50_ms": took[len(took) // 2] if took else 0.0,
            "handle_p99_ms": took[int(len(took) * 0.99)] if took else 0.0,
            "commit_p50_ms": committing[len(committing) // 2] if committing else 0.0,
            "commit_p99_ms": committing[int(len(committing) * 0.99)] if committing else 0.0,
            "batches": sum(o.committer.units for o in owners.owners),
            "commands": sum(o.committer.requests for o in owners.owners),
            "transactions": sum(o.log.transactions for o in owners.owners),
            "records": sum(o.log.records for o in owners.owners),
            "partitions": sum(o.log.partitions for o in owners.owners),
        }

    return app


def main() -> None:
    port, bootstrap, state_dir = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    options = sys.argv[4:]
    shards = (
        [{p} for p in range(RUNS_COMMANDS.partitions)]
        if "--per-partition" in options
        else [set(range(RUNS_COMMANDS.partitions))]
    )
    by_partition: dict[int, Owner] = {}
    for index, partitions in enumerate(shards):
        owner = Owner(
            CountingLog(KafkaEventLog(bootstrap, f"tenure-bench-owner-{index}")),
            RocksStore(state_dir / f"runs-{index}"),
            RocksStore(state_dir / f"trajectories-{index}"),
            partitions,
            group="--no-group" not in options,
            changelog_every_ms=1000 if "--changelog-every-second" in options else 0,
        )
        by_partition.update({partition: owner for partition in partitions})
    if "--no-changelog" in options:
        # The bound of a changelog written less often than every unit (docs/architecture.md, "The
        # state changelog in every transaction"): the Run's units write no state changelog, so a
        # restore of this owner folds every event. A measurement, never a mode to run.
        for owner in Sharded(by_partition).owners:
            owner.runs.definition.changelog_topic = None
    app = create_app(Sharded(by_partition), SystemClock(), separate="--separate" in options)
    serve_http(app, "127.0.0.1", port, TenureSettings())


if __name__ == "__main__":
    main()
