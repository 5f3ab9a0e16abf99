"""The Run aggregate's own commands and events, every contract's union, and the wire mapping.

Field names are snake_case here and camelCase on the wire (the Avro schemas in schemas/runs);
`to_record`/`from_record` translate one to the other so no other module spells a wire name.
Avro maps are read-only mappings here, Avro arrays are tuples, and nested Avro records are
frozen dataclasses (e.g. ArtifactEntry), so values stay immutable. The lease holder's contracts
live in leases.py and the longer life of a Run in lifecycle.py; the one mapping table is here.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Union

from services.common.contracts._headers import (
    COMMANDS_NS,
    EVENTS_NS,
    INCIDENTS_NS,
    POLICY_EVENTS_NS,
    REJECTIONS_NS,
    TRAJECTORY_COMMANDS_NS,
    TRAJECTORY_EVENTS_NS,
    WATCHDOG_COMMANDS_NS,
    WATCHDOG_EVENTS_NS,
    CommandHeader,
    EventHeader,
)
from services.common.contracts.breakers import (
    BREAKER_COMMAND_TYPES,
    BREAKER_COMMANDS_NS,
    BREAKER_EVENT_TYPES,
    BREAKER_EVENTS_NS,
)
from services.common.contracts.leases import (
    AttemptClaimed,
    AttemptReported,
    ClaimRun,
    EffectIntentRecorded,
    EffectOutcomeRecorded,
    LeaseAtRisk,
    LeaseExpired,
    LeaseRenewed,
    LeaseTakenOver,
    RecordEffectIntent,
    RecordEffectOutcome,
    RenewLease,
    RenewLeases,
    ReportAttempt,
    RequestUploadGrant,
    RunRequeued,
    TakeOverLease,
    UploadGrantIssued,
)
from services.common.contracts.lifecycle import (
    DeadlineReached,
    InputProvided,
    InputRequested,
    ProvideInput,
    RequestInput,
    RetryRun,
    RunCancelRequested,
    RunFailed,
    RunInterrupted,
    RunRetried,
)
from services.common.contracts.quarantine import (
    QUARANTINE_COMMAND_TYPES,
    QUARANTINE_COMMANDS_NS,
    QUARANTINE_EVENT_TYPES,
    QUARANTINE_EVENTS_NS,
)
from services.common.contracts.schedules import (
    SCHEDULE_COMMAND_TYPES,
    SCHEDULE_COMMANDS_NS,
    SCHEDULE_EVENT_TYPES,
    SCHEDULE_EVENTS_NS,
)
from services.common.contracts.trajectories import (
    AbortTrajectory,
    AdoptLease,
    ApprovePivot,
    CompensationCompleted,
    CompensationFailed,
    CompensationStackRetired,
    FinishTrajectory,
    IncidentOpened,
    IncidentResolved,
    LeaseAdopted,
    LeaseRevocationRecorded,
    PivotApproved,
    PivotGateEvaluated,
    ProposeStep,
    RecordCompensationOutcome,
    RecordLeaseRevocation,
    RecordPivotGate,
    RecordStepOutcome,
    RecordWatchdogIntervention,
    RecoveryDecided,
    ResolveIncident,
    StartTrajectory,
    StepCommitted,
    StepFailed,
    StepIntentRecorded,
    StepOutcomeUnknown,
    TrajectoryCompleted,
    TrajectoryFrozen,
    TrajectoryRolledBack,
    TrajectoryStarted,
    WatchdogInterventionRecorded,
)
from services.common.contracts.watchdog import WATCHDOG_COMMAND_TYPES, WATCHDOG_EVENT_TYPES
from services.common.ids import derived_id

__all__ = [
    "COMMAND_TYPES",
    "EVENT_TYPES",
    "TRAJECTORY_COMMAND_TYPES",
    "TRAJECTORY_EVENT_TYPES",
    "CancelRun",
    "CommandRejected",
    "RunCancelled",
    "RunCommand",
    "RunEvent",
    "RunSubmitted",
    "SubmitRun",
    "TrajectoryCommand",
    "TrajectoryEvent",
    "from_record",
    "full_name_of",
    "to_record",
]


# --- the Run's own commands and events --------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SubmitRun(CommandHeader):
    """Create a Run; `parent_run_id` names the terminal Run a user's retry copies (EXE-5)."""

    tenant: str
    idempotency_key: str
    execution_spec: str
    retry_safe: bool = False
    timeout_seconds: int
    max_attempts: int = 3
    parent_run_id: str | None = None
    # v3 (EXE-14): what the run runs, when a schedule (or a caller) names it; labels as given.
    agent_revision_id: str | None = None
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, kw_only=True)
class CancelRun(CommandHeader):
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class RunSubmitted(EventHeader):
    tenant: str
    idempotency_key: str
    execution_spec: str
    spec_digest: str
    retry_safe: bool
    timeout_seconds: int
    max_attempts: int
    queue_reservation_id: str
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    parent_run_id: str | None = None
    agent_revision_id: str | None = None  # v4 (EXE-14)


