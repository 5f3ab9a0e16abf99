"""The tool registry of the saga orchestrator (SAGA-2, SAGA-5): what each tool is, and how it is undone.

Tools are registered by their authors, never by the model: a tool's reversibility class, its
compensating action and how that compensator's parameters are bound from the forward action's
output are fixed here, at definition time, so nothing has to be synthesised during a failure.
Registration refuses every inconsistency it can see (a compensable tool with no compensator, a
pivot with one, a binding that can never resolve...) because a bad entry found during an unwind is
an orphaned resource.

Pure: values in, values out. The one exception is `load_catalog`, a convenience that reads a
registration file and hands its content to `ToolCatalog.from_json`.
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

__all__ = [
    "BindingFailed",
    "BoundCompensation",
    "CompensatorSpec",
    "Cost",
    "RegistrationRefused",
    "Reversibility",
    "ToolCatalog",
    "ToolDomain",
    "ToolSpec",
    "UnknownTool",
    "bind_compensation",
    "check_postcondition",
    "check_spec",
    "load_catalog",
    "validate_parameters",
]


class Reversibility(StrEnum):
    """SAGA-5 classes; the values are the ones tool authors write in the registration file."""

    REVERSIBLE = "I"
    COMPENSABLE = "II"
    PIVOT = "III"


class ToolDomain(StrEnum):
    LOCAL = "local"
    INTERNAL = "internal"
    EXTERNAL = "external"


@dataclass(frozen=True)
class Cost:
    """Wall time and money of one action. Two dimensions on purpose: REC-4 compares each on its own."""

    duration_ms: int = 0
    money: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(self.duration_ms + other.duration_ms, self.money + other.money)

    @classmethod
    def zero(cls) -> Cost:
        return cls(0, 0.0)

    @classmethod
    def total(cls, costs: Sequence[Cost]) -> Cost:
        result = cls.zero()
        for cost in costs:
            result = result + cost
        return result

    @property
    def is_zero(self) -> bool:
        return self.duration_ms == 0 and self.money == 0.0

    def to_json(self) -> dict[str, Any]:
        return {"durationMs": self.duration_ms, "money": self.money}


@dataclass(frozen=True)
class CompensatorSpec:
    """How the tool's effect is neutralised: an operation on the same gateway tool, with bindings.

    `bind` maps each compensator parameter to its source: "output.<path>" (the forward action's
    output, or its partial output when it failed half-way), "params.<path>" (the forward action's
    parameters) or "const:<json>" (a literal).
    """

    operation: str
    bind: Mapping[str, str]
    cost: Cost = field(default_factory=Cost)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bind", MappingProxyType(dict(self.bind)))

    def to_json(self) -> dict[str, Any]:
        return {"operation": self.operation, "bind": dict(self.bind), "cost": self.cost.to_json()}


def _default_parameters() -> Mapping[str, Any]:
    return {"type": "object"}


@dataclass(frozen=True)
class ToolSpec:
    """One registered tool. `parameters` is a JSON Schema (draft 2020-12) of the forward payload."""

    name: str
    gateway_tool: str
    operation: str
    reversibility: Reversibility
    domain: ToolDomain
    idempotent: bool = True
    probe: bool = False
    outbound: bool = False
    cost: Cost = field(default_factory=Cost)
    parameters: Mapping[str, Any] = field(default_factory=_default_parameters)
    compensator: CompensatorSpec | None = None
    verifiers: tuple[str, ...] = ()
    # The post-condition (SAGA-1): a JSON Schema the forward action's output must meet; None = any.
    output: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        # A private deep copy: the registry must not change because a caller mutated its dict later.
        # The schema stays a plain dict because jsonschema only accepts dicts as JSON objects.
        if isinstance(self.parameters, Mapping):
            object.__setattr__(self, "parameters", copy.deepcopy(dict(self.parameters)))
        object.__setattr__(self, "verifiers", tuple(self.verifiers))
        if isinstance(self.output, Mapping):
            object.__setattr__(self, "output", copy.deepcopy(dict(self.output)))

    @property
    def is_pivot(self) -> bool:
        return self.reversibility is Reversibility.PIVOT

    @property
    def is_mutating(self) -> bool:
        """True when the tool's effect is something the saga must track (SAGA-2): every class I/II
        tool (it pushes a compensator) and the pivot (it retires the stack). Always true for a
        registered tool; false only for a hand-built spec that registration would refuse."""
        return self.compensator is not None or self.is_pivot

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gatewayTool": self.gateway_tool,
            "operation": self.operation,
            "reversibility": self.reversibility.value,
            "domain": self.domain.value,
            "idempotent": self.idempotent,
            "probe": self.probe,
            "outbound": self.outbound,
            "cost": self.cost.to_json(),
            "parameters": copy.deepcopy(dict(self.parameters)),
            "compensator": None if self.compensator is None else self.compensator.to_json(),
            "verifiers": list(self.verifiers),
            **({"output": copy.deepcopy(dict(self.output))} if self.output is not None else {}),
        }


class RegistrationRefused(ValueError):
    """A tool definition breaks a registry rule; `tool` names it and `rule` says which rule."""

    def __init__(self, tool: str, rule: str, detail: str) -> None:
        self.tool = tool
        self.rule = rule
        self.detail = detail
        super().__init__(f"tool {tool!r} refused ({rule}): {detail}")


class UnknownTool(KeyError):
    def __init__(self, name: str, known: Sequence[str]) -> None:
        self.name = name
        self.known = tuple(known)
        super().__init__(name)

    def __str__(self) -> str:
        listing = ", ".join(self.known) if self.known else "none"
        return f"unknown tool {self.name!r}; registered tools: {listing}"


class BindingFailed(ValueError):
    """A compensator parameter could not be bound; `path` is the binding source that did not resolve."""

    def __init__(self, tool: str, parameter: str, path: str, reason: str) -> None:
        self.tool = tool
        self.parameter = parameter
        self.path = path
        super().__init__(
            f"cannot bind compensator parameter {parameter!r} of tool {tool!r} from {path!r}: {reason}"
        )


@dataclass(frozen=True)
class BoundCompensation:
    """A compensator ready to dispatch: sent to the forward action's gateway tool (SAGA-2)."""

    gateway_tool: str
    operation: str
    params: dict[str, Any]
    cost: Cost = field(default_factory=Cost)


