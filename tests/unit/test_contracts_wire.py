"""Contract types <-> Avro wire: names, fields, defaults and exact round trips through MessageCodec.

Every schema under schemas/ must have exactly one frozen contract type whose snake_case fields
are the schema's camelCase fields in the same order, with matching Python types and defaults,
and every contract value must come back from the wire equal to what was sent. Avro arrays are
tuples on the Python side (so values stay immutable and hashable) and lists on the wire; a
nested Avro record (tenure.runs.ArtifactEntry) is a frozen dataclass with snake_case fields.

The expectations here are derived from the .avsc files and the golden samples with helpers of
this module, not with the mapping code under test, so a mistake in that code cannot hide itself.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.avro import SchemaRegistry
from services.common.contracts import (
    BREAKER_COMMAND_TYPES,
    BREAKER_EVENT_TYPES,
    COMMAND_TYPES,
    EVENT_TYPES,
    TRAJECTORY_COMMAND_TYPES,
    TRAJECTORY_EVENT_TYPES,
    WATCHDOG_COMMAND_TYPES,
    WATCHDOG_EVENT_TYPES,
    ArtifactEntry,
    AttemptReported,
    BatchedRenewal,
    BlockChanged,
    ClaimRun,
    CommandRejected,
    IncidentOpened,
    LeaseTakenOver,
    RecordEffectIntent,
    RecordEffectOutcome,
    RenewLease,
    RenewLeases,
    ReportAttempt,
    RequestInput,
    RequestUploadGrant,
    RunCommand,
    RunEvent,
    from_record,
    full_name_of,
    to_record,
)
from services.common.contracts.quarantine import QUARANTINE_COMMAND_TYPES, QUARANTINE_EVENT_TYPES
from services.common.contracts.schedules import SCHEDULE_COMMAND_TYPES, SCHEDULE_EVENT_TYPES
from services.common.messages import MessageCodec
from services.common.topics import POLICY, RUNS_COMMANDS, RUNS_EVENTS, RUNS_REJECTIONS

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = REPO_ROOT / "schemas"
GOLDEN_DIR = REPO_ROOT / "tests" / "golden"
REGISTRY = SchemaRegistry.from_directory(SCHEMA_DIR)
CODEC = MessageCodec(REGISTRY)
ALL_TYPES: tuple[type[Any], ...] = (
    *COMMAND_TYPES,
    RenewLeases,  # an envelope of RenewLease commands (issue 16), not one of the Run's commands
    *EVENT_TYPES,
    CommandRejected,
    BlockChanged,
    *TRAJECTORY_COMMAND_TYPES,
    *TRAJECTORY_EVENT_TYPES,
    IncidentOpened,
    *WATCHDOG_COMMAND_TYPES,
    *WATCHDOG_EVENT_TYPES,
    *BREAKER_COMMAND_TYPES,
    *BREAKER_EVENT_TYPES,
    *SCHEDULE_COMMAND_TYPES,
    *SCHEDULE_EVENT_TYPES,
    *QUARANTINE_COMMAND_TYPES,
    *QUARANTINE_EVENT_TYPES,
)

# Nested Avro records and their contract types, by Avro full name.
NESTED_TYPES: dict[str, type[Any]] = {
    "tenure.runs.ArtifactEntry": ArtifactEntry,
    "tenure.runs.commands.BatchedRenewal": BatchedRenewal,
}

# Wire defaults the Python type deliberately does not repeat: a rejection must always say
# whether the Run existed, so the processor has to pass current_status explicitly.
WIRE_ONLY_DEFAULTS = {(CommandRejected, "current_status")}


def _type_id(cls: type[Any]) -> str:
    return cls.__name__


def _snake(wire_name: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m.group(0).lower(), wire_name)


def _schema_fields(cls: type[Any]) -> list[dict[str, Any]]:
    return list(REGISTRY.latest(full_name_of(cls)).declared["fields"])


def _key_of(message: Any) -> str:
    """The Kafka key a message travels under: its run, or for a block its subject."""
    if isinstance(message, BlockChanged):
        return f"{message.subject_kind}:{message.subject}"
    return str(message.run_id)


def _topic_of(cls: type[Any]) -> str:
    if cls is BlockChanged:
        return POLICY.name
    if cls in COMMAND_TYPES:
        return RUNS_COMMANDS.name
    return RUNS_EVENTS.name if cls in EVENT_TYPES else RUNS_REJECTIONS.name


def _nested_record_type(avro_type: Any) -> type[Any] | None:
    """The contract type of an inline Avro record (as the .avsc declares it), else None."""
    if not (isinstance(avro_type, dict) and avro_type["type"] == "record"):
        return None
    name = avro_type["name"]
    full_name = name if "." in name else f"{avro_type['namespace']}.{name}"
    return NESTED_TYPES[full_name]


def _contract_value(
    cls: type[Any], record: Mapping[str, Any], fields: list[dict[str, Any]] | None = None
) -> Any:
    """`cls` built from a camelCase wire record by hand, guided by its schema `fields`: arrays as
    tuples (of nested contract values for arrays of records), maps read-only."""
    types_by_name = {f["name"]: f["type"] for f in (fields or _schema_fields(cls))}
    kwargs: dict[str, Any] = {}
    for key, value in record.items():
        avro_type = types_by_name[key]
        if isinstance(value, list):
            items = avro_type["items"]
            nested = _nested_record_type(items)
            value = tuple(
                value if nested is None else (_contract_value(nested, v, items["fields"]) for v in value)
            )
        elif isinstance(value, dict):
            value = MappingProxyType(dict(value))
        kwargs[_snake(key)] = value
    return cls(**kwargs)


def _from_golden(cls: type[Any]) -> tuple[dict[str, Any], Any]:
    """(wire record, expected contract value) of the newest golden sample of `cls`."""
    version = REGISTRY.latest(full_name_of(cls)).version
    expectation = json.loads((GOLDEN_DIR / f"{cls.__name__}.v{version}.json").read_text("utf-8"))
    record: dict[str, Any] = expectation["record"]
    return record, _contract_value(cls, record)


def _round_trip(message: Any) -> Any:
    outbound = CODEC.outbound(_topic_of(type(message)), _key_of(message), message)
    return CODEC.decode(outbound.value)


# --- names ----------------------------------------------------------------------------------


def test_every_schema_file_has_a_contract_type_and_vice_versa() -> None:
    declared = set()
    for path in SCHEMA_DIR.rglob("*.avsc"):
        schema = json.loads(path.read_text(encoding="utf-8"))
        declared.add(f"{schema['namespace']}.{schema['name']}")
    contract_names = [full_name_of(cls) for cls in ALL_TYPES]
    assert len(contract_names) == len(set(contract_names)), "a contract type is listed twice"
    assert set(contract_names) == declared
    assert set(REGISTRY.names()) == declared


@pytest.mark.parametrize("cls", ALL_TYPES, ids=_type_id)
def test_full_name_of_matches_the_schema_name(cls: type[Any]) -> None:
    schema = REGISTRY.latest(full_name_of(cls)).declared
    assert full_name_of(cls) == f"{schema['namespace']}.{schema['name']}"
    assert schema["name"] == cls.__name__
    _, message = _from_golden(cls)
    assert full_name_of(message) == full_name_of(cls)


def test_commands_and_events_live_in_their_namespaces_and_unions() -> None:
    assert all(full_name_of(cls).startswith("tenure.runs.commands.") for cls in COMMAND_TYPES)
    assert all(full_name_of(cls).startswith("tenure.runs.events.") for cls in EVENT_TYPES)
    assert set(typing.get_args(RunCommand)) == set(COMMAND_TYPES)
    assert set(typing.get_args(RunEvent)) == set(EVENT_TYPES)
    assert len(COMMAND_TYPES) == 12 and len(EVENT_TYPES) == 19


# --- fields, types and defaults ---------------------------------------------------------------


def _python_type_for(avro_type: Any) -> Any:
    if isinstance(avro_type, list):
        (branch,) = [t for t in avro_type if t != "null"]
        return _python_type_for(branch) | None
    nested = _nested_record_type(avro_type)
    if nested is not None:
        return nested
    if isinstance(avro_type, dict):
        if avro_type.get("logicalType") == "timestamp-millis":
            return int  # epoch millis; the codec never turns them into datetimes
        if avro_type["type"] == "array":
            return types.GenericAlias(tuple, (_python_type_for(avro_type["items"]), ...))
        if avro_type["type"] == "map":
            return types.GenericAlias(Mapping, (str, _python_type_for(avro_type["values"])))
        return _python_type_for(avro_type["type"])
    return {"string": str, "int": int, "long": int, "boolean": bool, "double": float}[avro_type]


def _shape(annotation: Any) -> Any:
    """A comparable form of a type hint: `X | None` and `Optional[X]`, typing.Mapping and
    collections.abc.Mapping compare equal."""
    origin = typing.get_origin(annotation)
    if origin is None:
        return annotation
    arguments = tuple(_shape(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return ("union", frozenset(arguments))
    return (origin, arguments)


def _python_default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _as_wire_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return dict(value) if isinstance(value, Mapping) else value


@pytest.mark.parametrize("cls", ALL_TYPES, ids=_type_id)
def test_dataclass_fields_are_the_schema_fields_in_order(cls: type[Any]) -> None:
    """Common header fields first, then the type's own, exactly as the schema lists them."""
    python_names = [f.name for f in dataclasses.fields(cls)]
    assert python_names == [_snake(f["name"]) for f in _schema_fields(cls)]


