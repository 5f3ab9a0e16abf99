"""The plan compiler, pure: SAGA-7 (a proposed DAG is reordered so that every reversible and
compensable step that does not need the pivot runs before it) and SAGA-6 (at most one pivot; after
it only idempotent steps; a second outbound irreversible step waits in the outbox).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.saga_orchestrator.domain.plan import (
    CompiledPlan,
    PlanRejected,
    PlanStep,
    compile_plan,
    plan_from_json,
)
from services.saga_orchestrator.domain.tools import (
    CompensatorSpec,
    Cost,
    Reversibility,
    ToolCatalog,
    ToolDomain,
    ToolSpec,
)


def compensable(
    name: str, *, idempotent: bool = True, reversibility: Reversibility = Reversibility.COMPENSABLE
) -> ToolSpec:
    return ToolSpec(
        name=name,
        gateway_tool="env",
        operation=name,
        reversibility=reversibility,
        domain=ToolDomain.LOCAL if reversibility is Reversibility.REVERSIBLE else ToolDomain.INTERNAL,
        idempotent=idempotent,
        cost=Cost(100, 0.0),
        compensator=CompensatorSpec(f"undo.{name}", {"id": "output.id"}),
    )


def pivot(name: str, *, outbound: bool = False, idempotent: bool = True) -> ToolSpec:
    return ToolSpec(
        name=name,
        gateway_tool="env",
        operation=name,
        reversibility=Reversibility.PIVOT,
        domain=ToolDomain.EXTERNAL,
        idempotent=idempotent,
        outbound=outbound,
    )


def catalog_of(*specs: ToolSpec) -> ToolCatalog:
    catalog = ToolCatalog()
    for spec in specs:
        catalog = catalog.register(spec)
    return catalog


CATALOG = catalog_of(
    compensable("vm.provision"),
    compensable("ip.reserve"),
    compensable("build.compile", reversibility=Reversibility.REVERSIBLE),
    compensable("firewall.write"),
    compensable("payment.hold", idempotent=False),
    compensable("cache.warm"),
    pivot("dns.publish"),
    pivot("payment.capture"),
    pivot("email.send", outbound=True),
    pivot("webhook.notify", outbound=True),
    pivot("sms.send", outbound=True, idempotent=False),
)


def ids(steps: tuple[PlanStep, ...]) -> list[str]:
    return [step.step_id for step in steps]


def test_saga7_the_pivot_proposed_early_is_moved_after_every_independent_step() -> None:
    """SAGA-7: the seed's deploy with DNS proposed second: every I/II step not needing DNS runs first."""
    plan = [
        PlanStep("vm", "vm.provision"),
        PlanStep("dns", "dns.publish", {"name": "app.example"}, after=("vm",)),
        PlanStep("ip", "ip.reserve"),
        PlanStep("build", "build.compile", after=("vm",)),
        PlanStep("fw", "firewall.write", after=("vm", "ip")),
    ]
    compiled = compile_plan(plan, CATALOG)
    assert ids(compiled.order) == ["vm", "ip", "build", "fw", "dns"]
    assert compiled.pivot == "dns" and compiled.reordered and compiled.outbox == ()
    assert ids(compiled.before_pivot) == ["vm", "ip", "build", "fw"] and compiled.after_pivot == ()
    assert compiled.order[-1].params == {"name": "app.example"}


def test_saga7_steps_that_need_the_pivot_run_after_it() -> None:
    """SAGA-6/SAGA-7: a step depending (transitively) on the pivot stays after it; others go before."""
    plan = [
        PlanStep("vm", "vm.provision"),
        PlanStep("dns", "dns.publish", after=("vm",)),
        PlanStep("warm", "cache.warm", after=("dns",)),
        PlanStep("fw", "firewall.write", after=("warm",)),
        PlanStep("ip", "ip.reserve"),
    ]
    compiled = compile_plan(plan, CATALOG)
    assert ids(compiled.order) == ["vm", "ip", "dns", "warm", "fw"]
    assert ids(compiled.after_pivot) == ["warm", "fw"]


def test_saga7_a_well_formed_plan_is_kept_as_proposed() -> None:
    plan = [PlanStep("b", "build.compile"), PlanStep("vm", "vm.provision"), PlanStep("d", "dns.publish")]
    compiled = compile_plan(plan, CATALOG)
    assert ids(compiled.order) == ["b", "vm", "d"] and not compiled.reordered


def test_saga7_a_plan_without_pivot_is_only_ordered_topologically() -> None:
    plan = [PlanStep("fw", "firewall.write", after=("vm",)), PlanStep("vm", "vm.provision")]
    compiled = compile_plan(plan, CATALOG)
    assert ids(compiled.order) == ["vm", "fw"] and compiled.pivot is None and compiled.reordered
    assert compiled.before_pivot == compiled.order


