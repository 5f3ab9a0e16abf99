"""Matching a published command to its decision: the Run view changing, or a rejection."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from services.common.contracts import CommandRejected
from services.common.kafka import TopicFollower
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.topics import RUNS_REJECTIONS

__all__ = ["Accepted", "Pending", "Rejected", "RejectionListener", "await_decision"]

_REMEMBERED_REJECTIONS = 10_000


@dataclass(frozen=True)
class Accepted:
    view: dict[str, Any]


@dataclass(frozen=True)
class Rejected:
    rejection: CommandRejected


@dataclass(frozen=True)
class Pending:
    pass


class RejectionListener:
    """Follows runs.rejections from now on and remembers the latest rejections by command id."""

    def __init__(self, bootstrap_servers: str, codec: MessageCodec) -> None:
        self._codec = codec
        self._seen: OrderedDict[str, CommandRejected] = OrderedDict()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._follower = TopicFollower(
            bootstrap_servers, [RUNS_REJECTIONS.name], "end", client_id="tenure-api-rejections"
        )
        self._thread = threading.Thread(target=self._run, name="rejections", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for record in self._follower.poll(timeout_s=0.1):
                try:
                    message = self._codec.decode(record.value)
                except UndecodableRecord:
                    continue
                if isinstance(message, CommandRejected):
                    with self._lock:
                        self._seen[message.causation_id] = message
                        while len(self._seen) > _REMEMBERED_REJECTIONS:
                            self._seen.popitem(last=False)
        self._follower.close()

    def get(self, command_id: str) -> CommandRejected | None:
        with self._lock:
            return self._seen.get(command_id)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)


def _caused_by(view: dict[str, Any], command_id: str) -> bool:
    return any(entry.get("causationId") == command_id for entry in view.get("history", ()))


async def await_decision(
    command_id: str,
    run_id: str,
    read_view: Callable[[str], dict[str, Any] | None],
    rejections: RejectionListener,
    timeout_s: float,
    poll_s: float = 0.01,
) -> Accepted | Rejected | Pending:
    deadline = time.monotonic() + timeout_s
    while True:
        rejection = rejections.get(command_id)
        if rejection is not None:
            return Rejected(rejection)
        view = read_view(run_id)
        if view is not None and _caused_by(view, command_id):
            return Accepted(view)
        if time.monotonic() >= deadline:
            return Pending()
        await asyncio.sleep(poll_s)
