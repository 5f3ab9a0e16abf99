"""TransactionalWriter leaves the producer ready for the next batch whatever a transaction met.

Before: a retriable commit_transaction failure (a timeout: the commit goes on in the background)
was re-raised with the transaction still committing, and a delivery failure with it still open,
so the stream runtime's transient retry of the batch met librdkafka's wrong-state error
("Operation not valid in state ...") on begin_transaction, which is not transient: the process
exited. Now, as librdkafka documents for transactions: a retriable failure calls
commit_transaction again (a call left unresolved is resumed before the next transaction), an
abortable one aborts, a fatal one is WriterFenced, and any failure between begin and commit
aborts. The producer here is a fake that keeps librdkafka's transaction states.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from services.common.kafka import (
    GroupFence,
    OffsetsStalled,
    OutboundRecord,
    TransactionalWriter,
    WriterFenced,
)
from services.common.kafka import _transactional as transactional
from services.common.kafka._errors import is_transient_kafka_error


class _Message:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self._coordinates = (topic, partition, offset)

    def topic(self) -> str:
        return self._coordinates[0]

    def partition(self) -> int:
        return self._coordinates[1]

    def offset(self) -> int:
        return self._coordinates[2]


def _state_error(state: str) -> KafkaException:
    return KafkaException(KafkaError(KafkaError._STATE, f"Operation not valid in state {state}"))


class FakeProducer:
    """librdkafka's transactional producer, as far as TransactionalWriter drives it."""

    instances: list[FakeProducer] = []

    def __init__(self, config: dict[str, Any]) -> None:
        self.state = "Init"
        self.commit_errors: list[KafkaError] = []
        self.delivery_errors: list[KafkaError] = []
        self.committed: list[list[tuple[str, int]]] = []
        self.aborted = 0
        self.commit_calls = 0
        self._open: list[tuple[str, int, Callable[..., None]]] = []
        self._offsets: dict[tuple[str, int], int] = {}
        FakeProducer.instances.append(self)

    def init_transactions(self, timeout: float | None = None) -> None:
        self.state = "Ready"

    def begin_transaction(self) -> None:
        if self.state != "Ready":
            raise _state_error(self.state)
        self.state = "InTransaction"
        self._open = []

    def produce(self, topic: str, *, partition: int, on_delivery: Callable[..., None], **_: Any) -> None:
        if self.state != "InTransaction":
            raise _state_error(self.state)
        self._open.append((topic, partition, on_delivery))

    def flush(self, timeout: float | None = None) -> int:
        for topic, partition, on_delivery in self._open:
            if self.delivery_errors:
                self.state = "AbortableError"
                on_delivery(self.delivery_errors.pop(0), None)
                continue
            offset = self._offsets.get((topic, partition), -1) + 1
            self._offsets[(topic, partition)] = offset
            on_delivery(None, _Message(topic, partition, offset))
        return 0

    # librdkafka ignores this call's timeout while the group coordinator is away (#5456): a
    # test sets `offsets_stuck` to hold it until released, as librdkafka held a batch for good.
    offsets_stuck: threading.Event | None = None
    offsets_error: KafkaError | None = None

    def send_offsets_to_transaction(
        self, positions: Any, metadata: bytes, timeout: float | None = None
    ) -> None:
        if self.state != "InTransaction":
            raise _state_error(self.state)
        if self.offsets_stuck is not None:
            self.offsets_stuck.wait(30)
        if self.offsets_error is not None:
            raise KafkaException(self.offsets_error)

    def commit_transaction(self, timeout: float | None = None) -> None:
        self.commit_calls += 1
        if self.state not in ("InTransaction", "CommittingTransaction"):
            raise _state_error(self.state)
        if self.commit_errors:
            error = self.commit_errors.pop(0)
            self.state = "AbortableError" if error.txn_requires_abort() else "CommittingTransaction"
            raise KafkaException(error)
        self.committed.append([(topic, partition) for topic, partition, _ in self._open])
        self.state = "Ready"

    def abort_transaction(self, timeout: float | None = None) -> None:
        if self.state == "CommittingTransaction":
            raise KafkaException(
                KafkaError(
                    KafkaError._CONFLICT,
                    "Conflicting commit_transaction API call is already in progress",
                    retriable=True,
                )
            )
        if self.state not in ("InTransaction", "AbortableError"):
            raise _state_error(self.state)
        self.aborted += 1
        self.state = "Ready"


@pytest.fixture
def writer(monkeypatch: pytest.MonkeyPatch) -> TransactionalWriter:
    FakeProducer.instances.clear()
    monkeypatch.setattr(transactional, "Producer", FakeProducer)
    return TransactionalWriter(
        "fake:9092", "test-writer", commit_retry_budget_s=0.05, retry_base_s=0.001, offsets_timeout_s=0.05
    )


def producer() -> FakeProducer:
    [only] = FakeProducer.instances
    return only


BATCH = [OutboundRecord("runs.events", b"run_a", b"v", partition=1)]
TIMED_OUT = KafkaError(KafkaError._TIMED_OUT, "commit timed out", retriable=True)


