"""Errors of the Tenure Avro codec; each says what was wrong and with which schema or field."""

from __future__ import annotations

from enum import StrEnum


class AvroCodecError(Exception):
    """Base of every error raised by the Tenure Avro codec."""


class SchemaFileError(AvroCodecError):
    """A schema file or the schema directory is malformed or inconsistent."""


class UnknownSchema(AvroCodecError):
    """A record name or version is not in the registry."""


class SchemaViolation(AvroCodecError):
    """A record does not match its schema; `field` names the offending field."""

    def __init__(self, full_name: str, field_name: str, detail: str) -> None:
        super().__init__(f"{full_name}.{field_name}: {detail}")
        self.full_name = full_name
        self.field = field_name
        self.detail = detail


class DecodeFailure(StrEnum):
    """Why bytes could not be decoded; stable codes for metrics and dead-letter headers."""

    BAD_MAGIC = "BAD_MAGIC"  # not single-object encoded, or shorter than its header
    UNKNOWN_FINGERPRINT = "UNKNOWN_FINGERPRINT"  # writer schema is not in this registry
    CORRUPT_BODY = "CORRUPT_BODY"  # body does not parse with the writer schema
    INCOMPATIBLE_SCHEMA = "INCOMPATIBLE_SCHEMA"  # writer cannot be resolved into the reader
    UNKNOWN_SCHEMA_ID = "UNKNOWN_SCHEMA_ID"  # Confluent framing: the registry has no such id, or
    # its schema is none of Tenure's
    NO_SCHEMA_REGISTRY = "NO_SCHEMA_REGISTRY"  # Confluent framing, but no registry is configured


class UndecodableRecord(AvroCodecError):
    """Bytes that cannot be turned into a record; `reason_code` says why (a DecodeFailure here;
    layers above may add their own codes, e.g. for a record no contract type maps)."""

    def __init__(self, reason_code: str, detail: str) -> None:
        super().__init__(f"{reason_code}: {detail}")
        self.reason_code = reason_code
        self.detail = detail


class SchemaRegistryError(AvroCodecError, ConnectionError):
    """The schema registry could not be used (unreachable, timed out, 5xx, refused the
    credentials or the schema): transient for the caller, which retries the whole batch; never
    a reason to dead-letter a record or to write another format instead. `status` is the HTTP
    status when the registry answered. A ConnectionError, so that the stream runtime classifies
    it as transient (retried with backoff, /readyz not ready) like a lost broker connection."""

    def __init__(self, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
