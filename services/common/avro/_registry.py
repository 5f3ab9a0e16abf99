"""The Confluent wire format and its schema registry client (docs/architecture.md
"Interoperability: the Confluent wire format").

Framing: the magic byte 0, the 4-byte big-endian schema id, then the schemaless Avro body, as
Confluent's serializers write it, so kcat -s avro, ksqlDB, Kafka Connect's AvroConverter and
Flink's avro-confluent format can read Tenure's topics with nothing but the registry.

Subjects follow RecordNameStrategy: the subject is the record's full name
(`tenure.runs.events.LeaseGranted`). One topic carries many record types (runs.events holds
every lease event), and TopicNameStrategy's one subject per topic would make each new type an
incompatible "evolution" of the previous one. A record type's compatibility is a property of the
type, wherever it travels, which is also how Tenure's own schema evolution rules are stated.

The registry is any server speaking the Confluent API: Confluent Schema Registry at its root,
or Apicurio Registry at `/apis/ccompat/v7`. Ids are cached for the life of the process (an id
never changes meaning), so the registry is asked once per schema on encode and once per id on
decode. A registry that cannot be used raises SchemaRegistryError: the caller retries; nothing
ever falls back to the single-object format.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Collection
from enum import StrEnum
from functools import cache
from typing import Any

import httpx

from services.common.avro._errors import (
    DecodeFailure,
    SchemaRegistryError,
    UndecodableRecord,
)
from services.common.settings import TenureSettings

__all__ = [
    "CONFLUENT_MAGIC",
    "ConfluentRegistryClient",
    "ConfluentWire",
    "WireFormat",
    "confluent_to_single_object",
    "subject_for",
    "wire_from_settings",
]

CONFLUENT_MAGIC = b"\x00"
_CONFLUENT_HEADER_LEN = 5
_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class WireFormat(StrEnum):
    """TENURE_WIRE_FORMAT: what producers write. Readers accept both, always."""

    SINGLE_OBJECT = "single-object"
    CONFLUENT = "confluent"


def subject_for(full_name: str) -> str:
    """RecordNameStrategy: the subject of a record is its full name."""
    return full_name


class ConfluentRegistryClient:
    """The two calls Tenure needs of the Confluent schema registry API, each answer cached."""

    def __init__(
        self,
        url: str,
        *,
        username: str = "",
        password: str = "",
        timeout_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"schema registry URL {url!r} must start with http:// or https://")
        self.url = url.rstrip("/")
        auth = httpx.BasicAuth(username, password) if username else None
        self._http = httpx.Client(
            base_url=self.url,
            auth=auth,
            timeout=timeout_s,
            transport=transport,
            headers={"Accept": _CONTENT_TYPE},
        )
        self._ids: dict[tuple[str, str], int] = {}
        self._schemas: dict[int, str] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._http.close()

    def register(self, subject: str, schema_text: str) -> int:
        """The id of `schema_text` under `subject`, registering it if it is new (idempotent)."""
        key = (subject, schema_text)
        cached = self._ids.get(key)
        if cached is not None:
            return cached
        body = self._call(
            "POST",
            f"/subjects/{subject}/versions",
            f"registering {subject}",
            json={"schemaType": "AVRO", "schema": schema_text},
        )
        schema_id = body.get("id") if isinstance(body, dict) else None
        if not isinstance(schema_id, int) or not 0 <= schema_id < 2**31:
            raise SchemaRegistryError(f"registering {subject}: the registry answered no id: {body!r:.200}")
        with self._lock:
            self._ids[key] = schema_id
            self._schemas.setdefault(schema_id, schema_text)
        return schema_id

    def schema_text(self, schema_id: int) -> str:
        """The schema registered under `schema_id`; UndecodableRecord if the registry has none."""
        cached = self._schemas.get(schema_id)
        if cached is not None:
            return cached
        body = self._call("GET", f"/schemas/ids/{schema_id}", f"fetching schema id {schema_id}")
        text = body.get("schema") if isinstance(body, dict) else None
        schema_type = body.get("schemaType", "AVRO") if isinstance(body, dict) else None
        if not isinstance(text, str) or schema_type != "AVRO":
            raise UndecodableRecord(
                DecodeFailure.UNKNOWN_SCHEMA_ID, f"schema id {schema_id} is not an Avro schema: {body!r:.200}"
            )
        with self._lock:
            self._schemas[schema_id] = text
        return text

    def _call(self, method: str, path: str, what: str, json: Any = None) -> Any:
        try:
            response = self._http.request(
                method, path, json=json, headers={"Content-Type": _CONTENT_TYPE} if json else None
            )
        except httpx.HTTPError as exc:
            raise SchemaRegistryError(f"{what}: schema registry {self.url} unreachable: {exc!r}") from exc
        if response.status_code == 404 and method == "GET":
            raise UndecodableRecord(
                DecodeFailure.UNKNOWN_SCHEMA_ID, f"{what}: the registry at {self.url} has no such schema"
            )
        if response.status_code >= 300:
            raise SchemaRegistryError(
                f"{what}: schema registry {self.url} answered {response.status_code}: {response.text[:300]}",
                status=response.status_code,
            )
        try:
            return response.json()
        except ValueError as exc:
            raise SchemaRegistryError(f"{what}: schema registry answered no JSON: {exc}") from exc


class ConfluentWire:
    """How one process uses the registry: whether it writes the Confluent framing, and how it
    turns a Confluent-framed record back into one the codec knows by fingerprint."""

    def __init__(
        self,
        client: ConfluentRegistryClient,
        *,
        write: WireFormat,
        fingerprint_of: Callable[[str], int],
    ) -> None:
        self.client = client
        self.write = WireFormat(write)
        self._fingerprint_of = fingerprint_of
        self._fingerprints: dict[int, int] = {}

    @property
    def writes_confluent(self) -> bool:
        return self.write is WireFormat.CONFLUENT

    def frame(self, full_name: str, declared: Any, body: bytes) -> bytes:
        """Magic byte 0, the schema's id (registered on first use), the body."""
        schema_id = self.client.register(subject_for(full_name), json.dumps(declared, separators=(",", ":")))
        return CONFLUENT_MAGIC + schema_id.to_bytes(4, "big") + body

    def writer_fingerprint(self, data: bytes, known: Collection[int]) -> int:
        """The fingerprint of the writer schema of a Confluent-framed record, one of `known`."""
        if len(data) < _CONFLUENT_HEADER_LEN:
            raise UndecodableRecord(
                DecodeFailure.BAD_MAGIC, f"Confluent framing needs 5 header bytes, got {bytes(data).hex()!r}"
            )
        schema_id = int.from_bytes(data[1:_CONFLUENT_HEADER_LEN], "big")
        fingerprint = self._fingerprints.get(schema_id)
        if fingerprint is None:
            text = self.client.schema_text(schema_id)
            try:
                fingerprint = self._fingerprint_of(text)
            except Exception as exc:  # a registry's schema is untrusted input too
                raise UndecodableRecord(
                    DecodeFailure.UNKNOWN_SCHEMA_ID, f"schema id {schema_id} does not parse: {exc}"
                ) from exc
            self._fingerprints[schema_id] = fingerprint
        if fingerprint not in known:
            raise UndecodableRecord(
                DecodeFailure.UNKNOWN_SCHEMA_ID,
                f"schema id {schema_id} (fingerprint {fingerprint:#018x}) is none of this reader's schemas",
            )
        return fingerprint


