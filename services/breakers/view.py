"""The breakers as every gateway instance (and runner) sees them: breakers.events, folded (BRK-2).

`BreakerFold` holds each endpoint's state, folded with the breaker's own `evolve` (one fold per
aggregate: the read side cannot drift from the writer), and answers "does a call to this endpoint
fail fast now?" from memory, in microseconds: a dictionary lookup and a comparison of times under
a lock, no I/O. `BreakerBoard` feeds it from Kafka: one thread follows breakers.events from the
beginning (read_committed, so an aborted transaction is never seen), and readiness waits until it
has folded what was on the log when it started.

Times are compared with this process's clock against the breaker processor's (the cooldown's end
and the canary's expiry are recorded as epoch ms): hosts are assumed to agree within a fraction
of the cooldown.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from services.breakers.domain import BreakerState, Verdict, evolve, verdict
from services.common.clock import Clock, SystemClock
from services.common.contracts import BREAKER_EVENT_TYPES, BreakerEvent
from services.common.decisions import FollowerHealth
from services.common.feed import TopicFeed
from services.common.messages import MessageCodec
from services.common.topics import BREAKERS_EVENTS

__all__ = ["FORCED_OPEN_RETRY_MS", "BreakerBoard", "BreakerFold"]

log = logging.getLogger("tenure.breakers.view")
# What a forced-open breaker tells a caller to wait before it asks again: it has no cooldown, an
# operator will reset it whenever they do.
FORCED_OPEN_RETRY_MS = 30_000

Listener = Callable[[BreakerState], None]


class BreakerFold:
    """Each endpoint's breaker state, the fold of its events as they arrive (no Kafka here)."""

    def __init__(self, clock: Clock | None = None, forced_open_retry_ms: int = FORCED_OPEN_RETRY_MS) -> None:
        self._clock = clock or SystemClock()
        self._forced_open_retry_ms = forced_open_retry_ms
        self._lock = threading.Lock()
        self._states: dict[str, BreakerState] = {}
        self._listeners: list[Listener] = []
        self.folded = 0
        self.broken: dict[str, str] = {}  # endpoint -> why its fold stopped (a defect: never expected)

    def apply(self, event: BreakerEvent) -> BreakerState | None:
        """Fold one event; a repeat of a folded version is skipped. Returns the new state."""
        endpoint = event.run_id
        with self._lock:
            state = self._states.get(endpoint)
            if state is not None and event.version <= state.version:
                return None
            try:
                after = evolve(state, event)
            except ValueError as exc:
                # A gap or an impossible transition: the log is the truth, this reader is behind
                # or wrong. Keep the last good state (fail-fast stays as it was) and say so.
                if endpoint not in self.broken:
                    log.error("breaker %s: cannot fold %s: %s", endpoint, type(event).__name__, exc)
                self.broken[endpoint] = str(exc)
                return None
            self._states[endpoint] = after
            self.folded += 1
            listeners = list(self._listeners)
        for listener in listeners:
            listener(after)
        return after

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(state)` after each folded event (from the folding thread)."""
        with self._lock:
            self._listeners.append(listener)

    def state(self, endpoint: str) -> BreakerState | None:
        with self._lock:
            return self._states.get(endpoint)

    def states(self) -> dict[str, BreakerState]:
        with self._lock:
            return dict(self._states)

    def verdict(self, endpoint: str, now_ms: int | None = None) -> Verdict:
        """What a call to `endpoint` does now (see services/breakers/domain/state.py `Verdict`)."""
        with self._lock:
            state = self._states.get(endpoint)
        found = verdict(state, self._clock.now_ms() if now_ms is None else now_ms, self._forced_open_retry_ms)
        return found if state is not None else Verdict(endpoint, found.status, False, 0, False)

    def is_open(self, endpoint: str) -> tuple[bool, int]:
        """(fail fast?, cooldown remaining in ms): the gateway's check before every call."""
        found = self.verdict(endpoint)
        return found.open, found.cooldown_remaining_ms


class BreakerBoard(BreakerFold):
    """A BreakerFold fed by a thread that follows breakers.events from the beginning."""

    def __init__(
        self,
        bootstrap_servers: str,
        codec: MessageCodec | None = None,
        clock: Clock | None = None,
        *,
        client_id: str = "tenure-breaker-board",
        forced_open_retry_ms: int = FORCED_OPEN_RETRY_MS,
    ) -> None:
        super().__init__(clock, forced_open_retry_ms)
        self._feed = TopicFeed(
            bootstrap_servers,
            BREAKERS_EVENTS.name,
            BREAKER_EVENT_TYPES,
            self.apply,
            what="breaker",
            client_id=client_id,
            codec=codec,
        )

    def wait_until_current(self, timeout_s: float = 30.0) -> bool:
        """True once everything on the log at start-up is folded (then verdicts are the fleet's)."""
        return self._feed.wait_until_current(timeout_s)

    def health(self) -> FollowerHealth:
        return self._feed.health(f"{len(self.states())} breakers")

    def close(self) -> None:
        self._feed.close()