# --- registration rules ---------------------------------------------------------------------------

_SOURCES = ("output.", "params.")
_CONST = "const:"


def _check_cost(name: str, cost: Cost, what: str) -> None:
    duration_ok = isinstance(cost.duration_ms, int) and not isinstance(cost.duration_ms, bool)
    money_ok = isinstance(cost.money, int | float) and not isinstance(cost.money, bool)
    if not duration_ok or not money_ok or not math.isfinite(cost.money):
        raise RegistrationRefused(name, "cost", f"{what} must be an integer durationMs and a finite money")
    if cost.duration_ms < 0 or cost.money < 0:
        raise RegistrationRefused(
            name, "cost", f"{what} is negative (durationMs={cost.duration_ms}, money={cost.money})"
        )


def _declared_properties(parameters: Mapping[str, Any]) -> frozenset[str]:
    properties = parameters.get("properties")
    return frozenset(properties) if isinstance(properties, Mapping) else frozenset()


def _check_binding(spec: ToolSpec, parameter: str, source: str) -> None:
    name = spec.name
    if not isinstance(parameter, str) or not parameter:
        raise RegistrationRefused(
            name, "binding", f"compensator parameter names must be non-empty strings, got {parameter!r}"
        )
    if not isinstance(source, str):
        raise RegistrationRefused(
            name, "binding", f"binding of {parameter!r} must be a string, got {source!r}"
        )
    if source.startswith(_CONST):
        try:
            json.loads(source[len(_CONST) :])
        except ValueError as exc:
            raise RegistrationRefused(
                name,
                "binding",
                f"binding of {parameter!r} is {source!r}, and its literal is not JSON ({exc})",
            ) from exc
        return
    if not source.startswith(_SOURCES):
        raise RegistrationRefused(
            name,
            "binding",
            f"binding of {parameter!r} is {source!r}; a source is 'output.<path>', 'params.<path>' "
            "or 'const:<json>'",
        )
    segments = source.split(".")[1:]
    if not segments or any(not segment for segment in segments):
        raise RegistrationRefused(name, "binding", f"binding of {parameter!r} is {source!r}, an empty path")
    if source.startswith("params.") and segments[0] not in _declared_properties(spec.parameters):
        declared = ", ".join(sorted(_declared_properties(spec.parameters))) or "none"
        raise RegistrationRefused(
            name,
            "binding",
            f"binding of {parameter!r} reads params.{segments[0]}, which the parameter schema does not "
            f"declare (declared properties: {declared})",
        )


