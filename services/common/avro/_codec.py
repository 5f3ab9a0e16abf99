"""Avro single-object encoding of Tenure's records; the only module that imports fastavro.

Wire format (Avro spec, "Single-object encoding"): b"\\xC3\\x01", then the 8-byte little-endian
CRC-64-AVRO fingerprint of the writer schema's Parsing Canonical Form, then the schemaless
Avro body. A reader finds the writer schema by fingerprint and resolves the body into the
latest version of the same record name, so consumers never see an old shape.

As an option (TENURE_WIRE_FORMAT=confluent, _registry.py) encode writes the Confluent framing
(magic byte 0 + 4-byte schema id) instead; decode accepts both framings, always.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, cast

import fastavro
from fastavro.read import SchemaResolutionError
from fastavro.schema import (
    SchemaParseException,
    fingerprint,
    parse_schema,
    to_parsing_canonical_form,
)
from fastavro.validation import ValidationError, validate

from services.common.avro._errors import (
    DecodeFailure,
    SchemaFileError,
    SchemaViolation,
    UndecodableRecord,
    UnknownSchema,
)
from services.common.avro._registry import (
    CONFLUENT_MAGIC,
    ConfluentWire,
    confluent_to_single_object,
    wire_from_settings,
)
from services.common.settings import schema_dir_override

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
SCHEMA_DIR_ENV = "TENURE_SCHEMA_DIR"
_HEADER_LEN = len(SINGLE_OBJECT_MAGIC) + 8
_FILE_NAME = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\.v(?P<version>[1-9][0-9]*)\.avsc$")
# Timestamps travel as plain epoch millis: fastavro would turn them into datetimes, which do not
# round-trip exactly and would make replayed state depend on timezone handling. Dropping the
# logicalType only from the working copy keeps the fingerprint (Parsing Canonical Form ignores it).
_PASS_THROUGH_LOGICAL_TYPES = frozenset({"timestamp-millis", "timestamp-micros"})


@dataclass(frozen=True)
class SchemaVersion:
    """One version of one record schema, as loaded from `<Name>.v<N>.avsc`."""

    full_name: str
    version: int
    fingerprint: int
    canonical_form: str
    path: Path
    declared: Mapping[str, Any] = field(repr=False, compare=False)
    _working: Any = field(repr=False, compare=False)

    @property
    def fingerprint_hex(self) -> str:
        """The fingerprint's 8 wire bytes (little-endian) in hex, as fastavro also prints it."""
        return self.fingerprint.to_bytes(8, "little").hex()


@dataclass(frozen=True)
class Decoded:
    """A decoded record; name, version and fingerprint are the writer's."""

    full_name: str
    version: int
    fingerprint_hex: str
    record: dict[str, Any]


def parsing_canonical_form(schema_json: str | Mapping[str, Any] | list[Any]) -> str:
    """The Avro Parsing Canonical Form of a schema given as JSON text or as parsed JSON."""
    schema = json.loads(schema_json) if isinstance(schema_json, str) else schema_json
    # The canonical form drops defaults, so a bad default cannot change it (Apache's reference
    # case 026 has one); registry files are still parsed strictly.
    parsed = parse_schema(cast(Any, schema), _ignore_default_error=True)
    return str(to_parsing_canonical_form(parsed))


def fingerprint_of(schema_json: str | Mapping[str, Any] | list[Any]) -> int:
    """CRC-64-AVRO fingerprint (unsigned) of a schema's Parsing Canonical Form."""
    return _fingerprint_of_canonical(parsing_canonical_form(schema_json))


def _fingerprint_of_canonical(canonical_form: str) -> int:
    # fastavro prints the fingerprint's little-endian bytes as hex.
    return int.from_bytes(bytes.fromhex(fingerprint(canonical_form, "CRC-64-AVRO")), "little")


def _strip_timestamp_logical_types(node: Any) -> Any:
    if isinstance(node, list):
        return [_strip_timestamp_logical_types(item) for item in node]
    if not isinstance(node, dict):
        return node
    stripped = {key: _strip_timestamp_logical_types(value) for key, value in node.items()}
    if stripped.get("logicalType") in _PASS_THROUGH_LOGICAL_TYPES:
        del stripped["logicalType"]
    return stripped


def _load_schema_file(root: Path, path: Path) -> SchemaVersion:
    match = _FILE_NAME.match(path.name)
    if match is None:
        raise SchemaFileError(f"{path}: file name must be <RecordName>.v<N>.avsc")
    namespace = ".".join(("tenure", *path.parent.relative_to(root).parts))
    expected_name = f"{namespace}.{match['name']}"
    try:
        declared = json.loads(path.read_text(encoding="utf-8"))
        parsed = parse_schema(declared)
        working = parse_schema(_strip_timestamp_logical_types(declared))
    except (OSError, ValueError, SchemaParseException) as exc:
        raise SchemaFileError(f"{path}: cannot load schema: {exc}") from exc
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        raise SchemaFileError(f"{path}: top-level schema must be a record")
    if parsed["name"] != expected_name:
        raise SchemaFileError(f"{path}: declares {parsed['name']!r} but its path says {expected_name!r}")
    canonical = str(to_parsing_canonical_form(parsed))
    return SchemaVersion(
        full_name=expected_name,
        version=int(match["version"]),
        fingerprint=_fingerprint_of_canonical(canonical),
        canonical_form=canonical,
        path=path,
        declared=declared,
        _working=working,
    )


