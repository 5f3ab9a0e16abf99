"""Configurations 1-3 of the fault-injection scoreboard (DUR-3): honest ablations of Tenure.

Each is built from the same parts as Tenure with features switched off, never a strawman:

1. ``UnmanagedRunner``: calls the environment directly, a fresh Idempotency-Key per call, epoch 1,
   naive retries (up to 3) on timeouts, lost connections, 5xx and 429, gives up on anything else;
   no compensation; its state lives in memory, so a resumed trajectory starts over.
2. ``LogOnlyRunner``: the same calls, but every committed turn is journaled durably (an fsynced
   JSON-lines file per trajectory) before the runner moves on, and a resumed trajectory continues
   after its last journaled turn. Still a fresh key per call (nothing reconciles a lost answer),
   no compensation, no repair: a semantic error ends the trajectory ("failed").
3. ``SagaMemoryRunner``: Tenure's own pure saga core (services.saga_orchestrator.domain: decide,
   evolve, pending_work, the recovery policy D, the reference tool catalog) held in memory. It
   validates proposals, repairs with the agent, retries, runs the pivot gate's verifiers,
   compensates on rollback and escalates after the pivot; it performs the work items by calling the
   environment directly with a fresh key per call (there is no gateway, so no probe and no
   reconciliation). Everything is lost on a kill: a resumed trajectory starts over.

In every configuration the runner arms the turn's planned environment fault right before the
turn's first dispatch, and executes a planned kill at the first dispatch of the turn's correct
proposal: "before-dispatch", or "after-effect" (the environment applied it, the runner has not
recorded the answer).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from bench.faults.runner_api import EffectResult, Reporter, SimClient
from bench.faults.workload import (
    RERUN_COST_MONEY,
    RERUN_COST_MS,
    FaultKind,
    MalformedProposal,
    Proposal,
    TrajectorySpec,
    TurnFault,
    env_fault,
    plan_step_id,
    propose,
    turn_of_plan_step,
)
from services.common.contracts import (
    FinishTrajectory,
    ProposeStep,
    RecordCompensationOutcome,
    RecordLeaseRevocation,
    RecordPivotGate,
    RecordStepOutcome,
    StartTrajectory,
    TrajectoryFrozen,
)
from services.common.ids import canonical_json
from services.saga_orchestrator.domain import (
    DispatchStep,
    ErrorClass,
    EvaluateGate,
    Rejection,
    RevokeLease,
    RunCompensator,
    SagaContext,
    StepError,
    StepState,
    StepStatus,
    TrajectoryState,
    TrajectoryStatus,
    classify,
    decide,
    evolve,
    load_catalog,
    pending_work,
)
from services.sim_environment import TOOLS_JSON

__all__ = ["LogOnlyRunner", "SagaMemoryRunner", "UnmanagedRunner"]

NAIVE_RETRIES = 3
# A runaway guard: no trajectory of this workload needs anywhere near this many work items.
MAX_WORK_ITEMS = 400
MAX_BACKOFF_WAIT_S = 30.0


class _GiveUp(Exception):
    """The naive runners stop here; the message says why."""


def _kill_of(fault: TurnFault | None) -> TurnFault | None:
    return fault if fault is not None and fault.kind is FaultKind.KILL else None


def _malformation(fault: TurnFault | None) -> str:
    return fault.malformed if fault is not None and fault.kind is FaultKind.MALFORMED_PROPOSAL else ""


def _arm(sim: SimClient, spec: TrajectorySpec, turn: int, proposal: Proposal, with_planned: bool) -> None:
    """The proposal's own faults (a mistake the tool must refuse) and, once per turn, the turn's
    planned environment fault; all limited to this trajectory's work id."""
    bodies = [dict(body) for body in proposal.faults]
    planned = env_fault(spec, turn, spec.work_id) if with_planned else None
    if planned is not None:
        bodies.append(planned)
    for body in bodies:
        body["workId"] = spec.work_id
        sim.arm(body)


# --- 1 and 2: direct calls with naive retries ------------------------------------------------------


