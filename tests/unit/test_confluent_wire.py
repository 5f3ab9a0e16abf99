"""The Confluent wire format (issue 17, interoperability): magic byte 0, a 4-byte big-endian
schema id and the Avro body, with schemas registered under RecordNameStrategy subjects; readers
accept it and the single-object encoding alike, so every golden sample still decodes.

The registry here is an in-process fake of the two Confluent API calls the codec makes
(httpx.MockTransport); tests/integration/test_confluent_wire_interop.py runs a real Apicurio."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.avro import (
    CONFLUENT_MAGIC,
    SINGLE_OBJECT_MAGIC,
    ConfluentRegistryClient,
    ConfluentWire,
    DecodeFailure,
    SchemaRegistry,
    SchemaRegistryError,
    UndecodableRecord,
    WireFormat,
    fingerprint_of,
    wire_from_settings,
)
from services.common.clock import ManualClock
from services.common.contracts import RunSubmitted
from services.common.eventlog import MemoryEventLog
from services.common.messages import MessageCodec
from services.common.settings import TenureSettings
from services.common.store import MemoryStore
from services.common.streams._runtime import Failure, classify_failure
from services.common.topics import DEADLETTER, RUNS_EVENTS, RUNS_REJECTIONS
from services.lease_coordinator.processor import RunCommandProcessor
from tests.support.api_harness import InMemoryTenure, api_client

from .strategies import submit_command
from .test_run_processor import CommandTopic, log_records

pytestmark = pytest.mark.timeout(60)

REPO_ROOT = Path(__file__).resolve().parents[2]
GOLDEN = REPO_ROOT / "tests" / "golden"
GOLDEN_SAMPLES = sorted(GOLDEN.glob("*.json"))
URL = "http://registry.test/apis/ccompat/v7"


class FakeRegistry:
    """The Confluent API's register and get-by-id, enough to exercise the client; `down` makes
    every call fail the way an unreachable server does."""

    def __init__(self) -> None:
        self.schemas: list[str] = []
        self.subjects: dict[str, list[int]] = {}
        self.calls: list[tuple[str, str]] = []
        self.auth: list[str | None] = []
        self.down = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append((request.method, request.url.path))
        self.auth.append(request.headers.get("authorization"))
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path.removeprefix("/apis/ccompat/v7")
        if request.method == "POST" and path.startswith("/subjects/") and path.endswith("/versions"):
            subject = path.removeprefix("/subjects/").removesuffix("/versions")
            schema = json.loads(request.content)["schema"]
            if schema not in self.schemas:
                self.schemas.append(schema)
            schema_id = self.schemas.index(schema) + 1
            self.subjects.setdefault(subject, [])
            if schema_id not in self.subjects[subject]:
                self.subjects[subject].append(schema_id)
            return httpx.Response(200, json={"id": schema_id})
        if request.method == "GET" and path.startswith("/schemas/ids/"):
            schema_id = int(path.removeprefix("/schemas/ids/"))
            if not 1 <= schema_id <= len(self.schemas):
                return httpx.Response(404, json={"error_code": 40403, "message": "not found"})
            return httpx.Response(200, json={"schema": self.schemas[schema_id - 1]})
        return httpx.Response(404, json={"error_code": 404, "message": "no route"})


@pytest.fixture
def fake() -> FakeRegistry:
    return FakeRegistry()


_PLAIN = SchemaRegistry.from_directory(REPO_ROOT / "schemas")
# Loaded once: a registry over the same versions with another wire is then cheap to build.
_VERSIONS = [version for name in _PLAIN.names() for version in _PLAIN.versions(name)]


def _registry(fake: FakeRegistry, write: WireFormat, **client: Any) -> SchemaRegistry:
    wire = ConfluentWire(
        ConfluentRegistryClient(URL, transport=httpx.MockTransport(fake), **client),
        write=write,
        fingerprint_of=fingerprint_of,
    )
    return SchemaRegistry(_VERSIONS, wire)


def _golden(path: Path) -> tuple[dict[str, Any], bytes]:
    return json.loads(path.read_text()), path.with_suffix(".bin").read_bytes()


def test_there_are_golden_samples_to_check() -> None:
    assert len(GOLDEN_SAMPLES) > 100


@pytest.mark.parametrize("sample", GOLDEN_SAMPLES, ids=lambda p: p.stem)
def test_every_golden_sample_round_trips_in_both_formats(fake: FakeRegistry, sample: Path) -> None:
    meta, golden_bytes = _golden(sample)
    name, version = meta["schema"], meta["version"]
    confluent = _registry(fake, WireFormat.CONFLUENT)
    single = _registry(fake, WireFormat.SINGLE_OBJECT)
    # The golden bytes (single-object, what Tenure wrote before) decode with either reader.
    for reader in (confluent, single):
        old = reader.decode(golden_bytes, reader_version=version)
        assert (old.full_name, old.version, old.record) == (name, version, meta["record"])
    framed = confluent.encode(name, meta["record"], version=version)
    assert framed[:1] == CONFLUENT_MAGIC
    schema_id = int.from_bytes(framed[1:5], "big")
    assert fake.subjects[name] == [schema_id]  # RecordNameStrategy: the subject is the record name
    assert framed[5:] == golden_bytes[10:]  # the same Avro body, only the framing differs
    for reader in (confluent, single):
        decoded = reader.decode(framed, reader_version=version)
        assert (decoded.full_name, decoded.version, decoded.record) == (name, version, meta["record"])
    assert single.encode(name, meta["record"], version=version) == golden_bytes


def test_magic_byte_zero_is_decoded_by_the_registry_id_and_ids_are_cached(fake: FakeRegistry) -> None:
    meta, _ = _golden(GOLDEN / "SchedulePaused.v1.json")
    writer = _registry(fake, WireFormat.CONFLUENT)
    first = writer.encode(meta["schema"], meta["record"])
    again = writer.encode(meta["schema"], meta["record"])
    assert first == again and [m for m, _ in fake.calls] == ["POST"]  # registered once
    # A reader that never saw the schema fetches it by id, once.
    reader = _registry(fake, WireFormat.SINGLE_OBJECT)
    assert reader.decode(first).record == meta["record"]
    assert reader.decode(first).record == meta["record"]
    assert fake.calls[1:] == [("GET", f"/apis/ccompat/v7/schemas/ids/{int.from_bytes(first[1:5], 'big')}")]


def test_an_id_the_registry_does_not_have_is_unknown_schema_id(fake: FakeRegistry) -> None:
    reader = _registry(fake, WireFormat.SINGLE_OBJECT)
    with pytest.raises(UndecodableRecord) as raised:
        reader.decode(CONFLUENT_MAGIC + (4242).to_bytes(4, "big") + b"\x02")
    assert raised.value.reason_code == DecodeFailure.UNKNOWN_SCHEMA_ID


def test_a_registered_schema_that_is_none_of_tenures_is_unknown_schema_id(fake: FakeRegistry) -> None:
    client = ConfluentRegistryClient(URL, transport=httpx.MockTransport(fake))
    foreign = json.dumps({"type": "record", "name": "Other", "fields": [{"name": "x", "type": "int"}]})
    schema_id = client.register("Other", foreign)
    with pytest.raises(UndecodableRecord) as raised:
        reader = _registry(fake, WireFormat.SINGLE_OBJECT)
        reader.decode(CONFLUENT_MAGIC + schema_id.to_bytes(4, "big") + b"\x02")
    assert raised.value.reason_code == DecodeFailure.UNKNOWN_SCHEMA_ID


@pytest.mark.parametrize("data", [b"\x00", b"\x00\x00\x00\x01"])
def test_a_short_confluent_header_is_bad_magic(fake: FakeRegistry, data: bytes) -> None:
    with pytest.raises(UndecodableRecord) as raised:
        _registry(fake, WireFormat.SINGLE_OBJECT).decode(data)
    assert raised.value.reason_code == DecodeFailure.BAD_MAGIC


def test_a_confluent_record_without_a_registry_configured_says_so() -> None:
    with pytest.raises(UndecodableRecord) as raised:
        _PLAIN.decode(CONFLUENT_MAGIC + (1).to_bytes(4, "big") + b"\x02")
    assert raised.value.reason_code == DecodeFailure.NO_SCHEMA_REGISTRY
    assert "TENURE_SCHEMA_REGISTRY_URL" in str(raised.value)


def test_registry_down_at_encode_is_a_transient_error_never_another_format(fake: FakeRegistry) -> None:
    meta, _ = _golden(GOLDEN / "SchedulePaused.v1.json")
    writer = _registry(fake, WireFormat.CONFLUENT)
    fake.down = True
    with pytest.raises(SchemaRegistryError) as raised:
        writer.encode(meta["schema"], meta["record"])
    assert "unreachable" in str(raised.value)
    assert not isinstance(raised.value, UndecodableRecord)
    fake.down = False  # back: the same call now succeeds, in the Confluent framing
    assert writer.encode(meta["schema"], meta["record"])[:1] == CONFLUENT_MAGIC


def test_registry_down_at_decode_is_transient_not_undecodable(fake: FakeRegistry) -> None:
    meta, _ = _golden(GOLDEN / "SchedulePaused.v1.json")
    framed = _registry(fake, WireFormat.CONFLUENT).encode(meta["schema"], meta["record"])
    fake.down = True
    with pytest.raises(SchemaRegistryError):
        _registry(fake, WireFormat.SINGLE_OBJECT).decode(framed)  # a consumer retries; no dead letter


def test_a_registry_error_status_is_a_transient_error_with_the_status() -> None:
    client = ConfluentRegistryClient(
        URL, transport=httpx.MockTransport(lambda r: httpx.Response(503, text="overloaded"))
    )
    with pytest.raises(SchemaRegistryError) as raised:
        client.register("tenure.x.Y", "{}")
    assert raised.value.status == 503 and "overloaded" in str(raised.value)


def test_basic_auth_is_sent_when_configured(fake: FakeRegistry) -> None:
    meta, _ = _golden(GOLDEN / "SchedulePaused.v1.json")
    _registry(fake, WireFormat.CONFLUENT, username="tenure", password="s3cret").encode(
        meta["schema"], meta["record"]
    )
    assert fake.auth == ["Basic " + base64.b64encode(b"tenure:s3cret").decode()]


def test_single_object_writer_with_a_registry_writes_single_object(fake: FakeRegistry) -> None:
    meta, _ = _golden(GOLDEN / "SchedulePaused.v1.json")
    assert _registry(fake, WireFormat.SINGLE_OBJECT).encode(meta["schema"], meta["record"])[:2] == (
        SINGLE_OBJECT_MAGIC
    )
    assert fake.calls == []


def test_settings_confluent_needs_a_registry_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENURE_WIRE_FORMAT", "confluent")
    monkeypatch.delenv("TENURE_SCHEMA_REGISTRY_URL", raising=False)
    with pytest.raises(ValueError, match="TENURE_SCHEMA_REGISTRY_URL"):
        TenureSettings()
    monkeypatch.setenv("TENURE_SCHEMA_REGISTRY_URL", URL)
    monkeypatch.setenv("TENURE_SCHEMA_REGISTRY_PASSWORD", "hidden")
    settings = TenureSettings()
    assert settings.wire_format == "confluent" and "hidden" not in repr(settings)


def test_the_wire_comes_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENURE_WIRE_FORMAT", "confluent")
    monkeypatch.setenv("TENURE_SCHEMA_REGISTRY_URL", URL)
    wire_from_settings.cache_clear()
    try:
        wire = wire_from_settings(fingerprint_of)
        assert wire is not None and wire.writes_confluent and wire.client.url == URL
        monkeypatch.delenv("TENURE_WIRE_FORMAT")
        monkeypatch.delenv("TENURE_SCHEMA_REGISTRY_URL")
        wire_from_settings.cache_clear()
        assert wire_from_settings(fingerprint_of) is None  # the default: single-object, no registry
    finally:
        wire_from_settings.cache_clear()


# --- the processor: a registry outage is retried, never a poison command ----------------------


def test_a_registry_outage_while_encoding_events_fails_the_batch_and_never_dead_letters(
    fake: FakeRegistry,
) -> None:
    """The coordinator's batch raises SchemaRegistryError (the stream runtime retries it): the
    command is neither dead-lettered nor refused, and once the registry is back the same command
    is decided and its events are written in the Confluent framing."""
    log, store = MemoryEventLog(), MemoryStore()
    codec = MessageCodec(_registry(fake, WireFormat.CONFLUENT))
    processor = RunCommandProcessor(log, store, codec, ManualClock())
    batch = [CommandTopic().record(submit_command("acme", "wire-1", command_id="s-wire-1"))]
    fake.down = True
    with pytest.raises(SchemaRegistryError):
        processor.handle(batch)
    for topic in (DEADLETTER.name, RUNS_REJECTIONS.name, RUNS_EVENTS.name):
        assert log_records(log, topic) == [], topic
    fake.down = False
    outcome = processor.handle(batch)
    assert (outcome.accepted, outcome.failed, outcome.deadlettered) == (1, 0, 0)
    [event] = log_records(log, RUNS_EVENTS.name)
    assert event.value[:1] == CONFLUENT_MAGIC
    decided = codec.decode(event.value)
    assert isinstance(decided, RunSubmitted) and decided.causation_id == "s-wire-1"


def test_the_api_answers_503_with_retry_after_while_the_registry_is_down(
    fake: FakeRegistry, tmp_path: Path
) -> None:
    """A command the API cannot encode for want of the registry is an outage, not a 500."""
    tenure = InMemoryTenure()
    tenure.codec = MessageCodec(_registry(fake, WireFormat.CONFLUENT))
    fake.down = True
    with api_client(tmp_path, tenure=tenure) as (client, _):
        body = {"tenant": "t", "executionSpec": {}, "timeoutSeconds": 60}
        response = client.post("/runs", headers={"Idempotency-Key": "wire-down"}, json=body)
        assert response.status_code == 503, response.text
        assert response.headers["Retry-After"] and "unreachable" in response.json()["detail"]
        assert tenure.commands == []


def test_the_stream_runtime_retries_a_registry_error_as_transient() -> None:
    assert classify_failure(SchemaRegistryError("registry down")) is Failure.TRANSIENT
    assert classify_failure(SchemaRegistryError("HTTP 409: incompatible", status=409)) is Failure.TRANSIENT