def check_spec(spec: ToolSpec) -> None:
    """Every rule a single tool definition must meet on its own; raises RegistrationRefused."""
    name = spec.name
    if not isinstance(name, str) or not name.strip():
        raise RegistrationRefused(str(name), "name", "a tool needs a non-empty name")
    for attribute in ("gateway_tool", "operation"):
        value = getattr(spec, attribute)
        if not isinstance(value, str) or not value.strip():
            raise RegistrationRefused(
                name, attribute, f"{attribute} must be a non-empty string, got {value!r}"
            )
    if not isinstance(spec.reversibility, Reversibility):
        raise RegistrationRefused(name, "SAGA-5", f"unknown reversibility class {spec.reversibility!r}")
    if not isinstance(spec.domain, ToolDomain):
        raise RegistrationRefused(name, "domain", f"unknown domain {spec.domain!r}")
    _check_cost(name, spec.cost, "cost")
    if not isinstance(spec.parameters, dict):
        raise RegistrationRefused(name, "parameters", "the parameter schema must be a JSON Schema object")
    try:
        Draft202012Validator.check_schema(spec.parameters)
    except SchemaError as exc:
        raise RegistrationRefused(
            name, "parameters", f"the parameter schema is not valid JSON Schema 2020-12: {exc.message}"
        ) from exc
    if spec.output is not None:
        try:
            Draft202012Validator.check_schema(dict(spec.output))
        except SchemaError as exc:
            raise RegistrationRefused(
                name, "output", f"the output post-condition is not valid JSON Schema 2020-12: {exc.message}"
            ) from exc
    if spec.is_pivot:
        if spec.compensator is not None:
            raise RegistrationRefused(
                name,
                "SAGA-5",
                "a class III (pivot) tool is irreversible by definition and must not declare a compensator",
            )
    else:
        if spec.compensator is None:
            raise RegistrationRefused(
                name,
                "SAGA-2",
                f"a class {spec.reversibility.value} tool must declare its compensator at registration",
            )
        if spec.outbound:
            raise RegistrationRefused(
                name, "SAGA-7", "only a class III tool can be outbound (the outbox stages second pivots)"
            )
        if spec.verifiers:
            raise RegistrationRefused(
                name, "SAGA-6", "pre-pivot verifiers are only allowed on a class III tool"
            )
    if spec.compensator is not None:
        if not isinstance(spec.compensator.operation, str) or not spec.compensator.operation.strip():
            raise RegistrationRefused(name, "SAGA-2", "the compensator needs a non-empty operation")
        _check_cost(name, spec.compensator.cost, "compensator cost")
        for parameter, source in spec.compensator.bind.items():
            _check_binding(spec, parameter, source)
    for verifier in spec.verifiers:
        if not isinstance(verifier, str) or not verifier.strip():
            raise RegistrationRefused(
                name, "SAGA-6", f"verifier names must be non-empty strings, got {verifier!r}"
            )
    if len(set(spec.verifiers)) != len(spec.verifiers):
        raise RegistrationRefused(name, "SAGA-6", f"verifiers are listed twice: {list(spec.verifiers)}")


# --- the catalog ---------------------------------------------------------------------------------

_REQUIRED_KEYS = ("name", "gatewayTool", "operation", "reversibility", "domain", "parameters")
_OPTIONAL_KEYS = ("idempotent", "probe", "outbound", "cost", "compensator", "verifiers", "output")


def _cost_from_json(label: str, raw: Any, what: str) -> Cost:
    if raw is None:
        return Cost.zero()
    if not isinstance(raw, Mapping) or set(raw) - {"durationMs", "money"}:
        raise RegistrationRefused(
            label, "format", f"{what} must be an object with durationMs and money, got {raw!r}"
        )
    duration = raw.get("durationMs", 0)
    money = raw.get("money", 0.0)
    if isinstance(duration, float) and duration.is_integer():
        duration = int(duration)
    if not isinstance(duration, int) or isinstance(duration, bool):
        raise RegistrationRefused(label, "format", f"{what}.durationMs must be an integer, got {duration!r}")
    if not isinstance(money, int | float) or isinstance(money, bool):
        raise RegistrationRefused(label, "format", f"{what}.money must be a number, got {money!r}")
    return Cost(duration, float(money))