def test_a_retriable_commit_failure_commits_again_and_the_next_batch_begins_cleanly(
    writer: TransactionalWriter,
) -> None:
    producer().commit_errors = [TIMED_OUT]
    assert writer.commit(BATCH) == {("runs.events", 1): 0}
    assert producer().commit_calls == 2, "commit_transaction was called again, as librdkafka says"
    assert writer.commit(BATCH) == {("runs.events", 1): 1}, "no wrong-state error"
    assert len(producer().committed) == 2 and producer().aborted == 0


def test_a_commit_still_unresolved_is_transient_and_resumed_before_the_next_transaction(
    writer: TransactionalWriter,
) -> None:
    producer().commit_errors = [TIMED_OUT] * 50  # longer than the writer's retry budget
    with pytest.raises(KafkaException) as raised:
        writer.commit(BATCH)
    assert is_transient_kafka_error(raised.value), "the stream runtime retries it"
    producer().commit_errors = []
    # The runtime's retry: the pending commit is finished first, then the batch is written.
    assert writer.commit(BATCH) == {("runs.events", 1): 1}
    assert len(producer().committed) == 2, "the pending transaction resolved, then the new one"


def test_an_abortable_commit_failure_aborts_and_the_batch_can_be_redone(
    writer: TransactionalWriter,
) -> None:
    producer().commit_errors = [KafkaError(KafkaError._INCONSISTENT, "abortable", txn_requires_abort=True)]
    with pytest.raises(KafkaException) as raised:
        writer.commit(BATCH)
    assert is_transient_kafka_error(raised.value)
    assert producer().aborted == 1
    assert writer.commit(BATCH) == {("runs.events", 1): 1}


def test_a_delivery_failure_aborts_and_raises_the_deliverys_own_error(writer: TransactionalWriter) -> None:
    producer().delivery_errors = [KafkaError(KafkaError._MSG_TIMED_OUT, "message timed out")]
    with pytest.raises(KafkaException) as raised:
        writer.commit(BATCH)
    assert raised.value.args[0].code() == KafkaError._MSG_TIMED_OUT
    assert is_transient_kafka_error(raised.value), "a broker away is worth a retry"
    assert producer().aborted == 1 and producer().committed == []
    assert writer.commit(BATCH) == {("runs.events", 1): 0}


def test_a_fenced_commit_is_writer_fenced(writer: TransactionalWriter) -> None:
    producer().commit_errors = [KafkaError(KafkaError._FENCED, "fenced", fatal=True)]
    with pytest.raises(WriterFenced):
        writer.commit(BATCH)


FENCE = GroupFence("tenure-lease-coordinator", 3, "member-1", "lease-coordinator-0", "runs.commands", {1: 7})


def test_an_offset_send_that_never_returns_is_transient_and_the_writer_reinitialises(
    writer: TransactionalWriter,
) -> None:
    """Issue 16, the generation fence after a broker restart: librdkafka kept a batch inside
    send_offsets_to_transaction past its timeout while faust's rebalance waited on that batch.
    The writer's own clock bounds the wait: OffsetsStalled, transient (the runtime retries the
    batch), with no abort attempted while librdkafka still holds the call. At once a new
    producer takes the same transactional id (its init_transactions aborts the stalled
    transaction and fences the old producer); the retry runs on it, the old one is never called
    again."""
    stalled = producer()
    stuck = threading.Event()
    stalled.offsets_stuck = stuck
    began = time.monotonic()
    try:
        with pytest.raises(OffsetsStalled) as raised:
            writer.commit(BATCH, fence=FENCE)
        took = time.monotonic() - began
        assert took < 0.05 + transactional._STALL_MARGIN_S + 1.0, took
        assert isinstance(raised.value, TimeoutError), "classified transient by the stream runtime"
        assert stalled.aborted == 0 and stalled.committed == []
        # Re-initialised at once: the stalled transaction must not hold read_committed readers.
        assert len(FakeProducer.instances) == 2 and writer.reinitialisations == 1
        assert writer.commit(BATCH, fence=FENCE) == {("runs.events", 1): 0}
        assert writer.reinitialisations == 1
        fresh = FakeProducer.instances[1]
        assert fresh.committed == [[("runs.events", 1)]]
        assert stalled.committed == [] and stalled.state == "InTransaction", "the old one untouched"
    finally:
        stuck.set()


def test_an_offset_send_from_a_past_generation_is_writer_fenced_and_aborted(
    writer: TransactionalWriter,
) -> None:
    producer().offsets_error = KafkaError(KafkaError.ILLEGAL_GENERATION, "ILLEGAL_GENERATION")
    with pytest.raises(WriterFenced):
        writer.commit(BATCH, fence=FENCE)
    assert producer().aborted == 1 and producer().committed == []


def test_a_fenced_batch_commits_with_its_offsets(writer: TransactionalWriter) -> None:
    assert writer.commit(BATCH, fence=FENCE) == {("runs.events", 1): 0}
    assert producer().committed == [[("runs.events", 1)]]
