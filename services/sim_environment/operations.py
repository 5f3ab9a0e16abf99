"""The simulated environment's operations: what each does to which resource, its payload schema,
its nominal duration, and the problem types the world answers with."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Literal

from jsonschema import Draft202012Validator

__all__ = ["OPERATIONS", "PROBLEM_KINDS", "OperationSpec", "Role", "canonical_json", "problem"]

# Problem kinds this world answers with, and their default status (the effect protocol's list).
PROBLEM_KINDS: dict[str, tuple[int, str]] = {
    "stale-epoch": (409, "Fencing epoch is stale"),
    "idempotency-key-conflict": (409, "Idempotency-Key reused for a different request"),
    "conflict": (409, "Conflict with the current state"),
    "rate-limited": (429, "Rate limited"),
    "unavailable": (503, "Service unavailable"),
    "lock-contention": (423, "Resource is locked"),
    "schema-invalid": (422, "Payload does not match the operation's schema"),
    "missing-parameter": (422, "A required parameter is missing"),
    "compile-error": (422, "Compilation failed"),
    "not-found": (404, "No such resource"),
    "auth-revoked": (403, "Credentials revoked"),
    "exhausted": (507, "Quota exhausted"),
    "corrupted": (422, "Resource state is corrupted"),
    "sandbox-breach": (403, "Sandbox breach"),
}

Role = Literal["create", "release"]


def canonical_json(value: Any) -> str:
    """One spelling per JSON value, so "the same payload" is a string comparison."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def problem(kind: str, detail: str, status: int | None = None, **extensions: Any) -> dict[str, Any]:
    """An RFC 9457 problem body; ``extensions`` never override the standard members."""
    default_status, title = PROBLEM_KINDS.get(kind, (500, kind.replace("-", " ").capitalize()))
    return {
        **extensions,
        "type": f"/problems/{kind}",
        "title": title,
        "status": status if status is not None else default_status,
        "detail": detail,
    }


def _string(min_length: int = 1, max_length: int = 255) -> dict[str, Any]:
    return {"type": "string", "minLength": min_length, "maxLength": max_length}


def _object(**properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class OperationSpec:
    """One operation: what it does to which kind of resource, its payload schema and its outputs.

    ``id_field`` names the resource id: an output of a "create", a parameter of a "release".
    ``permanent`` resources (DNS records, sent messages) have no compensator: never "live"."""

    name: str
    role: Role
    resource_kind: str
    id_field: str
    nominal_ms: int
    parameters: dict[str, Any]
    permanent: bool = False
    released_flag: str = "released"

    @property
    def outputs(self) -> tuple[str, ...]:
        if self.role == "release":
            return (self.id_field, self.released_flag, "alreadyReleased")
        return (self.id_field, "address") if self.name == "ip.reserve" else (self.id_field,)

    @property
    def validator(self) -> Draft202012Validator:
        return _VALIDATORS[self.name]


def _creates(name: str, kind: str, id_field: str, ms: int, /, **parameters: dict[str, Any]) -> OperationSpec:
    return OperationSpec(name, "create", kind, id_field, ms, _object(**parameters))


def _releases(name: str, kind: str, id_field: str, ms: int, flag: str = "released") -> OperationSpec:
    parameters = _object(**{id_field: _string()})
    return OperationSpec(name, "release", kind, id_field, ms, parameters, released_flag=flag)


_PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
_AMOUNT = {"type": "number", "exclusiveMinimum": 0}
_SPECS = (
    _creates("vm.provision", "vm", "vmId", 120, name=_string(1, 63)),
    _releases("vm.terminate", "vm", "vmId", 45, "terminated"),
    _creates("ip.reserve", "ip", "ipId", 350, region=_string(1, 63)),
    _releases("ip.release", "ip", "ipId", 220),
    _creates("sandbox.compile", "build", "buildId", 4200, vmId=_string(), source=_string(0, 100_000)),
    _releases("sandbox.clean", "build", "buildId", 15, "cleaned"),
    _creates("firewall.write", "firewall-rule", "ruleId", 80, vmId=_string(), port=_PORT),
    _releases("firewall.unbind", "firewall-rule", "ruleId", 10, "unbound"),
    replace(
        _creates("dns.publish", "dns-record", "recordId", 450, name=_string(1, 253), address=_string(1, 64)),
        permanent=True,
    ),
    _creates("payment.hold", "payment-hold", "holdId", 50, account=_string(), amount=_AMOUNT),
    _releases("payment.release", "payment-hold", "holdId", 50),
    replace(
        _creates("notify.send", "message", "messageId", 50, to=_string(), text=_string(0, 10_000)),
        permanent=True,
    ),
    _creates("cache.warm", "cache", "cacheId", 50, name=_string()),
    _releases("cache.drop", "cache", "cacheId", 50, "dropped"),
)
OPERATIONS: dict[str, OperationSpec] = {spec.name: spec for spec in _SPECS}
_VALIDATORS = {spec.name: Draft202012Validator(spec.parameters) for spec in _SPECS}
