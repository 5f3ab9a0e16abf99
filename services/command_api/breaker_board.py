"""The breakers as the API shows them: the fleet's BreakerBoard, plus each breaker's recent events.

The state of each breaker is the BreakerFold's (folded with the breaker's own `evolve`: one fold
per aggregate, none written here). What the fold does not keep is the history a person asks
for: how the breaker got where it is, with the evidence. `BreakerHistoryFold` remembers the last
MAX_TRANSITIONS events of each breaker that are not call outcomes (openings with their window,
half-openings, canary grants and expiries, closings, re-openings, operators' actions with their
reason), exactly as they were folded, and the W of the last outcome recorded (the state keeps
the ring, not its size). `ApiBreakerBoard` is the same fed from Kafka (services.breakers.view).

`configured_bulkheads`: the effect gateway's bulkheads (BRK-4) as this deployment's settings
configure them, for GET /bulkheads (their live occupancy is the gateway's own).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from services.breakers.domain import BreakerState
from services.breakers.view import FORCED_OPEN_RETRY_MS, BreakerBoard, BreakerFold
from services.common.bulkhead import Bulkheads, parse_tool_rules
from services.common.clock import Clock
from services.common.contracts import BreakerEvent, CallOutcomeRecorded
from services.common.decisions import FollowerHealth
from services.common.settings import TenureSettings

__all__ = ["MAX_TRANSITIONS", "ApiBreakerBoard", "BreakerHistoryFold", "configured_bulkheads"]

MAX_TRANSITIONS = 50


class BreakerHistoryFold(BreakerFold):
    """A BreakerFold that also remembers each breaker's recent transitions (fed by `apply`)."""

    def __init__(
        self,
        clock: Clock | None = None,
        forced_open_retry_ms: int = FORCED_OPEN_RETRY_MS,
        *,
        keep: int = MAX_TRANSITIONS,
    ) -> None:
        super().__init__(clock, forced_open_retry_ms)
        self._keep = keep
        self._history_lock = threading.Lock()
        self._history: dict[str, deque[BreakerEvent]] = {}
        self._window_sizes: dict[str, int] = {}

    def apply(self, event: BreakerEvent) -> BreakerState | None:
        after = super().apply(event)
        if after is None:
            return None  # a repeat, or an event this reader could not fold: not history
        with self._history_lock:
            if isinstance(event, CallOutcomeRecorded):
                self._window_sizes[event.run_id] = event.window_size
            else:
                self._history.setdefault(event.run_id, deque(maxlen=self._keep)).append(event)
        return after

    def transitions(self, endpoint: str) -> list[BreakerEvent]:
        """The breaker's recent events other than outcomes, oldest first."""
        with self._history_lock:
            return list(self._history.get(endpoint, ()))

    def window_size(self, endpoint: str) -> int | None:
        """W as the last recorded outcome of `endpoint` carried it (None: none seen)."""
        with self._history_lock:
            return self._window_sizes.get(endpoint)

    # A fold fed by hand (tests) is always current; ApiBreakerBoard follows Kafka.
    def wait_until_current(self, timeout_s: float = 30.0) -> bool:
        return True

    def health(self) -> FollowerHealth:
        return FollowerHealth(True, f"folded in memory: {len(self.states())} breakers")

    def close(self) -> None:
        """Nothing to stop."""


class ApiBreakerBoard(BreakerBoard, BreakerHistoryFold):
    """The BreakerBoard (a thread following breakers.events) with the history above.

    Method order: BreakerBoard's `wait_until_current`, `health` and `close`, then
    BreakerHistoryFold's `apply`, then BreakerFold's; BreakerBoard's constructor reaches
    BreakerHistoryFold's before its thread starts folding."""


def configured_bulkheads(settings: TenureSettings) -> dict[str, Any] | str:
    """The gateway's bulkheads as the settings configure them (GET /bulkheads), or why they
    cannot be: a wrong TENURE_BULKHEAD_* stops the gateway, not the API."""
    try:
        bulkheads = Bulkheads.from_settings(settings)
        rules = parse_tool_rules(settings.bulkhead_tools)
    except ValueError as exc:
        return str(exc)
    limits = ("pool", "domain", "concurrency", "queue", "timeoutMs")
    return {
        "defaultDomain": bulkheads.default_domain.value,
        "pools": [{k: pool[k] for k in limits} for pool in bulkheads.snapshot()],
        "tools": [
            {"tool": tool, "domain": rule.domain.value, "pool": bulkheads.pool_for(tool).name}
            for tool, rule in sorted(rules.items())
        ],
        "connectionLimit": bulkheads.connection_limit(),
    }