@dataclass(frozen=True, kw_only=True)
class RunCancelled(EventHeader):
    reason: str
    previous_status: str
    reservation_released: bool


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

    @classmethod
    def of(
        cls, command: Any, code: str, detail: str, status: str | None, version: int, now_ms: int
    ) -> CommandRejected:
        """The refusal of `command` (any aggregate's), addressed to whoever sent it; its id is
        derived from the command, so re-deciding the command gives the same record."""
        return cls(
            event_id=derived_id("rej", command.command_id),
            run_id=command.run_id,
            occurred_at=now_ms,
            causation_id=command.command_id,
            correlation_id=command.correlation_id,
            actor=command.actor,
            command_type=type(command).__name__,
            code=code,
            detail=detail,
            current_status=status,
            current_version=version,
        )


# --- unions ---------------------------------------------------------------------------------

RunCommand = Union[
    SubmitRun,
    CancelRun,
    ClaimRun,
    RenewLease,
    ReportAttempt,
    TakeOverLease,
    RecordEffectIntent,
    RecordEffectOutcome,
    RetryRun,
    RequestInput,
    ProvideInput,
    RequestUploadGrant,
]
RunEvent = Union[
    RunSubmitted,
    RunCancelled,
    AttemptClaimed,
    LeaseRenewed,
    LeaseAtRisk,
    LeaseExpired,
    RunRequeued,
    LeaseTakenOver,
    AttemptReported,
    EffectIntentRecorded,
    EffectOutcomeRecorded,
    RunCancelRequested,
    RunInterrupted,
    DeadlineReached,
    RunFailed,
    RunRetried,
    InputRequested,
    InputProvided,
    UploadGrantIssued,
]

TrajectoryCommand = Union[
    StartTrajectory,
    ProposeStep,
    RecordStepOutcome,
    RecordCompensationOutcome,
    RecordPivotGate,
    ApprovePivot,
    FinishTrajectory,
    AbortTrajectory,
    RecordLeaseRevocation,
    ResolveIncident,
    AdoptLease,
    RecordWatchdogIntervention,
]
TrajectoryEvent = Union[
    TrajectoryStarted,
    StepIntentRecorded,
    PivotGateEvaluated,
    PivotApproved,
    StepCommitted,
    StepOutcomeUnknown,
    StepFailed,
    RecoveryDecided,
    CompensationStackRetired,
    CompensationCompleted,
    CompensationFailed,
    TrajectoryCompleted,
    TrajectoryRolledBack,
    TrajectoryFrozen,
    LeaseRevocationRecorded,
    IncidentResolved,
    LeaseAdopted,
    WatchdogInterventionRecorded,
]


@dataclass(frozen=True, kw_only=True)
class BlockChanged:
    """An operator blocked or unblocked a principal or a tenant (the block policy of EXE-2)."""

    event_id: str
    subject_kind: str
    subject: str
    blocked: bool
    reason: str
    occurred_at: int
    actor: str


# --- wire mapping ---------------------------------------------------------------------------

