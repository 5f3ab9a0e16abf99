"""A thread that follows events topics from the beginning and hands each event to a fold.

The gateway's and the API's boards (the breakers', the quarantines') are in-memory folds of an
aggregate's events, built with the aggregate's own `evolve`; `TopicFeed` is what keeps such a
fold fed from Kafka, and says when it is current: folded past where the log ended when it
started, so its answers are the fleet's and not a stale subset.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable

from services.common.backoff import Backoff
from services.common.decisions import FollowerHealth
from services.common.kafka import TopicFollower
from services.common.messages import MessageCodec, UndecodableRecord

__all__ = ["TopicFeed"]

log = logging.getLogger("tenure.feed")

# A poll that has not come back for this long means the follower is stuck: not ready.
_STALL_S = 5.0
# How long start-up may retry reading the topic's end (a broker still electing leaders).
_END_OFFSETS_BUDGET_S = 30.0


class TopicFeed:
    """Follows `topics` from their beginning on a daemon thread; `apply` gets every event of
    `event_types` in log order (per partition). `what` names the fold in health answers."""

    def __init__(
        self,
        bootstrap_servers: str,
        topics: str | Sequence[str],
        event_types: tuple[type[Any], ...],
        apply: Callable[[Any], object],
        *,
        what: str,
        client_id: str,
        codec: MessageCodec | None = None,
        poll_timeout_s: float = 0.1,
    ) -> None:
        self._topics = (topics,) if isinstance(topics, str) else tuple(topics)
        self._named = ", ".join(self._topics)
        self._event_types = event_types
        self._apply = apply
        self._what = what
        self._codec = codec or MessageCodec()
        self._poll_timeout_s = poll_timeout_s
        self._stop = threading.Event()
        self._current = threading.Event()
        self._polled_at = time.monotonic()
        self._failure: str | None = None
        self._follower = TopicFollower(
            bootstrap_servers, list(self._topics), "beginning", client_id=client_id
        )
        # Where the log ended when we started: folded past it, the fold is current.
        self._started_at_end = self._end_offsets()
        self._thread = threading.Thread(target=self._run, name=f"{what}-feed", daemon=True)
        self._thread.start()

    def _end_offsets(self) -> dict[tuple[str, int], int]:
        return {(topic, p): end for topic in self._topics for p, end in self._end_offsets_of(topic).items()}

    def _end_offsets_of(self, topic: str) -> dict[int, int]:
        # Right after the topics are created (or while a leader moves) the broker may not answer.
        backoff = Backoff(base_s=0.1, cap_s=2.0)
        deadline = time.monotonic() + _END_OFFSETS_BUDGET_S
        while True:
            try:
                return self._follower.end_offsets(topic)
            except Exception as exc:
                if time.monotonic() >= deadline:
                    raise
                if backoff.attempt == 0:
                    log.warning("cannot read the end of %s yet (%s); retrying", topic, exc)
                time.sleep(backoff.next_delay())

    def _run(self) -> None:
        backoff = Backoff(base_s=0.1, cap_s=5.0)
        while not self._stop.is_set():
            try:
                records = self._follower.poll(max_records=2000, timeout_s=self._poll_timeout_s)
            except Exception as exc:  # a consume error must not end the fold for good
                if self._failure is None:
                    log.warning("following %s failed: %s; retrying", self._named, exc)
                self._failure = str(exc)
                self._stop.wait(backoff.next_delay())
                continue
            if self._failure is not None:
                log.info("following %s again", self._named)
                self._failure = None
                backoff.reset()
            self._polled_at = time.monotonic()
            for record in records:
                try:
                    message = self._codec.decode(record.value)
                except UndecodableRecord:
                    continue
                if isinstance(message, self._event_types):
                    self._apply(message)
            if not self._current.is_set() and self._folded_to_start_end():
                self._current.set()
        self._follower.close()

    def _folded_to_start_end(self) -> bool:
        # Called from the polling thread only: position() from another thread blocks (see
        # services/common/decisions.py).
        positions = {(t, p): at for t in self._topics for p, at in self._follower.positions(t).items()}
        return all(positions.get(k, -1) >= end or end <= 0 for k, end in self._started_at_end.items())

    def wait_until_current(self, timeout_s: float = 30.0) -> bool:
        """True once everything on the log at start-up is folded."""
        return self._current.wait(timeout_s)

    @property
    def current(self) -> bool:
        return self._current.is_set()

    @property
    def failure(self) -> str | None:
        """Why the last poll failed, None while polls succeed."""
        return self._failure

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def health(self, detail: str = "") -> FollowerHealth:
        if not self._thread.is_alive():
            return FollowerHealth(False, f"the {self._what} follower thread has stopped")
        if self._failure is not None:
            return FollowerHealth(False, f"consuming {self._named} fails: {self._failure}")
        if not self._current.is_set():
            return FollowerHealth(False, f"folding {self._named} up to where it ended at start-up")
        stalled = time.monotonic() - self._polled_at
        if stalled > _STALL_S:
            return FollowerHealth(False, f"no poll of {self._named} completed for {stalled:.1f}s")
        return FollowerHealth(True, f"following {self._named}" + (f": {detail}" if detail else ""))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
