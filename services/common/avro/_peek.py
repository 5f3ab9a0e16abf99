"""An event's identity read from its first bytes, without decoding the record (issue 16).

Every Tenure event schema begins with the same three fields: the event id (string), the
aggregate id (string) and the version (long). In Avro's binary encoding those are the first
bytes of the body, after the single-object header, so a reader that only needs to know which
aggregate and version a record is (a projection rebuild keeping each event's bytes as its
history entry) can read them in about a microsecond, where decoding the record costs ~10.

`EventPeek` answers only for records whose writer schema it knows to start that way; anything
else (another wire format, another schema, a body whose first fields do not parse) is None, and
the caller decodes the record as usual. A peek never reads past the version: the rest of the
body is not checked, so a caller that stores the bytes must be ready for a decode to fail later.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from services.common.avro._codec import SINGLE_OBJECT_MAGIC, SchemaRegistry

__all__ = ["EventPeek", "PeekedEvent"]

_HEADER_LEN = len(SINGLE_OBJECT_MAGIC) + 8
# The longest id worth peeking at: Tenure's ids are far shorter (services/common/ids.py).
_MAX_ID_BYTES = 256
_LEADING = (("eventId", "string"), (None, "string"), ("version", "long"))


@dataclass(frozen=True, slots=True)
class PeekedEvent:
    full_name: str  # the writer schema's
    aggregate_id: str
    version: int


def _leads_with_identity(declared: object) -> bool:
    if not isinstance(declared, dict):
        return False
    fields = declared.get("fields")
    if not isinstance(fields, list) or len(fields) < len(_LEADING):
        return False
    for field, (name, kind) in zip(fields, _LEADING, strict=False):
        if not isinstance(field, dict) or field.get("type") != kind:
            return False
        if name is not None and field.get("name") != name:
            return False
    return True


class EventPeek:
    """Peeks at records written with any version of the schemas named in `full_names`."""

    def __init__(self, registry: SchemaRegistry, full_names: Iterable[str]) -> None:
        self._names: dict[bytes, str] = {}  # the 8 fingerprint bytes as written -> full name
        for full_name in full_names:
            for version in registry.versions(full_name):
                if _leads_with_identity(version.declared):
                    self._names[version.fingerprint.to_bytes(8, "little")] = version.full_name

    def __call__(self, data: bytes) -> PeekedEvent | None:
        if data[:2] != SINGLE_OBJECT_MAGIC:
            return None
        full_name = self._names.get(data[2:_HEADER_LEN])
        if full_name is None:
            return None
        try:
            # The common case in one step: ids under 64 bytes and versions under 64 have a
            # one-byte length or value (zig-zag: the byte is twice the number).
            event_id_bytes = data[_HEADER_LEN]
            if event_id_bytes & 1:
                return None  # a negative length: not a string
            if event_id_bytes < 0x80:
                position = _HEADER_LEN + 1 + (event_id_bytes >> 1)
            else:
                position = _skip_string(data, _HEADER_LEN)
            length, position = _read_long(data, position)
            if not 0 < length <= _MAX_ID_BYTES or position + length > len(data):
                return None
            aggregate_id = data[position : position + length].decode("utf-8")
            version, _ = _read_long(data, position + length)
        except (IndexError, UnicodeDecodeError, ValueError):
            return None
        return PeekedEvent(full_name, aggregate_id, version) if 0 < version < 1 << 63 else None


def _read_long(data: bytes, position: int) -> tuple[int, int]:
    """Avro's zig-zag varint at `position`: (value, the position after it)."""
    shift = accumulated = 0
    while True:
        byte = data[position]
        position += 1
        accumulated |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (accumulated >> 1) ^ -(accumulated & 1), position
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than a long")


def _skip_string(data: bytes, position: int) -> int:
    length, position = _read_long(data, position)
    if not 0 <= length <= _MAX_ID_BYTES or position + length > len(data):
        raise ValueError("not a short string")
    return position + length
