"""A measuring prototype of the owner-per-partition design: requests decided in the process
that owns the Run's partitions, with a group commit (bench/owner_path.py drives it).

`python -m bench._owner_server PORT BOOTSTRAP STATE_DIR [--no-group]` serves four routes that
carry the Run aggregate's share of a durable 1-step workflow (submit, claim, the effect's intent
and outcome, the report): five of the workflow's decisions, in four requests. Each route builds
the same Run command the command API and the effect gateway build and hands it to the one
aggregate runtime, `RunCommandProcessor.handle` over a real `KafkaEventLog` (one Kafka
transaction per batch) and a real RocksDB store, exactly as the lease coordinator runs it.
What is different is how a command gets there: no command topic, no stream consumer, no
decision follower. One committer thread takes every command that waits when it is free, decides
them as one batch and one transaction (a group commit across workflows, with no linger: the
batch is whatever came while the previous one committed), and answers each request once its
transaction committed. `--no-group` hands each command to `handle` alone, for comparison.

This is not a Tenure service: it has no authentication, no routing of a request to the
partition's owner, no rebalance, no views; it exists to measure what the design's core costs
on this machine (docs/architecture.md, "The owner's core, measured").
"""

from __future__ import annotations

import asyncio
import json
import queue
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from services.common.aggregate.processor import AggregateProcessor
from services.common.clock import SystemClock
from services.common.contracts import (
    ClaimRun,
    FinishTrajectory,
    ProposeStep,
    RecordEffectIntent,
    RecordEffectOutcome,
    RecordStepOutcome,
    ReportAttempt,
    RunCommand,
    StartTrajectory,
    SubmitRun,
    TrajectoryCommand,
)
from services.common.eventlog import EventLog, KafkaEventLog
from services.common.http_serve import serve_http
from services.common.ids import command_id_for, derived_id, run_id_for
from services.common.kafka import InboundRecord, OutboundRecord
from services.common.messages import MessageCodec
from services.common.routing import command_record, partition_for_run, trajectory_command_record
from services.common.settings import TenureSettings, repo_root
from services.common.store import RocksStore
from services.common.topics import RUNS_COMMANDS
from services.lease_coordinator.domain.state import RunState
from services.lease_coordinator.processor import RunCommandProcessor
from services.saga_orchestrator.domain import load_catalog
from services.saga_orchestrator.domain.state import TrajectoryState
from services.saga_orchestrator.processor import TrajectoryProcessor

__all__ = ["Committer", "CountingLog", "Sharded", "create_app", "main"]

ACTOR = "bench-owner"
TENANT = "bench-owner"
CATALOG = repo_root() / "services" / "sim_environment" / "tools.json"
_MAX_BATCH = 500
S = TypeVar("S")
C = TypeVar("C")


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


