"""A Trajectory driven through its pure core the way the orchestrator drives it: the `Saga` test
builder, the reference tools' parameters and outputs, and the catalog (shared by the trajectory
tests). Nothing here touches I/O; time is a value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from services.common.contracts import (
    AbortTrajectory,
    FinishTrajectory,
    ProposeStep,
    RecordCompensationOutcome,
    RecordPivotGate,
    RecordStepOutcome,
    StartTrajectory,
    TrajectoryCommand,
    TrajectoryEvent,
)
from services.common.ids import run_id_for
from services.saga_orchestrator.domain import (
    Decision,
    DispatchStep,
    EvaluateGate,
    Rejection,
    RunCompensator,
    SagaContext,
    StepStatus,
    ToolCatalog,
    TrajectoryState,
    TrajectoryStatus,
    Work,
    decide,
    evolve,
    load_catalog,
    pending_work,
)

__all__ = [
    "CATALOG",
    "COMPENSATORS",
    "DEPLOY",
    "OUTPUTS",
    "PARAMS",
    "RUNNER_COMMANDS",
    "T0",
    "TICK_MS",
    "TOOLS_JSON",
    "UNCHECKED_CATALOG",
    "S",
    "Saga",
    "T",
    "names",
    "of_type",
    "started",
]

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
