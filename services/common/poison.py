"""A command whose handling fails: set aside with its evidence, answered, and never tried again.

A processor decides each command of a batch on values only (decide, evolve, encode) and changes
its working set only when that succeeds. If that raises, the failure is deterministic: the same
command meets the same state and fails the same way on every redelivery, so retrying it, or
ending the process, would stop its partition for good (a crash loop). Instead, in the SAME Kafka
transaction as the rest of the batch:

  * the command's original bytes go to tenure.deadletter, with the reason (COMMAND_FAILED, or
    RECORD_TOO_LARGE when an output record would exceed what Kafka takes), the exception and a
    short traceback, and the source coordinates (topic, partition, offset, key, command id/type);
  * a CommandRejected with the same code answers the caller, and, like every refusal, it puts
    the command id in the processor's refused set (restored from the rejections topic), so a
    redelivery is dropped, not tried again.

Timer work (a due lease timer) that fails is set aside the same way (TIMER_FAILED, no source
record) and skipped until the aggregate's state changes.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence

from services.common.contracts import CommandRejected
from services.common.ids import derived_id
from services.common.kafka import InboundRecord, OutboundRecord
from services.common.logs import log_fields
from services.common.messages import (
    MAX_RECORD_BYTES,
    MessageCodec,
    command_headers,
    deadletter_of,
    deadletter_record,
    record_bytes,
)

__all__ = [
    "COMMAND_FAILED",
    "RECORD_TOO_LARGE",
    "TIMER_FAILED",
    "RecordTooLarge",
    "ensure_writable",
    "failed_command_deadletter",
    "failure_reason",
    "failure_refusal",
    "failure_summary",
    "set_aside_command",
    "set_aside_timer",
    "short_traceback",
    "timer_deadletter",
]

COMMAND_FAILED = "COMMAND_FAILED"
RECORD_TOO_LARGE = "RECORD_TOO_LARGE"
TIMER_FAILED = "TIMER_FAILED"
_TRACEBACK_FRAMES = 4
_TRACEBACK_BYTES = 4000
_SUMMARY_CHARS = 500


class RecordTooLarge(ValueError):
    """An output record the producer would refuse (MSG_SIZE_TOO_LARGE) every time."""


def ensure_writable(records: Sequence[OutboundRecord]) -> None:
    for record in records:
        size = record_bytes(record)
        if size > MAX_RECORD_BYTES:
            raise RecordTooLarge(
                f"a {record.topic} record would be {size} bytes; a Kafka record carries at most "
                f"{MAX_RECORD_BYTES}"
            )


def failure_reason(exc: BaseException) -> str:
    return RECORD_TOO_LARGE if isinstance(exc, RecordTooLarge) else COMMAND_FAILED


def failure_summary(exc: BaseException) -> str:
    """`Type: message`, bounded: an exception's message may quote the whole offending value."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _SUMMARY_CHARS else text[:_SUMMARY_CHARS] + "..."


def short_traceback(exc: BaseException) -> str:
    """The innermost frames only (a RecursionError has a thousand), bounded in size."""
    text = "".join(traceback.format_exception(exc, limit=-_TRACEBACK_FRAMES))
    return text[-_TRACEBACK_BYTES:]


def _failure_headers(exc: BaseException, processor: str) -> tuple[tuple[str, bytes], ...]:
    """What failed and where, on every dead letter a processor writes for its own failure."""
    return (
        ("tenure-dlq-exception", type(exc).__name__.encode()),
        ("tenure-dlq-traceback", short_traceback(exc).encode("utf-8", "replace")),
        ("tenure-dlq-processor", processor.encode()),
    )


def failed_command_deadletter(
    deadletter_topic: str, record: InboundRecord, exc: BaseException, command: object, processor: str
) -> OutboundRecord:
    return deadletter_of(
        deadletter_topic,
        record,
        failure_reason(exc),
        failure_summary(exc),
        (
            *command_headers(command),
            *_failure_headers(exc, processor),
        ),
    )


