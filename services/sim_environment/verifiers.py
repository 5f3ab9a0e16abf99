"""Deterministic pre-pivot verifiers of the simulated environment (SAGA-7).

The orchestrator's pivot gate asks these, not the model's self-report, whether the pivot can
succeed. Each reads the world and changes nothing: ``verify(name, world, payload, work_id)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from services.sim_environment.world import World

__all__ = ["VERIFIERS", "UnknownVerifier", "Verifier", "verify"]

Verifier = Callable[[World, Mapping[str, Any], "str | None"], tuple[bool, str]]


class UnknownVerifier(KeyError):
    """No verifier is registered under this name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "unknown verifier"


def _dns_name_available(world: World, payload: Mapping[str, Any], work_id: str | None) -> tuple[bool, str]:
    """Ok unless the name is already published by another work (the same work may republish)."""
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return False, "payload.name must be a non-empty string"
    existing = world.dns_record(name)
    if existing is None:
        return True, f"name {name!r} is not published"
    if work_id is not None and existing.work_id == work_id:
        return True, f"name {name!r} is already published by this work ({existing.resource_id})"
    return False, f"name {name!r} is already published by work {existing.work_id!r} ({existing.resource_id})"


VERIFIERS: dict[str, Verifier] = {
    "dns.name-available": _dns_name_available,
}


def verify(
    name: str, world: World, payload: Mapping[str, Any], work_id: str | None = None
) -> tuple[bool, str]:
    """Run the verifier ``name``: (ok, detail). Raises :class:`UnknownVerifier`."""
    check = VERIFIERS.get(name)
    if check is None:
        raise UnknownVerifier(f"no verifier {name!r}; known: {', '.join(VERIFIERS)}")
    return check(world, payload, work_id)
