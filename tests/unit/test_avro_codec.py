"""The Avro single-object codec: fingerprints, wire format, round trips and failure codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.avro import (
    SCHEMA_DIR_ENV,
    SINGLE_OBJECT_MAGIC,
    DecodeFailure,
    SchemaFileError,
    SchemaRegistry,
    SchemaViolation,
    UndecodableRecord,
    UnknownSchema,
    decode,
    default_registry,
    encode,
    fingerprint_of,
    headers_for,
)
from tests.support.avro_reference import reference_crc64_avro

REPO_ROOT = Path(__file__).resolve().parents[2]
SUBMIT_RUN = "tenure.runs.commands.SubmitRun"
CANCEL_RUN = "tenure.runs.commands.CancelRun"
RUN_SUBMITTED = "tenure.runs.events.RunSubmitted"
RUN_CANCELLED = "tenure.runs.events.RunCancelled"
COMMAND_REJECTED = "tenure.runs.rejections.CommandRejected"


SAMPLES: dict[str, dict[str, Any]] = {
    SUBMIT_RUN: {
        "commandId": "cmd-1",
        "runId": "run-1",
        "issuedAt": 1_767_225_600_000,
        "correlationId": "corr-1",
        "actor": "user:bob",
        "tenant": "acme",
        "idempotencyKey": "idem-1",
        "executionSpec": '{"entrypoint":"run"}',
        "retrySafe": False,
        "timeoutSeconds": 600,
        "maxAttempts": 3,
        "parentRunId": "run-0",
        "agentRevisionId": "agrev-1",
        "labels": {"schedule": "sch_0123456789abcdef"},
    },
    CANCEL_RUN: {
        "commandId": "cmd-2",
        "runId": "run-1",
        "issuedAt": 1_767_225_601_000,
        "correlationId": "corr-1",
        "actor": "user:bob",
        "reason": "no longer needed",
    },
    RUN_SUBMITTED: {
        "eventId": "evt-1",
        "runId": "run-1",
        "version": 1,
        "occurredAt": 1_767_225_600_005,
        "causationId": "cmd-1",
        "correlationId": "corr-1",
        "actor": "user:bob",
        "tenant": "acme",
        "idempotencyKey": "idem-1",
        "executionSpec": '{"entrypoint":"run"}',
        "specDigest": "sha256:" + "ab" * 32,
        "retrySafe": True,
        "timeoutSeconds": 600,
        "maxAttempts": 3,
        "queueReservationId": "resv-1",
        "labels": {"team": "infra"},
        "parentRunId": None,
        "agentRevisionId": None,
    },
    RUN_CANCELLED: {
        "eventId": "evt-2",
        "runId": "run-1",
        "version": 2,
        "occurredAt": 1_767_225_601_005,
        "causationId": "cmd-2",
        "correlationId": "corr-1",
        "actor": "user:bob",
        "reason": "no longer needed",
        "previousStatus": "queued",
        "reservationReleased": True,
    },
    COMMAND_REJECTED: {
        "eventId": "rej-1",
        "runId": "run-1",
        "occurredAt": 1_767_225_602_005,
        "causationId": "cmd-3",
        "correlationId": "corr-1",
        "actor": "user:bob",
        "commandType": "CancelRun",
        "code": "INVALID_TRANSITION",
        "detail": "run-1 is already cancelled",
        "currentStatus": "cancelled",
        "currentVersion": 2,
    },
}

# Lease, effect and upload records (issues 3, 4b) and lifecycle records (issues 4, 4b) take their
# values from their newest golden sample, which make_golden.py writes from hand-picked values;
# naming them here one by one keeps test_samples_cover_every_record_name a real check that a new
# schema gets a sample.
_LEASE_COMMANDS = (
    "ClaimRun RenewLease RenewLeases ReportAttempt TakeOverLease RecordEffectIntent RecordEffectOutcome"
    " RequestUploadGrant"
)
_LEASE_EVENTS = (
    "AttemptClaimed LeaseRenewed LeaseAtRisk LeaseExpired RunRequeued LeaseTakenOver AttemptReported"
    " EffectIntentRecorded EffectOutcomeRecorded UploadGrantIssued"
)
_LIFECYCLE_COMMANDS = "RetryRun RequestInput ProvideInput"
_LIFECYCLE_EVENTS = (
    "RunCancelRequested RunInterrupted DeadlineReached RunFailed RunRetried InputRequested InputProvided"
)
REPORT_ATTEMPT = "tenure.runs.commands.ReportAttempt"
ATTEMPT_REPORTED = "tenure.runs.events.AttemptReported"
GOLDEN_SAMPLED = (
    *(f"tenure.runs.commands.{name}" for name in f"{_LEASE_COMMANDS} {_LIFECYCLE_COMMANDS}".split()),
    *(f"tenure.runs.events.{name}" for name in f"{_LEASE_EVENTS} {_LIFECYCLE_EVENTS}".split()),
    "tenure.policy.events.BlockChanged",
    # The saga's records (commands, events, the incident), the semantic watchdog's and the
    # breakers', one sample each from its golden.
    *(
        f"{json.loads(path.read_text(encoding='utf-8'))['namespace']}.{path.name.split('.')[0]}"
        for area in ("trajectories", "incidents", "watchdog", "breakers", "schedules", "quarantine")
        for path in sorted((REPO_ROOT / "schemas" / area).rglob("*.avsc"))
    ),
)


def _golden_sample(full_name: str) -> dict[str, Any]:
    """The record of the newest golden sample of `full_name` (tests/golden/<Name>.v<N>.json)."""
    name = full_name.rsplit(".", 1)[1]
    goldens = list((REPO_ROOT / "tests" / "golden").glob(f"{name}.v*.json"))
    if not goldens:
        raise FileNotFoundError(f"no golden sample for {full_name}: run tests/golden/make_golden.py")
    newest = max(goldens, key=lambda path: int(path.stem.rsplit(".v", 1)[1]))
    expectation = json.loads(newest.read_text(encoding="utf-8"))
    assert expectation["schema"] == full_name, newest
    return dict(expectation["record"])


SAMPLES.update({full_name: _golden_sample(full_name) for full_name in GOLDEN_SAMPLED})


@pytest.fixture(scope="module")
def registry() -> SchemaRegistry:
    return SchemaRegistry.from_directory(REPO_ROOT / "schemas")


# --- wire format and round trips ----------------------------------------------------------------


@pytest.mark.parametrize("full_name", sorted(SAMPLES))
def test_every_record_type_round_trips_exactly(registry: SchemaRegistry, full_name: str) -> None:
    data = registry.encode(full_name, SAMPLES[full_name])
    decoded = registry.decode(data)
    latest = registry.latest(full_name)
    assert decoded.full_name == full_name
    assert decoded.version == latest.version
    assert decoded.fingerprint_hex == latest.fingerprint_hex
    assert decoded.record == SAMPLES[full_name]


def test_samples_cover_every_record_name(registry: SchemaRegistry) -> None:
    assert sorted(SAMPLES) == list(registry.names())


@pytest.mark.parametrize("full_name", sorted(SAMPLES))
def test_single_object_header_is_c301_then_little_endian_fingerprint(
    registry: SchemaRegistry, full_name: str
) -> None:
    data = registry.encode(full_name, SAMPLES[full_name])
    expected_fp = reference_crc64_avro(registry.latest(full_name).canonical_form.encode())
    assert data[:2] == b"\xc3\x01" == SINGLE_OBJECT_MAGIC
    assert data[2:10] == expected_fp.to_bytes(8, "little")
    assert data[2:10].hex() == registry.latest(full_name).fingerprint_hex


def test_timestamps_are_plain_epoch_millis_both_ways(registry: SchemaRegistry) -> None:
    record = dict(SAMPLES[RUN_CANCELLED], occurredAt=1)
    decoded = registry.decode(registry.encode(RUN_CANCELLED, record)).record
    assert type(decoded["occurredAt"]) is int
    assert decoded["occurredAt"] == 1


def test_defaults_fill_omitted_optional_fields(registry: SchemaRegistry) -> None:
    optional = ("retrySafe", "maxAttempts", "parentRunId")
    record = {k: v for k, v in SAMPLES[SUBMIT_RUN].items() if k not in optional}
    decoded = registry.decode(registry.encode(SUBMIT_RUN, record)).record
    assert decoded["retrySafe"] is False
    assert decoded["maxAttempts"] == 3
    assert decoded["parentRunId"] is None


def test_run_submitted_v1_data_decodes_into_latest_reader_with_empty_labels_and_no_parent(
    registry: SchemaRegistry,
) -> None:
    later = ("labels", "parentRunId", "agentRevisionId")
    v1_record = {k: v for k, v in SAMPLES[RUN_SUBMITTED].items() if k not in later}
    data = registry.encode(RUN_SUBMITTED, v1_record, version=1)
    assert data[2:10].hex() == registry.get(RUN_SUBMITTED, 1).fingerprint_hex
    decoded = registry.decode(data)
    assert registry.latest(RUN_SUBMITTED).version == 4
    assert decoded.version == 1
    assert decoded.record == {**v1_record, "labels": {}, "parentRunId": None, "agentRevisionId": None}


def test_decode_can_target_an_older_reader_version(registry: SchemaRegistry) -> None:
    data = registry.encode(RUN_SUBMITTED, SAMPLES[RUN_SUBMITTED])
    decoded = registry.decode(data, reader_version=1)
    assert "labels" not in decoded.record
    assert decoded.record["queueReservationId"] == "resv-1"


# --- nested records (the ResultManifest's ArtifactEntry) ----------------------------------------


def _artifact(artifact_id: str, size: int) -> dict[str, Any]:
    return {
        "artifactId": artifact_id,
        "digest": "sha256:" + "0f" * 32,
        "sizeBytes": size,
        "mediaType": "application/octet-stream",
    }


@pytest.mark.parametrize("full_name", [REPORT_ATTEMPT, ATTEMPT_REPORTED])
@pytest.mark.parametrize("count", [0, 1, 3])
def test_arrays_of_nested_records_round_trip_exe_15(
    registry: SchemaRegistry, full_name: str, count: int
) -> None:
    """EXE-15: a ResultManifest of any length travels exactly, in order, sizes as longs."""
    manifest = [_artifact(f"a{i}-é", 2**33 + i) for i in range(count)]
    record = {**SAMPLES[full_name], "manifest": manifest}
    decoded = registry.decode(registry.encode(full_name, record))
    assert decoded.record == record
    assert decoded.record["manifest"] == manifest


def test_report_attempt_v1_data_decodes_with_an_empty_unverified_manifest(registry: SchemaRegistry) -> None:
    v1 = registry.get(REPORT_ATTEMPT, 1)
    v1_record = {f["name"]: SAMPLES[REPORT_ATTEMPT][f["name"]] for f in v1.declared["fields"]}
    decoded = registry.decode(registry.encode(REPORT_ATTEMPT, v1_record, version=1))
    assert (decoded.version, registry.latest(REPORT_ATTEMPT).version) == (1, 2)
    assert decoded.record == {**v1_record, "manifest": [], "manifestVerified": False, "manifestProblem": ""}


@pytest.mark.parametrize(
    ("entry", "field_part"),
    [
        ({**_artifact("a1", 1), "sizeBytes": "1"}, "sizeBytes"),
        ({k: v for k, v in _artifact("a1", 1).items() if k != "digest"}, "digest"),
        ({**_artifact("a1", 1), "sizeBytes": 2**63}, "sizeBytes"),
    ],
)
def test_wrong_nested_value_is_a_schema_violation_naming_the_nested_field(
    registry: SchemaRegistry, entry: dict[str, Any], field_part: str
) -> None:
    with pytest.raises(SchemaViolation) as raised:
        registry.encode(REPORT_ATTEMPT, {**SAMPLES[REPORT_ATTEMPT], "manifest": [entry]})
    assert field_part in raised.value.field
    assert "ArtifactEntry" in str(raised.value)


def _with_entries(name: str, entry_fields: list[dict[str, Any]]) -> dict[str, Any]:
    """A record `name` whose one field is an array of the inline named record tenure.t.Entry."""
    entry = {"type": "record", "name": "Entry", "namespace": "tenure.t", "fields": entry_fields}
    return {
        "type": "record",
        "name": name,
        "namespace": "tenure.t.events",
        "fields": [{"name": "entries", "type": {"type": "array", "items": entry}, "default": []}],
    }


def test_a_named_type_defined_inline_in_several_files_is_scoped_to_each_file(tmp_path: Path) -> None:
    """Every schema file defines the shared record it needs (e.g. tenure.runs.ArtifactEntry) on its
    own; the registry parses each file separately, so a second definition is no redefinition,
    and each file encodes and decodes with its own."""
    small = [{"name": "id", "type": "string"}]
    larger = [*small, {"name": "size", "type": "long"}]
    _write_schema(tmp_path, "t/events/Thing.v1.avsc", _with_entries("Thing", small))
    _write_schema(tmp_path, "t/events/Other.v1.avsc", _with_entries("Other", larger))
    two_files = SchemaRegistry.from_directory(tmp_path)
    assert two_files.names() == ("tenure.t.events.Other", "tenure.t.events.Thing")
    for full_name, entries in [
        ("tenure.t.events.Thing", [{"id": "x"}, {"id": "y"}]),
        ("tenure.t.events.Other", [{"id": "x", "size": 2**40}]),
    ]:
        decoded = two_files.decode(two_files.encode(full_name, {"entries": entries}))
        assert (decoded.full_name, decoded.record) == (full_name, {"entries": entries})
    with pytest.raises(SchemaViolation):
        two_files.encode("tenure.t.events.Other", {"entries": [{"id": "x"}]})


# --- failures -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data", [b"", b"\xc3", b"\xc3\x01\x00\x00", b"\x01\x01" + bytes(8) + b"\x02", b'{"json":1}']
)
def test_bad_magic_or_truncated_header_is_bad_magic(registry: SchemaRegistry, data: bytes) -> None:
    with pytest.raises(UndecodableRecord) as raised:
        registry.decode(data)
    assert raised.value.reason_code == DecodeFailure.BAD_MAGIC
    assert "BAD_MAGIC" in str(raised.value)


def test_unregistered_fingerprint_is_unknown_fingerprint(registry: SchemaRegistry) -> None:
    body = registry.encode(CANCEL_RUN, SAMPLES[CANCEL_RUN])[10:]
    foreign = fingerprint_of('{"type":"record","name":"x.Other","fields":[]}').to_bytes(8, "little")
    with pytest.raises(UndecodableRecord) as raised:
        registry.decode(SINGLE_OBJECT_MAGIC + foreign + body)
    assert raised.value.reason_code == DecodeFailure.UNKNOWN_FINGERPRINT
    assert "UNKNOWN_FINGERPRINT" in str(raised.value)
    assert foreign.hex() in str(raised.value)


@pytest.mark.parametrize("damage", ["truncated", "trailing", "bad_utf8"])
def test_damaged_body_is_corrupt_body(registry: SchemaRegistry, damage: str) -> None:
    data = registry.encode(CANCEL_RUN, SAMPLES[CANCEL_RUN])
    if damage == "truncated":
        data = data[:-3]
    elif damage == "trailing":
        data = data + b"\x00"
    else:  # the first string's length prefix stays valid, its first byte becomes invalid UTF-8
        data = data[:11] + b"\xff" + data[12:]
    with pytest.raises(UndecodableRecord) as raised:
        registry.decode(data)
    assert raised.value.reason_code == DecodeFailure.CORRUPT_BODY
    assert "CORRUPT_BODY" in str(raised.value)


def _write_schema(root: Path, relative: str, schema: dict[str, Any]) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(schema))


def _thing(version_fields: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "type": "record",
        "name": "Thing",
        "namespace": "tenure.t.events",
        "fields": version_fields,
    }


def test_unresolvable_writer_is_incompatible_schema(tmp_path: Path) -> None:
    _write_schema(tmp_path, "t/events/Thing.v1.avsc", _thing([{"name": "a", "type": "string"}]))
    # v2 adds a field WITHOUT a default: it cannot read v1 data (the evolution test forbids this).
    v2_fields = [{"name": "a", "type": "string"}, {"name": "b", "type": "int"}]
    _write_schema(tmp_path, "t/events/Thing.v2.avsc", _thing(v2_fields))
    broken = SchemaRegistry.from_directory(tmp_path)
    data = broken.encode("tenure.t.events.Thing", {"a": "x"}, version=1)
    with pytest.raises(UndecodableRecord) as raised:
        broken.decode(data)
    assert raised.value.reason_code == DecodeFailure.INCOMPATIBLE_SCHEMA


def test_missing_required_field_is_a_schema_violation_naming_it(registry: SchemaRegistry) -> None:
    record = {k: v for k, v in SAMPLES[SUBMIT_RUN].items() if k != "tenant"}
    with pytest.raises(SchemaViolation) as raised:
        registry.encode(SUBMIT_RUN, record)
    assert raised.value.field == "tenant"
    assert "tenant" in str(raised.value) and "missing" in str(raised.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [("timeoutSeconds", "600"), ("version", 2**63), ("labels", {"k": 1}), ("runId", None)],
)
def test_wrong_value_is_a_schema_violation_naming_the_field(
    registry: SchemaRegistry, field: str, value: Any
) -> None:
    full_name = SUBMIT_RUN if field == "timeoutSeconds" else RUN_SUBMITTED
    with pytest.raises(SchemaViolation) as raised:
        registry.encode(full_name, {**SAMPLES[full_name], field: value})
    assert raised.value.field == field


def test_unknown_field_is_a_schema_violation(registry: SchemaRegistry) -> None:
    with pytest.raises(SchemaViolation) as raised:
        registry.encode(CANCEL_RUN, {**SAMPLES[CANCEL_RUN], "reasn": "typo"})
    assert raised.value.field == "reasn"


def test_unknown_record_name_or_version_is_unknown_schema(registry: SchemaRegistry) -> None:
    with pytest.raises(UnknownSchema):
        registry.encode("tenure.runs.events.NoSuchEvent", {})
    with pytest.raises(UnknownSchema):
        registry.encode(CANCEL_RUN, SAMPLES[CANCEL_RUN], version=9)


@pytest.mark.parametrize(
    ("relative", "schema", "complaint"),
    [
        ("t/events/Thing.avsc", _thing([]), "file name"),
        ("t/commands/Thing.v1.avsc", _thing([]), "path says"),
        ("t/events/Other.v1.avsc", _thing([]), "path says"),
        ("t/events/Thing.v2.avsc", _thing([]), "without gaps"),
    ],
)
def test_registry_refuses_inconsistent_schema_files(
    tmp_path: Path, relative: str, schema: dict[str, Any], complaint: str
) -> None:
    _write_schema(tmp_path, relative, schema)
    with pytest.raises(SchemaFileError, match=complaint):
        SchemaRegistry.from_directory(tmp_path)


def test_registry_refuses_two_versions_with_one_wire_form(tmp_path: Path) -> None:
    _write_schema(tmp_path, "t/events/Thing.v1.avsc", _thing([{"name": "a", "type": "string"}]))
    doc_only = _thing([{"name": "a", "type": "string", "doc": "only the doc changed"}])
    _write_schema(tmp_path, "t/events/Thing.v2.avsc", doc_only)
    with pytest.raises(SchemaFileError, match="same canonical form"):
        SchemaRegistry.from_directory(tmp_path)


# --- headers and the default registry -----------------------------------------------------------


def test_headers_name_the_latest_schema_without_decoding(registry: SchemaRegistry) -> None:
    latest = registry.latest(RUN_SUBMITTED)
    data = registry.encode(RUN_SUBMITTED, SAMPLES[RUN_SUBMITTED])
    assert registry.headers_for(RUN_SUBMITTED) == [
        ("tenure-schema", b"tenure.runs.events.RunSubmitted"),
        ("tenure-schema-fingerprint", data[2:10].hex().encode()),
        ("tenure-schema-version", b"4"),
    ]
    assert len(latest.fingerprint_hex) == 16


def test_module_functions_use_the_repository_schemas() -> None:
    data = encode(CANCEL_RUN, SAMPLES[CANCEL_RUN])
    assert decode(data).record == SAMPLES[CANCEL_RUN]
    assert headers_for(CANCEL_RUN)[0] == ("tenure-schema", CANCEL_RUN.encode())
    assert default_registry() is default_registry()


def test_schema_directory_can_be_overridden_by_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_schema(tmp_path, "t/events/Thing.v1.avsc", _thing([{"name": "a", "type": "string"}]))
    monkeypatch.setenv(SCHEMA_DIR_ENV, str(tmp_path))
    assert default_registry().names() == ("tenure.t.events.Thing",)


# --- properties ---------------------------------------------------------------------------------

_text = st.text(max_size=40)
_int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_submit_runs = st.fixed_dictionaries(
    {
        "commandId": _text,
        "runId": _text,
        "issuedAt": _int64,
        "correlationId": _text,
        "actor": _text,
        "tenant": _text,
        "idempotencyKey": _text,
        "executionSpec": _text,
        "retrySafe": st.booleans(),
        "timeoutSeconds": _int32,
        "maxAttempts": _int32,
        "parentRunId": st.none() | _text,
        "agentRevisionId": st.none() | _text,
        "labels": st.dictionaries(_text, _text, max_size=5),
    }
)
_run_submitted = st.fixed_dictionaries(
    {
        "eventId": _text,
        "runId": _text,
        "version": _int64,
        "occurredAt": _int64,
        "causationId": _text,
        "correlationId": _text,
        "actor": _text,
        "tenant": _text,
        "idempotencyKey": _text,
        "executionSpec": _text,
        "specDigest": _text,
        "retrySafe": st.booleans(),
        "timeoutSeconds": _int32,
        "maxAttempts": _int32,
        "queueReservationId": _text,
        "labels": st.dictionaries(_text, _text, max_size=5),
        "parentRunId": st.none() | _text,
        "agentRevisionId": st.none() | _text,
    }
)


@settings(max_examples=150, deadline=None)
@given(record=_submit_runs)
def test_random_submit_run_round_trips(record: dict[str, Any]) -> None:
    assert decode(encode(SUBMIT_RUN, record)).record == record


@settings(max_examples=150, deadline=None)
@given(record=_run_submitted)
def test_random_run_submitted_round_trips(record: dict[str, Any]) -> None:
    decoded = decode(encode(RUN_SUBMITTED, record))
    assert decoded.full_name == RUN_SUBMITTED
    assert decoded.record == record


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=64))
def test_arbitrary_body_bytes_decode_or_fail_as_corrupt_body(body: bytes) -> None:
    """A damaged message must surface as UndecodableRecord, never as some other exception."""
    header = encode(CANCEL_RUN, SAMPLES[CANCEL_RUN])[:10]
    try:
        decoded = decode(header + body)
    except UndecodableRecord as exc:
        assert exc.reason_code == DecodeFailure.CORRUPT_BODY
    else:
        assert set(decoded.record) == set(SAMPLES[CANCEL_RUN])
