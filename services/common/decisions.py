"""Matching a published command to its decision by causation id.

One background thread follows runs.events and runs.rejections from the moment the API starts
and resolves the waiting requests, so a request costs no polling while it waits. A waiter is
registered before its command is published, and decisions that arrive with no waiter yet are
remembered for a while, so no order of events can lose an answer.

`publish_and_await` is bounded as a whole: the publish and the wait for the decision share one
deadline, so a request never waits for a broker outage to end.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol, Sequence

from services.common.backoff import Backoff
from services.common.contracts import EVENT_TYPES, CommandRejected
from services.common.kafka import OutboundRecord, TopicFollower
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.topics import RUNS_EVENTS, RUNS_REJECTIONS

__all__ = [
    "Decided",
    "Decision",
    "DecisionBook",
    "DecisionGroup",
    "DecisionListener",
    "FollowerHealth",
    "NotDurable",
    "Publisher",
    "Rejected",
    "publish_and_await",
]

_REMEMBERED = 20_000
# Aggregates whose newest version is remembered (the long-poll and the views' lazy catch-up).
_VERSIONS_REMEMBERED = 200_000
# A follower that has not completed a poll for this long is stuck, whatever it says.
_STALL_S = 5.0

log = logging.getLogger("tenure.decisions")


@dataclass(frozen=True)
class Decided:
    """The command produced events; `event` is the first one seen (a Run or Trajectory event)."""

    event: Any


@dataclass(frozen=True)
class Rejected:
    rejection: CommandRejected


Decision = Decided | Rejected


class NotDurable(Exception):
    """Kafka did not acknowledge the command in time, or refused to queue it.

    Nothing is known to be recorded. When `may_land` is True the record is still queued in the
    producer and may yet be written (until the publisher's delivery timeout), so the caller must
    be told a retry is safe only because command ids are deterministic per Idempotency-Key."""

    def __init__(self, detail: str, *, may_land: bool) -> None:
        super().__init__(detail)
        self.may_land = may_land


class Publisher(Protocol):
    def publish(self, record: OutboundRecord) -> Any: ...  # a concurrent.futures.Future[int]


@dataclass(frozen=True)
class FollowerHealth:
    """What readiness needs to know of a decision follower."""

    ready: bool
    detail: str
    lag: int | None = None


class DecisionGroup:
    """The decisions of many commands awaited together (a batch renewal's, issue 16): the
    follower wakes the waiting request once, when the last of them arrives, instead of once per
    command. Read what arrived with `DecisionBook.decided`, at any time."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, command_ids: Sequence[str], registered_at: float = 0.0
    ) -> None:
        self.done: asyncio.Future[None] = loop.create_future()
        self.registered_at = registered_at  # the book's monotonic clock
        self._loop = loop
        self._pending = set(command_ids)
        self._decided: dict[str, Decision] = {}


class DecisionBook:
    """Waiters by command id and the decisions seen recently (no Kafka here).

    It also keeps the newest version heard of each aggregate, and wakes those waiting for an
    aggregate to pass a version: that is how a long-poll learns of a change the moment it is
    on the log, and how a view read knows whether it must catch up with the projection first.

    And it says how long the oldest group still waiting has waited (`oldest_wait_s`): the API's
    admission control for batch renewals (services/command_api/lease_batch.py) reads it.
    """

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[Decision]]]] = {}
        self._grouped: dict[str, DecisionGroup] = {}  # command id -> the group waiting for it
        self._recent: OrderedDict[str, Decision] = OrderedDict()
        self._versions: OrderedDict[str, int] = OrderedDict()
        self._watchers: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[int], int]]] = {}
        # The groups still waiting for a decision, oldest first (a dict keeps insertion order).
        self._open: dict[DecisionGroup, None] = {}

    # --- versions -------------------------------------------------------------------------------

    def heard(self, aggregate_id: str, version: int) -> None:
        """An event of `aggregate_id` at `version` is on the log."""
        with self._lock:
            if version <= self._versions.get(aggregate_id, 0):
                return
            self._versions[aggregate_id] = version
            self._versions.move_to_end(aggregate_id)
            while len(self._versions) > _VERSIONS_REMEMBERED:
                self._versions.popitem(last=False)
            watchers = self._watchers.pop(aggregate_id, [])
            waiting = [w for w in watchers if w[2] >= version]
            if waiting:
                self._watchers[aggregate_id] = waiting
        for loop, future, after in watchers:
            if after < version:
                loop.call_soon_threadsafe(_resolve, future, version)

    def newest_heard(self, aggregate_id: str) -> int:
        """The newest version of `aggregate_id` heard of since start-up (0: none)."""
        with self._lock:
            return self._versions.get(aggregate_id, 0)

    async def wait_past(self, aggregate_id: str, after: int, timeout_s: float) -> int | None:
        """The first version above `after` heard of within `timeout_s`, else None."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        entry = (loop, future, after)
        with self._lock:
            known = self._versions.get(aggregate_id, 0)
            if known <= after:
                self._watchers.setdefault(aggregate_id, []).append(entry)
        if known > after:
            return known
        try:
            return await asyncio.wait_for(future, max(0.0, timeout_s))
        except TimeoutError:
            return None
        finally:
            with self._lock:
                rest = [w for w in self._watchers.get(aggregate_id, []) if w[1] is not future]
                if rest:
                    self._watchers[aggregate_id] = rest
                else:
                    self._watchers.pop(aggregate_id, None)

    # --- decisions ------------------------------------------------------------------------------

    def deliver(self, command_id: str, decision: Decision) -> None:
        self.deliver_many(((command_id, decision),))

    def deliver_many(self, decisions: Iterable[tuple[str, Decision]]) -> None:
        """Decisions by command id, a polled batch's under one hold of the lock: at 5,000
        renewals/s, a lock per decision was a sixth of the follower's time (issue 16)."""
        woken: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], Decision | None]] = []
        with self._lock:
            for command_id, decision in decisions:
                self._recent[command_id] = decision
                self._recent.move_to_end(command_id)
                woken.extend((loop, future, decision) for loop, future in self._waiters.pop(command_id, ()))
                group = self._grouped.pop(command_id, None)
                if group is not None:
                    group._decided[command_id] = decision
                    group._pending.discard(command_id)
                    if not group._pending:  # the last of it: one wake-up for the whole group
                        self._open.pop(group, None)
                        woken.append((group._loop, group.done, None))
            while len(self._recent) > _REMEMBERED:
                self._recent.popitem(last=False)
        for loop, future, value in woken:
            loop.call_soon_threadsafe(_resolve, future, value)

    def register_many(self, command_ids: Sequence[str]) -> DecisionGroup:
        """One group for the decisions of `command_ids` (distinct, and in no other group); its
        `done` resolves once every one is decided or released. Register before publishing."""
        group = DecisionGroup(asyncio.get_running_loop(), command_ids, self._monotonic())
        with self._lock:
            for command_id in command_ids:
                known = self._recent.get(command_id)
                if known is not None:
                    group._decided[command_id] = known
                    group._pending.discard(command_id)
                else:
                    self._grouped[command_id] = group
            complete = not group._pending
            if not complete:
                self._open[group] = None
        if complete:
            group.done.set_result(None)
        return group

    def release(self, group: DecisionGroup, command_ids: Sequence[str]) -> None:
        """Stop waiting in `group` for `command_ids` (e.g. never published, so never decided);
        `group.done` resolves now if nothing else is pending. Call it on the group's loop."""
        with self._lock:
            for command_id in command_ids:
                if self._grouped.get(command_id) is group:
                    del self._grouped[command_id]
                group._pending.discard(command_id)
            complete = not group._pending
            if complete:
                self._open.pop(group, None)
        if complete:
            _resolve(group.done, None)

    def oldest_wait_s(self) -> float:
        """How long the oldest group still waiting for a decision has waited (0: none waits).
        A group waits at most its request's deadline: it is released then, decided or not."""
        with self._lock:
            oldest = next(iter(self._open), None)
        return 0.0 if oldest is None else max(0.0, self._monotonic() - oldest.registered_at)

    def decided(self, group: DecisionGroup) -> dict[str, Decision]:
        """The group's decisions that have arrived so far, by command id."""
        with self._lock:
            return dict(group._decided)

    def register(self, command_id: str) -> asyncio.Future[Decision]:
        """A future for the decision of `command_id`; register before publishing the command."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Decision] = loop.create_future()
        with self._lock:
            known = self._recent.get(command_id)
            if known is None:
                self._waiters.setdefault(command_id, []).append((loop, future))
        if known is not None:
            future.set_result(known)
        return future

    def forget(self, command_id: str, future: asyncio.Future[Decision]) -> None:
        with self._lock:
            waiters = [w for w in self._waiters.get(command_id, []) if w[1] is not future]
            if waiters:
                self._waiters[command_id] = waiters
            else:
                self._waiters.pop(command_id, None)

    def health(self) -> FollowerHealth:
        return FollowerHealth(True, "in memory")

    def close(self) -> None:
        """Nothing to stop."""


class DecisionListener(DecisionBook):
    _LAG_EVERY_S = 0.5

    def __init__(
        self,
        bootstrap_servers: str,
        codec: MessageCodec,
        topics: Sequence[str] = (RUNS_EVENTS.name, RUNS_REJECTIONS.name),
        event_types: tuple[type[Any], ...] = EVENT_TYPES,
        client_id: str = "tenure-api-decisions",
    ) -> None:
        """Follows `topics` (an aggregate's events and rejections) from their end.

        Decisions kept off the events topic (services/common/aggregate/keepalives.py: a renewal
        on runs.renewals) are not followed here: the API's projection reads that topic anyway,
        and hands them over decoded (`deliver_kept`), one consumer and one decode each."""
        super().__init__()
        self._codec = codec
        self._event_types = event_types
        self._topics = tuple(topics)
        self._stop = threading.Event()
        self._polled_at = time.monotonic()
        self._failure: str | None = None
        self._lag: int | None = None
        self._lag_at = float("-inf")
        self._follower = TopicFollower(
            bootstrap_servers,
            list(topics),
            "end",
            client_id=client_id,
        )
        self._thread = threading.Thread(target=self._run, name="decisions", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        backoff = Backoff(base_s=0.1, cap_s=5.0)
        while not self._stop.is_set():
            try:
                records = self._follower.poll(max_records=2000, timeout_s=0.1)
            except Exception as exc:  # a consume error must not end the answers for good
                if self._failure is None:
                    log.warning("following %s failed: %s; retrying", ",".join(self._topics), exc)
                self._failure = str(exc)
                self._stop.wait(backoff.next_delay())
                continue
            if self._failure is not None:
                log.info("following %s again", ",".join(self._topics))
                self._failure = None
                backoff.reset()
            self._polled_at = time.monotonic()
            # Measured here, in the polling thread: the consumer's position() called from another
            # thread while this one polls blocks (confluent-kafka 2.16), and a probe would hang.
            # At most every _LAG_EVERY_S: it asks librdkafka once per partition, and measuring
            # it on every poll was ~9% of the API's CPU under load.
            if self._polled_at - self._lag_at >= self._LAG_EVERY_S:
                self._lag = self._follower.lag()
                self._lag_at = self._polled_at
            decisions: list[tuple[str, Decision]] = []
            for record in records:
                try:
                    message = self._codec.decode(record.value)
                except UndecodableRecord:
                    continue
                if isinstance(message, CommandRejected):
                    decisions.append((message.causation_id, Rejected(message)))
                elif isinstance(message, self._event_types):
                    self.heard(message.run_id, message.version)
                    decisions.append((message.causation_id, Decided(message)))
            if decisions:
                self.deliver_many(decisions)
        self._follower.close()

    def deliver_kept(self, decoded: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """Answer the commands of decisions kept off the events topic: (full name, wire record)
        as the reader of their topic decoded them, once it has stored them. Their versions are
        not heard: they are not on the events topic, and no view will ever fold them."""
        decisions: list[tuple[str, Decision]] = []
        for full_name, record in decoded:
            try:
                message = self._codec.contract_of(full_name, record)
            except UndecodableRecord:
                continue
            if isinstance(message, self._event_types):
                decisions.append((message.causation_id, Decided(message)))
        if decisions:
            self.deliver_many(decisions)

    def health(self) -> FollowerHealth:
        """Ready while the thread follows every partition and keeps up with what it last heard."""
        if not self._thread.is_alive():
            return FollowerHealth(False, "the follower thread has stopped")
        if self._failure is not None:
            return FollowerHealth(False, f"consuming fails: {self._failure}")
        stalled = time.monotonic() - self._polled_at
        if stalled > _STALL_S:
            return FollowerHealth(False, f"no poll completed for {stalled:.1f}s")
        return FollowerHealth(True, f"following {', '.join(self._topics)}", self._lag)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


async def publish_and_await(
    publisher: Publisher,
    listener: DecisionBook,
    record: OutboundRecord,
    command_id: str,
    timeout_s: float,
) -> Decision | None:
    """Register for the decision, publish the command, wait; None if durable but undecided.

    `timeout_s` bounds the whole call. Raises NotDurable when Kafka did not acknowledge the
    command within it (or the producer's queue is full).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, timeout_s)
    decision = listener.register(command_id)
    try:
        try:
            produced = publisher.publish(record)
        except BufferError as exc:
            raise NotDurable(
                "the producer's queue is full (Kafka has been unreachable for a while)", may_land=False
            ) from exc
        except Exception as exc:
            raise NotDurable(f"Kafka refused the command: {exc}", may_land=False) from exc
        try:
            # shield: giving up must not cancel the producer's Future under librdkafka's feet.
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(produced)), deadline - loop.time())
        except TimeoutError as exc:
            raise NotDurable(
                f"Kafka did not acknowledge the command within {timeout_s:.2g}s", may_land=True
            ) from exc
        except Exception as exc:
            raise NotDurable(f"Kafka did not take the command: {exc}", may_land=False) from exc
        try:
            return await asyncio.wait_for(asyncio.shield(decision), max(0.0, deadline - loop.time()))
        except TimeoutError:
            return None
    finally:
        if not decision.done():
            listener.forget(command_id, decision)