def _flag(label: str, entry: Mapping[str, Any], key: str) -> bool:
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise RegistrationRefused(label, "format", f"{key} must be true or false, got {value!r}")
    return value


def _spec_from_json(index: int, entry: Any) -> ToolSpec:
    if not isinstance(entry, Mapping):
        raise RegistrationRefused(f"#{index}", "format", f"a tool must be a JSON object, got {entry!r}")
    raw_name = entry.get("name")
    label = raw_name if isinstance(raw_name, str) and raw_name else f"#{index}"
    missing = [key for key in _REQUIRED_KEYS if key not in entry]
    if missing:
        raise RegistrationRefused(label, "format", f"lacks {', '.join(missing)}")
    unknown = sorted(set(entry) - set(_REQUIRED_KEYS) - set(_OPTIONAL_KEYS))
    if unknown:
        raise RegistrationRefused(label, "format", f"has unknown keys {', '.join(unknown)}")
    for key in ("name", "gatewayTool", "operation"):
        if not isinstance(entry[key], str):
            raise RegistrationRefused(label, "format", f"{key} must be a string, got {entry[key]!r}")
    try:
        reversibility = Reversibility(entry["reversibility"])
    except ValueError as exc:
        raise RegistrationRefused(
            label, "SAGA-5", f"reversibility must be 'I', 'II' or 'III', got {entry['reversibility']!r}"
        ) from exc
    try:
        domain = ToolDomain(entry["domain"])
    except ValueError as exc:
        raise RegistrationRefused(
            label, "format", f"domain must be 'local', 'internal' or 'external', got {entry['domain']!r}"
        ) from exc
    if not isinstance(entry["parameters"], dict):
        raise RegistrationRefused(
            label, "parameters", f"parameters must be a JSON Schema object, got {entry['parameters']!r}"
        )
    compensator: CompensatorSpec | None = None
    raw_compensator = entry.get("compensator")
    if raw_compensator is not None:
        if not isinstance(raw_compensator, Mapping) or set(raw_compensator) - {"operation", "bind", "cost"}:
            raise RegistrationRefused(
                label,
                "format",
                f"compensator must be an object with operation, bind and cost, got {raw_compensator!r}",
            )
        operation = raw_compensator.get("operation")
        bind = raw_compensator.get("bind", {})
        if not isinstance(operation, str):
            raise RegistrationRefused(
                label, "format", f"compensator.operation must be a string, got {operation!r}"
            )
        if not isinstance(bind, Mapping):
            raise RegistrationRefused(label, "format", f"compensator.bind must be an object, got {bind!r}")
        compensator = CompensatorSpec(
            operation, dict(bind), _cost_from_json(label, raw_compensator.get("cost"), "compensator.cost")
        )
    verifiers = entry.get("verifiers", [])
    if not isinstance(verifiers, list):
        raise RegistrationRefused(label, "format", f"verifiers must be a list of names, got {verifiers!r}")
    return ToolSpec(
        name=entry["name"],
        gateway_tool=entry["gatewayTool"],
        operation=entry["operation"],
        reversibility=reversibility,
        domain=domain,
        idempotent=_flag(label, entry, "idempotent"),
        probe=_flag(label, entry, "probe"),
        outbound=_flag(label, entry, "outbound"),
        cost=_cost_from_json(label, entry.get("cost"), "cost"),
        parameters=entry["parameters"],
        compensator=compensator,
        verifiers=tuple(verifiers),
        output=_output_schema(label, entry.get("output")),
    )


def _output_schema(label: str, raw: Any) -> Mapping[str, Any] | None:
    if raw is not None and not isinstance(raw, dict):
        raise RegistrationRefused(label, "output", f"output must be a JSON Schema object, got {raw!r}")
    return raw


