"""Plain values for records crossing the adapter boundary, so callers never see library types."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Headers", "InboundRecord", "OutboundRecord", "header_value"]

Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class InboundRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: Headers = ()
    timestamp_ms: int = 0


@dataclass(frozen=True)
class OutboundRecord:
    topic: str
    key: bytes
    value: bytes
    headers: Headers = ()
    # None lets the partitioner pick by key; processors pin output to their input partition.
    partition: int | None = None
    metadata: dict[str, str] = field(default_factory=dict, compare=False)


def header_value(headers: Headers, name: str) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None