def _naive_turn(
    sim: SimClient, spec: TrajectorySpec, turn: int, reporter: Reporter, vm_id: str | None
) -> dict[str, Any]:
    """One turn the naive way: propose once, call with a fresh key, retry what looks transient."""
    step = spec.steps[turn]
    fault = reporter.fault(spec, turn)
    proposal = propose(spec, turn, 0, vm_id, malformed=_malformation(fault))
    try:
        payload = proposal.params()
    except MalformedProposal as exc:
        raise _GiveUp(str(exc)) from exc
    _arm(sim, spec, turn, proposal, fault is not None)
    kill = _kill_of(fault) if proposal.correct else None
    if kill is not None and kill.point == "before-dispatch":
        reporter.kill_me(turn, kill.point)
    last: EffectResult | None = None
    for _ in range(1 + NAIVE_RETRIES):
        result = sim.perform(step.tool, payload, key=uuid.uuid4().hex, work=spec.work_id)
        if result.ok and result.output is not None:
            if kill is not None and kill.point == "after-effect":
                reporter.kill_me(turn, kill.point)
            return result.output
        last = result
        if not result.naive_retryable:
            break
    assert last is not None
    raise _GiveUp(f"turn {turn} ({step.tool}): {last.describe()}")


class UnmanagedRunner:
    """Configuration 1 (see the module docstring)."""

    def __init__(self, sim: SimClient) -> None:
        self.sim = sim

    def close(self) -> None:
        self.sim.close()

    def run(self, spec: TrajectorySpec, resume: bool, reporter: Reporter) -> None:
        # ``resume`` changes nothing: the state died with the killed process, so start over.
        committed: dict[int, dict[str, Any]] = {}
        vm_id: str | None = None
        for step in spec.steps:
            try:
                output = _naive_turn(self.sim, spec, step.turn, reporter, vm_id)
            except _GiveUp as exc:
                reporter.finished("failed", committed, detail=str(exc))
                return
            committed[step.turn] = output
            if step.tool == "vm.provision":
                vm_id = str(output.get("vmId"))
            reporter.committed(step.turn, output)
        reporter.finished("completed", committed)


class LogOnlyRunner:
    """Configuration 2 (see the module docstring). One journal file per trajectory."""

    def __init__(self, sim: SimClient, journal_dir: Path) -> None:
        self.sim = sim
        self.journal_dir = journal_dir
        journal_dir.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        self.sim.close()

    def journal_path(self, spec: TrajectorySpec) -> Path:
        return self.journal_dir / f"{spec.trajectory_id}.jsonl"

    def _append(self, path: Path, entry: dict[str, Any]) -> None:
        with open(path, "a", encoding="utf-8") as journal:
            journal.write(json.dumps(entry, sort_keys=True) + "\n")
            journal.flush()
            os.fsync(journal.fileno())

    @staticmethod
    def _read(path: Path) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        if not path.exists():
            return entries
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                break  # a torn last line: the write it belongs to never completed
            if isinstance(entry, dict):
                entries.append(entry)
        return entries

    def run(self, spec: TrajectorySpec, resume: bool, reporter: Reporter) -> None:
        path = self.journal_path(spec)
        if not resume:
            path.unlink(missing_ok=True)
        entries = self._read(path)
        committed = {int(e["turn"]): dict(e["output"]) for e in entries if "turn" in e}
        final = next((e for e in entries if "finished" in e), None)
        if final is not None:
            reporter.finished(str(final["finished"]), committed, detail="as journaled before the kill")
            return
        vm_id = str(committed[0]["vmId"]) if 0 in committed else None
        for step in spec.steps:
            if step.turn in committed:
                continue  # journaled by an earlier incarnation: durable, not redone
            try:
                output = _naive_turn(self.sim, spec, step.turn, reporter, vm_id)
            except _GiveUp as exc:
                self._append(path, {"finished": "failed", "detail": str(exc)})
                reporter.finished("failed", committed, detail=str(exc))
                return
            self._append(path, {"turn": step.turn, "output": output})
            committed[step.turn] = output
            if step.tool == "vm.provision":
                vm_id = str(output.get("vmId"))
            reporter.committed(step.turn, output)
        self._append(path, {"finished": "completed"})
        reporter.finished("completed", committed)


