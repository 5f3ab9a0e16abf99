"""Which Kafka client errors are worth retrying in-process (the stream runtime asks, BRK-3).

A transient error (a broker away, a leader moving, a request timing out) passes by itself; a
retry with backoff is the answer. Anything else (a record too large, a fatal producer, a wrong
transaction state) gives the same answer every time: retrying it only hides it.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

__all__ = ["AuthenticationWatch", "KafkaAuthenticationError", "is_transient_kafka_error"]

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


class KafkaAuthenticationError(ConnectionError):
    """The cluster refused this client's credentials (SASL) or certificate (TLS): no retry helps."""


class AuthenticationWatch:
    """An `error_cb` that remembers an authentication failure, so a metadata call that merely
    timed out ("Broker transport failure") can be told apart from refused credentials at once,
    instead of after every retry (`tenure topics`, `tenure tail` fail fast with the cause)."""

    _CODES = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._SSL})

    def __init__(self, bootstrap_servers: str) -> None:
        self._bootstrap = bootstrap_servers
        self.failure: str | None = None

    # A TLS handshake the broker ends with an alert (e.g. no or a bad client certificate) reaches
    # the client as a transport error whose text is OpenSSL's.
    _TLS_MARKERS = ("SSL routines", "SSL handshake failed", "certificate verify failed")

    def __call__(self, error: KafkaError) -> None:
        text = error.str()
        if error.code() in self._CODES or any(marker in text for marker in self._TLS_MARKERS):
            self.failure = text

    def check(self, client: object) -> None:
        """Deliver the client's pending error events, then raise if one was an authentication failure."""
        poll = getattr(client, "poll", None)
        if poll is not None:
            poll(0)
        if self.failure is not None:
            # librdkafka's text names the mechanism and the broker, never the secret.
            raise KafkaAuthenticationError(
                f"Kafka at {self._bootstrap} refused the connection: {self.failure} "
                "(check TENURE_KAFKA_CONFIG / TENURE_KAFKA_CONFIG_FILE)"
            )
