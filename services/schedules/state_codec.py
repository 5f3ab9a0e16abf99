"""ScheduleState <-> bytes for the RocksDB store (a cache of the log's fold, never the record)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from services.schedules.domain import Definition, Firing, FiringStatus, ScheduleState, ScheduleStatus

__all__ = ["decode_state", "encode_state"]


def encode_state(state: ScheduleState) -> bytes:
    return json.dumps(asdict(state), separators=(",", ":")).encode("utf-8")


def _firing(data: dict[str, Any]) -> Firing:
    return Firing(**{**data, "status": FiringStatus(data["status"])})


def decode_state(raw: bytes) -> ScheduleState:
    data = json.loads(raw)
    definition = data.pop("definition")
    pending = data.pop("pending")
    return ScheduleState(
        **{
            **data,
            "status": ScheduleStatus(data["status"]),
            "active_runs": tuple(data["active_runs"]),
            "history": tuple(_firing(f) for f in data["history"]),
            "recent": tuple(data["recent"]),
        },
        definition=Definition(**{**definition, "labels": tuple((k, v) for k, v in definition["labels"])}),
        pending=_firing(pending) if pending is not None else None,
    )
