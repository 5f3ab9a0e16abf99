"""The plan compiler (SAGA-6, SAGA-7): a proposed DAG of steps, ordered around at most one pivot.

The runner may submit its plan up front. The compiler orders it so that every reversible or
compensable step that does not need the pivot runs first, then the single pivot, then whatever
depends on the pivot (which must be idempotent, since after the pivot a failure can only be
retried or repaired, never rolled back). The order is stable: where the dependencies allow, steps
keep the order the runner proposed, so a plan that is already well-formed comes back unchanged.

A second irreversible step is staged in the outbox when it is an outbound message (released
atomically with the pivot, so the trajectory still crosses one point of no return); any other
second pivot rejects the plan with an explanation.
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.saga_orchestrator.domain.tools import ToolCatalog

__all__ = ["CompiledPlan", "PlanRejected", "PlanStep", "compile_plan", "plan_from_json"]


@dataclass(frozen=True)
class PlanStep:
    """One proposed step: a tool, its parameters and the steps (by id) it must come after."""

    step_id: str
    tool: str
    params: Mapping[str, Any] = field(default_factory=dict)
    after: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Kept a plain dict (not a proxy) so it serialises as JSON; a private copy all the same.
        object.__setattr__(self, "params", copy.deepcopy(dict(self.params)))
        object.__setattr__(self, "after", tuple(self.after))

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.step_id,
            "tool": self.tool,
            "params": copy.deepcopy(dict(self.params)),
            "after": list(self.after),
        }


@dataclass(frozen=True)
class CompiledPlan:
    """`order` is the dispatch order (before-pivot steps, the pivot, after-pivot steps); `outbox`
    holds the staged outbound messages released atomically with the pivot (not in `order`);
    `pivot` is the pivot's step id; `reordered` says the order differs from the proposal."""

    order: tuple[PlanStep, ...]
    pivot: str | None
    outbox: tuple[PlanStep, ...]
    reordered: bool

    @property
    def before_pivot(self) -> tuple[PlanStep, ...]:
        if self.pivot is None:
            return self.order
        ids = [step.step_id for step in self.order]
        return self.order[: ids.index(self.pivot)]

    @property
    def after_pivot(self) -> tuple[PlanStep, ...]:
        if self.pivot is None:
            return ()
        ids = [step.step_id for step in self.order]
        return self.order[ids.index(self.pivot) + 1 :]


class PlanRejected(ValueError):
    """The plan cannot be compiled; `code` is machine-readable, `explanation` for the runner's author."""

    def __init__(self, code: str, explanation: str, steps: Iterable[str] = ()) -> None:
        self.code = code
        self.explanation = explanation
        self.steps = tuple(steps)
        super().__init__(f"{code}: {explanation}")


def plan_from_json(entries: Any) -> tuple[PlanStep, ...]:
    """Parses [{"id", "tool", "params"?, "after"?}, ...]; malformed input -> PlanRejected(MALFORMED_PLAN)."""
    if not isinstance(entries, list):
        raise PlanRejected("MALFORMED_PLAN", f"a plan is a JSON list of steps, got {type(entries).__name__}")
    steps = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise PlanRejected("MALFORMED_PLAN", f"step {index} must be an object, got {entry!r}")
        unknown = sorted(set(entry) - {"id", "tool", "params", "after"})
        step_id, tool = entry.get("id"), entry.get("tool")
        params, after = entry.get("params", {}), entry.get("after", [])
        if unknown:
            raise PlanRejected("MALFORMED_PLAN", f"step {index} has unknown keys {', '.join(unknown)}")
        if not isinstance(step_id, str) or not step_id or not isinstance(tool, str) or not tool:
            raise PlanRejected("MALFORMED_PLAN", f"step {index} needs a non-empty string id and tool")
        if not isinstance(params, Mapping):
            raise PlanRejected("MALFORMED_PLAN", f"step {step_id!r}: params must be an object")
        if not isinstance(after, list) or not all(isinstance(item, str) for item in after):
            raise PlanRejected("MALFORMED_PLAN", f"step {step_id!r}: after must be a list of step ids")
        steps.append(PlanStep(step_id, tool, params, tuple(after)))
    return tuple(steps)


def _stable_topological(
    ids: Sequence[str], deps: Mapping[str, tuple[str, ...]], position: Mapping[str, int]
) -> tuple[list[str], set[str]]:
    """Kahn's algorithm, always taking the earliest proposed step that is ready. Dependencies on
    ids outside `ids` count as already satisfied. Returns the order and the ids left in cycles."""
    members = set(ids)
    waiting = {step: {dep for dep in deps[step] if dep in members} for step in ids}
    dependants: dict[str, list[str]] = {step: [] for step in ids}
    for step in ids:
        for dep in waiting[step]:
            dependants[dep].append(step)
    ready = [(position[step], step) for step in ids if not waiting[step]]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, step = heapq.heappop(ready)
        order.append(step)
        for dependant in dependants[step]:
            waiting[dependant].discard(step)
            if not waiting[dependant]:
                heapq.heappush(ready, (position[dependant], dependant))
    return order, members - set(order)


def _describe_cycle(
    stuck: set[str], deps: Mapping[str, tuple[str, ...]], position: Mapping[str, int]
) -> list[str]:
    # Every stuck step waits on another stuck step, so walking "needs" edges must revisit one.
    start = min(stuck, key=position.__getitem__)
    path: list[str] = []
    seen: dict[str, int] = {}
    current = start
    while current not in seen:
        seen[current] = len(path)
        path.append(current)
        current = min((dep for dep in deps[current] if dep in stuck), key=position.__getitem__)
    return [*path[seen[current] :], current]


