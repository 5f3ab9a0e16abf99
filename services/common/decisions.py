"""Matching a published command to its decision by causation id.

One background thread follows runs.events and runs.rejections from the moment the API starts
and resolves the waiting requests, so a request costs no polling while it waits. A waiter is
registered before its command is published, and decisions that arrive with no waiter yet are
remembered for a while, so no order of events can lose an answer.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

from services.common.contracts import EVENT_TYPES, CommandRejected
from services.common.kafka import CommandPublisher, OutboundRecord, TopicFollower
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.topics import RUNS_EVENTS, RUNS_REJECTIONS

__all__ = ["Decided", "Decision", "DecisionListener", "Rejected", "publish_and_await"]

_REMEMBERED = 20_000


@dataclass(frozen=True)
class Decided:
    """The command produced events; `event` is the first one seen (a Run or Trajectory event)."""

    event: Any


@dataclass(frozen=True)
class Rejected:
    rejection: CommandRejected


Decision = Decided | Rejected


class DecisionListener:
    def __init__(
        self,
        bootstrap_servers: str,
        codec: MessageCodec,
        topics: Sequence[str] = (RUNS_EVENTS.name, RUNS_REJECTIONS.name),
        event_types: tuple[type[Any], ...] = EVENT_TYPES,
        client_id: str = "tenure-api-decisions",
    ) -> None:
        """Follows `topics` (an aggregate's events and rejections) from their end."""
        self._codec = codec
        self._event_types = event_types
        self._lock = threading.Lock()
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[Decision]]]] = {}
        self._recent: OrderedDict[str, Decision] = OrderedDict()
        self._stop = threading.Event()
        self._follower = TopicFollower(
            bootstrap_servers,
            list(topics),
            "end",
            client_id=client_id,
        )
        self._thread = threading.Thread(target=self._run, name="decisions", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for record in self._follower.poll(max_records=2000, timeout_s=0.1):
                try:
                    message = self._codec.decode(record.value)
                except UndecodableRecord:
                    continue
                if isinstance(message, CommandRejected):
                    self._deliver(message.causation_id, Rejected(message))
                elif isinstance(message, self._event_types):
                    self._deliver(message.causation_id, Decided(message))
        self._follower.close()

    def _deliver(self, command_id: str, decision: Decision) -> None:
        with self._lock:
            self._recent[command_id] = decision
            self._recent.move_to_end(command_id)
            while len(self._recent) > _REMEMBERED:
                self._recent.popitem(last=False)
            waiters = self._waiters.pop(command_id, [])
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future, decision)

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
            waiters = self._waiters.get(command_id, [])
            self._waiters[command_id] = [w for w in waiters if w[1] is not future]
            if not self._waiters[command_id]:
                del self._waiters[command_id]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)


def _resolve(future: asyncio.Future[Decision], decision: Decision) -> None:
    if not future.done():
        future.set_result(decision)


async def publish_and_await(
    publisher: CommandPublisher,
    listener: DecisionListener,
    record: OutboundRecord,
    command_id: str,
    timeout_s: float,
) -> Decision | None:
    """Register for the decision, publish the command, wait; None if no decision in time.

    Raises whatever the publisher raises when Kafka does not take the command (nothing was sent).
    """
    decision = listener.register(command_id)
    try:
        await asyncio.wrap_future(publisher.publish(record))
    except Exception:
        listener.forget(command_id, decision)
        raise
    try:
        return await asyncio.wait_for(decision, timeout_s)
    except TimeoutError:
        listener.forget(command_id, decision)
        return None
