"""RunState <-> bytes for the local store. JSON keeps the store readable with any RocksDB tool.

`state_record` / `state_from_record` are the same mapping one level up (a JSON-able dict), for
stores that keep a RunState inside a larger JSON document (the Run view projection). Decoding
tolerates states written before a field existed: a missing field takes its default.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from services.common import jsonbytes
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

__all__ = ["STATE_FORMAT", "decode_state", "encode_state", "state_from_record", "state_record"]


def _format_of(*types: type) -> str:
    """A name for the layout `encode_state` writes: every field's name and declared type."""
    layout = ";".join(
        f"{t.__name__}:" + ",".join(f"{f.name}={f.type}" for f in dataclasses.fields(t)) for t in types
    )
    return "run/" + hashlib.sha256(layout.encode()).hexdigest()[:16]


# What the state changelog's records are stamped with (services/common/aggregate/changelog.py):
# any change to a field of these types gives another name, and the changelog is written again.
STATE_FORMAT = _format_of(RunState, LeaseState, InputWait, EffectRecord, StopRequest)


def state_record(state: RunState) -> dict[str, Any]:
    # Field by field rather than dataclasses.asdict, which deep-copies every value on the way:
    # this runs for every run a batch changes. The JSON is the same as asdict's.
    data = _plain(state)
    data["status"] = state.status.value
    data["handled_commands"] = list(state.handled_commands)
    data["input_responses"] = list(state.input_responses)
    data["handled_renewals"] = list(state.handled_renewals)
    data["effects"] = [_plain(effect) for effect in state.effects]
    lease, wait, stop = state.lease, state.input_wait, state.stop
    if lease is not None:
        data["lease"] = {
            **_plain(lease),
            "certainty": lease.certainty.value,
            "capabilities": list(lease.capabilities),
        }
    if wait is not None:
        data["input_wait"] = _plain(wait)
    if stop is not None:
        data["stop"] = {**_plain(stop), "kind": stop.kind.value}
    return data


_FIELDS: dict[type, tuple[str, ...]] = {}


def _plain(value: Any) -> dict[str, Any]:
    """A dataclass value's fields as a dict, one level deep."""
    names = _FIELDS.get(type(value))
    if names is None:
        names = _FIELDS[type(value)] = tuple(f.name for f in dataclasses.fields(value))
    return {name: getattr(value, name) for name in names}


def state_from_record(record: dict[str, Any]) -> RunState:
    data = dict(record)
    data["status"] = RunStatus(data["status"])
    data["handled_commands"] = tuple(data["handled_commands"])
    lease = data.get("lease")
    if lease is not None:
        lease = dict(lease)
        lease["certainty"] = LeaseCertainty(lease["certainty"])
        lease["capabilities"] = tuple(lease.get("capabilities", ()))
        data["lease"] = LeaseState(**lease)
    wait = data.get("input_wait")
    if wait is not None:
        data["input_wait"] = InputWait(**wait)
    data["input_responses"] = tuple(data.get("input_responses", ()))
    data["handled_renewals"] = tuple(data.get("handled_renewals", ()))
    data["effects"] = tuple(EffectRecord(**e) for e in data.get("effects", ()))
    stop = data.get("stop")
    if stop is not None:
        stop = dict(stop)
        stop["kind"] = StopKind(stop["kind"])
        data["stop"] = StopRequest(**stop)
    return RunState(**data)


def encode_state(state: RunState) -> bytes:
    # The dataclass itself, encoded in C: the same document as state_record's, with each
    # object's keys in field order rather than sorted (decode_state reads either).
    return jsonbytes.dumps(state)


def decode_state(raw: bytes) -> RunState:
    return state_from_record(jsonbytes.loads(raw))
