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
  * a fenced or fatal producer is WriterFenced: this incarnation must stop;
  * the generation fence's offset send (`send_offsets_to_transaction`) is waited for by the
    writer's own clock, not librdkafka's: librdkafka ignores that call's timeout while the group
    coordinator is away (confluentinc/librdkafka#5456, #5511), and a broker restart left a batch
    inside it for good while faust's rebalance waited on that batch. Past `offsets_timeout_s`
    the producer is abandoned (librdkafka refuses every other transactional call while it holds
    that one), the writer re-initialises at once — a new producer under the same transactional
    id, whose `init_transactions` aborts the stalled transaction (it never committed; until then
    it holds every read_committed reader back, the retry's restore first) and fences the
    abandoned producer, so nothing it still holds can land — and OffsetsStalled, a TimeoutError,
    is raised: transient, the batch is retried (if the re-initialisation failed too, the next
    `commit` tries it again first).
A raised `commit` may have landed (a resumed commit can still succeed): the processor restores
from the log before it decides again (services/common/aggregate/processor.py).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Sequence

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from services.common.backoff import Backoff
from services.common.kafka._client_settings import resource_prefix
from services.common.kafka._config import base_config
from services.common.kafka._group import GROUP_FENCED_CODES, GroupFence
from services.common.kafka._records import OutboundRecord

# librdkafka's RD_KAFKA_PARTITION_UA: let the configured partitioner choose by key.
_ANY_PARTITION = -1
_FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})

# How much longer than librdkafka's own timeout the writer waits for the offset send.
_STALL_MARGIN_S = 1.0

__all__ = ["OffsetsStalled", "TransactionalWriter", "WriterFenced"]


class WriterFenced(Exception):
    """Another incarnation with the same transactional id took over; this one must stop."""


class OffsetsStalled(TimeoutError):
    """The offset send outlived its bound inside librdkafka; the writer re-initialises before
    its next transaction (module docstring). Transient: the batch is retried."""


class _CallThread:
    """Runs one call at a time on a daemon thread and waits for it by the caller's clock. A
    daemon, so a call librdkafka never returns from cannot hold the interpreter's exit."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def _serve(self) -> None:
        while True:
            call, done = self._calls.get()
            try:
                done.set_result(call())
            except BaseException as exc:  # handed to the waiting caller
                done.set_exception(exc)

    def run(self, call: Callable[[], Any], timeout_s: float) -> Any:
        done: Future[Any] = Future()
        self._calls.put((call, done))
        return done.result(timeout_s)  # FutureTimeout past the bound; the call goes on there


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
        offsets_timeout_s: float = 3.0,
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
        self._config = config
        self._init_timeout_s = init_timeout_s
        self._offsets_timeout_s = offsets_timeout_s
        self._retry_budget_s = commit_retry_budget_s
        self._retry_base_s = retry_base_s
        self._retry_cap_s = retry_cap_s
        # The transactional call (commit or abort) that failed retriably and must be resumed:
        # librdkafka refuses any other transactional call until it is resolved.
        self._unresolved: Callable[[], None] | None = None
        self._producer = Producer(config)
        self._producer.init_transactions(init_timeout_s)
        # Where the offset send runs, so that its wait is bounded by our clock (module docstring):
        # made on first use (an unfenced writer never needs it), abandoned with a stalled producer.
        self._offsets_thread: _CallThread | None = None
        self._stalled = False
        self.reinitialisations = 0

    def commit(
        self, records: Sequence[OutboundRecord], *, fence: GroupFence | None = None
    ) -> dict[tuple[str, int], int]:
        """Write `records` in one transaction; returns the last offset written per partition.

        With a `fence`, its command offsets are committed in the same transaction under its
        group generation: a member the group has moved on from is refused (WriterFenced), and
        nothing of the transaction becomes visible (services/common/kafka/_group.py)."""
        if not records:
            return {}
        if self._stalled:
            self._reinitialise()
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
        except OffsetsStalled:
            raise  # librdkafka still holds the offset send: an abort would be refused or hang
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
        if self._offsets_thread is None:
            self._offsets_thread = _CallThread("tenure-offsets-to-txn")
        producer, bound_s = self._producer, self._offsets_timeout_s
        try:
            self._offsets_thread.run(
                lambda: producer.send_offsets_to_transaction(fence.positions(), fence.metadata(), bound_s),
                bound_s + _STALL_MARGIN_S,
            )
        except FutureTimeout:
            self._stalled = True
            self._offsets_thread = None  # its thread is still inside librdkafka: never reused
            # Now, not at the next commit: until the stalled transaction is aborted, every
            # read_committed reader of these partitions (the retry's own restore first) waits
            # at it, up to transaction.timeout.ms. If the broker is still away, the next commit
            # tries again.
            with contextlib.suppress(KafkaException):
                self._reinitialise()
            raise OffsetsStalled(
                f"the generation fence's offset commit to group {fence.group_id} did not return in "
                f"{bound_s + _STALL_MARGIN_S:.0f} s (librdkafka ignores its timeout while the group "
                "coordinator is away); the writer re-initialises before the next transaction"
            ) from None
        except KafkaException as exc:
            error = _error_of(exc)
            if error is not None and error.name() in GROUP_FENCED_CODES:
                raise WriterFenced(
                    f"generation {fence.generation} of group {fence.group_id} is over ({error.name()}): "
                    "these partitions have another owner"
                ) from exc
            _raise_if_fenced(error, exc)
            raise

    def _reinitialise(self) -> None:
        """A new producer under the same transactional id: its `init_transactions` aborts the
        stalled transaction and fences the abandoned producer (the broker bumps the epoch)."""
        producer = Producer(self._config)
        try:
            producer.init_transactions(self._init_timeout_s)
        except KafkaException as exc:
            _raise_if_fenced(_error_of(exc), exc)
            raise  # transient (the broker still away): the next commit tries again
        self._producer, self._stalled, self._unresolved = producer, False, None
        self.reinitialisations += 1

    def _call(self, call: Callable[[], None]) -> None:
        try:
            call()
        except KafkaException as exc:
            _raise_if_fenced(_error_of(exc), exc)
            raise

    def close(self) -> None:
        if not self._stalled:
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
