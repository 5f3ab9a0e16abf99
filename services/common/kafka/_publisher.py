"""An idempotent publisher for commands, safe to call from many threads and from asyncio."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, InvalidStateError

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from services.common.kafka._config import base_config
from services.common.kafka._records import OutboundRecord

# librdkafka's RD_KAFKA_PARTITION_UA: let the configured partitioner choose by key.
_ANY_PARTITION = -1

__all__ = ["CommandPublisher"]

log = logging.getLogger("tenure.kafka.publisher")


class CommandPublisher:
    """`publish` returns a Future that resolves to the offset once the broker has the record.

    `delivery_timeout_s` bounds how long librdkafka keeps trying to deliver a record (its
    `message.timeout.ms`, 300 s unless given): after it the Future fails with a timeout instead
    of the record lingering in the background for the whole outage. A caller that answers within
    a deadline passes a bound a little above it. `publish` raises BufferError when the
    local queue is full (the broker has been away long enough for it to fill up).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        client_id: str = "tenure-command-publisher",
        delivery_timeout_s: float | None = None,
        max_queued: int | None = None,
    ) -> None:
        config = base_config(bootstrap_servers, client_id)
        config.update(
            {
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 0,
            }
        )
        if delivery_timeout_s is not None:
            config["message.timeout.ms"] = max(1000, int(delivery_timeout_s * 1000))
        if max_queued is not None:
            config["queue.buffering.max.messages"] = max_queued
        self._producer = Producer(config)
        self._stopping = threading.Event()
        self._poller = threading.Thread(target=self._serve_callbacks, daemon=True, name=client_id)
        self._poller.start()

    def _serve_callbacks(self) -> None:
        while not self._stopping.is_set():
            try:
                self._producer.poll(0.05)
            except Exception:  # a failing callback must not stop every later delivery report
                log.exception("a delivery callback failed")

    def publish(self, record: OutboundRecord) -> Future[int]:
        future: Future[int] = Future()

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            # The waiter may have given up (its deadline passed, the Future was cancelled):
            # the late report still arrives here and must not raise inside librdkafka's poll.
            try:
                if err is not None:
                    future.set_exception(KafkaException(err))
                else:
                    future.set_result(int(msg.offset() or 0))
            except InvalidStateError:
                pass

        self._producer.produce(
            record.topic,
            value=record.value,
            key=record.key,
            headers=list(record.headers),
            on_delivery=on_delivery,
            partition=_ANY_PARTITION if record.partition is None else record.partition,
        )

        return future

    def reachable(self, timeout_s: float = 0.5) -> str | None:
        """None when a broker answered a metadata request within `timeout_s`, else why not."""
        try:
            metadata = self._producer.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            return str(exc.args[0] if exc.args else exc)
        if not metadata.brokers:
            return "no broker in the cluster metadata"
        return None

    def close(self, timeout_s: float = 10.0) -> None:
        self._producer.flush(timeout_s)
        self._stopping.set()
        self._poller.join(timeout_s)
