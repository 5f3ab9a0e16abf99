"""TrajectoryState <-> bytes for the RocksDB store (a cache of the log's fold, never the record)."""

from __future__ import annotations

import dataclasses
from typing import Any

from services.common import jsonbytes
from services.saga_orchestrator.domain.lifecycle import StepStatus, TrajectoryStatus
from services.saga_orchestrator.domain.state import Incident, StepState, TrajectoryState

__all__ = ["decode_state", "encode_state", "state_from_record", "state_record"]


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


def state_record(state: TrajectoryState) -> dict[str, Any]:
    """The state as a JSON-able dict: what `encode_state` writes, for documents that embed it
    (the trajectory view's fold), so they need not encode it to text and parse it back."""
    record: dict[str, Any] = _plain(state)
    return record


def encode_state(state: TrajectoryState) -> bytes:
    return jsonbytes.dumps(state_record(state))


def decode_state(raw: bytes) -> TrajectoryState:
    return state_from_record(jsonbytes.loads(raw))


def state_from_record(record: dict[str, Any]) -> TrajectoryState:
    data = dict(record)
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