COMMAND_TYPES: tuple[type[Any], ...] = typing.get_args(RunCommand)
EVENT_TYPES: tuple[type[Any], ...] = typing.get_args(RunEvent)
TRAJECTORY_COMMAND_TYPES: tuple[type[Any], ...] = typing.get_args(TrajectoryCommand)
TRAJECTORY_EVENT_TYPES: tuple[type[Any], ...] = typing.get_args(TrajectoryEvent)
_NAMESPACE_BY_TYPE: dict[type[Any], str] = {
    **{cls: COMMANDS_NS for cls in COMMAND_TYPES},
    RenewLeases: COMMANDS_NS,  # an envelope of RenewLease commands, not a command of its own
    **{cls: EVENTS_NS for cls in EVENT_TYPES},
    CommandRejected: REJECTIONS_NS,
    BlockChanged: POLICY_EVENTS_NS,
    **{cls: TRAJECTORY_COMMANDS_NS for cls in TRAJECTORY_COMMAND_TYPES},
    **{cls: TRAJECTORY_EVENTS_NS for cls in TRAJECTORY_EVENT_TYPES},
    IncidentOpened: INCIDENTS_NS,
    **{cls: WATCHDOG_COMMANDS_NS for cls in WATCHDOG_COMMAND_TYPES},
    **{cls: WATCHDOG_EVENTS_NS for cls in WATCHDOG_EVENT_TYPES},
    **{cls: BREAKER_COMMANDS_NS for cls in BREAKER_COMMAND_TYPES},
    **{cls: BREAKER_EVENTS_NS for cls in BREAKER_EVENT_TYPES},
    **{cls: SCHEDULE_COMMANDS_NS for cls in SCHEDULE_COMMAND_TYPES},
    **{cls: SCHEDULE_EVENTS_NS for cls in SCHEDULE_EVENT_TYPES},
    **{cls: QUARANTINE_COMMANDS_NS for cls in QUARANTINE_COMMAND_TYPES},
    **{cls: QUARANTINE_EVENTS_NS for cls in QUARANTINE_EVENT_TYPES},
}
_TYPE_BY_FULL_NAME: dict[str, type[Any]] = {
    f"{ns}.{cls.__name__}": cls for cls, ns in _NAMESPACE_BY_TYPE.items()
}

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


def _is_record_value(value: object) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


# cls -> ((field name, wire key), ...): resolved once per type, not per value (issue 16).
_WIRE_KEYS: dict[type[Any], tuple[tuple[str, str], ...]] = {}


def _record_of(value: Any) -> dict[str, Any]:
    cls = type(value)
    keys = _WIRE_KEYS.get(cls)
    if keys is None:
        keys = _WIRE_KEYS[cls] = tuple((f.name, _to_camel(f.name)) for f in dataclasses.fields(value))
    return {key: _to_wire(getattr(value, name)) for name, key in keys}


def _to_wire(value: Any) -> Any:
    if type(value) in _WIRE_SCALARS:
        return value
    if _is_record_value(value):
        return _record_of(value)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return [_to_wire(item) for item in value]
    return value


# What a decoded Avro value mostly is: passed through without the (slow, ABC) Mapping check.
_WIRE_SCALARS = frozenset({str, int, bool, float, bytes, type(None)})


def _from_wire(value: Any) -> Any:
    # Read-only containers keep decoded values immutable, and tuples keep them hashable.
    if type(value) in _WIRE_SCALARS:
        return value
    if isinstance(value, Mapping):
        return MappingProxyType(dict(value))
    if isinstance(value, list):
        return tuple(value)
    return value


_ARRAY_OF_RECORD_FIELDS: dict[type[Any], dict[str, type[Any]]] = {}


def _array_of_record_fields(cls: type[Any]) -> dict[str, type[Any]]:
    """Fields typed `tuple[SomeRecord, ...]`: field name -> the nested record's dataclass.

    A wire value alone cannot tell an array of records from an array of maps, so the type hints
    decide which items become dataclasses. Resolving hints is slow, hence the memo.
    """
    known = _ARRAY_OF_RECORD_FIELDS.get(cls)
    if known is not None:
        return known
    nested: dict[str, type[Any]] = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = typing.get_args(hint)
        is_variadic_tuple = typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis
        if is_variadic_tuple and isinstance(args[0], type) and dataclasses.is_dataclass(args[0]):
            nested[name] = args[0]
    _ARRAY_OF_RECORD_FIELDS[cls] = nested
    return nested


