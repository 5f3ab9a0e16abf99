"""RunState <-> bytes for the local store. JSON keeps the store readable with any RocksDB tool."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from services.lease_coordinator.domain import (
    EffectRecord,
    InputWait,
    LeaseCertainty,
    LeaseState,
    RunState,
    RunStatus,
    StopKind,
    StopRequest,
)

__all__ = ["decode_state", "encode_state"]


def encode_state(state: RunState) -> bytes:
    data: dict[str, Any] = dataclasses.asdict(state)
    data["status"] = state.status.value
    data["handled_commands"] = list(state.handled_commands)
    if state.lease is not None:
        data["lease"]["certainty"] = state.lease.certainty.value
    if state.stop is not None:
        data["stop"]["kind"] = state.stop.kind.value
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode("utf-8")


def decode_state(raw: bytes) -> RunState:
    data = json.loads(raw)
    data["status"] = RunStatus(data["status"])
    data["handled_commands"] = tuple(data["handled_commands"])
    lease = data.get("lease")
    if lease is not None:
        lease["certainty"] = LeaseCertainty(lease["certainty"])
        lease["capabilities"] = tuple(lease.get("capabilities", ()))
        data["lease"] = LeaseState(**lease)
    wait = data.get("input_wait")
    if wait is not None:
        data["input_wait"] = InputWait(**wait)
    data["input_responses"] = tuple(data.get("input_responses", ()))
    data["effects"] = tuple(EffectRecord(**e) for e in data.get("effects", ()))
    stop = data.get("stop")
    if stop is not None:
        stop["kind"] = StopKind(stop["kind"])
        data["stop"] = StopRequest(**stop)
    return RunState(**data)