@pytest.mark.parametrize("cls", ALL_TYPES, ids=_type_id)
def test_dataclass_field_types_and_defaults_match_the_schema(cls: type[Any]) -> None:
    hints = typing.get_type_hints(cls)
    for python_field, wire_field in zip(dataclasses.fields(cls), _schema_fields(cls), strict=True):
        name = python_field.name
        assert _shape(hints[name]) == _shape(_python_type_for(wire_field["type"])), name
        default = _python_default(python_field)
        if default is dataclasses.MISSING:
            assert "default" not in wire_field or (cls, name) in WIRE_ONLY_DEFAULTS, (
                f"{cls.__name__}.{name} has a wire default but no Python default"
            )
        else:
            assert "default" in wire_field, f"{cls.__name__}.{name} has a Python default only"
            assert _as_wire_value(default) == wire_field["default"], name
            assert type(default) is not list and not isinstance(default, dict), (
                f"{cls.__name__}.{name}: a mutable default would make the value mutable"
            )


def test_holder_commands_carry_attempt_epoch_and_sequence_exe_4() -> None:
    """EXE-4: every heartbeat and terminal report carries attemptId, leaseEpoch and sequence;
    LEASE-3: effects carry the fencing epoch. Checked on the wire schemas themselves."""
    for cls in (RenewLease, ReportAttempt, RequestInput):
        fields = {f["name"]: f["type"] for f in _schema_fields(cls)}
        assert (fields["attemptId"], fields["leaseEpoch"], fields["sequence"]) == ("string", "long", "long")
    for effect_cls in (RecordEffectIntent, RecordEffectOutcome, RequestUploadGrant):
        assert {f["name"]: f["type"] for f in _schema_fields(effect_cls)}["leaseEpoch"] == "long"