class ToolCatalog:
    """An immutable set of registered tools; `register` returns a new catalog."""

    __slots__ = ("_specs",)

    def __init__(self) -> None:
        self._specs: Mapping[str, ToolSpec] = MappingProxyType({})

    def register(self, spec: ToolSpec) -> ToolCatalog:
        check_spec(spec)
        if spec.name in self._specs:
            raise RegistrationRefused(spec.name, "duplicate", "a tool with this name is already registered")
        grown = ToolCatalog()
        grown._specs = MappingProxyType({**self._specs, spec.name: spec})
        return grown

    def get(self, name: str) -> ToolSpec:
        try:
            return self._specs[name]
        except KeyError:
            raise UnknownTool(name, self.names()) from None

    def names(self) -> tuple[str, ...]:
        """In registration order."""
        return tuple(self._specs)

    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(self._specs.values())

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __len__(self) -> int:
        return len(self._specs)

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(self._specs.values())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ToolCatalog) and dict(self._specs) == dict(other._specs)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ToolCatalog({list(self._specs)!r})"

    @classmethod
    def from_json(cls, entries: Any) -> ToolCatalog:
        """From the registration format (a list of camelCase objects); refuses the first bad entry."""
        if not isinstance(entries, list):
            raise RegistrationRefused(
                "<catalog>", "format", f"a catalog is a JSON list of tools, got {type(entries).__name__}"
            )
        catalog = cls()
        for index, entry in enumerate(entries):
            try:
                catalog = catalog.register(_spec_from_json(index, entry))
            except RegistrationRefused as exc:
                raise RegistrationRefused(exc.tool, exc.rule, f"entry {index}: {exc.detail}") from exc
        return catalog

    def to_json(self) -> list[dict[str, Any]]:
        return [spec.to_json() for spec in self._specs.values()]


def load_catalog(path: str | os.PathLike[str]) -> ToolCatalog:
    """Reads a registration file (the JSON list of `ToolCatalog.from_json`)."""
    with open(path, encoding="utf-8") as handle:
        try:
            entries = json.load(handle)
        except ValueError as exc:
            raise RegistrationRefused(
                os.fspath(path), "format", f"the catalog file is not JSON: {exc}"
            ) from exc
    return ToolCatalog.from_json(entries)


# --- using a spec --------------------------------------------------------------------------------


def validate_parameters(spec: ToolSpec, params: Any) -> tuple[str, ...]:
    """Problems of `params` against the tool's schema, one readable line each; empty when valid."""
    validator = Draft202012Validator(dict(spec.parameters))
    problems = []
    for error in sorted(
        validator.iter_errors(params), key=lambda error: [str(part) for part in error.absolute_path]
    ):
        where = "/".join(str(part) for part in error.absolute_path) or "(root)"
        problems.append(f"{spec.name} parameters at {where}: {error.message}")
    return tuple(problems)


def check_postcondition(spec: ToolSpec, output: Any) -> tuple[str, ...]:
    """Problems of a committed action's output against the tool's post-condition (SAGA-1)."""
    if spec.output is None:
        return ()
    validator = Draft202012Validator(dict(spec.output))
    return tuple(
        f"{spec.name} output at {'/'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
        for error in validator.iter_errors(output)
    )


_MISSING = object()


def _resolve(document: Any, segments: Sequence[str]) -> Any:
    current = document
    for segment in segments:
        if isinstance(current, Mapping) and segment in current:
            current = current[segment]
        elif isinstance(current, list) and segment.isdigit() and int(segment) < len(current):
            current = current[int(segment)]
        else:
            return _MISSING
    return current


def bind_compensation(
    spec: ToolSpec, params: Mapping[str, Any] | None, output: Mapping[str, Any] | None
) -> BoundCompensation:
    """Builds the compensator of one forward action from its parameters and (partial) output (SAGA-2).

    `output` is the forward action's output, or its partial output when it failed after leaving a
    resource behind; None counts as an empty output. Values are deep copies.
    """
    if spec.compensator is None:
        raise BindingFailed(spec.name, "*", "compensator", "the tool is a pivot and has no compensator")
    sources = {"output": output if output is not None else {}, "params": params if params is not None else {}}
    bound: dict[str, Any] = {}
    for parameter, source in spec.compensator.bind.items():
        if source.startswith(_CONST):
            bound[parameter] = json.loads(source[len(_CONST) :])
            continue
        root, _, dotted = source.partition(".")
        if root not in sources:
            raise BindingFailed(spec.name, parameter, source, "unknown binding source")
        value = _resolve(sources[root], dotted.split("."))
        if value is _MISSING:
            raise BindingFailed(
                spec.name, parameter, source, f"the forward action's {root} has no {dotted!r}"
            )
        bound[parameter] = copy.deepcopy(value)
    return BoundCompensation(spec.gateway_tool, spec.compensator.operation, bound, spec.compensator.cost)