def timer_deadletter(
    deadletter_topic: str,
    events_topic: str,
    partition: int,
    aggregate_id: str,
    version: int,
    due_ms: int,
    exc: BaseException,
    processor: str,
) -> OutboundRecord:
    """Evidence of a timer whose work failed; there is no source record (offset -1)."""
    return deadletter_record(
        deadletter_topic,
        events_topic,
        partition,
        -1,
        aggregate_id.encode("utf-8"),
        b"",
        TIMER_FAILED,
        failure_summary(exc),
        (
            ("tenure-dlq-run-id", aggregate_id.encode("utf-8")),
            ("tenure-dlq-state-version", str(version).encode()),
            ("tenure-dlq-timer-due", str(due_ms).encode()),
            *_failure_headers(exc, processor),
        ),
    )


def failure_refusal(
    command: object,
    exc: BaseException,
    now_ms: int,
    processor: str,
    current_status: str | None,
    current_version: int,
) -> CommandRejected:
    """The caller's answer. It names the exception type, never its message or traceback (those
    may carry another tenant's data or internals; they are on the dead-letter topic)."""
    reason = failure_reason(exc)
    if reason == RECORD_TOO_LARGE:
        detail = f"the command's events would not fit in a Kafka record: {exc}"
    else:
        detail = (
            f"the {processor} could not handle this command ({type(exc).__name__}); it was set "
            "aside on tenure.deadletter for an operator and will not be retried"
        )
    command_id = str(getattr(command, "command_id"))  # noqa: B009 - any aggregate's command
    return CommandRejected(
        event_id=derived_id("rej", command_id),
        run_id=str(getattr(command, "run_id")),  # noqa: B009
        occurred_at=now_ms,
        causation_id=command_id,
        correlation_id=str(getattr(command, "correlation_id", "")),
        actor=str(getattr(command, "actor", "")),
        command_type=type(command).__name__,
        code=reason,
        detail=detail,
        current_status=current_status,
        current_version=current_version,
    )


def set_aside_command(
    codec: MessageCodec,
    record: InboundRecord,
    command: object,
    exc: BaseException,
    now_ms: int,
    *,
    processor: str,
    deadletter_topic: str,
    rejections_topic: str,
    current_status: str | None,
    current_version: int,
    log: logging.Logger,
) -> list[OutboundRecord]:
    """The dead letter and the refusal of a command whose handling raised, logged once.

    The caller commits them with its batch and adds the command id to its refused set."""
    command_id = getattr(command, "command_id", "?")
    run_id = str(getattr(command, "run_id", "?"))
    log.error(
        "%s %s of run %s (%s[%d]@%d) failed: %s; dead-lettered as %s and refused\n%s",
        type(command).__name__,
        command_id,
        run_id,
        record.topic,
        record.partition,
        record.offset,
        failure_summary(exc),
        failure_reason(exc),
        short_traceback(exc),
        extra=log_fields(
            run_id=run_id,
            command_id=command_id,
            correlation_id=getattr(command, "correlation_id", None),
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
        ),
    )
    out = [failed_command_deadletter(deadletter_topic, record, exc, command, processor)]
    try:
        refusal = failure_refusal(command, exc, now_ms, processor, current_status, current_version)
        answer = codec.outbound(rejections_topic, run_id, refusal, record.partition)
        ensure_writable([answer])
        out.append(answer)
    except Exception:
        # The dead letter is the evidence; the refused id still drops a redelivery.
        log.warning("could not encode the refusal of %s", command_id, exc_info=True)
    return out


def set_aside_timer(
    partition: int,
    aggregate_id: str,
    version: int,
    due_ms: int,
    exc: BaseException,
    *,
    processor: str,
    deadletter_topic: str,
    events_topic: str,
    log: logging.Logger,
) -> OutboundRecord:
    """The dead letter of a timer whose work raised, logged once."""
    log.error(
        "timer of %s (version %d, due %d) failed: %s; dead-lettered as %s, skipped until it changes\n%s",
        aggregate_id,
        version,
        due_ms,
        failure_summary(exc),
        TIMER_FAILED,
        short_traceback(exc),
        extra=log_fields(run_id=aggregate_id, partition=partition),
    )
    return timer_deadletter(
        deadletter_topic, events_topic, partition, aggregate_id, version, due_ms, exc, processor
    )
