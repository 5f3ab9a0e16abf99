"""The saga tool registry, pure: SAGA-2 (compensators registered by the tool's author, bound from the
forward action's output) and SAGA-5 (reversibility classes I / II / III declared per tool).

Registration refuses every inconsistent definition with an error naming the tool and the rule;
the catalog is immutable and round-trips through the camelCase registration format.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.saga_orchestrator.domain.tools import (
    BindingFailed,
    BoundCompensation,
    CompensatorSpec,
    Cost,
    RegistrationRefused,
    Reversibility,
    ToolCatalog,
    ToolDomain,
    ToolSpec,
    UnknownTool,
    bind_compensation,
    load_catalog,
    validate_parameters,
)

VM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"image": {"type": "string"}, "cpus": {"type": "integer", "minimum": 1}},
    "required": ["image"],
    "additionalProperties": False,
}


def vm_provision(**changes: Any) -> ToolSpec:
    spec = ToolSpec(
        name="vm.provision",
        gateway_tool="env",
        operation="vm.provision",
        reversibility=Reversibility.COMPENSABLE,
        domain=ToolDomain.INTERNAL,
        idempotent=True,
        probe=True,
        outbound=False,
        cost=Cost(120, 0.0),
        parameters=VM_SCHEMA,
        compensator=CompensatorSpec("vm.terminate", {"vmId": "output.vmId"}, Cost(45, 0.0)),
        verifiers=(),
    )
    return dataclasses.replace(spec, **changes)


def dns_publish(**changes: Any) -> ToolSpec:
    spec = ToolSpec(
        name="dns.publish",
        gateway_tool="env",
        operation="dns.publish",
        reversibility=Reversibility.PIVOT,
        domain=ToolDomain.EXTERNAL,
        idempotent=True,
        probe=True,
        outbound=False,
        cost=Cost(450, 0.0),
        parameters={"type": "object", "properties": {"name": {"type": "string"}}},
        compensator=None,
        verifiers=("dns.name-owned",),
    )
    return dataclasses.replace(spec, **changes)


def firewall_write() -> ToolSpec:
    return ToolSpec(
        name="firewall.write",
        gateway_tool="env",
        operation="firewall.write",
        reversibility=Reversibility.COMPENSABLE,
        domain=ToolDomain.INTERNAL,
        parameters={
            "type": "object",
            "properties": {"ruleSet": {"type": "object"}, "port": {"type": "integer"}},
        },
        compensator=CompensatorSpec(
            "firewall.restore",
            {
                "previous": "output.previous.rules",
                "port": "params.port",
                "firstRule": "output.previous.rules.0",
                "mode": 'const:{"strict": true}',
            },
            Cost(10, 0.0),
        ),
    )


def test_saga5_catalog_registers_the_three_classes_and_answers_by_name() -> None:
    """SAGA-5: classes I, II and III register; the catalog is looked up by the saga-level name."""
    compile_tool = dataclasses.replace(
        vm_provision(),
        name="build.compile",
        reversibility=Reversibility.REVERSIBLE,
        domain=ToolDomain.LOCAL,
        compensator=CompensatorSpec("build.clean", {"dir": "output.dir"}),
    )
    catalog = ToolCatalog().register(vm_provision()).register(compile_tool).register(dns_publish())
    assert catalog.names() == ("vm.provision", "build.compile", "dns.publish")
    assert "dns.publish" in catalog and "nope" not in catalog
    assert len(catalog) == 3
    assert catalog.get("dns.publish").is_pivot
    assert not catalog.get("vm.provision").is_pivot
    assert all(spec.is_mutating for spec in catalog)
    assert catalog.get("build.compile").reversibility is Reversibility.REVERSIBLE


def test_catalog_is_immutable_register_returns_a_new_catalog() -> None:
    empty = ToolCatalog()
    one = empty.register(vm_provision())
    assert empty.names() == () and one.names() == ("vm.provision",)


def test_unknown_tool_is_a_key_error_listing_the_registered_names() -> None:
    catalog = ToolCatalog().register(vm_provision()).register(dns_publish())
    with pytest.raises(UnknownTool) as caught:
        catalog.get("vm.destroy")
    assert isinstance(caught.value, KeyError)
    assert "vm.destroy" in str(caught.value)
    assert "vm.provision" in str(caught.value) and "dns.publish" in str(caught.value)


def test_spec_keeps_a_private_copy_of_the_callers_schema() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"image": {"type": "string"}}}
    spec = vm_provision(parameters=schema)
    schema["properties"]["image"]["type"] = "integer"
    assert spec.parameters["properties"]["image"]["type"] == "string"


REFUSALS: list[tuple[str, ToolSpec, str]] = [
    ("class II without compensator", vm_provision(compensator=None), "SAGA-2"),
    (
        "class I without compensator",
        vm_provision(reversibility=Reversibility.REVERSIBLE, compensator=None),
        "SAGA-2",
    ),
    (
        "pivot with a compensator",
        dns_publish(compensator=CompensatorSpec("dns.delete", {"name": "params.name"})),
        "SAGA-5",
    ),
    ("invalid JSON schema", vm_provision(parameters={"type": "objekt"}), "parameters"),
    (
        "binding source of another kind",
        vm_provision(compensator=CompensatorSpec("vm.terminate", {"vmId": "result.vmId"})),
        "binding",
    ),
    (
        "binding with an empty path",
        vm_provision(compensator=CompensatorSpec("vm.terminate", {"vmId": "output."})),
        "binding",
    ),
    (
        "const binding that is not JSON",
        vm_provision(compensator=CompensatorSpec("vm.terminate", {"force": "const:yes please"})),
        "binding",
    ),
    (
        "params binding on an undeclared property",
        vm_provision(compensator=CompensatorSpec("vm.terminate", {"zone": "params.zone"})),
        "binding",
    ),
    ("outbound on a non-pivot", vm_provision(outbound=True), "SAGA-7"),
    ("verifiers on a non-pivot", vm_provision(verifiers=("dns.name-owned",)), "SAGA-6"),
    ("negative duration", vm_provision(cost=Cost(-1, 0.0)), "cost"),
    ("negative money", vm_provision(cost=Cost(10, -0.5)), "cost"),
    (
        "negative compensator cost",
        vm_provision(compensator=CompensatorSpec("vm.terminate", {"vmId": "output.vmId"}, Cost(-5, 0.0))),
        "cost",
    ),
    ("empty operation", vm_provision(operation=" "), "operation"),
]


@pytest.mark.parametrize(("case", "spec", "rule"), REFUSALS, ids=[case for case, _, _ in REFUSALS])
def test_saga2_saga5_registration_refuses_inconsistent_tools(case: str, spec: ToolSpec, rule: str) -> None:
    """SAGA-2/SAGA-5: each broken rule is refused with the tool's name and the rule in the message."""
    with pytest.raises(RegistrationRefused) as caught:
        ToolCatalog().register(spec)
    assert caught.value.tool == spec.name
    assert caught.value.rule == rule
    assert spec.name in str(caught.value) and rule in str(caught.value)


