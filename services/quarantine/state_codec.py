"""Quarantine and graph states <-> bytes for the RocksDB store (a cache of the log's fold).

JSON keeps the store readable with any RocksDB tool; a tag says which aggregate a value is, and
tuples, enums and nested dataclasses come back as they were, so a decoded state equals the fold.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from services.quarantine.domain import (
    AnyState,
    Artifact,
    ArtifactStatus,
    GraphState,
    QuarantineState,
    QuarantineStatus,
    Stage,
    Window,
)

__all__ = ["decode_state", "encode_state"]


def encode_state(state: AnyState) -> bytes:
    if isinstance(state, QuarantineState):
        data: dict[str, Any] = {"kind": "quarantine", **asdict(state), "status": state.status.value}
    else:
        data = {
            "kind": "graph",
            "graph_id": state.graph_id,
            "version": state.version,
            "artifacts": {i: {**asdict(a), "status": a.status.value} for i, a in state.artifacts.items()},
            "reads": {run: list(ids) for run, ids in state.reads.items()},
            "quarantined": {run: [w.since_step, w.since_at] for run, w in state.quarantined.items()},
            "suspect_runs": dict(state.suspect_runs),
            "recent": list(state.recent),
        }
    return json.dumps(data, separators=(",", ":")).encode("utf-8")


def decode_state(raw: bytes) -> AnyState:
    data = json.loads(raw)
    kind = data.pop("kind")
    if kind == "quarantine":
        return QuarantineState(
            **{
                **data,
                "status": QuarantineStatus(data["status"]),
                "stages": tuple(Stage(**s) for s in data["stages"]),
                "recent": tuple(data["recent"]),
            }
        )
    return GraphState(
        graph_id=data["graph_id"],
        version=data["version"],
        artifacts={
            i: Artifact(
                **{**a, "status": ArtifactStatus(a["status"]), "derived_from": tuple(a["derived_from"])}
            )
            for i, a in data["artifacts"].items()
        },
        reads={run: tuple(ids) for run, ids in data["reads"].items()},
        quarantined={run: Window(w[0], w[1]) for run, w in data["quarantined"].items()},
        suspect_runs=dict(data["suspect_runs"]),
        recent=tuple(data["recent"]),
    )
