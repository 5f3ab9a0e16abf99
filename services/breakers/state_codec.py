"""BreakerState <-> bytes for the RocksDB store (a cache of the log's fold, never the record).

JSON keeps the store readable with any RocksDB tool; tuples come back as tuples and the canary as
its frozen dataclass, so a decoded state equals the folded one.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from services.breakers.domain import BreakerState, BreakerStatus, Canary

__all__ = ["decode_state", "encode_state"]


def encode_state(state: BreakerState) -> bytes:
    data = asdict(state)
    data["status"] = state.status.value
    return json.dumps(data, separators=(",", ":")).encode("utf-8")


def decode_state(raw: bytes) -> BreakerState:
    data = json.loads(raw)
    canary = data.pop("canary")
    return BreakerState(
        **{
            **data,
            "status": BreakerStatus(data["status"]),
            "window": tuple(data["window"]),
            "instances": tuple((instance, seq) for instance, seq in data["instances"]),
            "recent": tuple(data["recent"]),
        },
        canary=Canary(**canary) if canary is not None else None,
    )