def test_registration_refuses_a_duplicate_name() -> None:
    catalog = ToolCatalog().register(vm_provision())
    with pytest.raises(RegistrationRefused, match="already registered") as caught:
        catalog.register(vm_provision(operation="vm.provision.v2"))
    assert caught.value.tool == "vm.provision"


def test_params_binding_names_the_declared_properties_when_refused() -> None:
    with pytest.raises(RegistrationRefused, match=r"declared properties: cpus, image"):
        ToolCatalog().register(
            vm_provision(compensator=CompensatorSpec("vm.terminate", {"z": "params.zone"}))
        )


def registration_entries() -> list[dict[str, Any]]:
    return [
        {
            "name": "vm.provision",
            "gatewayTool": "env",
            "operation": "vm.provision",
            "reversibility": "II",
            "domain": "internal",
            "idempotent": True,
            "probe": True,
            "outbound": False,
            "cost": {"durationMs": 120, "money": 0.0},
            "parameters": VM_SCHEMA,
            "compensator": {
                "operation": "vm.terminate",
                "bind": {"vmId": "output.vmId"},
                "cost": {"durationMs": 45, "money": 0.0},
            },
            "verifiers": [],
        },
        {
            "name": "dns.publish",
            "gatewayTool": "env",
            "operation": "dns.publish",
            "reversibility": "III",
            "domain": "external",
            "idempotent": True,
            "probe": True,
            "outbound": False,
            "cost": {"durationMs": 450, "money": 0.0},
            "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
            "compensator": None,
            "verifiers": ["dns.name-owned"],
        },
    ]


