"""Contract values <-> Kafka records: Avro single-object encoding plus the schema headers."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from services.common.avro import EventPeek, SchemaRegistry, UndecodableRecord, default_registry
from services.common.contracts import from_record, full_name_of, to_record
from services.common.kafka import InboundRecord, OutboundRecord

__all__ = [
    "MAX_RECORD_BYTES",
    "MessageCodec",
    "UndecodableRecord",
    "command_headers",
    "command_or_deadletter",
    "deadletter_into",
    "deadletter_of",
    "deadletter_record",
    "record_bytes",
]

# The largest record a processor may write: librdkafka's default message.max.bytes (1,000,000,
# the producer refuses a bigger record with MSG_SIZE_TOO_LARGE) less room for the record framing.
# A record over it is refused by the producer every time, so it must never reach a transaction.
MAX_RECORD_BYTES = 990_000
_DETAIL_BYTES = 2000
Headers = tuple[tuple[str, bytes], ...]


class MessageCodec:
    def __init__(self, registry: SchemaRegistry | None = None) -> None:
        self._registry = registry or default_registry()

    def outbound(self, topic: str, key: str, message: object, partition: int | None = None) -> OutboundRecord:
        full_name = full_name_of(message)
        return OutboundRecord(
            topic=topic,
            key=key.encode("utf-8"),
            value=self._registry.encode(full_name, to_record(message)),
            headers=self._registry.header_tuple(full_name),
            partition=partition,
        )

    def decode(self, data: bytes) -> Any:
        """The contract value of an encoded record; raises UndecodableRecord with a reason code."""
        decoded = self._registry.decode(data)
        return self.contract_of(decoded.full_name, decoded.record)

    @staticmethod
    def contract_of(full_name: str, record: Mapping[str, Any]) -> Any:
        """The contract value of a wire record (`decode_record`'s); raises UndecodableRecord."""
        try:
            return from_record(full_name, record)
        except (KeyError, TypeError) as exc:
            raise UndecodableRecord("UNKNOWN_CONTRACT", str(exc)) from exc

    def peek(self, message_types: tuple[type[Any], ...]) -> EventPeek:
        """A reader of the aggregate id and version of records of these event types, without
        decoding them (services/common/avro/_peek.py)."""
        return EventPeek(self._registry, (full_name_of(t) for t in message_types))

    def decode_record(self, data: bytes) -> tuple[str, dict[str, Any]]:
        """(full name, wire record) without mapping to a contract type; for tools like `tail`."""
        decoded = self._registry.decode(data)
        return decoded.full_name, dict(decoded.record)


def record_bytes(record: OutboundRecord) -> int:
    """What a record weighs against MAX_RECORD_BYTES: key, value and headers."""
    return len(record.key) + len(record.value) + sum(len(k) + len(v) for k, v in record.headers)


def deadletter_record(
    deadletter_topic: str,
    source_topic: str,
    source_partition: int,
    source_offset: int,
    key: bytes | None,
    value: bytes,
    reason_code: str,
    detail: str,
    extra: Headers = (),
) -> OutboundRecord:
    """The original bytes, untouched, with why and where from in headers (Kafka Connect style).

    `extra` adds headers (tenure-dlq-*). A dead letter must always be writable, or the bad record
    it sets aside would stop its partition after all: a value that would not fit in one record
    beside its headers is cut to fit, and its full size and sha256 travel in headers instead."""
    headers: Headers = (
        ("tenure-dlq-reason", reason_code.encode("utf-8")),
        ("tenure-dlq-detail", detail.encode("utf-8", "replace")[:_DETAIL_BYTES]),
        ("tenure-dlq-source-topic", source_topic.encode("utf-8")),
        ("tenure-dlq-source-partition", str(source_partition).encode("utf-8")),
        ("tenure-dlq-source-offset", str(source_offset).encode("utf-8")),
        *extra,
    )
    key = (key or b"")[:1024]
    room = MAX_RECORD_BYTES - len(key) - sum(len(k) + len(v) for k, v in headers) - 256
    if len(value) > room:
        headers = (
            *headers,
            ("tenure-dlq-value-truncated", b"1"),
            ("tenure-dlq-value-bytes", str(len(value)).encode()),
            ("tenure-dlq-value-sha256", hashlib.sha256(value).hexdigest().encode()),
        )
        value = value[: max(room, 0)]
    return OutboundRecord(topic=deadletter_topic, key=key, value=value, headers=headers)


def deadletter_of(
    deadletter_topic: str, record: InboundRecord, reason_code: str, detail: str, extra: Headers = ()
) -> OutboundRecord:
    """`deadletter_record` of a record that was consumed: its bytes, from where it was read."""
    return deadletter_record(
        deadletter_topic,
        record.topic,
        record.partition,
        record.offset,
        record.key,
        record.value,
        reason_code,
        detail,
        extra,
    )


def deadletter_into(
    out: list[OutboundRecord],
    deadletter_topic: str,
    record: InboundRecord,
    code: str,
    detail: str,
    log: logging.Logger,
    on_deadletter: Callable[[str], None] | None = None,
    extra: Headers = (),
) -> None:
    """Append `record`'s dead letter (`deadletter_record`) to `out`, logged once, and tell
    `on_deadletter` its reason code (for metrics)."""
    log.warning(
        "dead-lettering %s[%d]@%d: %s %s", record.topic, record.partition, record.offset, code, detail
    )
    out.append(deadletter_of(deadletter_topic, record, code, detail, extra))
    if on_deadletter is not None:
        on_deadletter(code)


def command_or_deadletter(
    codec: MessageCodec,
    record: InboundRecord,
    command_types: tuple[type[Any], ...],
    what: str,
    out: list[OutboundRecord],
    deadletter_topic: str,
    log: logging.Logger,
    on_deadletter: Callable[[str], None] | None = None,
) -> Any | None:
    """The command in `record`, or None after appending its dead letter to `out` with the reason:
    undecodable, not one of `command_types` (`what` names them), or keyed by another run id.
    `on_deadletter` hears each reason code (for metrics).

    A processor commits the dead letter in the same transaction as the rest of its batch, so a
    bad record is set aside exactly once and the batch goes on."""

    def dead(code: str, detail: str, extra: Headers = ()) -> None:
        deadletter_into(out, deadletter_topic, record, code, detail, log, on_deadletter, extra)

    try:
        message = codec.decode(record.value)
    except UndecodableRecord as exc:
        dead(exc.reason_code, str(exc))
        return None
    if not isinstance(message, command_types):
        kind = type(message).__name__
        dead("NOT_A_COMMAND", f"{kind} is not a {what}", (("tenure-dlq-message-type", kind.encode()),))
        return None
    if record.key is None or record.key.decode("utf-8", "replace") != message.run_id:
        dead(
            "KEY_MISMATCH",
            f"record key {record.key!r} is not the runId {message.run_id!r}",
            command_headers(message),
        )
        return None
    return message


def command_headers(command: object) -> Headers:
    """tenure-dlq-command-id / -type / -run-id of a decoded command, for a dead letter."""
    headers: list[tuple[str, bytes]] = [("tenure-dlq-command-type", type(command).__name__.encode())]
    for header, attribute in (("tenure-dlq-command-id", "command_id"), ("tenure-dlq-run-id", "run_id")):
        value = getattr(command, attribute, None)
        if isinstance(value, str):
            headers.append((header, value.encode("utf-8", "replace")[:512]))
    return tuple(headers)