def test_saga6_two_pivots_are_rejected_with_an_explanation_naming_both() -> None:
    """SAGA-6/SAGA-7: two non-outbound irreversible steps cannot share one trajectory."""
    plan = [
        PlanStep("vm", "vm.provision"),
        PlanStep("dns", "dns.publish"),
        PlanStep("charge", "payment.capture", after=("vm",)),
    ]
    with pytest.raises(PlanRejected) as caught:
        compile_plan(plan, CATALOG)
    assert caught.value.code == "TWO_PIVOTS"
    assert "'dns'" in caught.value.explanation and "'charge'" in caught.value.explanation
    assert "dns.publish" in caught.value.explanation and "payment.capture" in caught.value.explanation
    assert caught.value.steps == ("dns", "charge")
    assert str(caught.value).startswith("TWO_PIVOTS: ")


def test_saga7_a_second_outbound_pivot_is_staged_in_the_outbox() -> None:
    """SAGA-7: an outbound message is released atomically with the pivot instead of being a second one."""
    plan = [
        PlanStep("mail", "email.send", {"to": "ops@example.com"}),
        PlanStep("vm", "vm.provision"),
        PlanStep("dns", "dns.publish", after=("vm",)),
        PlanStep("hook", "webhook.notify", after=("dns",)),
        PlanStep("warm", "cache.warm", after=("hook",)),
    ]
    compiled = compile_plan(plan, CATALOG)
    assert compiled.pivot == "dns"
    assert ids(compiled.outbox) == ["mail", "hook"]
    assert ids(compiled.order) == ["vm", "dns", "warm"]
    assert compiled.outbox[0].params == {"to": "ops@example.com"}


def test_saga7_with_only_outbound_pivots_the_first_is_the_pivot_and_the_rest_wait() -> None:
    plan = [
        PlanStep("hook", "webhook.notify", after=("mail",)),
        PlanStep("mail", "email.send", after=("vm",)),
        PlanStep("vm", "vm.provision"),
    ]
    compiled = compile_plan(plan, CATALOG)
    assert compiled.pivot == "mail" and ids(compiled.outbox) == ["hook"]
    assert ids(compiled.order) == ["vm", "mail"]


def test_saga7_an_outbound_step_the_pivot_needs_cannot_be_staged() -> None:
    plan = [PlanStep("mail", "email.send"), PlanStep("dns", "dns.publish", after=("mail",))]
    with pytest.raises(PlanRejected, match="cannot wait in the outbox") as caught:
        compile_plan(plan, CATALOG)
    assert caught.value.code == "TWO_PIVOTS"


def test_saga7_an_outbound_step_after_post_pivot_work_cannot_be_released_with_the_pivot() -> None:
    plan = [
        PlanStep("dns", "dns.publish"),
        PlanStep("warm", "cache.warm", after=("dns",)),
        PlanStep("mail", "email.send", after=("warm",)),
    ]
    with pytest.raises(PlanRejected, match="released atomically") as caught:
        compile_plan(plan, CATALOG)
    assert caught.value.code == "TWO_PIVOTS" and "'warm'" in caught.value.explanation


def test_saga6_a_non_idempotent_step_after_the_pivot_is_rejected() -> None:
    """SAGA-6: after the pivot failures can only be retried, so every later step must be idempotent."""
    plan = [PlanStep("dns", "dns.publish"), PlanStep("hold", "payment.hold", after=("dns",))]
    with pytest.raises(PlanRejected) as caught:
        compile_plan(plan, CATALOG)
    assert caught.value.code == "NON_IDEMPOTENT_AFTER_PIVOT" and "'hold'" in caught.value.explanation
    before = compile_plan([PlanStep("dns", "dns.publish"), PlanStep("hold", "payment.hold")], CATALOG)
    assert ids(before.order) == ["hold", "dns"]
    with pytest.raises(PlanRejected, match="outbox") as outbox:
        compile_plan([PlanStep("dns", "dns.publish"), PlanStep("sms", "sms.send")], CATALOG)
    assert outbox.value.code == "NON_IDEMPOTENT_AFTER_PIVOT"


def test_saga7_cycles_are_rejected_naming_the_cycle() -> None:
    plan = [
        PlanStep("vm", "vm.provision"),
        PlanStep("a", "ip.reserve", after=("c", "vm")),
        PlanStep("b", "firewall.write", after=("a",)),
        PlanStep("c", "cache.warm", after=("b",)),
    ]
    with pytest.raises(PlanRejected) as caught:
        compile_plan(plan, CATALOG)
    assert caught.value.code == "CYCLE"
    assert caught.value.explanation.endswith("'a' needs 'c' needs 'b' needs 'a'")
    assert set(caught.value.steps) == {"a", "b", "c"}
    with pytest.raises(PlanRejected, match="'x' needs 'x'"):
        compile_plan([PlanStep("x", "vm.provision", after=("x",))], CATALOG)