def test_saga5_registration_format_round_trips() -> None:
    """SAGA-5: the camelCase registration file reads into specs and writes back the same JSON."""
    catalog = ToolCatalog.from_json(registration_entries())
    assert catalog.get("vm.provision") == vm_provision()
    assert catalog.get("dns.publish") == dns_publish()
    assert catalog.to_json() == registration_entries()
    assert ToolCatalog.from_json(json.loads(json.dumps(catalog.to_json()))) == catalog


def test_from_json_defaults_optional_keys_conservatively() -> None:
    entry = registration_entries()[1]
    for key in ("idempotent", "probe", "outbound", "cost", "compensator", "verifiers"):
        del entry[key]
    spec = ToolCatalog.from_json([entry]).get("dns.publish")
    assert (spec.idempotent, spec.probe, spec.outbound) == (False, False, False)
    assert spec.cost == Cost.zero() and spec.verifiers == () and spec.compensator is None


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda e: e.pop("gatewayTool"), "lacks gatewayTool"),
        (lambda e: e.update(compensater={}), "unknown keys compensater"),
        (lambda e: e.update(reversibility="IV"), "reversibility must be"),
        (lambda e: e.update(domain="cloud"), "domain must be"),
        (lambda e: e.update(idempotent="yes"), "idempotent must be true or false"),
        (lambda e: e.update(cost={"durationMs": "fast"}), "cost.durationMs must be an integer"),
        (lambda e: e.update(parameters=[]), "parameters must be a JSON Schema object"),
        (lambda e: e.update(compensator=None), "must declare its compensator"),
    ],
)
def test_from_json_names_the_offending_entry(mutate: Any, expected: str) -> None:
    entries = registration_entries()
    entries.append(dict(entries[0], name="ip.reserve"))
    mutate(entries[2])
    with pytest.raises(RegistrationRefused, match=expected) as caught:
        ToolCatalog.from_json(entries)
    assert caught.value.tool == "ip.reserve"
    assert "entry 2" in str(caught.value)


def test_from_json_labels_a_nameless_entry_by_its_index() -> None:
    with pytest.raises(RegistrationRefused) as caught:
        ToolCatalog.from_json([registration_entries()[0], 42])
    assert caught.value.tool == "#1"
    with pytest.raises(RegistrationRefused, match="JSON list"):
        ToolCatalog.from_json({"tools": []})


def test_from_json_refuses_a_duplicate_with_its_index() -> None:
    entries = registration_entries()
    entries.append(entries[0])
    with pytest.raises(RegistrationRefused, match="entry 2: a tool with this name is already registered"):
        ToolCatalog.from_json(entries)


def test_load_catalog_reads_a_registration_file(tmp_path: Path) -> None:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(registration_entries()), encoding="utf-8")
    assert load_catalog(path).names() == ("vm.provision", "dns.publish")
    path.write_text("[not json", encoding="utf-8")
    with pytest.raises(RegistrationRefused, match="not JSON"):
        load_catalog(path)


def test_validate_parameters_reports_each_problem_readably() -> None:
    spec = vm_provision()
    assert validate_parameters(spec, {"image": "debian-12", "cpus": 2}) == ()
    problems = validate_parameters(spec, {"cpus": 0, "colour": "red"})
    assert len(problems) == 3
    assert any("'image' is a required property" in problem for problem in problems)
    assert any("at cpus" in problem and "minimum" in problem for problem in problems)
    assert any("colour" in problem for problem in problems)
    assert all(problem.startswith("vm.provision parameters at ") for problem in problems)
    assert validate_parameters(spec, ["not", "an", "object"])


def test_saga2_compensator_is_bound_from_the_forward_output() -> None:
    """SAGA-2: the compensator's parameters come from the forward action's output (resource ids)."""
    bound = bind_compensation(vm_provision(), {"image": "debian-12"}, {"vmId": "vm-7", "ip": "10.0.0.7"})
    assert bound == BoundCompensation("env", "vm.terminate", {"vmId": "vm-7"}, Cost(45, 0.0))


def test_saga2_bindings_read_output_paths_params_and_constants() -> None:
    """SAGA-2: nested output paths (previous content), list indexes, params and JSON constants."""
    output = {"previous": {"rules": [{"allow": 22}, {"allow": 443}]}}
    bound = bind_compensation(firewall_write(), {"port": 8443, "ruleSet": {}}, output)
    assert bound.params == {
        "previous": [{"allow": 22}, {"allow": 443}],
        "port": 8443,
        "firstRule": {"allow": 22},
        "mode": {"strict": True},
    }
    output["previous"]["rules"].clear()
    assert bound.params["previous"] == [{"allow": 22}, {"allow": 443}], "bound values are copies"