def _artifact_entry_definitions() -> list[tuple[str, dict[str, Any]]]:
    """(schema file, inline definition) of tenure.runs.ArtifactEntry in every latest schema."""
    found = []
    for cls in ALL_TYPES:
        for wire_field in _schema_fields(cls):
            avro_type = wire_field["type"]
            is_array = isinstance(avro_type, dict) and avro_type["type"] == "array"
            if is_array and _nested_record_type(avro_type["items"]) is ArtifactEntry:
                found.append((f"{cls.__name__}.{wire_field['name']}", avro_type["items"]))
    return found


def test_artifact_entry_mirrors_its_inline_record_in_every_schema_exe_15() -> None:
    """EXE-15: a manifest entry is artifactId, digest, sizeBytes and mediaType, nothing else;
    the dataclass has exactly those fields, in order, with the schema's types and no defaults."""
    definitions = _artifact_entry_definitions()
    assert sorted(where for where, _ in definitions) == ["AttemptReported.manifest", "ReportAttempt.manifest"]
    hints = typing.get_type_hints(ArtifactEntry)
    for where, record in definitions:
        python_fields = dataclasses.fields(ArtifactEntry)
        assert [f.name for f in python_fields] == [_snake(f["name"]) for f in record["fields"]], where
        for python_field, wire_field in zip(python_fields, record["fields"], strict=True):
            assert hints[python_field.name] == _python_type_for(wire_field["type"]), where
            assert _python_default(python_field) is dataclasses.MISSING and "default" not in wire_field
    assert dataclasses.fields(ArtifactEntry)[2].name == "size_bytes" and hints["size_bytes"] is int


# --- wire mapping and round trips -------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL_TYPES, ids=_type_id)
def test_golden_record_maps_to_its_contract_value_and_back(cls: type[Any]) -> None:
    record, expected = _from_golden(cls)
    assert from_record(full_name_of(cls), record) == expected
    assert to_record(expected) == record


