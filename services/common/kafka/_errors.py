"""Which Kafka client errors are worth retrying in-process (the stream runtime asks, BRK-3).

A transient error (a broker away, a leader moving, a request timing out) passes by itself; a
retry with backoff is the answer. Anything else (a record too large, a fatal producer, a wrong
transaction state) gives the same answer every time: retrying it only hides it.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

__all__ = ["is_transient_kafka_error"]

_TRANSIENT_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._RESOLVE,
        KafkaError._QUEUE_FULL,
        KafkaError._WAIT_COORD,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.CONCURRENT_TRANSACTIONS,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    }
)


def is_transient_kafka_error(exc: BaseException) -> bool:
    """True for a KafkaException that a later attempt may not meet again.

    A fatal error is never transient (the producer is unusable; TransactionalWriter turns it into
    WriterFenced). An abortable transaction error is: the writer aborted, the batch may be retried.
    """
    if not isinstance(exc, KafkaException) or not exc.args or not isinstance(exc.args[0], KafkaError):
        return False
    error: KafkaError = exc.args[0]
    if error.fatal():
        return False
    return bool(error.retriable() or error.txn_requires_abort() or error.code() in _TRANSIENT_CODES)
