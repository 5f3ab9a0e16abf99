"""A group commit over a joint unit: the requests that wait are decided together, in one
transaction, and each is answered once it is durable (issue 11).

`bench/owner_path.py` measured what an owner of a partition's aggregates spends on the peers'
workload (docs/architecture.md, "The owner's core, measured"): its throughput at 8 clients is
bound by serial commits, a Kafka transaction each. Two things here cut their number:
  * **a group commit without a linger**: one thread takes every request waiting when it is free
    and decides them as one unit, so k requests in flight share one transaction, and a lone
    request waits for no timer (the batch is whatever came during the previous commit);
  * **one unit for what one request decides of several aggregates** (joint.py): a request is a
    first command and, optionally, what follows from its answer in the same unit. A step's
    intent (the Trajectory) and then the effect's intent fenced by the lease the Run holds as
    the same unit leaves it are one commit instead of two.

A request's answer is each of its commands' `Verdict` with the aggregate's state after the unit.
The answers are given only after the transaction and every participant's store write: an
answer never names a decision the log does not hold. If the unit fails (the log, the store),
every request of the batch gets the error and the participants restore before the next unit
(joint.py); the callers retry with the same command ids, which the aggregates deduplicate.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from services.common.aggregate.changes import Verdict
from services.common.aggregate.joint import Deciding, JointUnit
from services.common.kafka import InboundRecord, OutboundRecord

__all__ = ["Answer", "Ask", "GroupCommitter", "NotOwned", "Then", "as_inbound"]


@dataclass(frozen=True)
class Ask:
    """One command for the aggregate (definition name) that decides it."""

    aggregate: str
    command: Any


@dataclass(frozen=True)
class Answer:
    """What one command came to, and its aggregate's state after the unit (None: none)."""

    verdict: Verdict
    state: Any


# What a request decides next from its previous answer, in the same unit (None: nothing).
Then = Callable[[Answer], Ask | None]


@dataclass
class _Request:
    asks: list[Ask | Then]
    future: Future[tuple[Answer, ...]]
    answers: list[Answer] = field(default_factory=list)
    first: InboundRecord | None = None  # the first command's record, once made


class GroupCommitter:
    """Decides waiting requests as one joint unit each time it is free (module docstring).

    `inbound[aggregate]` turns a command into the record its aggregate's runtime decides: the
    command's own partition, offset -1 (it came from no topic)."""

    def __init__(
        self,
        joint: JointUnit,
        inbound: Mapping[str, Callable[[Any], InboundRecord]],
        *,
        max_batch: int = 500,
    ) -> None:
        if missing := set(joint.aggregates) - set(inbound):
            raise ValueError(f"no inbound record for {sorted(missing)}")
        self._joint = joint
        self._inbound = dict(inbound)
        self._max_batch = max_batch  # 1: every request a unit (and a transaction) of its own
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.units = 0
        self.requests = 0
        # The latest units' times: decide, the transaction, the store writes (bounded: it runs for days).
        self.unit_ms: deque[float] = deque(maxlen=10_000)

    def submit(self, first: Ask, *then: Then) -> Future[tuple[Answer, ...]]:
        """The answers of `first` and of what each `then` makes of the answer before it."""
        future: Future[tuple[Answer, ...]] = Future()
        self._queue.put(_Request([first, *then], future))
        return future

    def start(self) -> None:
        """Decide what is queued and what comes, on a thread of its own (again after a `stop`)."""
        self._thread = threading.Thread(target=self._run, name="group-commit", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Answer what is queued, then end the thread. A request submitted after this waits for
        the next `start` (a server stops taking requests before it stops its committer)."""
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            waiting = [first]
            stopping = False
            while len(waiting) < self._max_batch:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stopping = True
                    break
                waiting.append(more)
            self._decide(waiting)
            if stopping:
                return

    def _decide(self, requests: Sequence[_Request]) -> None:
        """One unit for `requests`; each future gets its answers or the unit's error."""
        began = time.monotonic()
        live = [r for r in requests if r.future.set_running_or_notify_cancel()]
        try:
            self._joint.run(self._partitions(live), lambda deciding: self._rounds(deciding, live))
        except Exception as exc:  # the log's or the store's: every request of the unit learns of it
            for request in live:
                if not request.future.done():
                    request.future.set_exception(exc)
            return
        self.units += 1
        self.requests += len(live)
        self.unit_ms.append(1000 * (time.monotonic() - began))
        for request in live:
            if not request.future.done():
                request.future.set_result(tuple(request.answers))

    def _partitions(self, requests: Sequence[_Request]) -> set[int]:
        """The partitions of the requests' first commands (their records are kept for round 0)."""
        partitions: set[int] = set()
        for request in requests:
            first = request.asks[0]
            if isinstance(first, Ask) and first.aggregate in self._inbound:
                with contextlib.suppress(ValueError):  # answered with its error in round 0
                    request.first = self._inbound[first.aggregate](first.command)
                    partitions.add(request.first.partition)
        return partitions

    def _rounds(self, deciding: Deciding, requests: Sequence[_Request]) -> None:
        """Round n decides every request's n-th command, each aggregate's in one call."""
        pending = list(requests)
        round_index = 0
        while pending:
            asks: dict[str, list[tuple[_Request, InboundRecord]]] = defaultdict(list)
            for request in pending:
                try:
                    ask = self._ask(request, round_index)
                    if ask is None:
                        continue
                    record = request.first if round_index == 0 and request.first else None
                    record = record or self._inbound[ask.aggregate](ask.command)
                    if record.partition not in deciding.partitions:
                        raise NotOwned(f"partition {record.partition} of {ask.aggregate} is not owned here")
                except Exception as exc:  # a malformed command, or a `then` that failed: this request's
                    request.future.set_exception(exc)
                    continue
                asks[ask.aggregate].append((request, record))
            for aggregate, entries in asks.items():
                verdicts = deciding.decide(aggregate, [record for _, record in entries])
                for (request, _), verdict in zip(entries, verdicts, strict=True):
                    aggregate_id = verdict.aggregate_id
                    state = None if aggregate_id is None else deciding.state(aggregate, aggregate_id)
                    request.answers.append(Answer(verdict, state))
            round_index += 1
            pending = [r for r in pending if self._goes_on(r, round_index)]

    @staticmethod
    def _goes_on(request: _Request, decided: int) -> bool:
        return not request.future.done() and len(request.answers) == decided < len(request.asks)

    def _ask(self, request: _Request, index: int) -> Ask | None:
        step = request.asks[index]
        ask = step if isinstance(step, Ask) else step(request.answers[-1])
        if ask is not None and ask.aggregate not in self._inbound:
            raise ValueError(f"no aggregate {ask.aggregate!r} here")
        return ask


class NotOwned(ValueError):
    """A command of a partition this owner has not restored: it is decided by another."""


def as_inbound(record: OutboundRecord) -> InboundRecord:
    """A command record as a joint unit decides it: on its own partition, from no topic (-1)."""
    if record.partition is None:
        raise ValueError(f"a command for {record.topic} names no partition")
    return InboundRecord(record.topic, record.partition, -1, record.key, record.value, record.headers)
