"""Kept renewals are answered from the renewal history's own reading of runs.renewals (issue 16):
one consumer and one decode per renewal in the API, and an answer only once the renewal is in
the history that GET /runs/{id} shows (LEASE-2)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.common.contracts import LeaseRenewed
from services.common.decisions import Decided, DecisionBook, DecisionListener, Rejected
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec
from services.common.store import MemoryStore
from services.common.topics import RUNS_RENEWALS
from services.projections.renewal_store import RenewalHistoryStore

from .test_renewal_envelopes import _decision
from .test_renewal_history import _record
from .test_renewal_history import _renewed as renewed_event

CODEC = MessageCodec()
RUN = "run_0123456789abcdef0123456789abcdef"  # test_renewal_history's run


def _renewed(sequence: int) -> LeaseRenewed:
    """test_renewal_history's renewal under epoch 1; its command id is `renew-<sequence>`."""
    return renewed_event(1, sequence, 1_000)


class _Listener(DecisionListener):
    """DecisionListener's answers without its Kafka follower."""

    def __init__(self) -> None:
        DecisionBook.__init__(self)
        self._codec = CODEC
        self._event_types = (LeaseRenewed,)


class _FailingStore(MemoryStore):
    def write(self, puts: Any, deletes: tuple[str, ...] = (), delete_ranges: Any = ()) -> None:
        raise OSError("disk full")


def test_the_history_hands_on_every_decoded_renewal_once_it_is_stored_lease_2() -> None:
    store = MemoryStore()
    handed: list[list[tuple[str, dict[str, Any]]]] = []

    def on_stored(decoded: list[tuple[str, dict[str, Any]]]) -> None:
        assert store.get("offset/runs.renewals/2") == b"3", "handed on only after the write"
        handed.append(decoded)

    bad = InboundRecord(RUNS_RENEWALS.name, 2, 2, RUN.encode(), b"not avro")
    history = RenewalHistoryStore(store, CODEC)
    assert history.apply([_record(0, _renewed(1)), _record(1, _renewed(2)), bad], None, on_stored) == 2
    assert [[record["sequence"] for _, record in batch] for batch in handed] == [[1, 2]]


def test_a_failed_write_hands_on_nothing_so_no_renewal_is_answered_before_it_is_kept() -> None:
    handed: list[Any] = []
    with pytest.raises(OSError):
        RenewalHistoryStore(_FailingStore(), CODEC).apply([_record(0, _renewed(1))], None, handed.append)
    assert handed == []


def test_kept_renewals_answer_their_commands_with_the_contract_event() -> None:
    async def scenario() -> None:
        listener = _Listener()
        group = listener.register_many(["renew-1", "renew-2"])
        single = listener.register("renew-3")
        history = RenewalHistoryStore(MemoryStore(), CODEC)
        records = [_record(i, _renewed(i + 1)) for i in range(3)]
        history.apply(records, None, listener.deliver_kept)
        await asyncio.wait_for(group.done, 5)
        decided = listener.decided(group)
        assert decided == {"renew-1": Decided(_renewed(1)), "renew-2": Decided(_renewed(2))}
        assert (await asyncio.wait_for(single, 5)) == Decided(_renewed(3))
        assert listener.newest_heard(RUN) == 0, "a kept renewal is not on runs.events: not heard"

    asyncio.run(scenario())


def test_a_decision_of_another_type_on_the_kept_topic_answers_nothing() -> None:
    async def scenario() -> None:
        listener = _Listener()
        waiter = listener.register("cmd-x")
        rejected = _decision("cmd-x").rejection
        listener.deliver_kept([CODEC.decode_record(CODEC.outbound("t", RUN, rejected, 0).value)])
        listener.deliver_kept([("no.such.Contract", {})])  # undecodable: skipped, not raised
        await asyncio.sleep(0.01)
        assert not waiter.done()

    asyncio.run(scenario())


def test_many_decisions_delivered_at_once_wake_a_group_once_and_every_waiter() -> None:
    async def scenario() -> None:
        book = DecisionBook()
        group = book.register_many(["a", "b"])
        solo = book.register("c")
        a, b, c = (Decided(_renewed(i)) for i in (1, 2, 3))
        book.deliver_many([("a", a)])
        await asyncio.sleep(0.01)
        assert not group.done.done(), "b is still pending"
        book.deliver_many([("b", b), ("c", c), ("late", _decision("late"))])
        await asyncio.wait_for(group.done, 5)
        assert book.decided(group) == {"a": a, "b": b}
        assert (await asyncio.wait_for(solo, 5)) == c
        remembered = book.register("late")  # decided before anyone asked: still answered
        assert remembered.done() and isinstance(remembered.result(), Rejected)

    asyncio.run(scenario())