def compile_plan(steps: Sequence[PlanStep], catalog: ToolCatalog) -> CompiledPlan:
    """SAGA-7: order a proposed DAG so that every class I/II step not depending on the pivot runs
    before it; raises PlanRejected (DUPLICATE_STEP, UNKNOWN_TOOL, UNKNOWN_DEPENDENCY, CYCLE,
    TWO_PIVOTS, NON_IDEMPOTENT_AFTER_PIVOT)."""
    ids = [step.step_id for step in steps]
    by_id: dict[str, PlanStep] = {}
    for step in steps:
        if step.step_id in by_id:
            raise PlanRejected("DUPLICATE_STEP", f"step id {step.step_id!r} is used twice", [step.step_id])
        by_id[step.step_id] = step
    for step in steps:
        if step.tool not in catalog:
            raise PlanRejected(
                "UNKNOWN_TOOL",
                f"step {step.step_id!r} uses tool {step.tool!r}, which is not registered (registered: "
                f"{', '.join(catalog.names()) or 'none'})",
                [step.step_id],
            )
        missing = [dep for dep in step.after if dep not in by_id]
        if missing:
            raise PlanRejected(
                "UNKNOWN_DEPENDENCY",
                f"step {step.step_id!r} comes after {', '.join(map(repr, missing))}, "
                "which the plan does not contain",
                [step.step_id],
            )
    position = {step_id: index for index, step_id in enumerate(ids)}
    deps = {step.step_id: tuple(dict.fromkeys(step.after)) for step in steps}
    full_order, stuck = _stable_topological(ids, deps, position)
    if stuck:
        cycle = _describe_cycle(stuck, deps, position)
        raise PlanRejected(
            "CYCLE",
            "the plan's dependencies form a cycle: " + " needs ".join(map(repr, cycle)),
            cycle[:-1],
        )
    ancestors: dict[str, frozenset[str]] = {}
    for step_id in full_order:
        reached: set[str] = set(deps[step_id])
        for dep in deps[step_id]:
            reached |= ancestors[dep]
        ancestors[step_id] = frozenset(reached)

    specs = {step.step_id: catalog.get(step.tool) for step in steps}
    pivots = [step_id for step_id in ids if specs[step_id].is_pivot]
    if not pivots:
        order = tuple(by_id[step_id] for step_id in full_order)
        return CompiledPlan(order, None, (), full_order != ids)

    stationary = [step_id for step_id in pivots if not specs[step_id].outbound]
    if len(stationary) >= 2:
        first, second = stationary[0], stationary[1]
        raise PlanRejected(
            "TWO_PIVOTS",
            f"steps {first!r} ({by_id[first].tool}) and {second!r} ({by_id[second].tool}) are both class III "
            "(irreversible) and neither is an outbound message that could wait in the outbox; a trajectory "
            "crosses at most one pivot (SAGA-6), so split the plan into two runs",
            stationary,
        )
    if stationary:
        pivot = stationary[0]
    else:
        # Only outbound messages: the earliest one that needs no other irreversible step is the pivot.
        pivot = next(step_id for step_id in pivots if not ancestors[step_id] & set(pivots))
    staged = [step_id for step_id in pivots if step_id != pivot]
    for step_id in staged:
        if step_id in ancestors[pivot]:
            raise PlanRejected(
                "TWO_PIVOTS",
                f"outbound step {step_id!r} ({by_id[step_id].tool}) would have to be sent before the pivot "
                f"{pivot!r} ({by_id[pivot].tool}), which depends on it, so it cannot wait in the outbox "
                "to be released with the pivot; a trajectory crosses at most one pivot (SAGA-6)",
                [pivot, step_id],
            )
    group = {pivot, *staged}
    after_pivot = [step_id for step_id in ids if step_id not in group and ancestors[step_id] & group]
    for step_id in staged:
        blocking = sorted(ancestors[step_id] & set(after_pivot), key=position.__getitem__)
        if blocking:
            raise PlanRejected(
                "TWO_PIVOTS",
                f"outbound step {step_id!r} ({by_id[step_id].tool}) needs "
                f"{', '.join(map(repr, blocking))}, which run after the pivot {pivot!r}, so it cannot be "
                "released atomically with the pivot; a trajectory crosses at most one pivot (SAGA-6)",
                [pivot, step_id],
            )
    for step_id in [*staged, *after_pivot]:
        if not specs[step_id].idempotent:
            where = "is staged in the outbox" if step_id in staged else f"depends on the pivot {pivot!r}"
            raise PlanRejected(
                "NON_IDEMPOTENT_AFTER_PIVOT",
                f"step {step_id!r} ({by_id[step_id].tool}) {where}, so it runs after the point of no return, "
                "where failures can only be retried; its tool is not idempotent (SAGA-6)",
                [step_id],
            )
    after_set = set(after_pivot)
    before = [step_id for step_id in ids if step_id not in group and step_id not in after_set]
    before_order, _ = _stable_topological(before, deps, position)
    after_order, _ = _stable_topological(after_pivot, deps, position)
    outbox_order, _ = _stable_topological(staged, deps, position)
    order_ids = [*before_order, pivot, *after_order]
    proposed_without_outbox = [step_id for step_id in ids if step_id not in staged]
    return CompiledPlan(
        order=tuple(by_id[step_id] for step_id in order_ids),
        pivot=pivot,
        outbox=tuple(by_id[step_id] for step_id in outbox_order),
        reordered=order_ids != proposed_without_outbox,
    )
