"""WatchdogState <-> bytes for the RocksDB store (a cache of the log's fold, never the record).

JSON keeps the store readable with any RocksDB tool. The rings (marks, metric points, failures)
are written as positional arrays, not objects: a state is encoded for every run a batch changes,
so its size and encoding time are on every observation's path (bench/watchdog_detectors.py).
Tuples come back as tuples and nested records as their frozen dataclasses, so a decoded state
equals the folded one (tests/unit/watchdog/test_decide_evolve.py).
"""

from __future__ import annotations

import json
from dataclasses import fields

from services.watchdog.domain import (
    Failure,
    Mark,
    MetricPoint,
    Poll,
    Thresholds,
    WatchdogState,
    WatchdogStatus,
)

__all__ = ["decode_state", "encode_state"]

_THRESHOLDS = tuple(f.name for f in fields(Thresholds))


def _marks(marks: tuple[Mark, ...]) -> list[list[object]]:
    return [[m.turn, m.step_seq, m.state_hash, m.action_hash] for m in marks]


def _mark(mark: Mark | None) -> list[object] | None:
    return None if mark is None else [mark.turn, mark.step_seq, mark.state_hash, mark.action_hash]


def encode_state(state: WatchdogState) -> bytes:
    poll = state.poll
    data = {
        "run_id": state.run_id,
        "version": state.version,
        "status": state.status.value,
        "thresholds": {name: getattr(state.thresholds, name) for name in _THRESHOLDS},
        "configured_by": list(state.configured_by),
        "turn": state.turn,
        "last_saga_seq": state.last_saga_seq,
        "last_runner_seq": state.last_runner_seq,
        "marks": _marks(state.marks),
        "recent": _marks(state.recent),
        "last_mutation": state.last_mutation,
        "mutations": state.mutations,
        "last_state_hash": state.last_state_hash,
        "best": list(state.best),
        "gain_turn": state.gain_turn,
        "since_gain": state.since_gain,
        "trail": [[p.turn, p.step_seq, list(p.values)] for p in state.trail],
        "failures": [
            [f.action_hash, f.turn, f.step_seq, f.state_hash, f.mutations, f.repeats] for f in state.failures
        ],
        "poll": None
        if poll is None
        else [poll.action_hash, poll.summary_digest, poll.turn, poll.step_seq, poll.idle],
        "probation_from": state.probation_from,
        "rollbacks": state.rollbacks,
        "pending_rollback": state.pending_rollback,
        "acknowledged": list(state.acknowledged),
        "checkpoint": _mark(state.checkpoint),
        "tombstones": list(state.tombstones),
        "interventions": state.interventions,
    }
    return json.dumps(data, separators=(",", ":")).encode("utf-8")


def decode_state(raw: bytes) -> WatchdogState:
    data = json.loads(raw)
    poll, checkpoint = data["poll"], data["checkpoint"]
    return WatchdogState(
        **{
            **data,
            "status": WatchdogStatus(data["status"]),
            "thresholds": Thresholds(**data["thresholds"]),
            "configured_by": tuple(data["configured_by"]),
            "marks": tuple(Mark(*m) for m in data["marks"]),
            "recent": tuple(Mark(*m) for m in data["recent"]),
            "best": tuple(data["best"]),
            "trail": tuple(MetricPoint(t, s, tuple(v)) for t, s, v in data["trail"]),
            "failures": tuple(Failure(*f) for f in data["failures"]),
            "poll": Poll(*poll) if poll is not None else None,
            "acknowledged": tuple(data["acknowledged"]),
            "checkpoint": Mark(*checkpoint) if checkpoint is not None else None,
            "tombstones": tuple(data["tombstones"]),
        }
    )
