"""Tenure's Avro schemas on the wire: single-object encoding, fingerprints, schema evolution.

Producers call `encode(full_name, record)` and attach `headers_for(full_name)`; consumers call
`decode(payload)` and get the record resolved into the latest schema of its name.
"""

from services.common.avro._codec import (
    SCHEMA_DIR_ENV,
    SINGLE_OBJECT_MAGIC,
    Decoded,
    SchemaRegistry,
    SchemaVersion,
    decode,
    default_registry,
    encode,
    fingerprint_of,
    headers_for,
    parsing_canonical_form,
)
from services.common.avro._errors import (
    AvroCodecError,
    DecodeFailure,
    SchemaFileError,
    SchemaViolation,
    UndecodableRecord,
    UnknownSchema,
)

__all__ = [
    "SCHEMA_DIR_ENV",
    "SINGLE_OBJECT_MAGIC",
    "AvroCodecError",
    "DecodeFailure",
    "Decoded",
    "SchemaFileError",
    "SchemaRegistry",
    "SchemaVersion",
    "SchemaViolation",
    "UndecodableRecord",
    "UnknownSchema",
    "decode",
    "default_registry",
    "encode",
    "fingerprint_of",
    "headers_for",
    "parsing_canonical_form",
]