class Committer(Generic[S, C]):
    """One thread deciding every waiting command of one aggregate as one batch: one
    transaction, then the answers."""

    def __init__(
        self,
        processor: AggregateProcessor[S, C, Any, Any],
        log: CountingLog,
        record: Callable[[C], OutboundRecord],
        handled: Callable[[S, str], bool],
        group: bool,
        *,
        start: bool = True,
    ) -> None:
        self._processor = processor
        self.log = log
        self._record = record
        self._handled = handled
        self._group = group
        self._queue: queue.Queue[tuple[C, asyncio.Future[S | None]]] = queue.Queue()
        self._offsets: defaultdict[int, int] = defaultdict(int)
        self.batches = 0
        self.commands = 0
        self.handle_ms: list[float] = []  # each batch's handle: decide, the transaction, the store
        if start:
            self.start()

    def start(self) -> None:
        threading.Thread(target=self._run, name="committer", daemon=True).start()

    async def decide(self, command: C) -> S | None:
        """The aggregate's state after the command's batch committed, or None if refused."""
        future: asyncio.Future[S | None] = asyncio.get_running_loop().create_future()
        self._queue.put((command, future))
        return await future

    def _inbound(self, command: C) -> InboundRecord:
        """The command as the stream would have delivered it, at the next offset of its partition."""
        out = self._record(command)
        partition = partition_for_run(out.key.decode(), RUNS_COMMANDS.partitions)
        offset = self._offsets[partition]
        self._offsets[partition] += 1
        return InboundRecord(out.topic, partition, offset, out.key, out.value, out.headers)

    def _routed(
        self, waiting: list[tuple[C, asyncio.Future[S | None]]]
    ) -> tuple[list[tuple[C, asyncio.Future[S | None]]], list[InboundRecord]]:
        """The commands that could be routed, with their records; the others are answered with
        their error at once, so that one malformed command does not fail the batch."""
        routed, records = [], []
        for command, future in waiting:
            try:
                records.append(self._inbound(command))
            except ValueError as exc:
                future.get_loop().call_soon_threadsafe(_fail, future, exc)
                continue
            routed.append((command, future))
        return routed, records

    def _run(self) -> None:
        while True:
            waiting = [self._queue.get()]
            while self._group and len(waiting) < _MAX_BATCH:
                try:
                    waiting.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            waiting, records = self._routed(waiting)
            if not waiting:
                continue
            began = time.monotonic()
            try:
                self._processor.handle(records)
            except Exception as exc:  # every waiting request learns of it; the committer goes on
                for _, future in waiting:
                    future.get_loop().call_soon_threadsafe(_fail, future, exc)
                continue
            self.batches += 1
            self.commands += len(waiting)
            self.handle_ms.append(1000 * (time.monotonic() - began))
            definition = self._processor.definition
            for command, future in waiting:
                state = self._processor.load(definition.aggregate_id(command))
                handled = state is not None and self._handled(state, definition.command_id(command))
                future.get_loop().call_soon_threadsafe(_settle, future, state if handled else None)


def _settle(future: asyncio.Future[Any], state: Any) -> None:
    if not future.done():
        future.set_result(state)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class Sharded(Generic[S, C]):
    """An aggregate's committers by partition: one for all (one producer), or one per partition
    (a producer, a processor and a store each), so that commits of different partitions overlap."""

    def __init__(self, by_partition: dict[int, Committer[S, C]]) -> None:
        self._by_partition = by_partition
        self.committers = list({id(c): c for c in by_partition.values()}.values())

    @classmethod
    def single(cls, committer: Committer[S, C]) -> Sharded[S, C]:
        return cls({p: committer for p in range(RUNS_COMMANDS.partitions)})

    async def decide(self, command: C) -> S | None:
        run_id = str(getattr(command, "run_id", ""))
        try:
            partition = partition_for_run(run_id, RUNS_COMMANDS.partitions)
        except ValueError:
            partition = 0  # its committer refuses it with the same error
        return await self._by_partition[partition].decide(command)


class Submit(BaseModel):
    key: str = Field(min_length=1, max_length=200)
    tenant: str = Field(default=TENANT, min_length=1, max_length=200)


class Claim(BaseModel):
    runnerId: str = Field(min_length=1, max_length=200)
    leaseSeconds: int = Field(ge=0, le=86_400)


class Lease(BaseModel):
    attemptId: str = Field(min_length=1, max_length=200)
    leaseEpoch: int = Field(ge=0, le=2**31 - 1)


class Effect(Lease):
    effectId: str = Field(min_length=1, max_length=200)


class Proposal(Lease):
    tool: str = Field(min_length=1, max_length=200)
    params: dict[str, Any] = Field(default_factory=dict)


RunCommitters = Sharded[RunState, RunCommand]
TrajectoryCommitters = Sharded[TrajectoryState, TrajectoryCommand]


def _header(run_id: str, command_id: str, clock: SystemClock, correlation: str) -> dict[str, Any]:
    return {
        "command_id": command_id,
        "run_id": run_id,
        "issued_at": clock.now_ms(),
        "correlation_id": correlation,
        "actor": ACTOR,
    }


