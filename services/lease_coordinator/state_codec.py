"""RunState <-> bytes for the local store. JSON keeps the store readable with any RocksDB tool."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from services.lease_coordinator.domain import RunState, RunStatus

__all__ = ["decode_state", "encode_state"]


def encode_state(state: RunState) -> bytes:
    data: dict[str, Any] = dataclasses.asdict(state)
    data["status"] = state.status.value
    data["handled_commands"] = sorted(state.handled_commands)
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode("utf-8")


def decode_state(raw: bytes) -> RunState:
    data = json.loads(raw)
    data["status"] = RunStatus(data["status"])
    data["handled_commands"] = frozenset(data["handled_commands"])
    return RunState(**data)