class SchemaRegistry:
    """Every version of every Tenure record schema, indexed by name and by fingerprint."""

    def __init__(self, versions: Iterable[SchemaVersion], wire: ConfluentWire | None = None) -> None:
        # The Confluent wire format (_registry.py): None = single-object only, no registry.
        self.wire = wire
        self._by_name: dict[str, list[SchemaVersion]] = {}
        self._by_fingerprint: dict[int, SchemaVersion] = {}
        for version in sorted(versions, key=lambda v: (v.full_name, v.version)):
            clash = self._by_fingerprint.get(version.fingerprint)
            if clash is not None:
                # Two files with one wire form would make the decoded version ambiguous.
                raise SchemaFileError(f"{version.path} and {clash.path} have the same canonical form")
            self._by_fingerprint[version.fingerprint] = version
            self._by_name.setdefault(version.full_name, []).append(version)
        # writer fingerprint -> (writer, the latest version of its record or None when that is
        # the writer itself): the default decode resolves with no lookups (issue 16).
        self._resolve_latest: dict[int, tuple[SchemaVersion, SchemaVersion | None]] = {}
        for name, history in self._by_name.items():
            if [v.version for v in history] != list(range(1, len(history) + 1)):
                found = [v.version for v in history]
                raise SchemaFileError(f"{name}: versions must be 1..N without gaps, got {found}")
            for version in history:
                latest = history[-1]
                self._resolve_latest[version.fingerprint] = (version, None if latest is version else latest)
        # What every encode looks up, made once (a processor encodes an event per renewal: the
        # lookups, the header bytes and the field-name set were a fifth of an encode's cost).
        self._latest: dict[str, SchemaVersion] = {
            name: history[-1] for name, history in self._by_name.items()
        }
        self._headers: dict[str, tuple[tuple[str, bytes], ...]] = {
            name: (
                ("tenure-schema", v.full_name.encode()),
                ("tenure-schema-fingerprint", v.fingerprint_hex.encode()),
                ("tenure-schema-version", str(v.version).encode()),
            )
            for name, v in self._latest.items()
        }
        self._field_names: dict[int, frozenset[str]] = {
            v.fingerprint: frozenset(f["name"] for f in v._working["fields"])
            for v in self._by_fingerprint.values()
        }

    @classmethod
    def from_directory(cls, path: Path, wire: ConfluentWire | None = None) -> SchemaRegistry:
        if not path.is_dir():
            raise SchemaFileError(f"schema directory {path} does not exist")
        return cls((_load_schema_file(path, file) for file in sorted(path.rglob("*.avsc"))), wire)

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._by_name))

    def versions(self, full_name: str) -> tuple[SchemaVersion, ...]:
        try:
            return tuple(self._by_name[full_name])
        except KeyError:
            raise UnknownSchema(f"no schema named {full_name!r}") from None

    def latest(self, full_name: str) -> SchemaVersion:
        try:
            return self._latest[full_name]
        except KeyError:
            raise UnknownSchema(f"no schema named {full_name!r}") from None

    def get(self, full_name: str, version: int) -> SchemaVersion:
        history = self.versions(full_name)
        if not 1 <= version <= len(history):
            raise UnknownSchema(f"{full_name} has no version {version}")
        return history[version - 1]

    def by_fingerprint(self, fingerprint_value: int) -> SchemaVersion:
        try:
            return self._by_fingerprint[fingerprint_value]
        except KeyError:
            raise UnknownSchema(f"no schema has fingerprint {fingerprint_value:#018x}") from None

    def encode(self, full_name: str, record: Mapping[str, Any], *, version: int | None = None) -> bytes:
        """Single-object encoding with the latest version (or `version`, for tests and goldens)."""
        schema = self.latest(full_name) if version is None else self.get(full_name, version)
        if not isinstance(record, Mapping):
            raise SchemaViolation(full_name, "<record>", f"expected a mapping, got {type(record).__name__}")
        datum = dict(record)  # one copy, checked and written: the caller's mapping is not touched
        _check_record(schema, datum, self._field_names[schema.fingerprint])
        body = io.BytesIO()
        try:
            fastavro.schemaless_writer(body, schema._working, datum)
        except (TypeError, ValueError, OverflowError) as exc:
            raise SchemaViolation(full_name, "<record>", f"cannot be written: {exc}") from exc
        if self.wire is not None and self.wire.writes_confluent:
            return self.wire.frame(schema.full_name, schema.declared, body.getvalue())
        return SINGLE_OBJECT_MAGIC + schema.fingerprint.to_bytes(8, "little") + body.getvalue()

    def decode(self, data: bytes, *, reader_version: int | None = None) -> Decoded:
        """Decode into the latest version of the writer's record (or `reader_version` of it)."""
        if data[:1] == CONFLUENT_MAGIC:  # the writer's schema by registry id, then as below
            data = confluent_to_single_object(self.wire, data, self._by_fingerprint)
        if len(data) < _HEADER_LEN or data[:2] != SINGLE_OBJECT_MAGIC:
            header = bytes(data[:_HEADER_LEN]).hex()
            raise UndecodableRecord(
                DecodeFailure.BAD_MAGIC, f"expected c301 + 8-byte fingerprint, got {header!r}"
            )
        writer_fingerprint = int.from_bytes(data[2:_HEADER_LEN], "little")
        resolved = self._resolve_latest.get(writer_fingerprint)
        if resolved is None:
            raise UndecodableRecord(
                DecodeFailure.UNKNOWN_FINGERPRINT,
                f"no schema has fingerprint {bytes(data[2:_HEADER_LEN]).hex()} (wire bytes)",
            )
        writer, newer = resolved
        reader = (newer or writer) if reader_version is None else self.get(writer.full_name, reader_version)
        body = io.BytesIO(data)
        body.seek(_HEADER_LEN)
        try:
            # No reader schema when it is the writer's: fastavro then skips schema resolution.
            reader_schema = None if reader is writer else reader._working
            record = fastavro.schemaless_reader(body, writer._working, reader_schema)
        except SchemaResolutionError as exc:
            raise UndecodableRecord(
                DecodeFailure.INCOMPATIBLE_SCHEMA,
                f"{writer.full_name} v{writer.version} cannot be read as v{reader.version}: {exc}",
            ) from exc
        # Any failure while parsing untrusted bytes means the body is damaged; the C reader
        # raises a variety of built-in errors (EOFError, UnicodeDecodeError, IndexError, ...).
        except Exception as exc:
            raise UndecodableRecord(
                DecodeFailure.CORRUPT_BODY,
                f"{writer.full_name} v{writer.version} body: {type(exc).__name__}: {exc}",
            ) from exc
        trailing = len(data) - body.tell()
        if trailing or not isinstance(record, dict):
            raise UndecodableRecord(
                DecodeFailure.CORRUPT_BODY,
                f"{writer.full_name} v{writer.version} body has {trailing} trailing bytes",
            )
        return Decoded(writer.full_name, writer.version, writer.fingerprint_hex, record)

    def headers_for(self, full_name: str) -> list[tuple[str, bytes]]:
        """Kafka headers naming the latest schema of `full_name`, readable without decoding."""
        return list(self.header_tuple(full_name))

    def header_tuple(self, full_name: str) -> tuple[tuple[str, bytes], ...]:
        """`headers_for` as the immutable tuple a record carries, made once per schema."""
        try:
            return self._headers[full_name]
        except KeyError:
            raise UnknownSchema(f"no schema named {full_name!r}") from None