def create_app(runs: RunCommitters, trajectories: TrajectoryCommitters, clock: SystemClock) -> FastAPI:
    app = FastAPI()

    async def decided(committer: Sharded[S, Any], command: Any) -> S:
        state = await committer.decide(command)
        if state is None:
            raise HTTPException(409, f"{type(command).__name__} refused")
        return state

    @app.post("/runs", status_code=201)
    async def submit(body: Submit) -> dict[str, Any]:
        run_id = run_id_for(body.tenant, body.key)
        spec = json.dumps({"agent": "bench-owner", "key": body.key}, sort_keys=True)
        state = await decided(
            runs,
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
        command_id = derived_id("cmd", run_id, "claim", body.runnerId)
        state = await decided(
            runs,
            ClaimRun(
                **_header(run_id, command_id, clock, run_id),
                runner_id=body.runnerId,
                lease_seconds=body.leaseSeconds,
            ),
        )
        assert state.lease is not None
        return {"attemptId": state.lease.attempt_id, "epoch": state.lease.epoch, "version": state.version}

    async def holder_decided(kind: type[StartTrajectory | FinishTrajectory], run_id: str, body: Lease) -> Any:
        """A trajectory command that carries nothing but the holder's lease."""
        header = _header(run_id, derived_id("cmd", body.attemptId, kind.__name__), clock, body.attemptId)
        command = kind(**header, attempt_id=body.attemptId, lease_epoch=body.leaseEpoch)
        state = await decided(trajectories, command)
        return {"status": state.status.value, "version": state.version}

    @app.post("/runs/{run_id}/trajectory", status_code=201)
    async def open_trajectory(run_id: str, body: Lease) -> dict[str, Any]:
        answer: dict[str, Any] = await holder_decided(StartTrajectory, run_id, body)
        return answer

    @app.post("/runs/{run_id}/trajectory/steps")
    async def propose(run_id: str, body: Proposal) -> dict[str, Any]:
        """The step's intent, the gateway's fenced effect intent, the (trivial) effect, its
        outcome on the Run and the step's commit: answered once the commit is durable."""
        params = json.dumps(body.params, sort_keys=True)
        command_id = derived_id("cmd", body.attemptId, "propose", body.tool, params)
        state = await decided(
            trajectories,
            ProposeStep(
                **_header(run_id, command_id, clock, body.attemptId),
                attempt_id=body.attemptId,
                lease_epoch=body.leaseEpoch,
                tool=body.tool,
                params=params,
            ),
        )
        step = state.steps[-1]
        lease: dict[str, Any] = {"attempt_id": body.attemptId, "lease_epoch": body.leaseEpoch}
        effect_id = derived_id("eff", step.idempotency_key)
        await decided(
            runs,
            RecordEffectIntent(
                **_header(run_id, derived_id("cmd", effect_id, "intent"), clock, body.attemptId),
                effect_id=effect_id,
                idempotency_key=step.idempotency_key,
                tool=step.gateway_tool,
                operation=step.operation,
                **lease,
            ),
        )
        outcome = RecordEffectOutcome(
            **_header(run_id, derived_id("cmd", effect_id, "outcome"), clock, body.attemptId),
            effect_id=effect_id,
            outcome="committed",
            **lease,
        )
        commit = RecordStepOutcome(
            **_header(run_id, derived_id("cmd", step.idempotency_key, "committed"), clock, run_id),
            step_index=step.index,
            dispatch=step.dispatch,
            lease_epoch=body.leaseEpoch,
            outcome="committed",
            # What the simulated environment's cache.warm answers (the effect itself is not made).
            output=json.dumps({"cacheId": f"cache-{effect_id}"}),
        )
        _, after = await asyncio.gather(decided(runs, outcome), decided(trajectories, commit))
        return {"stepIndex": step.index, "status": after.steps[step.index].status.value}

    @app.post("/runs/{run_id}/trajectory/finish")
    async def finish(run_id: str, body: Lease) -> dict[str, Any]:
        answer: dict[str, Any] = await holder_decided(FinishTrajectory, run_id, body)
        return answer

    @app.post("/runs/{run_id}/report")
    async def report(run_id: str, body: Lease) -> dict[str, Any]:
        command_id = derived_id("cmd", body.attemptId, "report")
        state = await decided(
            runs,
            ReportAttempt(
                **_header(run_id, command_id, clock, body.attemptId),
                attempt_id=body.attemptId,
                lease_epoch=body.leaseEpoch,
                sequence=1,
                outcome="succeeded",
                manifest_verified=True,
            ),
        )
        return {"status": state.status.value, "version": state.version}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        committers: list[Committer[Any, Any]] = [*runs.committers, *trajectories.committers]
        took = sorted(ms for c in committers for ms in c.handle_ms)
        committing = sorted(ms for c in committers for ms in c.log.commit_ms)
        for committer in committers:
            committer.handle_ms.clear()
            committer.log.commit_ms.clear()
        return {
            "handle_p50_ms": took[len(took) // 2] if took else 0.0,
            "handle_p99_ms": took[int(len(took) * 0.99)] if took else 0.0,
            "commit_p50_ms": committing[len(committing) // 2] if committing else 0.0,
            "commit_p99_ms": committing[int(len(committing) * 0.99)] if committing else 0.0,
            "batches": sum(c.batches for c in committers),
            "commands": sum(c.commands for c in committers),
            "transactions": sum(c.log.transactions for c in committers),
            "records": sum(c.log.records for c in committers),
            "partitions": sum(c.log.partitions for c in committers),
        }

    return app


def _restored(
    processor: AggregateProcessor[S, C, Any, Any],
    log: CountingLog,
    record: Callable[[C], OutboundRecord],
    handled: Callable[[S, str], bool],
    partitions: set[int],
    group: bool,
) -> Committer[S, C]:
    """The committer of `processor` once it restored `partitions` from the log."""
    processor.restore_partitions(partitions)
    return Committer(processor, log, record, handled, group)


def main() -> None:
    port, bootstrap, state_dir = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    group = "--no-group" not in sys.argv[4:]
    shards = (
        [{p} for p in range(RUNS_COMMANDS.partitions)]
        if "--per-partition" in sys.argv[4:]
        else [set(range(RUNS_COMMANDS.partitions))]
    )
    codec, clock = MessageCodec(), SystemClock()
    catalog = load_catalog(CATALOG)
    runs: dict[int, Committer[RunState, RunCommand]] = {}
    trajectories: dict[int, Committer[TrajectoryState, TrajectoryCommand]] = {}
    for index, partitions in enumerate(shards):
        run_log = CountingLog(KafkaEventLog(bootstrap, f"tenure-bench-owner-runs-{index}"))
        trajectory_log = CountingLog(KafkaEventLog(bootstrap, f"tenure-bench-owner-trajectories-{index}"))
        run_committer = _restored(
            RunCommandProcessor(run_log, RocksStore(state_dir / f"runs-{index}"), codec, clock),
            run_log,
            lambda command: command_record(codec, command),
            lambda state, command_id: command_id in state.handled_commands,
            partitions,
            group,
        )
        trajectory_committer = _restored(
            TrajectoryProcessor(
                trajectory_log, RocksStore(state_dir / f"trajectories-{index}"), codec, clock, catalog
            ),
            trajectory_log,
            lambda command: trajectory_command_record(codec, command),
            lambda state, command_id: command_id in state.causes,
            partitions,
            group,
        )
        for partition in partitions:
            runs[partition], trajectories[partition] = run_committer, trajectory_committer
    serve_http(create_app(Sharded(runs), Sharded(trajectories), clock), "127.0.0.1", port, TenureSettings())


if __name__ == "__main__":
    main()
