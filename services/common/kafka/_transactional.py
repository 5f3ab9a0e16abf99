"""A transactional writer: the events of one batch of commands land all together or not at all.

A processor's `transactional.id` is stable across restarts, so `init_transactions` on start-up
fences any zombie incarnation and aborts its half-written transaction before we read the log to
restore state: what the new incarnation reads is exactly what was committed.

Whatever a transaction meets, the producer is left ready for the next one, so that the stream
runtime's retry of a failed batch really redoes it (librdkafka's transactional API contract):
  * a failure between begin_transaction and commit_transaction (a produce that raises, a
    delivery that fails) aborts the transaction, and the delivery's own error is raised;
  * commit_transaction failing retriably (a timeout: the commit goes on in the background, and
    abort_transaction would now be refused as a conflicting call) is called again, with the one
    full-jitter backoff, for up to `commit_retry_budget_s`; a commit still unresolved then is
    raised (transient) and resumed first by the next `commit`, before a new transaction begins;
  * a failure that requires an abort (txn_requires_abort) aborts, then is raised (transient);
  * a fenced or fatal producer is WriterFenced: this incarnation must stop.
A raised `commit` may have landed (a resumed commit can still succeed): the processor restores
from the log before it decides again (services/common/aggregate/processor.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Sequence

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from services.common.backoff import Backoff
from services.common.kafka._client_settings import resource_prefix
from services.common.kafka._config import base_config
from services.common.kafka._group import GROUP_FENCED_CODES, GroupFence
from services.common.kafka._records import OutboundRecord

# librdkafka's RD_KAFKA_PARTITION_UA: let the configured partitioner choose by key.
_ANY_PARTITION = -1
_FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})

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
        commit_retry_budget_s: float = 15.0,
        retry_base_s: float = 0.05,
        retry_cap_s: float = 1.0,
    ) -> None:
        config = base_config(bootstrap_servers, transactional_id)
        config.update(
            {
                # Prefixed like the topics: deployments sharing a cluster never fence each other.
                "transactional.id": resource_prefix() + transactional_id,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 1,
                # A crashed incarnation's open transaction blocks read_committed readers until it
                # times out or is fenced; keep the bound short since we always re-init on start.
                "transaction.timeout.ms": transaction_timeout_ms,
            }
        )
        self._retry_budget_s = commit_retry_budget_s
        self._retry_base_s = retry_base_s
        self._retry_cap_s = retry_cap_s
        # The transactional call (commit or abort) that failed retriably and must be resumed:
        # librdkafka refuses any other transactional call until it is resolved.
        self._unresolved: Callable[[], None] | None = None
        self._producer = Producer(config)
        self._producer.init_transactions(init_timeout_s)

    def commit(
        self, records: Sequence[OutboundRecord], *, fence: GroupFence | None = None
    ) -> dict[tuple[str, int], int]:
        """Write `records` in one transaction; returns the last offset written per partition.

        With a `fence`, its command offsets are committed in the same transaction under its
        group generation: a member the group has moved on from is refused (WriterFenced), and
        nothing of the transaction becomes visible (services/common/kafka/_group.py)."""
        if not records:
            return {}
        if self._unresolved is not None:
            self._resolve(self._unresolved)
        last_offsets: dict[tuple[str, int], int] = {}
        failures: list[KafkaError] = []

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                failures.append(err)
                return
            key = (str(msg.topic()), int(msg.partition() or 0))
            last_offsets[key] = max(last_offsets.get(key, -1), int(msg.offset() or 0))

        self._call(self._producer.begin_transaction)
        try:
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
                # The first delivery's own error: its code tells a broker away from a bad record.
                raise KafkaException(failures[0])
            if fence is not None and fence.offsets:
                self._send_offsets(fence)
        except BaseException:
            self._resolve(self._producer.abort_transaction)
            raise
        self._resolve(self._producer.commit_transaction)
        return last_offsets

    def _resolve(self, call: Callable[[], None]) -> None:
        """Run a transactional call to its end: again while it fails retriably (within the
        budget), abort when the transaction must be aborted, WriterFenced when fenced or fatal."""
        backoff = Backoff(self._retry_base_s, self._retry_cap_s)
        deadline = time.monotonic() + self._retry_budget_s
        while True:
            try:
                call()
            except KafkaException as exc:
                error = _error_of(exc)
                _raise_if_fenced(error, exc)
                if error is not None and error.txn_requires_abort():
                    self._unresolved = None
                    if call != self._producer.abort_transaction:
                        self._resolve(self._producer.abort_transaction)
                    raise
                if error is not None and error.retriable():
                    self._unresolved = call
                    if time.monotonic() < deadline:
                        time.sleep(backoff.next_delay())
                        continue
                raise
            self._unresolved = None
            return

    def _send_offsets(self, fence: GroupFence) -> None:
        try:
            self._producer.send_offsets_to_transaction(
                fence.positions(), fence.metadata(), self._retry_budget_s
            )
        except KafkaException as exc:
            error = _error_of(exc)
            if error is not None and error.name() in GROUP_FENCED_CODES:
                raise WriterFenced(
                    f"generation {fence.generation} of group {fence.group_id} is over ({error.name()}): "
                    "these partitions have another owner"
                ) from exc
            _raise_if_fenced(error, exc)
            raise

    def _call(self, call: Callable[[], None]) -> None:
        try:
            call()
        except KafkaException as exc:
            _raise_if_fenced(_error_of(exc), exc)
            raise

    def close(self) -> None:
        self._producer.flush(5.0)


def _error_of(exc: KafkaException) -> KafkaError | None:
    return exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None


def _raise_if_fenced(error: KafkaError | None, exc: KafkaException) -> None:
    if error is None:
        return
    if error.code() in _FENCED_CODES:
        raise WriterFenced(str(error)) from exc
    if error.fatal():
        raise WriterFenced(f"fatal producer error: {error}") from exc
