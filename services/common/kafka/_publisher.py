"""An idempotent publisher for commands, safe to call from many threads and from asyncio."""

from __future__ import annotations

import threading
from concurrent.futures import Future

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from services.common.kafka._config import base_config
from services.common.kafka._records import OutboundRecord

# librdkafka's RD_KAFKA_PARTITION_UA: let the configured partitioner choose by key.
_ANY_PARTITION = -1

__all__ = ["CommandPublisher"]


class CommandPublisher:
    """`publish` returns a Future that resolves to the offset once the broker has the record."""

    def __init__(self, bootstrap_servers: str, client_id: str = "tenure-command-publisher") -> None:
        config = base_config(bootstrap_servers, client_id)
        config.update({"enable.idempotence": True, "acks": "all", "linger.ms": 2})
        self._producer = Producer(config)
        self._stopping = threading.Event()
        self._poller = threading.Thread(target=self._serve_callbacks, daemon=True, name=client_id)
        self._poller.start()

    def _serve_callbacks(self) -> None:
        while not self._stopping.is_set():
            self._producer.poll(0.05)

    def publish(self, record: OutboundRecord) -> Future[int]:
        future: Future[int] = Future()

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                future.set_exception(KafkaException(err))
            else:
                future.set_result(int(msg.offset() or 0))

        self._producer.produce(
            record.topic,
            value=record.value,
            key=record.key,
            headers=list(record.headers),
            on_delivery=on_delivery,
            partition=_ANY_PARTITION if record.partition is None else record.partition,
        )

        return future

    def close(self, timeout_s: float = 10.0) -> None:
        self._producer.flush(timeout_s)
        self._stopping.set()
        self._poller.join(timeout_s)
