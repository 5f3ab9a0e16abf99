"""The egress allowlist (QUA-1's policy trigger): which hosts an effect may be aimed at, pure.

Declared per tool (TENURE_TOOL_EGRESS, `tool=host|*.domain|...,...`: the hosts a tool may reach
for anyone) and per run (`egressAllowlist` in the run's executionSpec, a list of hosts: what this
run may reach). An effect names the hosts it is aimed at in its payload: `url` (its host), `host`,
`egressHost`, or a list `urls`/`hosts`. An effect aimed at a host outside the tool's allowlist
(when the tool declares one) or outside the run's (when the run declares one) is refused before
dispatch, and the same decision triggers the run's quarantine (services/effect_gateway/service.py).
An effect that names no host goes only to the tool's own endpoint: nothing to check.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "EgressViolation",
    "check_egress",
    "effect_hosts",
    "host_allowed",
    "parse_tool_egress",
    "run_allowlist",
]

_HOST_KEYS = ("host", "egressHost")
_URL_KEYS = ("url",)
_LIST_KEYS = {"urls": True, "hosts": False}


@dataclass(frozen=True)
class EgressViolation:
    host: str
    declared_by: str  # "tool" or "run"
    allowlist: tuple[str, ...]


def parse_tool_egress(spec: str) -> dict[str, tuple[str, ...]]:
    """`tool=host|*.domain,...` (TENURE_TOOL_EGRESS) as {tool: hosts}."""
    rules: dict[str, tuple[str, ...]] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        tool, _, hosts = item.partition("=")
        if not tool.strip() or not hosts.strip():
            raise ValueError(f"TENURE_TOOL_EGRESS entry {item!r} is not tool=host|host")
        rules[tool.strip()] = tuple(h.strip().lower() for h in hosts.split("|") if h.strip())
    return rules


def run_allowlist(execution_spec: str) -> tuple[str, ...] | None:
    """The run's declared allowlist (None: it declares none). A spec that is not an object, or an
    allowlist that is not a list of strings, declares an empty one: nothing is allowed."""
    try:
        spec = json.loads(execution_spec)
    except ValueError:
        return None
    if not isinstance(spec, dict) or "egressAllowlist" not in spec:
        return None
    hosts = spec["egressAllowlist"]
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        return ()
    return tuple(h.strip().lower() for h in hosts)


def _host_of(url: str) -> str:
    try:
        return (urlsplit(url if "//" in url else f"//{url}").hostname or "").lower()
    except ValueError:
        return url.lower()


def effect_hosts(payload: Mapping[str, Any]) -> tuple[str, ...]:
    hosts: list[str] = []
    for key in _HOST_KEYS:
        if isinstance(payload.get(key), str):
            hosts.append(str(payload[key]).strip().lower())
    for key in _URL_KEYS:
        if isinstance(payload.get(key), str):
            hosts.append(_host_of(str(payload[key])))
    for key, is_url in _LIST_KEYS.items():
        items = payload.get(key)
        if isinstance(items, list):
            hosts.extend(_host_of(i) if is_url else i.strip().lower() for i in items if isinstance(i, str))
    return tuple(dict.fromkeys(h for h in hosts if h) or ([""] if _names_a_host(payload) else []))


def _names_a_host(payload: Mapping[str, Any]) -> bool:
    # A host field that is present but empty or unparsable is aimed somewhere unknown.
    return any(key in payload for key in (*_HOST_KEYS, *_URL_KEYS, *_LIST_KEYS))


def host_allowed(host: str, allowlist: tuple[str, ...]) -> bool:
    for allowed in allowlist:
        if allowed.startswith("*.") and host.endswith(allowed[1:]):
            return True
        if host and host == allowed:
            return True
    return False


def check_egress(
    payload: Mapping[str, Any], tool_allowlist: tuple[str, ...] | None, run_hosts: tuple[str, ...] | None
) -> EgressViolation | None:
    """The first host of the effect outside an allowlist that applies, or None."""
    for host in effect_hosts(payload):
        if tool_allowlist is not None and not host_allowed(host, tool_allowlist):
            return EgressViolation(host, "tool", tool_allowlist)
        if run_hosts is not None and not host_allowed(host, run_hosts):
            return EgressViolation(host, "run", run_hosts)
    return None
