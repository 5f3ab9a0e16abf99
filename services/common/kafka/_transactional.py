"""A transactional writer: the events of one batch of commands land all together or not at all.

A processor's `transactional.id` is stable across restarts, so `init_transactions` on start-up
fences any zombie incarnation and aborts its half-written transaction before we read the log to
restore state: what the new incarnation reads is exactly what was committed.
"""

from __future__ import annotations

from typing import Sequence

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from services.common.kafka._config import base_config
from services.common.kafka._records import OutboundRecord

# librdkafka's RD_KAFKA_PARTITION_UA: let the configured partitioner choose by key.
_ANY_PARTITION = -1

__all__ = ["TransactionalWriter", "WriterFenced"]


class WriterFenced(Exception):
    """Another incarnation with the same transactional id took over; this one must stop."""


class TransactionalWriter:
    def __init__(
        self,
        bootstrap_servers: str,
        transactional_id: str,
        *,
        transaction_timeout_ms: int = 15_000,
        init_timeout_s: float = 30.0,
    ) -> None:
        config = base_config(bootstrap_servers, transactional_id)
        config.update(
            {
                "transactional.id": transactional_id,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 1,
                # A crashed incarnation's open transaction blocks read_committed readers until it
                # times out or is fenced; keep the bound short since we always re-init on start.
                "transaction.timeout.ms": transaction_timeout_ms,
            }
        )
        self._producer = Producer(config)
        self._producer.init_transactions(init_timeout_s)

    def commit(self, records: Sequence[OutboundRecord]) -> dict[tuple[str, int], int]:
        """Write `records` in one transaction; returns the last offset written per partition."""
        if not records:
            return {}
        last_offsets: dict[tuple[str, int], int] = {}
        failures: list[str] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                failures.append(str(err))
                return
            key = (str(msg.topic()), int(msg.partition() or 0))
            last_offsets[key] = max(last_offsets.get(key, -1), int(msg.offset() or 0))

        try:
            self._producer.begin_transaction()
            for record in records:
                self._producer.produce(
                    record.topic,
                    value=record.value,
                    key=record.key,
                    headers=list(record.headers),
                    on_delivery=on_delivery,
                    partition=_ANY_PARTITION if record.partition is None else record.partition,
                )
            self._producer.flush()
            if failures:
                raise KafkaException(KafkaError(KafkaError._FAIL, "; ".join(failures)))
            self._producer.commit_transaction()
        except KafkaException as exc:
            self._recover(exc)
            raise
        return last_offsets

    def _recover(self, exc: KafkaException) -> None:
        error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if error is not None and error.code() in (
            KafkaError._FENCED,
            KafkaError.PRODUCER_FENCED,
            KafkaError.INVALID_PRODUCER_EPOCH,
        ):
            raise WriterFenced(str(error)) from exc
        if error is not None and error.txn_requires_abort():
            self._producer.abort_transaction()
        elif error is not None and error.fatal():
            raise WriterFenced(f"fatal producer error: {error}") from exc

    def close(self) -> None:
        self._producer.flush(5.0)