# --- 3: the saga core in memory -------------------------------------------------------------------


def _now_ms() -> int:
    return int(time.time() * 1000)


# Re-runs after a clean rollback: the same number Tenure's runner allows (tenure_runner.MAX_RERUNS).
MAX_RERUNS = 2


def _wait_until(not_before_ms: int) -> None:
    delay = (not_before_ms - _now_ms()) / 1000
    if delay > 0:
        time.sleep(min(delay, MAX_BACKOFF_WAIT_S))


class SagaMemoryRunner:
    """Configuration 3 (see the module docstring)."""

    def __init__(self, sim: SimClient, catalog_path: Path = TOOLS_JSON) -> None:
        self.sim = sim
        self.context = SagaContext(load_catalog(catalog_path))

    def close(self) -> None:
        self.sim.close()

    def run(self, spec: TrajectorySpec, resume: bool, reporter: Reporter) -> None:
        # ``resume`` changes nothing: the saga's state was in the killed process's memory.
        # A clean rollback is run again, as Tenure's runner does (MAX_RERUNS): the same policy,
        # so the two configurations differ only in durability (and reconciliation).
        prepared: set[int] = set()
        for rerun in range(MAX_RERUNS + 1):
            saga = _MemorySaga(spec, self.context, self.sim, reporter, rerun=rerun, prepared=prepared)
            if saga.run(last=rerun == MAX_RERUNS) != "aborted":
                return


