"""The fault-injection workload (DUR-3), pure and seeded: trajectories, the agent, the fault plan.

Everything here is a function of the seed, so every configuration of one benchmark run sees the
same trajectories, the same model mistakes and the same faults, and a run can be reproduced.

- A trajectory (``TrajectorySpec``) is 6-10 sysadmin turns against the simulated environment's
  reference tools: ``vm.provision`` first, then creating steps (IP, sandbox build, firewall rule,
  payment hold), the single pivot ``dns.publish`` last or second to last, and after it optionally
  one post-pivot step (``notify.send`` or ``cache.warm``). Every turn's payload carries a value
  unique to (trajectory, turn) in its *key field*, so the environment's audit can tell which turn
  a resource belongs to and whether a turn's effect was applied twice.
- The agent (the stand-in for the model, ``propose``): with probability ``q_sem`` a turn's first
  proposal carries a semantic error that reaches the tool; a repair fixes it with ``p_fix``,
  reintroduces the FIRST error with ``p_osc`` (an oscillation: anti-spin must stop it) and
  otherwise makes a new mistake. Mistakes are words without digits, because REC-5 normalises
  numbers away when it compares two errors.
- The fault plan (``TurnFault`` per turn): 20% of turns by default: 8% network drops (request lost
  / answer lost), 6% tool exceptions (2/3 transient 429/503, 1/3 fatal 403/507), 4% host process
  kills (before dispatch / after the effect; for Tenure a quarter of them kill one of its own
  processes instead), 2% format corruption (a malformed tool answer / a malformed proposal).
  Environment faults are armed with ``env_fault`` right before the turn's first dispatch, limited
  to the trajectory's work id and to the turn's key field, so they fire on that turn only.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "FAULT_PROCESSES",
    "KEY_FIELDS",
    "MISTAKES",
    "NETWORK_DELAY_S",
    "PIVOT_TOOL",
    "POST_PIVOT_TOOLS",
    "PRE_PIVOT_TOOLS",
    "RERUN_COST_MONEY",
    "RERUN_COST_MS",
    "VM_BINDING",
    "AgentPolicy",
    "FaultKind",
    "FaultProfile",
    "MalformedProposal",
    "PlannedStep",
    "Proposal",
    "TrajectorySpec",
    "TurnFault",
    "draw_fault",
    "env_fault",
    "fault_counts",
    "generate",
    "make_spec",
    "mistakes_of_turn",
    "plan_step_id",
    "propose",
    "resource_ids",
    "turn_of_plan_step",
    "work_id",
]

PRE_PIVOT_TOOLS = ("ip.reserve", "sandbox.compile", "firewall.write", "payment.hold")
PIVOT_TOOL = "dns.publish"
POST_PIVOT_TOOLS = ("notify.send", "cache.warm")
VM_BINDING = "$vmId"  # a parameter taken from the output of the trajectory's vm.provision turn
# The payload field of each tool whose value is unique per (trajectory, turn): faults match on it,
# the agent's mistakes change it, the outcome classifier maps resources back to turns with it.
KEY_FIELDS: Mapping[str, str] = {
    "vm.provision": "name",
    "ip.reserve": "region",
    "sandbox.compile": "source",
    "firewall.write": "port",
    "payment.hold": "account",
    "dns.publish": "name",
    "notify.send": "text",
    "cache.warm": "name",
}
# Tenure's own processes a host-kill fault may hit instead of the runner (config 4 only).
FAULT_PROCESSES = ("saga-orchestrator", "lease-coordinator", "effect-gateway", "projections", "command-api")
# Words, not numbers: the error signature (REC-5) replaces numbers, so "error 1" and "error 2"
# would read as the same error.
MISTAKES = (
    "undefined-symbol",
    "wrong-type",
    "missing-import",
    "stale-reference",
    "unknown-field",
    "bad-indentation",
    "misspelt-name",
    "wrong-unit",
    "off-by-one",
    "unquoted-string",
    "swapped-arguments",
    "null-dereference",
)
# How late the environment answers a dropped request or a lost answer: longer than any runner's
# own timeout, so the runner sees a timeout.
NETWORK_DELAY_S = 3.0
# R of the recovery policy's economics (REC-4): what re-running a rolled-back trajectory costs
# (the seed's worked example: 46 s of agent time and $0.162 of model calls).
RERUN_COST_MS = 46_000
RERUN_COST_MONEY = 0.162
_PORT_BASE = 1024
_BAD_PORT_OFFSET = 20_000


def _rng(*parts: object) -> random.Random:
    """A generator fixed by its parts alone (not by Python's per-process hash seed)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).digest()
    return random.Random(int.from_bytes(digest[:16], "big"))


def work_id(trajectory_id: str) -> str:
    """The X-Work-Id the ablation runners send for a trajectory (Tenure sends its run id)."""
    return f"traj-{trajectory_id}"


# --- trajectories -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedStep:
    """One turn as the agent means it. ``params`` may hold ``VM_BINDING`` (bound at run time)."""

    turn: int
    tool: str
    params: Mapping[str, Any]

    @property
    def key_field(self) -> str:
        return KEY_FIELDS[self.tool]

    @property
    def key_value(self) -> Any:
        return self.params[self.key_field]

    @property
    def identity(self) -> dict[str, Any]:
        """The parameters fixed before the run (everything but run-time bindings)."""
        return {name: value for name, value in self.params.items() if value != VM_BINDING}

    def bind(self, vm_id: str | None) -> dict[str, Any]:
        """The payload with the VM id filled in; a missing VM leaves the placeholder (the tool
        then refuses it: a turn cannot use a VM the run does not know)."""
        return {
            name: (vm_id if value == VM_BINDING and vm_id is not None else value)
            for name, value in self.params.items()
        }

    def to_json(self) -> dict[str, Any]:
        return {"turn": self.turn, "tool": self.tool, "params": dict(self.params)}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> PlannedStep:
        return cls(int(body["turn"]), str(body["tool"]), dict(body["params"]))


class FaultKind(StrEnum):
    REQUEST_LOST = "request-lost"  # network drop: the request never reached the tool
    ANSWER_LOST = "answer-lost"  # network drop: the tool committed, the answer was lost
    TRANSIENT_ERROR = "transient-error"  # tool exception: 429 rate-limited / 503 unavailable
    FATAL_ERROR = "fatal-error"  # tool exception: 403 auth-revoked / 507 exhausted
    KILL = "kill"  # SIGKILL of the runner (or, for Tenure, of one of its processes)
    CORRUPT_ANSWER = "corrupt-answer"  # format corruption: the tool's answer is malformed
    MALFORMED_PROPOSAL = "malformed-proposal"  # format corruption: the agent's params are malformed

    @property
    def category(self) -> str:
        return _CATEGORIES[self]


_CATEGORIES = {
    FaultKind.REQUEST_LOST: "network",
    FaultKind.ANSWER_LOST: "network",
    FaultKind.TRANSIENT_ERROR: "tool-exception",
    FaultKind.FATAL_ERROR: "tool-exception",
    FaultKind.KILL: "kill",
    FaultKind.CORRUPT_ANSWER: "format",
    FaultKind.MALFORMED_PROPOSAL: "format",
}


@dataclass(frozen=True)
class TurnFault:
    """The fault planned for one turn.

    ``problem``/``status``: the tool error of a transient or fatal exception. ``point``: where a
    kill happens ("before-dispatch" or "after-effect": the tool applied the effect, the runner has
    not recorded the answer). ``tenure_process``: set on a quarter of kills; Tenure's runner then
    kills that process instead of itself (the ablations, which have no such process, kill the
    runner). ``malformed``: "invalid-json" or "schema-violation"."""

    kind: FaultKind
    problem: str = ""
    status: int = 0
    point: str = ""
    tenure_process: str = ""
    malformed: str = ""

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": self.kind.value}
        for name in ("problem", "status", "point", "tenure_process", "malformed"):
            if getattr(self, name):
                body[name] = getattr(self, name)
        return body

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> TurnFault:
        return cls(
            FaultKind(body["kind"]),
            problem=str(body.get("problem", "")),
            status=int(body.get("status", 0)),
            point=str(body.get("point", "")),
            tenure_process=str(body.get("tenure_process", "")),
            malformed=str(body.get("malformed", "")),
        )


@dataclass(frozen=True)
class FaultProfile:
    """Shares of turns per fault category (DUR-3's profile by default) and the splits inside."""

    network_drop: float = 0.08
    tool_exception: float = 0.06
    host_kill: float = 0.04
    format_corruption: float = 0.02
    transient_share: float = 2 / 3  # of tool exceptions
    tenure_process_share: float = 0.25  # of kills

    def __post_init__(self) -> None:
        shares = (self.network_drop, self.tool_exception, self.host_kill, self.format_corruption)
        if any(share < 0 for share in shares) or sum(shares) > 1:
            raise ValueError(f"fault shares must be >= 0 and sum to at most 1, got {shares}")
        for name in ("transient_share", "tenure_process_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} is a probability, got {getattr(self, name)}")

    @property
    def total(self) -> float:
        return self.network_drop + self.tool_exception + self.host_kill + self.format_corruption

    def to_json(self) -> dict[str, float]:
        return {
            "networkDrop": self.network_drop,
            "toolException": self.tool_exception,
            "hostKill": self.host_kill,
            "formatCorruption": self.format_corruption,
            "transientShare": self.transient_share,
            "tenureProcessShare": self.tenure_process_share,
        }


@dataclass(frozen=True)
class AgentPolicy:
    """The simulated model's reliability: see the module docstring."""

    q_sem: float = 0.15
    p_fix: float = 0.8
    p_osc: float = 0.1
    max_attempts: int = 8

    def __post_init__(self) -> None:
        for name in ("q_sem", "p_fix", "p_osc"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} is a probability, got {getattr(self, name)}")
        if self.p_fix + self.p_osc > 1:
            raise ValueError(f"p_fix + p_osc must not exceed 1, got {self.p_fix + self.p_osc}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")

    def to_json(self) -> dict[str, Any]:
        return {"qSem": self.q_sem, "pFix": self.p_fix, "pOsc": self.p_osc, "maxAttempts": self.max_attempts}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> AgentPolicy:
        return cls(float(body["qSem"]), float(body["pFix"]), float(body["pOsc"]), int(body["maxAttempts"]))


@dataclass(frozen=True)
class TrajectorySpec:
    """One trajectory: its steps, the fault planned for each turn (None: no fault) and the agent."""

    trajectory_id: str
    seed: int
    steps: tuple[PlannedStep, ...]
    faults: tuple[TurnFault | None, ...] = ()
    policy: AgentPolicy = field(default_factory=AgentPolicy)

    def __post_init__(self) -> None:
        if not self.faults:
            object.__setattr__(self, "faults", (None,) * len(self.steps))
        if len(self.faults) != len(self.steps):
            raise ValueError(f"{len(self.steps)} steps but {len(self.faults)} planned faults")

    @property
    def work_id(self) -> str:
        return work_id(self.trajectory_id)

    @property
    def pivot_turn(self) -> int:
        return next(step.turn for step in self.steps if step.tool == PIVOT_TOOL)

    def fault(self, turn: int) -> TurnFault | None:
        return self.faults[turn]

    def plan(self) -> list[dict[str, Any]]:
        """The trajectory as a plan for the saga orchestrator (SAGA-7): one step per turn, id
        ``t<turn>``, each after the previous. A post-pivot ``notify.send`` is an outbound message
        the plan compiler stages in the outbox, released with the pivot (the saga refuses a second
        irreversible step proposed on its own). ``$vmId`` parameters are bound when proposed."""
        return [
            {
                "stepId": plan_step_id(step.turn),
                "tool": step.tool,
                "params": dict(step.params),
                "after": [plan_step_id(step.turn - 1)] if step.turn else [],
            }
            for step in self.steps
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "trajectoryId": self.trajectory_id,
            "seed": self.seed,
            "steps": [step.to_json() for step in self.steps],
            "faults": [None if fault is None else fault.to_json() for fault in self.faults],
            "policy": self.policy.to_json(),
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> TrajectorySpec:
        return cls(
            trajectory_id=str(body["trajectoryId"]),
            seed=int(body["seed"]),
            steps=tuple(PlannedStep.from_json(step) for step in body["steps"]),
            faults=tuple(None if f is None else TurnFault.from_json(f) for f in body["faults"]),
            policy=AgentPolicy.from_json(body["policy"]),
        )


def plan_step_id(turn: int) -> str:
    return f"t{turn}"


def turn_of_plan_step(step_id: str) -> int | None:
    """The turn of a plan step id ``t<turn>`` (None for anything else)."""
    return int(step_id[1:]) if step_id[:1] == "t" and step_id[1:].isdigit() else None


def _params(tool: str, tid: str, turn: int) -> dict[str, Any]:
    marker = f"{tid}-t{turn}"
    if tool == "vm.provision":
        return {"name": marker}
    if tool == "ip.reserve":
        return {"region": marker}
    if tool == "sandbox.compile":
        return {"vmId": VM_BINDING, "source": f"// {marker}\nint main(void) {{ return 0; }}\n"}
    if tool == "firewall.write":
        return {"vmId": VM_BINDING, "port": _PORT_BASE + turn}
    if tool == "payment.hold":
        return {"account": marker, "amount": 12.5}
    if tool == "dns.publish":
        return {"name": f"{tid}.example.test", "address": "192.0.2.10"}
    if tool == "notify.send":
        return {"to": "ops@example.test", "text": f"{marker}: deployed"}
    if tool == "cache.warm":
        return {"name": marker}
    raise ValueError(f"no parameters for tool {tool!r}")


def draw_fault(rng: random.Random, profile: FaultProfile) -> TurnFault | None:
    """One turn's fault: the category by the profile's shares, then the variant inside it."""
    u = rng.random()
    if u < profile.network_drop:
        return TurnFault(FaultKind.REQUEST_LOST if rng.random() < 0.5 else FaultKind.ANSWER_LOST)
    u -= profile.network_drop
    if u < profile.tool_exception:
        if rng.random() < profile.transient_share:
            problem, status = rng.choice((("rate-limited", 429), ("unavailable", 503)))
            return TurnFault(FaultKind.TRANSIENT_ERROR, problem=problem, status=status)
        problem, status = rng.choice((("auth-revoked", 403), ("exhausted", 507)))
        return TurnFault(FaultKind.FATAL_ERROR, problem=problem, status=status)
    u -= profile.tool_exception
    if u < profile.host_kill:
        point = rng.choice(("before-dispatch", "after-effect"))
        process = rng.choice(FAULT_PROCESSES) if rng.random() < profile.tenure_process_share else ""
        return TurnFault(FaultKind.KILL, point=point, tenure_process=process)
    u -= profile.host_kill
    if u < profile.format_corruption:
        if rng.random() < 0.5:
            return TurnFault(FaultKind.CORRUPT_ANSWER)
        return TurnFault(
            FaultKind.MALFORMED_PROPOSAL, malformed=rng.choice(("invalid-json", "schema-violation"))
        )
    return None


def make_spec(
    seed: int, index: int, profile: FaultProfile | None = None, policy: AgentPolicy | None = None
) -> TrajectorySpec:
    """Trajectory ``index`` of the benchmark seeded ``seed``."""
    profile = profile or FaultProfile()
    tid = f"s{seed}-{index:05d}"
    rng = _rng("spec", seed, index)
    length = rng.randint(6, 10)
    post_pivot = rng.random() < 0.5
    pivot = length - 2 if post_pivot else length - 1
    tools = ["vm.provision", *(rng.choice(PRE_PIVOT_TOOLS) for _ in range(pivot - 1)), PIVOT_TOOL]
    if post_pivot:
        tools.append(rng.choice(POST_PIVOT_TOOLS))
    steps = tuple(PlannedStep(turn, tool, _params(tool, tid, turn)) for turn, tool in enumerate(tools))
    faults = tuple(draw_fault(_rng("fault", seed, tid, turn), profile) for turn in range(length))
    return TrajectorySpec(tid, int(rng.getrandbits(63)), steps, faults, policy or AgentPolicy())


def generate(
    seed: int, count: int, profile: FaultProfile | None = None, policy: AgentPolicy | None = None
) -> list[TrajectorySpec]:
    """The benchmark's trajectories: the same seed gives the same specs and fault plans."""
    if count < 0:
        raise ValueError(f"count must not be negative, got {count}")
    return [make_spec(seed, index, profile, policy) for index in range(count)]


# --- the agent ----------------------------------------------------------------------------------


class MalformedProposal(ValueError):
    """The agent's parameters are not a JSON object (format corruption of a proposal)."""


def mistakes_of_turn(spec: TrajectorySpec, turn: int, rerun: int = 0) -> tuple[str | None, ...]:
    """The mistake of each successive proposal of ``turn`` (None: correct). Attempt 0 is the first
    proposal, attempt k the k-th repair. Ends with None once fixed; a turn still wrong after
    ``max_attempts`` proposals ends with its last mistake (``propose`` repeats it from then on).
    ``rerun``: a trajectory run again after a clean rollback asks the model afresh, so it draws
    its mistakes anew (rerun 0 is the first run)."""
    policy = spec.policy
    rng = (
        _rng("agent", spec.seed, spec.trajectory_id, turn)
        if not rerun
        else _rng("agent", spec.seed, spec.trajectory_id, turn, "rerun", rerun)
    )
    if rng.random() >= policy.q_sem:
        return (None,)
    first = rng.choice(MISTAKES)
    sequence: list[str | None] = [first]
    seen = {first}
    while len(sequence) < policy.max_attempts:
        u = rng.random()
        if u < policy.p_fix:
            sequence.append(None)
            break
        if u < policy.p_fix + policy.p_osc:
            sequence.append(first)  # oscillation: the repair reintroduces the first error
            continue
        fresh = [m for m in MISTAKES if m not in seen] or list(MISTAKES)
        mistake = rng.choice(fresh)
        seen.add(mistake)
        sequence.append(mistake)
    return tuple(sequence)


@dataclass(frozen=True)
class Proposal:
    """What the agent proposes: ``params_text`` is JSON text (malformed on a format fault).

    ``faults``: environment faults (without ``workId``) the runner arms before dispatching it, so
    the tool rejects the mistake; a compile mistake needs none (the sandbox refuses it)."""

    turn: int
    attempt: int
    tool: str
    params_text: str
    mistake: str | None = None
    malformed: str = ""
    faults: tuple[dict[str, Any], ...] = ()

    @property
    def correct(self) -> bool:
        return self.mistake is None and not self.malformed

    def params(self) -> dict[str, Any]:
        """The parameters as a dict; raises MalformedProposal when they are not a JSON object."""
        try:
            value = json.loads(self.params_text)
        except ValueError as exc:
            raise MalformedProposal(f"turn {self.turn}: params are not JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise MalformedProposal(f"turn {self.turn}: params are not a JSON object")
        return value


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _with_mistake(step: PlannedStep, payload: dict[str, Any], mistake: str) -> tuple[dict[str, Any], Any]:
    """The payload with ``mistake`` in its key field, and the wrong value there."""
    wrong = dict(payload)
    if step.tool == "sandbox.compile":
        wrong["source"] = f"{payload['source']}syntax-error: {mistake}\n"
    elif step.tool == "firewall.write":
        wrong["port"] = int(payload["port"]) + _BAD_PORT_OFFSET + 1000 * MISTAKES.index(mistake)
    else:
        wrong[step.key_field] = f"{payload[step.key_field]}~{mistake}"
    return wrong, wrong[step.key_field]


def propose(
    spec: TrajectorySpec, turn: int, attempt: int, vm_id: str | None, *, malformed: str = "", rerun: int = 0
) -> Proposal:
    """The agent's proposal for ``turn``: attempt 0 first, then repair ``attempt`` (deterministic).

    ``malformed`` ("invalid-json" / "schema-violation") makes this one proposal malformed; the
    runner re-proposes (same attempt) once the format error is reported back."""
    step = spec.steps[turn]
    payload = step.bind(vm_id)
    if malformed == "invalid-json":
        return Proposal(turn, attempt, step.tool, _canonical(payload)[:-2], malformed=malformed)
    if malformed == "schema-violation":
        broken = {name: value for name, value in payload.items() if name != step.key_field}
        return Proposal(turn, attempt, step.tool, _canonical(broken), malformed=malformed)
    if malformed:
        raise ValueError(f"unknown malformation {malformed!r}")
    mistakes = mistakes_of_turn(spec, turn, rerun)
    mistake = mistakes[min(attempt, len(mistakes) - 1)]
    if mistake is None:
        return Proposal(turn, attempt, step.tool, _canonical(payload))
    wrong, wrong_value = _with_mistake(step, payload, mistake)
    faults: tuple[dict[str, Any], ...] = ()
    if step.tool != "sandbox.compile":
        faults = (
            {
                "operation": step.tool,
                "kind": "error",
                "problem": "schema-invalid",
                "detail": f"payload.{step.key_field}: {mistake}",
                "match": {step.key_field: wrong_value},
                "times": 1000,  # the same mistake proposed again fails again
            },
        )
    return Proposal(turn, attempt, step.tool, _canonical(wrong), mistake=mistake, faults=faults)


# --- environment faults -------------------------------------------------------------------------


def env_fault(
    spec: TrajectorySpec, turn: int, work: str, *, delay_s: float = NETWORK_DELAY_S
) -> dict[str, Any] | None:
    """The ``POST /faults`` body for ``turn``'s planned fault, or None when the fault is not one
    the environment plays (none, a kill, a malformed proposal). ``work`` is the X-Work-Id the
    effect will carry (Tenure: the run id; the ablations: ``spec.work_id``)."""
    fault = spec.fault(turn)
    if fault is None:
        return None
    step = spec.steps[turn]
    base: dict[str, Any] = {"operation": step.tool, "workId": work, "match": {step.key_field: step.key_value}}
    if fault.kind is FaultKind.REQUEST_LOST:
        return {**base, "kind": "timeout-before-commit", "delayS": delay_s}
    if fault.kind is FaultKind.ANSWER_LOST:
        return {**base, "kind": "timeout-after-commit", "delayS": delay_s}
    if fault.kind is FaultKind.TRANSIENT_ERROR:
        return {**base, "kind": "error", "problem": fault.problem, "status": fault.status, "delayS": 0.0}
    if fault.kind is FaultKind.FATAL_ERROR:
        # Revoked credentials and an exhausted quota stay so: every retry of the turn meets them.
        return {**base, "kind": "error", "problem": fault.problem, "status": fault.status, "times": 1000}
    if fault.kind is FaultKind.CORRUPT_ANSWER:
        return {**base, "kind": "corrupt-answer"}
    return None


def fault_counts(specs: Iterable[TrajectorySpec]) -> dict[str, int]:
    """Turns per fault kind (and "none", "turns") over ``specs``: what a run injects at most."""
    counts: dict[str, int] = {"turns": 0, "none": 0}
    for spec in specs:
        for fault in spec.faults:
            counts["turns"] += 1
            key = "none" if fault is None else fault.kind.value
            counts[key] = counts.get(key, 0) + 1
    return counts


def resource_ids(output: Mapping[str, Any] | None) -> list[str]:
    """The resource ids a tool's output names (every string field ending in "Id")."""
    if not isinstance(output, Mapping):
        return []
    return sorted(str(v) for k, v in output.items() if k.endswith("Id") and isinstance(v, str))