# cls -> {wire key: (field name, the nested record's dataclass or None)}; a wire key that is no
# field maps to None. Built once per type: a restore decodes every event (issue 16).
_BUILD_PLANS: dict[type[Any], dict[str, tuple[str, type[Any] | None] | None]] = {}


def _build_plan(cls: type[Any], key: str) -> tuple[str, type[Any] | None] | None:
    plan = _BUILD_PLANS.setdefault(cls, {})
    if key not in plan:
        name = _to_snake(key)
        if name in {f.name for f in dataclasses.fields(cls)}:
            plan[key] = (name, _array_of_record_fields(cls).get(name))
        else:
            plan[key] = None
    return plan[key]


# cls -> a function building it from a record that has every field's wire key (compiled once,
# as dataclasses compiles __init__), or None for a type it cannot express. A record missing a
# key raises KeyError in it and is built by `_build_any`, so both give the same value.
_BUILDERS: dict[type[Any], Callable[[Mapping[str, Any]], Any] | None] = {}


def _compile_builder(cls: type[Any]) -> Callable[[Mapping[str, Any]], Any] | None:
    nested = _array_of_record_fields(cls)
    arguments = []
    for f in dataclasses.fields(cls):
        key = _to_camel(f.name)
        if not f.init or _to_snake(key) != f.name or not f.name.isidentifier():
            return None
        if f.name in nested:
            value = f"tuple(_build(nested[{f.name!r}], item) for item in r[{key!r}])"
        else:
            value = f"(v if type(v := r[{key!r}]) in scalars else from_wire(v))"
        arguments.append(f"{f.name}={value}")
    source = f"def build(r):\n    return cls({', '.join(arguments)})\n"
    scope: dict[str, Any] = {
        "cls": cls,
        "nested": nested,
        "_build": _build,
        "scalars": _WIRE_SCALARS,
        "from_wire": _from_wire,
    }
    exec(source, scope)  # built from field names only, as dataclasses builds __init__
    builder: Callable[[Mapping[str, Any]], Any] = scope["build"]
    return builder


def _build(cls: type[Any], record: Mapping[str, Any]) -> Any:
    if cls in _BUILDERS:
        builder = _BUILDERS[cls]
    else:
        builder = _BUILDERS[cls] = _compile_builder(cls)
    if builder is not None:
        try:
            return builder(record)
        except KeyError:
            pass  # a field's key is missing: its default applies, as below
    return _build_any(cls, record)


def _build_any(cls: type[Any], record: Mapping[str, Any]) -> Any:
    plan = _BUILD_PLANS.get(cls) or {}
    kwargs: dict[str, Any] = {}
    for key, value in record.items():
        step = plan[key] if key in plan else _build_plan(cls, key)
        if step is None:
            continue
        name, nested = step
        if nested is not None:
            kwargs[name] = tuple(_build(nested, item) for item in value)
        else:
            kwargs[name] = _from_wire(value)
    return cls(**kwargs)


def to_record(message: object) -> dict[str, Any]:
    """The Avro record of a contract value: camelCase keys, maps as dicts, arrays as lists and
    nested records (e.g. ArtifactEntry) as camelCase dicts."""
    if not _is_record_value(message):
        raise TypeError(f"not a contract value: {message!r}")
    return _record_of(message)


def from_record(full_name: str, record: Mapping[str, Any]) -> Any:
    """The contract value for a decoded Avro record; unknown wire fields are ignored.

    Maps become read-only mappings, arrays become tuples and nested records their frozen
    dataclasses (e.g. ArtifactEntry), so the value stays immutable.
    """
    try:
        cls = _TYPE_BY_FULL_NAME[full_name]
    except KeyError:
        raise KeyError(f"no contract type is registered for schema {full_name!r}") from None
    return _build(cls, record)
