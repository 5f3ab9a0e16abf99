"""Contract values <-> Kafka records: Avro single-object encoding plus the schema headers."""

from __future__ import annotations

from typing import Any

from services.common.avro import SchemaRegistry, UndecodableRecord, default_registry
from services.common.contracts import from_record, full_name_of, to_record
from services.common.kafka import OutboundRecord

__all__ = ["MessageCodec", "UndecodableRecord", "deadletter_record"]


class MessageCodec:
    def __init__(self, registry: SchemaRegistry | None = None) -> None:
        self._registry = registry or default_registry()

    def outbound(self, topic: str, key: str, message: object, partition: int | None = None) -> OutboundRecord:
        full_name = full_name_of(message)
        return OutboundRecord(
            topic=topic,
            key=key.encode("utf-8"),
            value=self._registry.encode(full_name, to_record(message)),
            headers=tuple(self._registry.headers_for(full_name)),
            partition=partition,
        )

    def decode(self, data: bytes) -> Any:
        """The contract value of an encoded record; raises UndecodableRecord with a reason code."""
        decoded = self._registry.decode(data)
        try:
            return from_record(decoded.full_name, decoded.record)
        except (KeyError, TypeError) as exc:
            raise UndecodableRecord("UNKNOWN_CONTRACT", str(exc)) from exc

    def decode_record(self, data: bytes) -> tuple[str, dict[str, Any]]:
        """(full name, wire record) without mapping to a contract type; for tools like `tail`."""
        decoded = self._registry.decode(data)
        return decoded.full_name, dict(decoded.record)


def deadletter_record(
    deadletter_topic: str,
    source_topic: str,
    source_partition: int,
    source_offset: int,
    key: bytes | None,
    value: bytes,
    reason_code: str,
    detail: str,
) -> OutboundRecord:
    """The original bytes, untouched, with why and where from in headers (Kafka Connect style)."""
    return OutboundRecord(
        topic=deadletter_topic,
        key=key or b"",
        value=value,
        headers=(
            ("tenure-dlq-reason", reason_code.encode("utf-8")),
            ("tenure-dlq-detail", detail.encode("utf-8")[:2000]),
            ("tenure-dlq-source-topic", source_topic.encode("utf-8")),
            ("tenure-dlq-source-partition", str(source_partition).encode("utf-8")),
            ("tenure-dlq-source-offset", str(source_offset).encode("utf-8")),
        ),
    )
