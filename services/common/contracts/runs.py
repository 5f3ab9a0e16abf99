"""Commands, events and rejections of the Run aggregate as immutable values.

Field names are snake_case here and camelCase on the wire (the Avro schemas in schemas/runs);
`to_record`/`from_record` translate one to the other so no other module spells a wire name.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Union

__all__ = [
    "COMMAND_TYPES",
    "EVENT_TYPES",
    "CancelRun",
    "CommandRejected",
    "RunCancelled",
    "RunCommand",
    "RunEvent",
    "RunSubmitted",
    "SubmitRun",
    "from_record",
    "full_name_of",
    "to_record",
]

_COMMANDS_NS = "tenure.runs.commands"
_EVENTS_NS = "tenure.runs.events"
_REJECTIONS_NS = "tenure.runs.rejections"


# --- commands -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _CommandBase:
    command_id: str
    run_id: str
    issued_at: int
    correlation_id: str
    actor: str


@dataclass(frozen=True, kw_only=True)
class SubmitRun(_CommandBase):
    tenant: str
    idempotency_key: str
    execution_spec: str
    retry_safe: bool = False
    timeout_seconds: int
    max_attempts: int = 3


@dataclass(frozen=True, kw_only=True)
class CancelRun(_CommandBase):
    reason: str = ""


RunCommand = Union[SubmitRun, CancelRun]

# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _EventBase:
    event_id: str
    run_id: str
    version: int
    occurred_at: int
    causation_id: str
    correlation_id: str
    actor: str


@dataclass(frozen=True, kw_only=True)
class RunSubmitted(_EventBase):
    tenant: str
    idempotency_key: str
    execution_spec: str
    spec_digest: str
    retry_safe: bool
    timeout_seconds: int
    max_attempts: int
    queue_reservation_id: str
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, kw_only=True)
class RunCancelled(_EventBase):
    reason: str
    previous_status: str
    reservation_released: bool


RunEvent = Union[RunSubmitted, RunCancelled]

# --- rejections -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CommandRejected:
    """A command the processor refused. It changes nothing, so it carries no aggregate version."""

    event_id: str
    run_id: str
    occurred_at: int
    causation_id: str
    correlation_id: str
    actor: str
    command_type: str
    code: str
    detail: str
    current_status: str | None
    current_version: int


# --- wire mapping ---------------------------------------------------------------------------

_NAMESPACE_BY_TYPE: dict[type[Any], str] = {
    SubmitRun: _COMMANDS_NS,
    CancelRun: _COMMANDS_NS,
    RunSubmitted: _EVENTS_NS,
    RunCancelled: _EVENTS_NS,
    CommandRejected: _REJECTIONS_NS,
}
_TYPE_BY_FULL_NAME: dict[str, type[Any]] = {
    f"{ns}.{cls.__name__}": cls for cls, ns in _NAMESPACE_BY_TYPE.items()
}
COMMAND_TYPES: tuple[type[Any], ...] = (SubmitRun, CancelRun)
EVENT_TYPES: tuple[type[Any], ...] = (RunSubmitted, RunCancelled)

_CAMEL_BOUNDARY = re.compile(r"_([a-z])")
_SNAKE_BOUNDARY = re.compile(r"([A-Z])")


def _to_camel(name: str) -> str:
    return _CAMEL_BOUNDARY.sub(lambda m: m.group(1).upper(), name)


def _to_snake(name: str) -> str:
    return _SNAKE_BOUNDARY.sub(lambda m: "_" + m.group(1).lower(), name)


def full_name_of(message: object) -> str:
    """The Avro full name of a contract value or type, e.g. tenure.runs.events.RunSubmitted."""
    cls = message if isinstance(message, type) else type(message)
    return f"{_NAMESPACE_BY_TYPE[cls]}.{cls.__name__}"


def to_record(message: object) -> dict[str, Any]:
    """The Avro record (camelCase dict) of a contract value."""
    if not dataclasses.is_dataclass(message) or isinstance(message, type):
        raise TypeError(f"not a contract value: {message!r}")
    record: dict[str, Any] = {}
    for f in dataclasses.fields(message):
        value = getattr(message, f.name)
        record[_to_camel(f.name)] = dict(value) if isinstance(value, Mapping) else value
    return record


def from_record(full_name: str, record: Mapping[str, Any]) -> Any:
    """The contract value for a decoded Avro record; unknown wire fields are ignored."""
    try:
        cls = _TYPE_BY_FULL_NAME[full_name]
    except KeyError:
        raise KeyError(f"no contract type is registered for schema {full_name!r}") from None
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in record.items():
        name = _to_snake(key)
        if name in names:
            kwargs[name] = MappingProxyType(dict(value)) if isinstance(value, Mapping) else value
    return cls(**kwargs)