class _MemorySaga:
    """One trajectory's saga, decided by the pure core and executed by direct calls."""

    def __init__(
        self,
        spec: TrajectorySpec,
        context: SagaContext,
        sim: SimClient,
        reporter: Reporter,
        *,
        rerun: int = 0,
        prepared: set[int] | None = None,
    ):
        self.spec = spec
        self.context = context
        self.sim = sim
        self.reporter = reporter
        self.rerun = rerun
        self.run_id = spec.work_id
        self.attempt_id = f"{spec.trajectory_id}-i{reporter.incarnation}-r{rerun}"
        self.state: TrajectoryState | None = None
        self.frozen: TrajectoryFrozen | None = None
        self.commands = 0
        self.vm_id: str | None = None
        # Shared by the re-runs of one incarnation: a planned fault is injected once.
        self.prepared: set[int] = prepared if prepared is not None else set()
        self.kills: dict[int, TurnFault] = {}
        self.work_items = 0

    # --- the core --------------------------------------------------------------------------------

    def _decide(self, kind: type[Any], **fields: Any) -> Rejection | None:
        self.commands += 1
        command = kind(
            command_id=f"{self.attempt_id}-c{self.commands}",
            run_id=self.run_id,
            issued_at=_now_ms(),
            correlation_id=self.run_id,
            actor="bench-saga-memory",
            **fields,
        )
        decision = decide(self.state, command, _now_ms(), self.context)
        if isinstance(decision, Rejection):
            return decision
        for event in decision:
            self.state = evolve(self.state, event)
            if isinstance(event, TrajectoryFrozen):
                self.frozen = event
        return None

    @property
    def _state(self) -> TrajectoryState:
        assert self.state is not None, "the trajectory has not started"
        return self.state

    def _turn_of(self, step_index: int) -> int:
        turn = turn_of_plan_step(self._state.steps[step_index].plan_step_id)
        assert turn is not None, f"step {step_index} is not a step of the plan"
        return turn

    def _step_of_turn(self, turn: int) -> StepState | None:
        wanted = plan_step_id(turn)
        return next((s for s in self._state.steps if s.plan_step_id == wanted), None)

    def _committed(self) -> dict[int, dict[str, Any]]:
        """Turns whose step is still committed (compensated ones are not)."""
        return {
            self._turn_of(step.index): json.loads(step.output or "{}")
            for step in self._state.steps
            if step.status is StepStatus.COMMITTED
        }

    # --- the trajectory --------------------------------------------------------------------------

    def run(self, *, last: bool = True) -> str:
        """Drive the trajectory; report it finished unless it was rolled back and may run again
        (not ``last``). Returns the status reached."""
        refused = self._decide(
            StartTrajectory,
            attempt_id=self.attempt_id,
            lease_epoch=1,
            plan=json.dumps(self.spec.plan()),
            rerun_cost_ms=RERUN_COST_MS,
            rerun_cost_money=RERUN_COST_MONEY,
        )
        if refused is not None:
            self.reporter.finished("failed", {}, detail=f"start refused: {refused.code}: {refused.detail}")
            return "failed"
        for step in self.spec.steps:
            ended = self._turn(step.turn)
            if ended is not None:
                status, detail = ended
                if status == "aborted" and not last:
                    return status
                incident = self._incident() if status == "escalated" else None
                self.reporter.finished(status, self._committed(), incident=incident, detail=detail)
                return status
        refused = self._decide(FinishTrajectory, attempt_id=self.attempt_id, lease_epoch=1)
        if refused is not None:
            self.reporter.finished(
                "failed", self._committed(), detail=f"finish refused: {refused.code}: {refused.detail}"
            )
            return "failed"
        self.reporter.finished("completed", self._committed(), detail=f"rerun {self.rerun}")
        return "completed"

    def _incident(self) -> dict[str, Any] | None:
        frozen = self.frozen
        if frozen is None:
            return None
        return {
            "incidentId": frozen.incident_id,
            "failureMode": frozen.failure_mode,
            "failedStep": frozen.failed_step,
            "failedTool": frozen.failed_tool,
            "uncompensated": json.loads(frozen.uncompensated or "[]"),
        }

    def _prepare(self, turn: int) -> None:
        """Arm ``turn``'s planned environment fault and note its kill, once. The pivot's turn also
        prepares the outbox turns, which the saga dispatches as soon as the pivot commits."""
        if turn in self.prepared:
            return
        self.prepared.add(turn)
        fault = self.reporter.fault(self.spec, turn)
        if fault is not None and fault.kind is FaultKind.KILL:
            self.kills[turn] = fault
        planned = env_fault(self.spec, turn, self.run_id) if fault is not None else None
        if planned is not None:
            self.sim.arm(planned)
        if turn == self.spec.pivot_turn:
            for later in self.spec.steps[turn + 1 :]:
                if self.context.catalog.get(later.tool).outbound:
                    self._prepare(later.turn)

    def _turn(self, turn: int) -> tuple[str, str] | None:
        """Drive ``turn`` until its step commits (None) or the trajectory stops: (status, detail)."""
        self._prepare(turn)
        fault = self.reporter.fault(self.spec, turn)
        malformed = _malformation(fault)
        attempt = 0
        staged = self._step_of_turn(turn)  # an outbox step, released with the pivot
        repair_of = -1
        while True:
            if staged is None or repair_of >= 0:
                proposal = propose(
                    self.spec, turn, attempt, self.vm_id, malformed=malformed, rerun=self.rerun
                )
                refused = self._decide(
                    ProposeStep,
                    attempt_id=self.attempt_id,
                    lease_epoch=1,
                    tool=proposal.tool,
                    params=proposal.params_text,
                    plan_step_id=plan_step_id(turn) if repair_of < 0 else "",
                    repair_of=repair_of,
                )
                if refused is not None:
                    if malformed and refused.code == "INVALID_PARAMETERS":
                        malformed = ""  # the agent is told its output was malformed and proposes again
                        continue
                    return "failed", f"turn {turn}: proposal refused: {refused.code}: {refused.detail}"
                for body in proposal.faults:
                    self.sim.arm({**body, "workId": self.run_id})
            self._drive()
            state = self._state
            step = self._step_of_turn(turn)
            assert step is not None, f"turn {turn} has no step"
            if step.status is StepStatus.COMMITTED:
                output = json.loads(step.output or "{}")
                if step.tool == "vm.provision":
                    self.vm_id = str(output.get("vmId"))
                self.reporter.committed(turn, output)
                return None
            if state.status is TrajectoryStatus.AWAITING_REPAIR and step.status is StepStatus.FAILED:
                attempt, repair_of = attempt + 1, step.index
                continue
            if state.status is TrajectoryStatus.ROLLED_BACK:
                return "aborted", f"rolled back at turn {turn}: {step.error_kind} {step.error_message}"
            if state.status is TrajectoryStatus.FROZEN:
                mode = state.incident.failure_mode if state.incident else "?"
                return "escalated", f"frozen at turn {turn} ({mode}): {step.error_kind} {step.error_message}"
            stopped = f"{state.status.value} (step {step.status.value})"
            return "failed", f"turn {turn}: the saga stopped in {stopped}"

    def _drive(self) -> None:
        """Perform the saga's work items until none is left (the step settled or the saga stopped)."""
        while (work := pending_work(self._state)) is not None:
            self.work_items += 1
            if self.work_items > MAX_WORK_ITEMS:
                raise RuntimeError(f"{self.spec.trajectory_id}: more than {MAX_WORK_ITEMS} work items")
            if isinstance(work, DispatchStep):
                self._dispatch(work)
            elif isinstance(work, EvaluateGate):
                self._gate(work)
            elif isinstance(work, RunCompensator):
                self._compensate(work)
            elif isinstance(work, RevokeLease):
                # No lease exists in this configuration: record the revocation as done.
                self._decide(RecordLeaseRevocation, incident_id=work.incident_id, revoked_epoch=work.epoch)

    def _dispatch(self, work: DispatchStep) -> None:
        _wait_until(work.not_before)
        turn = self._turn_of(work.step_index)
        # A planned kill strikes the first dispatch of the turn's correct payload.
        correct = work.params == self.spec.steps[turn].bind(self.vm_id)
        kill = self.kills.pop(turn, None) if correct else None
        if kill is not None and kill.point == "before-dispatch":
            self.reporter.kill_me(turn, kill.point)
        result = self.sim.perform(work.operation, work.params, key=uuid.uuid4().hex, work=self.run_id)
        if kill is not None and kill.point == "after-effect" and result.ok:
            self.reporter.kill_me(turn, kill.point)
        fields: dict[str, Any]
        if result.ok:
            fields = {"outcome": "committed", "output": canonical_json(result.output)}
        elif result.kind == "problem":
            fields = {
                "outcome": "failed",
                "error_kind": result.problem,
                "error_message": result.detail,
                "error_status": result.status,
                "partial_output": canonical_json(result.partial_output) if result.partial_output else "",
            }
        else:  # no answer, or one that cannot be read: the outcome is unknown and nothing can probe it
            fields = {"outcome": "unknown", "error_message": result.describe()}
        self._decide(
            RecordStepOutcome,
            step_index=work.step_index,
            dispatch=work.dispatch,
            lease_epoch=work.epoch,
            **fields,
        )

    def _gate(self, work: EvaluateGate) -> None:
        spec = self.context.catalog.get(work.tool)
        checks: list[dict[str, Any]] = [
            {"name": "lease-active", "passed": True, "detail": "no lease in this configuration"}
        ]
        for verifier in spec.verifiers:
            ok, detail = self.sim.verify(verifier, work.params, self.run_id)
            checks.append({"name": verifier, "passed": ok, "detail": detail})
        self._decide(RecordPivotGate, step_index=work.step_index, checks=canonical_json(checks))

    def _compensate(self, work: RunCompensator) -> None:
        _wait_until(work.not_before)
        result = self.sim.perform(work.operation, work.params, key=uuid.uuid4().hex, work=self.run_id)
        if result.ok:
            outcome, kind, message = "compensated", "", ""
        elif result.kind == "problem":
            error = StepError(result.problem, work.operation, result.detail, result.status)
            transient = classify(error) is ErrorClass.TRANSIENT
            outcome, kind, message = ("retriable" if transient else "fatal"), result.problem, result.detail
        else:
            outcome, kind, message = "retriable", result.kind, result.describe()
        self._decide(
            RecordCompensationOutcome,
            step_index=work.step_index,
            attempt=work.attempt,
            outcome=outcome,
            error_kind=kind,
            error_message=message,
            lease_epoch=work.epoch,
        )