@pytest.mark.parametrize("cls", ALL_TYPES, ids=_type_id)
def test_every_contract_type_round_trips_through_message_codec(cls: type[Any]) -> None:
    _, message = _from_golden(cls)
    outbound = CODEC.outbound(_topic_of(cls), _key_of(message), message)
    decoded = CODEC.decode(outbound.value)
    assert type(decoded) is cls
    assert decoded == message
    assert outbound.key == _key_of(message).encode()
    assert dict(outbound.headers)["tenure-schema"] == full_name_of(cls).encode()
    assert CODEC.decode_record(outbound.value) == (full_name_of(cls), to_record(message))
    for field in dataclasses.fields(cls):
        value = getattr(decoded, field.name)
        assert type(value) is type(getattr(message, field.name)), field.name
    if not any(isinstance(getattr(decoded, f.name), Mapping) for f in dataclasses.fields(cls)):
        assert hash(decoded) == hash(message)


GOLDEN_STEMS = sorted(p.name.removesuffix(".bin") for p in GOLDEN_DIR.glob("*.bin"))


@pytest.mark.parametrize("stem", GOLDEN_STEMS)
def test_every_golden_decodes_into_the_latest_contract_type(stem: str) -> None:
    """Old versions on the log (e.g. AttemptClaimed v1, RunSubmitted v1/v2) still become today's
    contract values, with the fields added since then at their schema defaults."""
    expectation = json.loads((GOLDEN_DIR / f"{stem}.json").read_text("utf-8"))
    decoded = CODEC.decode((GOLDEN_DIR / f"{stem}.bin").read_bytes())
    assert full_name_of(decoded) == expectation["schema"]
    written = expectation["record"]
    latest_fields = REGISTRY.latest(expectation["schema"]).declared["fields"]
    resolved = {f["name"]: written.get(f["name"], f.get("default")) for f in latest_fields}
    assert all(f["name"] in written or "default" in f for f in latest_fields)
    assert decoded == _contract_value(type(decoded), resolved)


def test_array_fields_are_tuples_in_python_and_lists_on_the_wire() -> None:
    claim = ClaimRun(
        command_id="cmd-claim-1",
        run_id="run-1",
        issued_at=1_767_225_600_000,
        correlation_id="corr-1",
        actor="runner:runner-7",
        runner_id="runner-7",
        capabilities=("checkpoint-v1", "gpu-a100", "checkpoint-v1"),
    )
    assert to_record(claim)["capabilities"] == ["checkpoint-v1", "gpu-a100", "checkpoint-v1"]
    assert type(to_record(claim)["capabilities"]) is list
    decoded = _round_trip(claim)
    # Order and duplicates survive: an array is a sequence, not a set.
    assert decoded.capabilities == ("checkpoint-v1", "gpu-a100", "checkpoint-v1")
    assert type(decoded.capabilities) is tuple
    assert decoded == claim and hash(decoded) == hash(claim)
    assert {decoded, claim} == {claim}
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.capabilities = ()


def test_omitted_optional_fields_take_the_schema_defaults() -> None:
    claim = ClaimRun(
        command_id="cmd-claim-2",
        run_id="run-1",
        issued_at=1_767_225_600_000,
        correlation_id="corr-1",
        actor="runner:runner-8",
        runner_id="runner-8",
    )
    decoded = _round_trip(claim)
    assert (decoded.holder_kind, decoded.capabilities) == ("runner", ())
    assert (decoded.lease_seconds, decoded.heartbeat_seconds) == (0, 0)
    assert decoded == claim


def test_empty_and_non_empty_effects_attempted_round_trip() -> None:
    _, taken_over = _from_golden(LeaseTakenOver)
    assert taken_over.effects_attempted == ("eff-1", "eff-2")
    for effects in ((), ("eff-9",), ("é-1", "eff-2", "eff-3")):
        message = dataclasses.replace(taken_over, effects_attempted=effects)
        decoded = _round_trip(message)
        assert decoded.effects_attempted == effects and type(decoded.effects_attempted) is tuple
        assert decoded == message


_ENTRY_A = ArtifactEntry(
    artifact_id="a1", digest="sha256:" + "ab" * 32, size_bytes=5_368_709_120, media_type="application/json"
)
_ENTRY_B = ArtifactEntry(
    artifact_id="отчёт", digest="sha256:" + "cd" * 32, size_bytes=0, media_type="text/plain"
)


