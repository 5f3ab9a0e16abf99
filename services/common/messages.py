"""Contract values <-> Kafka records: Avro single-object encoding plus the schema headers."""

from __future__ import annotations

import logging
from typing import Any

from services.common.avro import SchemaRegistry, UndecodableRecord, default_registry
from services.common.contracts import from_record, full_name_of, to_record
from services.common.kafka import InboundRecord, OutboundRecord

__all__ = ["MessageCodec", "UndecodableRecord", "command_or_deadletter", "deadletter_record"]


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


def command_or_deadletter(
    codec: MessageCodec,
    record: InboundRecord,
    command_types: tuple[type[Any], ...],
    what: str,
    out: list[OutboundRecord],
    deadletter_topic: str,
    log: logging.Logger,
) -> Any | None:
    """The command in `record`, or None after appending its dead letter to `out` with the reason:
    undecodable, not one of `command_types` (`what` names them), or keyed by another run id.

    A processor commits the dead letter in the same transaction as the rest of its batch, so a
    bad record is set aside exactly once and the batch goes on."""

    def dead(code: str, detail: str) -> None:
        log.warning(
            "dead-lettering %s[%d]@%d: %s %s", record.topic, record.partition, record.offset, code, detail
        )
        out.append(
            deadletter_record(
                deadletter_topic,
                record.topic,
                record.partition,
                record.offset,
                record.key,
                record.value,
                code,
                detail,
            )
        )

    try:
        message = codec.decode(record.value)
    except UndecodableRecord as exc:
        dead(exc.reason_code, str(exc))
        return None
    if not isinstance(message, command_types):
        dead("NOT_A_COMMAND", f"{type(message).__name__} is not a {what}")
        return None
    if record.key is None or record.key.decode("utf-8", "replace") != message.run_id:
        dead("KEY_MISMATCH", f"record key {record.key!r} is not the runId {message.run_id!r}")
        return None
    return message
