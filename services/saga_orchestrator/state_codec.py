"""TrajectoryState <-> bytes for the RocksDB store (a cache of the log's fold, never the record)."""

from __future__ import annotations

import dataclasses
from typing import Any

from services.common import jsonbytes
from services.saga_orchestrator.domain.lifecycle import StepStatus, TrajectoryStatus
from services.saga_orchestrator.domain.state import Incident, StepState, TrajectoryState

__all__ = ["decode_state", "encode_state"]


def _plain(value: Any) -> Any:
    if isinstance(value, (StepStatus, TrajectoryStatus)):
        return value.value
    if isinstance(value, frozenset):
        return sorted(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def encode_state(state: TrajectoryState) -> bytes:
    return jsonbytes.dumps(_plain(state))


def decode_state(raw: bytes) -> TrajectoryState:
    data = jsonbytes.loads(raw)
    steps = tuple(
        StepState(**{**s, "status": StepStatus(s["status"]), "signatures": tuple(s["signatures"])})
        for s in data.pop("steps")
    )
    incident = data.pop("incident")
    return TrajectoryState(
        **{
            **data,
            "status": TrajectoryStatus(data["status"]),
            "steps": steps,
            "stack": tuple(data["stack"]),
            "compensated": tuple(data["compensated"]),
            "causes": frozenset(data["causes"]),
            "tombstones": tuple(data.get("tombstones", ())),
            "incident": None
            if incident is None
            else Incident(**{**incident, "resume_to": TrajectoryStatus(incident["resume_to"])}),
        }
    )