def confluent_to_single_object(wire: ConfluentWire | None, data: bytes, known: Collection[int]) -> bytes:
    """A Confluent-framed record re-framed as single-object encoding (same body), so one decode
    path serves both formats."""
    if wire is None:
        raise UndecodableRecord(
            DecodeFailure.NO_SCHEMA_REGISTRY,
            "record is in the Confluent wire format (magic byte 0): "
            "set TENURE_SCHEMA_REGISTRY_URL to read it",
        )
    fingerprint = wire.writer_fingerprint(data, known)
    return b"\xc3\x01" + fingerprint.to_bytes(8, "little") + bytes(data[_CONFLUENT_HEADER_LEN:])


@cache
def wire_from_settings(fingerprint_of: Callable[[str], int]) -> ConfluentWire | None:
    """This process's wire: None without TENURE_SCHEMA_REGISTRY_URL (single-object only; a
    Confluent-framed record is then undecodable, NO_SCHEMA_REGISTRY). Read once per process."""
    settings = TenureSettings()
    if not settings.schema_registry_url:
        return None
    client = ConfluentRegistryClient(
        settings.schema_registry_url,
        username=settings.schema_registry_username,
        password=settings.schema_registry_password.get_secret_value(),
        timeout_s=settings.schema_registry_timeout_s,
    )
    return ConfluentWire(client, write=WireFormat(settings.wire_format), fingerprint_of=fingerprint_of)
