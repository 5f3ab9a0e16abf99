"""The one backoff function of Tenure: full jitter (BRK-3). It lives in the runner SDK so that the
SDK's own distribution (sdk/, tenure-sdk) carries it; services.common.backoff re-exports it.

wait = uniform(0, min(cap, base * 2**attempt)). Every retry loop uses it: on the I/O side with a
random draw (`Backoff`), in the pure core with a draw derived from the cause, so that replaying
the log reproduces the same wait. Deterministic exponential backoff synchronises clients that
fail together (a thundering herd); full jitter spreads them (AWS Architecture Blog, "Exponential
Backoff And Jitter").
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

__all__ = ["Backoff", "full_jitter_ms", "full_jitter_s"]


def full_jitter_s(attempt: int, base_s: float, cap_s: float, unit_random: float) -> float:
    """Seconds to wait before retry number `attempt` (0-based); `unit_random` is a draw in [0, 1)."""
    if attempt < 0 or base_s < 0 or cap_s < 0:
        raise ValueError(f"attempt, base and cap must not be negative (got {attempt}, {base_s}, {cap_s})")
    if not 0.0 <= unit_random < 1.0:
        raise ValueError(f"unit_random must be in [0, 1), got {unit_random}")
    # 2**attempt overflows a float past ~1024; with any base > 0 the cap is reached long before.
    if base_s == 0:
        ceiling: float = 0
    elif attempt >= 64:
        ceiling = cap_s
    else:
        ceiling = min(cap_s, base_s * 2**attempt)
    return unit_random * ceiling


def full_jitter_ms(attempt: int, base_ms: int, cap_ms: int, unit_random: float) -> int:
    """The same in whole milliseconds, for events (REC-2: t_wait ~ U(0, min(cap, 2^k * base)))."""
    return math.floor(full_jitter_s(attempt, base_ms, cap_ms, unit_random))


class Backoff:
    """A retry loop's state: `next_delay()` grows the ceiling, `reset()` after a success.

    Not thread-safe; one per loop. `draw` is injectable so tests can pin the jitter.
    """

    def __init__(
        self, base_s: float = 0.1, cap_s: float = 10.0, draw: Callable[[], float] = random.random
    ) -> None:
        if base_s <= 0 or cap_s < base_s:
            raise ValueError(f"need 0 < base_s <= cap_s, got {base_s}, {cap_s}")
        self.base_s = base_s
        self.cap_s = cap_s
        self._draw = draw
        self.attempt = 0

    def next_delay(self) -> float:
        delay = full_jitter_s(self.attempt, self.base_s, self.cap_s, self._draw())
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0