@pytest.mark.parametrize(
    ("plan", "code"),
    [
        ([PlanStep("a", "vm.provision"), PlanStep("a", "ip.reserve")], "DUPLICATE_STEP"),
        ([PlanStep("a", "vm.levitate")], "UNKNOWN_TOOL"),
        ([PlanStep("a", "vm.provision", after=("ghost",))], "UNKNOWN_DEPENDENCY"),
    ],
)
def test_saga7_malformed_plans_are_rejected_with_a_code(plan: list[PlanStep], code: str) -> None:
    with pytest.raises(PlanRejected) as caught:
        compile_plan(plan, CATALOG)
    assert caught.value.code == code and caught.value.steps == ("a",)


def test_plan_from_json_reads_the_runners_plan() -> None:
    steps = plan_from_json(
        [
            {"id": "vm", "tool": "vm.provision"},
            {"id": "dns", "tool": "dns.publish", "params": {"n": 1}, "after": ["vm"]},
        ]
    )
    assert steps == (PlanStep("vm", "vm.provision"), PlanStep("dns", "dns.publish", {"n": 1}, ("vm",)))
    assert plan_from_json([step.to_json() for step in steps]) == steps
    bad: object
    for bad in (
        {"steps": []},
        [{"id": "vm"}],
        [{"id": "vm", "tool": "t", "after": "x"}],
        [{"id": "a", "tool": "t", "x": 1}],
    ):
        with pytest.raises(PlanRejected) as caught:
            plan_from_json(bad)
        assert caught.value.code == "MALFORMED_PLAN"


# --- properties -------------------------------------------------------------------------------------


@st.composite
def random_plans(draw: st.DrawFn) -> tuple[list[PlanStep], ToolCatalog]:
    """A random DAG (edges only go from a lower to a higher rank, so no cycle), proposed in a random
    order, with at most one pivot and a random mix of idempotent and non-idempotent tools."""
    size = draw(st.integers(1, 9))
    tools = [
        compensable("t.i", reversibility=Reversibility.REVERSIBLE),
        compensable("t.ii"),
        compensable("t.ii.once", idempotent=False),
    ]
    catalog = catalog_of(*tools, pivot("t.pivot"))
    kinds = draw(st.lists(st.sampled_from([t.name for t in tools]), min_size=size, max_size=size))
    if draw(st.booleans()):
        kinds[draw(st.integers(0, size - 1))] = "t.pivot"
    names = [f"s{rank}" for rank in range(size)]
    steps = []
    for rank in range(size):
        after = draw(st.lists(st.sampled_from(names[:rank]), unique=True)) if rank else []
        steps.append(PlanStep(names[rank], kinds[rank], after=tuple(after)))
    return draw(st.permutations(steps)), catalog


def depends_on(step_id: str, target: str, by_id: dict[str, PlanStep]) -> bool:
    stack, seen = list(by_id[step_id].after), set()
    while stack:
        current = stack.pop()
        if current == target:
            return True
        if current not in seen:
            seen.add(current)
            stack.extend(by_id[current].after)
    return False


@settings(max_examples=300, deadline=None)
@given(random_plans())
def test_saga7_random_dags_compile_to_a_topological_order_with_the_pivot_after_independent_steps(
    case: tuple[list[PlanStep], ToolCatalog],
) -> None:
    """SAGA-7 (property): for any DAG with at most one pivot, the compiled order is a topological
    order of all steps, every I/II step that does not depend on the pivot precedes it, and every
    step that depends on it follows it (SAGA-6: and is idempotent, else the plan is rejected)."""
    steps, catalog = case
    by_id = {step.step_id: step for step in steps}
    pivot_ids = [step.step_id for step in steps if step.tool == "t.pivot"]
    dependants = [s for s in by_id if pivot_ids and depends_on(s, pivot_ids[0], by_id)]
    try:
        compiled: CompiledPlan = compile_plan(steps, catalog)
    except PlanRejected as rejected:
        assert rejected.code == "NON_IDEMPOTENT_AFTER_PIVOT"
        assert any(by_id[s].tool == "t.ii.once" for s in dependants)
        return
    assert not any(by_id[s].tool == "t.ii.once" for s in dependants)
    order = ids(compiled.order)
    assert sorted(order) == sorted(by_id) and compiled.outbox == ()
    position = {step_id: index for index, step_id in enumerate(order)}
    for step in steps:
        assert all(position[dep] < position[step.step_id] for dep in step.after)
    assert compiled.pivot == (pivot_ids[0] if pivot_ids else None)
    if compiled.pivot is not None:
        for step_id in order:
            if step_id == compiled.pivot:
                continue
            if step_id in dependants:
                assert position[step_id] > position[compiled.pivot]
            else:
                assert position[step_id] < position[compiled.pivot]
    # Stability: the proposal comes back unchanged exactly when it already satisfied every rule.
    proposed = ids(tuple(steps))
    topological = all(
        proposed.index(dep) < proposed.index(step.step_id) for step in steps for dep in step.after
    )
    pivot_last = not pivot_ids or all(s in dependants for s in proposed[proposed.index(pivot_ids[0]) + 1 :])
    assert compiled.reordered == (not (topological and pivot_last))
    if not compiled.reordered:
        assert order == proposed