def test_manifest_maps_nested_records_camel_case_and_tuples_both_ways_exe_15() -> None:
    _, report = _from_golden(ReportAttempt)
    message = dataclasses.replace(report, manifest=(_ENTRY_A, _ENTRY_B))
    record = to_record(message)
    assert type(record["manifest"]) is list
    assert record["manifest"] == [
        {
            "artifactId": "a1",
            "digest": "sha256:" + "ab" * 32,
            "sizeBytes": 5_368_709_120,
            "mediaType": "application/json",
        },
        {"artifactId": "отчёт", "digest": "sha256:" + "cd" * 32, "sizeBytes": 0, "mediaType": "text/plain"},
    ]
    assert all(type(entry) is dict for entry in record["manifest"])
    back = from_record(full_name_of(ReportAttempt), record)
    assert back == message and type(back.manifest) is tuple
    assert all(type(entry) is ArtifactEntry for entry in back.manifest)
    decoded = _round_trip(message)
    assert decoded == message and hash(decoded) == hash(message)
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.manifest[0].size_bytes = 1


@pytest.mark.parametrize("manifest", [(), (_ENTRY_A,), (_ENTRY_B, _ENTRY_A, _ENTRY_B)])
def test_manifests_of_any_length_round_trip_in_order(manifest: tuple[ArtifactEntry, ...]) -> None:
    for cls in (ReportAttempt, AttemptReported):
        _, golden = _from_golden(cls)
        message = dataclasses.replace(golden, manifest=manifest)
        decoded = _round_trip(message)
        assert decoded.manifest == manifest and type(decoded.manifest) is tuple
        assert decoded == message


def test_report_attempt_v1_on_the_log_becomes_an_unverified_report_without_manifest() -> None:
    """EXE-1: a report written before manifests existed never reads as a verified manifest."""
    decoded = CODEC.decode((GOLDEN_DIR / "ReportAttempt.v1.bin").read_bytes())
    assert type(decoded) is ReportAttempt
    assert (decoded.manifest, decoded.manifest_verified, decoded.manifest_problem) == ((), False, "")
    reported = CODEC.decode((GOLDEN_DIR / "AttemptReported.v1.bin").read_bytes())
    assert type(reported) is AttemptReported and reported.manifest == ()


def test_nested_records_ignore_unknown_wire_fields() -> None:
    record, expected = _from_golden(AttemptReported)
    widened = {**record, "manifest": [{**entry, "addedLater": 1} for entry in record["manifest"]]}
    assert from_record(full_name_of(AttemptReported), widened) == expected


def test_from_record_ignores_unknown_wire_fields_and_converts_arrays() -> None:
    record, expected = _from_golden(RenewLease)
    assert from_record(full_name_of(RenewLease), {**record, "addedLater": [1, 2]}) == expected
    claim_record, claim = _from_golden(ClaimRun)
    assert from_record(full_name_of(ClaimRun), claim_record).capabilities == claim.capabilities


# --- random values --------------------------------------------------------------------------

_INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def _values_for(avro_type: Any) -> st.SearchStrategy[Any]:
    if isinstance(avro_type, list):
        (branch,) = [t for t in avro_type if t != "null"]
        return st.none() | _values_for(branch)
    nested = _nested_record_type(avro_type)
    if nested is not None:
        fields = {_snake(f["name"]): _values_for(f["type"]) for f in avro_type["fields"]}
        return st.fixed_dictionaries(fields).map(lambda kwargs: nested(**kwargs))
    if isinstance(avro_type, dict):
        if avro_type["type"] == "array":
            return st.lists(_values_for(avro_type["items"]), max_size=4).map(tuple)
        if avro_type["type"] == "map":
            values = _values_for(avro_type["values"])
            return st.dictionaries(st.text(max_size=8), values, max_size=4).map(MappingProxyType)
        return _values_for(avro_type["type"])
    primitives: dict[str, st.SearchStrategy[Any]] = {
        "string": st.text(max_size=20),
        "int": _INT32,
        "long": _INT64,
        "boolean": st.booleans(),
        # Finite doubles only: NaN never equals itself, so "round-trips exactly" needs a number.
        "double": st.floats(allow_nan=False),
    }
    return primitives[avro_type]


def _contract_values(cls: type[Any]) -> st.SearchStrategy[Any]:
    fields = {_snake(f["name"]): _values_for(f["type"]) for f in _schema_fields(cls)}
    return st.fixed_dictionaries(fields).map(lambda kwargs: cls(**kwargs))


@pytest.mark.parametrize("cls", ALL_TYPES, ids=_type_id)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_random_contract_values_round_trip_exactly(cls: type[Any], data: st.DataObject) -> None:
    message = data.draw(_contract_values(cls))
    assert _round_trip(message) == message