def test_saga2_binding_from_partial_output_and_the_missing_path_named() -> None:
    """SAGA-3/SAGA-2: a failed step's partial output binds its own compensator; a missing value
    is refused naming the path instead of sending a compensator with a hole in it."""
    assert bind_compensation(vm_provision(), {"image": "x"}, {"vmId": "vm-half"}).params == {
        "vmId": "vm-half"
    }
    with pytest.raises(BindingFailed) as caught:
        bind_compensation(vm_provision(), {"image": "x"}, None)
    assert caught.value.path == "output.vmId"
    assert "output.vmId" in str(caught.value) and "vm.provision" in str(caught.value)
    with pytest.raises(BindingFailed, match=r"output\.previous\.rules\.0"):
        bind_compensation(firewall_write(), {"port": 1}, {"previous": {"rules": []}})


def test_binding_a_pivot_fails() -> None:
    with pytest.raises(BindingFailed, match="pivot"):
        bind_compensation(dns_publish(), {"name": "a.example"}, {})


def test_cost_adds_per_dimension() -> None:
    assert Cost(10, 0.5) + Cost(5, 0.25) == Cost(15, 0.75)
    assert Cost.total([Cost(1, 0.1), Cost(2, 0.2)]) == Cost(3, 0.1 + 0.2)
    assert Cost.zero().is_zero and not Cost(1, 0.0).is_zero


names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz.-", min_size=1, max_size=12).filter(lambda s: s.strip())
# a path segment of a binding source cannot contain the dot that separates segments
segments = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_-", min_size=1, max_size=8)
costs = st.builds(Cost, st.integers(0, 10**6), st.floats(0, 1000, allow_nan=False))


@st.composite
def tool_specs(draw: st.DrawFn) -> ToolSpec:
    reversibility = draw(st.sampled_from(list(Reversibility)))
    properties = draw(st.lists(segments, max_size=3, unique=True))
    schema: dict[str, Any] = {"type": "object", "properties": {p: {"type": "string"} for p in properties}}
    pivot = reversibility is Reversibility.PIVOT
    compensator = None
    if not pivot:
        sources = st.one_of(
            st.lists(segments, min_size=1, max_size=3).map(lambda path: "output." + ".".join(path)),
            st.sampled_from(properties).map(lambda p: f"params.{p}") if properties else st.nothing(),
            st.integers().map(lambda i: f"const:{i}"),
        )
        bind = draw(st.dictionaries(names, sources, max_size=3))
        compensator = CompensatorSpec(draw(names), bind, draw(costs))
    return ToolSpec(
        name=draw(names),
        gateway_tool=draw(names),
        operation=draw(names),
        reversibility=reversibility,
        domain=draw(st.sampled_from(list(ToolDomain))),
        idempotent=draw(st.booleans()),
        probe=draw(st.booleans()),
        outbound=pivot and draw(st.booleans()),
        cost=draw(costs),
        parameters=schema,
        compensator=compensator,
        verifiers=tuple(draw(st.lists(names, max_size=2, unique=True))) if pivot else (),
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(tool_specs(), max_size=5, unique_by=lambda spec: spec.name))
def test_saga5_any_valid_catalog_round_trips_through_json(specs: list[ToolSpec]) -> None:
    """SAGA-5: whatever valid tools are registered, the registration format loses nothing."""
    catalog = ToolCatalog()
    for spec in specs:
        catalog = catalog.register(spec)
    again = ToolCatalog.from_json(json.loads(json.dumps(catalog.to_json())))
    assert again == catalog
    assert again.names() == tuple(spec.name for spec in specs)


SIM_TOOLS = Path(__file__).resolve().parents[2] / "services" / "sim_environment" / "tools.json"


def test_saga5_the_simulated_environments_registration_file_is_accepted() -> None:
    """SAGA-2/SAGA-5: the reference tools registered for tests and demos pass every registry rule,
    include the seed's pivot (dns.publish) and lose nothing through the registration format."""
    catalog = load_catalog(SIM_TOOLS)
    assert catalog.get("dns.publish").is_pivot
    assert catalog.get("vm.provision").compensator is not None
    assert ToolCatalog.from_json(catalog.to_json()) == catalog
    assert (
        ToolCatalog.from_json(json.loads(SIM_TOOLS.read_text(encoding="utf-8"))).to_json()
        == catalog.to_json()
    )
