"""The fleet-wide circuit breaker as a real process on the real broker (BRK-1, BRK-2, DUR-1).

Two gateway instances, A and B (each a BreakerClient and a BreakerBoard of its own, with their
own Kafka clients, in this process), report transport failures of one endpoint to
`python -m services.breakers`. The breaker opens; both boards see it open within a measured
propagation time and fail fast. When it half-opens, A and B race for the canary: exactly one of
them gets it. The breaker processor is then SIGKILLed and restarted: the slot is neither lost nor
duplicated (still held by the same instance if the restart beat its lease, else expired once),
the holder never reports (it "died"), the slot expires exactly once and is granted exactly once
more, and that canary's success closes the breaker for both instances.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from confluent_kafka import KafkaException

from services.breakers.client import BreakerClient, CanaryAnswer
from services.breakers.view import BreakerBoard
from services.common.backoff import Backoff
from services.common.contracts import (
    SUCCESS,
    TRANSPORT_FAILURE,
    BreakerClosed,
    BreakerOpened,
    CanaryExpired,
    CanaryGranted,
)
from services.common.routing import partition_for_endpoint
from services.common.topics import BREAKERS_EVENTS
from tests.support.system import (
    ServiceProcess,
    decode_all,
    free_port,
    read_topic,
    service_env,
    wait_for_ready,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

COOLDOWN_MS = 1_500
CANARY_LEASE_MS = 8_000
# Stated bound of the propagation from the breaker's decision to both instances' boards.
PROPAGATION_BOUND_MS = 2_000
T = TypeVar("T")


def _endpoint_events(bootstrap: str, endpoint: str) -> list[Any]:
    partition = partition_for_endpoint(endpoint, BREAKERS_EVENTS.partitions)
    records = [
        r
        for r in read_topic(bootstrap, BREAKERS_EVENTS.name, BREAKERS_EVENTS.partitions)
        if r.partition == partition
    ]
    return [e for e in decode_all(records) if e.run_id == endpoint]


def _when_leaders_answer(build: Callable[[], T]) -> T:
    """`build()` once the topics' partitions have leaders that answer: right after a fresh broker
    created them, a watermark query may still meet NOT_LEADER_FOR_PARTITION."""
    backoff, deadline = Backoff(base_s=0.1, cap_s=1.0), time.monotonic() + 30
    while True:
        try:
            return build()
        except (KafkaException, RuntimeError):
            if time.monotonic() > deadline:
                raise
            time.sleep(backoff.next_delay())


def _race(a: BreakerClient, b: BreakerClient, endpoint: str, each: int = 3) -> list[CanaryAnswer]:
    """A and B ask for the canary `each` times at once."""

    async def race() -> list[CanaryAnswer]:
        asks = [client.request_canary(endpoint, 10.0) for _ in range(each) for client in (a, b)]
        return list(await asyncio.gather(*asks))

    return asyncio.run(race())


def test_two_instances_share_one_breaker_one_canary_and_survive_a_sigkill_brk_1_brk_2(
    tenure_topics: str, tmp_path: Path
) -> None:
    bootstrap = tenure_topics
    endpoint = f"it-{time.time_ns()}/search"
    port = free_port()
    env = service_env(
        bootstrap,
        tmp_path / "state",
        TENURE_BREAKERS_HEALTH_PORT=str(port),
        TENURE_BREAKER_MIN_CALLS="10",
        TENURE_BREAKER_COOLDOWN_MS=str(COOLDOWN_MS),
        TENURE_BREAKER_COOLDOWN_MAX_MS=str(4 * COOLDOWN_MS),
        TENURE_BREAKER_CANARY_LEASE_MS=str(CANARY_LEASE_MS),
        TENURE_TIMER_INTERVAL_S="0.05",
    )
    breakers = ServiceProcess("breakers", "services.breakers", env, tmp_path).start()
    a = _when_leaders_answer(lambda: BreakerClient.connect(bootstrap, "gw-a"))
    b = _when_leaders_answer(lambda: BreakerClient.connect(bootstrap, "gw-b"))
    boards = {
        name: _when_leaders_answer(
            lambda name=name: BreakerBoard(bootstrap, client_id=f"breaker-board-{name}")
        )
        for name in ("A", "B")
    }
    opened_seen: dict[str, float] = {}
    for name, board in boards.items():
        board.subscribe(
            lambda state, name=name: (
                opened_seen.setdefault(name, time.time() * 1000)
                if state.endpoint == endpoint and state.status.value == "open"
                else None
            )
        )
    try:
        assert wait_for_ready(port, 90, breakers)["service"] == "tenure-breakers"
        assert all(board.wait_until_current(30) for board in boards.values())

        # --- failures seen at A and B open the breaker; both instances fail fast -------------
        futures = [
            c.record_outcome(endpoint, TRANSPORT_FAILURE, 5_000, "HTTP 503") for c in (a, b) for _ in range(6)
        ]
        for future in futures:
            assert future is not None
            future.result(30)
        wait_until(lambda: len(opened_seen) == 2, 30, "both boards to see the breaker open", poll_s=0.02)
        events = _endpoint_events(bootstrap, endpoint)
        [opened] = [e for e in events if isinstance(e, BreakerOpened)]
        assert (opened.calls, opened.failures, opened.error_rate) == (10, 10, 1.0)
        propagation = {name: seen - opened.occurred_at for name, seen in opened_seen.items()}
        print(f"breaker propagation to instances (ms): {propagation}")
        assert all(0 <= ms < PROPAGATION_BOUND_MS for ms in propagation.values()), propagation
        for board in boards.values():
            is_open, remaining = board.is_open(endpoint)
            assert is_open and 0 <= remaining <= COOLDOWN_MS

        # --- half-open: exactly one canary across both instances ------------------------------
        wait_until(
            lambda: all(board.verdict(endpoint).status == "half-open" for board in boards.values()),
            30,
            "both boards to see the breaker half-open",
            poll_s=0.05,
        )
        answers = _race(a, b, endpoint)
        granted = [answer for answer in answers if answer.granted]
        assert len(granted) == 1, answers
        assert {answer.code for answer in answers if not answer.granted} == {"CANARY_IN_FLIGHT"}
        first = granted[0]
        holder = "gw-a" if answers.index(first) % 2 == 0 else "gw-b"
        wait_until(
            lambda: boards["B"].verdict(endpoint).canary_holder == holder, 10, "the holder on B's board"
        )

        # --- SIGKILL of the breaker processor with the slot held --------------------------------
        breakers.sigkill()
        killed_at = time.time() * 1000
        breakers.start()
        wait_for_ready(port, 90, breakers)
        restarted_in = time.time() * 1000 - killed_at
        print(f"breaker processor restarted in {restarted_in:.0f} ms (canary lease {CANARY_LEASE_MS} ms)")
        if time.time() * 1000 < first.expires_at - 500:
            again = _race(a, b, endpoint, each=1)
            assert [x.code for x in again] == ["CANARY_IN_FLIGHT"] * 2, again
            assert all(first.canary_id in x.detail and holder in x.detail for x in again)
        # The holder "died": it never reports. Its slot expires once, and is granted once more.
        wait_until(
            lambda: any(isinstance(e, CanaryExpired) for e in _endpoint_events(bootstrap, endpoint)),
            CANARY_LEASE_MS / 1000 + 30,
            "the canary's lease to run out",
            poll_s=0.2,
        )
        second_round = _race(a, b, endpoint)
        regranted = [x for x in second_round if x.granted]
        assert len(regranted) == 1, second_round
        second = regranted[0]
        assert second.canary_id != first.canary_id
        late = asyncio.run(a.report_canary(endpoint, first.canary_id, SUCCESS, 10, timeout_s=10))
        assert late is not None and getattr(late, "rejection", None) is not None
        assert late.rejection.code == "CANARY_NOT_HELD"  # type: ignore[union-attr]
        second_holder = a if second_round.index(second) % 2 == 0 else b
        closed = asyncio.run(
            second_holder.report_canary(endpoint, second.canary_id, SUCCESS, 25, timeout_s=10)
        )
        assert closed is not None and isinstance(getattr(closed, "event", None), BreakerClosed)
        wait_until(
            lambda: all(board.is_open(endpoint) == (False, 0) for board in boards.values()),
            10,
            "both boards to see the breaker closed",
            poll_s=0.05,
        )
    finally:
        for client in (a, b):
            client.close()
        for board in boards.values():
            board.close()
        breakers.stop()
    assert breakers.starts == 2

    events = _endpoint_events(bootstrap, endpoint)
    assert [e.version for e in events] == list(range(1, len(events) + 1)), "versions contiguous"
    assert len({e.event_id for e in events}) == len(events), "no event twice"
    grants = [e for e in events if isinstance(e, CanaryGranted)]
    assert [g.canary_id for g in grants] == [first.canary_id, second.canary_id], "one grant per round"
    expiries = [e for e in events if isinstance(e, CanaryExpired)]
    assert [x.canary_id for x in expiries] == [first.canary_id], "the dead holder's slot expired once"
    assert grants[1].occurred_at >= first.expires_at, "never two canaries in flight"
    assert sum(isinstance(e, BreakerOpened) for e in events) == 1
    # A gateway instance that starts now folds the whole history: the same state as the live ones.
    late_board = _when_leaders_answer(lambda: BreakerBoard(bootstrap, client_id="breaker-board-late"))
    try:
        assert late_board.wait_until_current(30), late_board.health()
        assert late_board.state(endpoint) == boards["A"].state(endpoint) == boards["B"].state(endpoint)
        assert late_board.health().ready
    finally:
        late_board.close()