def _check_record(schema: SchemaVersion, record: dict[str, Any], known: frozenset[str]) -> None:
    """`record` against `schema`, whose fields are `known` (every registry schema is a record)."""
    if not known.issuperset(record):
        # fastavro ignores extra keys; a misspelt optional field would silently take its default.
        unknown = sorted(set(record) - known)
        raise SchemaViolation(schema.full_name, str(unknown[0]), "is not a field of this schema")
    # First without errors: a union's branches that do not match raise and build an error each
    # (its message JSON-encoded, with closures that only the cyclic collector frees) even when
    # a later branch matches. The same check again, with errors, only for a record that fails.
    if validate(record, schema._working, raise_errors=False):
        return
    try:
        validate(record, schema._working, raise_errors=True)
    except ValidationError as exc:
        error = exc.errors[0]
        field_name = str(error.field).removeprefix(f"{schema.full_name}.") or "<record>"
        if field_name in known and field_name not in record:
            raise SchemaViolation(schema.full_name, field_name, "required field is missing") from None
        raise SchemaViolation(
            schema.full_name,
            field_name,
            f"{error.datum!r:.80} does not match schema {error.schema!r}",
        ) from None


@cache
def _registry_at(root: Path) -> SchemaRegistry:
    return SchemaRegistry.from_directory(root)


@cache
def _registry_at_with_wire(root: Path, wire: ConfluentWire | None) -> SchemaRegistry:
    return SchemaRegistry.from_directory(root, wire) if wire is not None else _registry_at(root)


def default_registry() -> SchemaRegistry:
    """The registry of `<repo>/schemas`, or of $TENURE_SCHEMA_DIR; loaded once per directory;
    with the process's wire format (TENURE_WIRE_FORMAT, TENURE_SCHEMA_REGISTRY_URL)."""
    root = schema_dir_override() or Path(__file__).resolve().parents[3] / "schemas"
    return _registry_at_with_wire(root.resolve(), wire_from_settings(fingerprint_of))


def encode(full_name: str, record: Mapping[str, Any]) -> bytes:
    return default_registry().encode(full_name, record)


def decode(data: bytes) -> Decoded:
    return default_registry().decode(data)


def headers_for(full_name: str) -> list[tuple[str, bytes]]:
    return default_registry().headers_for(full_name)
