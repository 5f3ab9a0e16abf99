"""Tenure's Avro schemas on the wire: single-object encoding, fingerprints, schema evolution,
and, as an option, the Confluent wire format with a schema registry (_registry.py).

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
    SchemaRegistryError,
    SchemaViolation,
    UndecodableRecord,
    UnknownSchema,
)
from services.common.avro._peek import EventPeek, PeekedEvent
from services.common.avro._registry import (
    CONFLUENT_MAGIC,
    ConfluentRegistryClient,
    ConfluentWire,
    WireFormat,
    subject_for,
    wire_from_settings,
)

__all__ = [
    "CONFLUENT_MAGIC",
    "SCHEMA_DIR_ENV",
    "SINGLE_OBJECT_MAGIC",
    "AvroCodecError",
    "ConfluentRegistryClient",
    "ConfluentWire",
    "DecodeFailure",
    "Decoded",
    "EventPeek",
    "PeekedEvent",
    "SchemaFileError",
    "SchemaRegistry",
    "SchemaRegistryError",
    "SchemaVersion",
    "SchemaViolation",
    "UndecodableRecord",
    "UnknownSchema",
    "WireFormat",
    "decode",
    "default_registry",
    "encode",
    "fingerprint_of",
    "headers_for",
    "parsing_canonical_form",
    "subject_for",
    "wire_from_settings",
]
