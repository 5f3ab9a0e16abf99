"""Tenure's simulated external world: VMs, IPs, sandbox builds, firewall rules, DNS records,
payment holds, messages and caches, reached through the effect gateway like a real provider.

It is NOT part of Tenure. It checks fencing epochs itself (LEASE-3), applies each idempotency
key's effect at most once and answers the probe (REC-6), and can be told to fail in a chosen way,
so tests, demos and the fault-injection benchmark can show that a saga's unwind leaves the world
as it found it (SAGA-3, SAGA-4). ``tools.json`` registers its forward operations with the saga
orchestrator (SAGA-2, SAGA-5). Run it with ``python -m services.sim_environment``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from services.sim_environment.verifiers import VERIFIERS, UnknownVerifier, verify
from services.sim_environment.world import (
    OPERATIONS,
    PROBLEM_KINDS,
    Answer,
    Fault,
    OperationSpec,
    World,
    is_back_to_start,
)

__all__ = [
    "OPERATIONS",
    "PROBLEM_KINDS",
    "TOOLS_JSON",
    "VERIFIERS",
    "Answer",
    "Fault",
    "OperationSpec",
    "UnknownVerifier",
    "World",
    "is_back_to_start",
    "load_tool_registrations",
    "verify",
]

TOOLS_JSON = Path(__file__).with_name("tools.json")


def load_tool_registrations() -> list[dict[str, Any]]:
    """The tool registrations of every forward operation (the saga brief's JSON format)."""
    loaded: list[dict[str, Any]] = json.loads(TOOLS_JSON.read_text(encoding="utf-8"))
    return loaded
