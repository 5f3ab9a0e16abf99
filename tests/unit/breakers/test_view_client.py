"""The read side and the client a gateway instance uses (BRK-2): the fold of breakers.events with
the breaker's own evolve answers in well under a millisecond, and the client's canary requests
and reports are matched to the breaker's decisions (no Kafka here: an in-memory breaker)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from services.breakers.client import UNDECIDED, BreakerClient
from services.breakers.domain import fold
from services.breakers.processor import BreakerDefinition
from services.breakers.view import FORCED_OPEN_RETRY_MS, BreakerFold
from services.common.clock import ManualClock
from services.common.contracts import SUCCESS, TRANSPORT_FAILURE, CommandRejected, RecordCallOutcome
from services.common.decisions import Decided, DecisionBook, Rejected
from services.common.kafka import OutboundRecord
from services.common.messages import MessageCodec
from services.common.routing import partition_for_endpoint
from services.common.topics import BREAKERS_COMMANDS

from .support import ENDPOINT, POLICY, Breaker, force_open, request

CODEC = MessageCodec()


def _opened_breaker() -> Breaker:
    b = Breaker(policy=POLICY)
    b.outcomes([SUCCESS] * 3)
    b.open()
    return b


# --- the fold ---------------------------------------------------------------------------------


def test_the_fold_of_the_followed_events_is_the_breakers_state_and_repeats_are_skipped() -> None:
    b = _opened_breaker()
    b.tick(POLICY.cooldown_ms)
    b.send(request("gw-a"))
    board = BreakerFold(ManualClock(b.now))
    for event in b.events:
        board.apply(event)
    for event in b.events[-3:]:  # at-least-once delivery: a repeat changes nothing
        assert board.apply(event) is None
    assert board.state(ENDPOINT) == b.state == fold(b.events)
    assert board.folded == len(b.events)


def test_is_open_answers_open_half_open_closed_and_unknown_endpoints_brk_2() -> None:
    b = _opened_breaker()
    clock = ManualClock(b.now)
    board = BreakerFold(clock)
    for event in b.events:
        board.apply(event)
    assert board.is_open(ENDPOINT) == (True, POLICY.cooldown_ms)
    clock.advance(10_000)
    assert board.is_open(ENDPOINT) == (True, POLICY.cooldown_ms - 10_000)
    assert board.is_open("ledger") == (False, 0), "a breaker never heard of is closed"
    assert board.verdict("ledger").endpoint == "ledger"
    clock.advance(POLICY.cooldown_ms)
    seen = board.verdict(ENDPOINT)
    assert (seen.open, seen.cooldown_remaining_ms, seen.canary_free) == (True, 0, True)
    forced = Breaker(policy=POLICY)
    forced.send(force_open(endpoint="search"))
    for event in forced.events:
        board.apply(event)
    assert board.is_open("search") == (True, FORCED_OPEN_RETRY_MS)


def test_a_gap_in_the_followed_versions_keeps_the_last_good_state_and_is_reported() -> None:
    b = _opened_breaker()
    board = BreakerFold(ManualClock(b.now))
    for event in b.events[:3]:
        board.apply(event)
    good = board.state(ENDPOINT)
    assert board.apply(b.events[4]) is None
    assert board.state(ENDPOINT) == good and ENDPOINT in board.broken


def test_is_open_takes_well_under_a_millisecond_with_a_thousand_breakers_brk_2() -> None:
    board = BreakerFold()
    template = _opened_breaker()
    for i in range(1000):
        endpoint = f"tool-{i}"
        for event in template.events:
            board.apply(replace(event, run_id=endpoint))
    samples = []
    for i in range(20_000):
        started = time.perf_counter_ns()
        board.is_open(f"tool-{i % 1000}")
        samples.append(time.perf_counter_ns() - started)
    samples.sort()
    p99_ms = samples[int(len(samples) * 0.99)] / 1e6
    assert p99_ms < 1.0, f"p99 {p99_ms:.4f} ms"


def test_listeners_hear_every_folded_state() -> None:
    b = _opened_breaker()
    board = BreakerFold(ManualClock(b.now))
    heard: list[Any] = []
    board.subscribe(heard.append)
    for event in b.events:
        board.apply(event)
    assert [s.version for s in heard] == [e.version for e in b.events]


# --- the client ---------------------------------------------------------------------------------


class InMemoryBreakers:
    """A publisher that decides each published command at once with the breaker's definition and
    delivers the decision to a DecisionBook, as the processor and the DecisionListener would."""

    def __init__(self, clock: ManualClock) -> None:
        self.definition = BreakerDefinition(POLICY)
        self.clock = clock
        self.books: list[DecisionBook] = []
        self.states: dict[str, Any] = {}
        self.published: list[OutboundRecord] = []
        self.fail = False

    def publish(self, record: OutboundRecord) -> Future[int]:
        if self.fail:
            raise BufferError("queue full")
        self.published.append(record)
        command = CODEC.decode(record.value)
        state = self.states.get(command.run_id)
        decision = self.definition.decide(state, command, self.clock.now_ms(), None)
        if isinstance(decision, list | tuple):
            for event in decision:
                state = self.definition.evolve(state, event)
            self.states[command.run_id] = state
            if decision:
                for book in self.books:
                    book.deliver(command.command_id, Decided(decision[0]))
        else:
            rejection = decision.record
            assert isinstance(rejection, CommandRejected)
            for book in self.books:
                book.deliver(command.command_id, Rejected(rejection))
        future: Future[int] = Future()
        future.set_result(len(self.published))
        return future


def _client(breakers: InMemoryBreakers, instance: str) -> BreakerClient:
    book = DecisionBook()
    breakers.books.append(book)
    return BreakerClient(breakers, book, instance, clock=breakers.clock)


def test_outcomes_are_routed_to_the_endpoints_partition_with_increasing_seqs() -> None:
    breakers = InMemoryBreakers(ManualClock())
    client = _client(breakers, "gw-a")
    for _ in range(3):
        assert client.record_outcome(ENDPOINT, TRANSPORT_FAILURE, 5_000, "HTTP 503") is not None
    commands = [CODEC.decode(r.value) for r in breakers.published]
    assert all(isinstance(c, RecordCallOutcome) for c in commands)
    seqs = [c.seq for c in commands]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert seqs[0] >= ManualClock().now_ms() * 1000, "seqs start at the process start in microseconds"
    assert {(r.topic, r.partition) for r in breakers.published} == {
        (BREAKERS_COMMANDS.name, partition_for_endpoint(ENDPOINT))
    }
    breakers.fail = True
    assert client.record_outcome(ENDPOINT, SUCCESS, 1) is None and client.dropped == 1


def test_two_instances_ask_for_the_canary_and_exactly_one_gets_it_then_reports_brk_2() -> None:
    clock = ManualClock()
    breakers = InMemoryBreakers(clock)
    a, b = _client(breakers, "gw-a"), _client(breakers, "gw-b")

    async def scenario() -> None:
        for _ in range(POLICY.min_calls):
            a.record_outcome(ENDPOINT, TRANSPORT_FAILURE, 5_000)
        early = await a.request_canary(ENDPOINT, timeout_s=1)
        assert (early.granted, early.code) == (False, "BREAKER_OPEN")
        clock.advance(POLICY.cooldown_ms)
        answers = await asyncio.gather(a.request_canary(ENDPOINT, 1), b.request_canary(ENDPOINT, 1))
        granted = [x for x in answers if x.granted]
        assert len(granted) == 1 and {x.code for x in answers if not x.granted} == {"CANARY_IN_FLIGHT"}
        holder = a if answers[0].granted else b
        decision = await holder.report_canary(ENDPOINT, granted[0].canary_id, SUCCESS, 20, timeout_s=1)
        assert isinstance(decision, Decided) and type(decision.event).__name__ == "BreakerClosed"
        again = await holder.request_canary(ENDPOINT, 1)
        assert again.code == "BREAKER_CLOSED"

    asyncio.run(scenario())
    assert breakers.states[ENDPOINT].status.value == "closed"


def test_operator_commands_and_an_undecided_canary_request() -> None:
    clock = ManualClock()
    breakers = InMemoryBreakers(clock)
    ops = _client(breakers, "ops")

    async def scenario() -> None:
        forced = await ops.force_open("search", "INC-77", "user:ops", timeout_s=1)
        assert isinstance(forced, Decided) and forced.event.actor == "user:ops"
        again = await ops.force_open("search", "INC-77", "user:ops", timeout_s=1)
        assert isinstance(again, Rejected) and again.rejection.code == "BREAKER_FORCED_OPEN"
        assert isinstance(await ops.disable("search", "noise", "user:ops", timeout_s=1), Decided)
        assert isinstance(await ops.reset("search", "ok", "user:ops", timeout_s=1), Decided)
        lonely = BreakerClient(breakers, DecisionBook(), "gw-z", clock=clock)  # hears no decision
        answer = await lonely.request_canary("search", timeout_s=0.05)
        assert (answer.granted, answer.code) == (False, UNDECIDED)

    asyncio.run(scenario())
    assert breakers.states["search"].status.value == "closed"
