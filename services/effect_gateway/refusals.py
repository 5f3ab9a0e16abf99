"""The effect gateway's refusals: problems of its catalog (services.effect_gateway.app.CATALOG).

`circuit_open_problem` and `bulkhead_full_problem` turn tool protection's refusals (BRK-2,
BRK-4; services/effect_gateway/protection.py) into the problems a caller gets: nothing was
recorded or sent, and the body says how long to wait and whether to keep the idempotency key.
"""

from __future__ import annotations

import math

from services.common.bulkhead import BulkheadFull
from services.common.problem_json import Problem
from services.effect_gateway.protection import CircuitOpen

__all__ = ["EffectRefused", "bulkhead_full_problem", "circuit_open_problem"]


class EffectRefused(Problem):
    """The gateway's refusals: a problem of its catalog (services.effect_gateway.app.CATALOG)."""


def circuit_open_problem(exc: CircuitOpen, pending_intent: bool = False) -> EffectRefused:
    """BRK-2's synthetic observation as a problem: ERR_CIRCUIT_OPEN, the dependency, the cooldown
    remaining (`retryAfterMs`, and Retry-After in whole seconds). `pendingIntent`: an earlier
    try under this idempotency key is recorded and unsettled, so a retry must keep the key."""
    seconds = max(1, math.ceil(exc.cooldown_remaining_ms / 1000))
    return EffectRefused(
        "circuit-open",
        str(exc),
        headers={"Retry-After": str(seconds)},
        code=exc.code,
        dependency=exc.endpoint,
        breakerStatus=exc.status,
        cooldownRemainingMs=exc.cooldown_remaining_ms,
        retryAfterMs=exc.cooldown_remaining_ms,
        pendingIntent=pending_intent,
        observation=exc.observation(),
    )


def bulkhead_full_problem(exc: BulkheadFull, pending_intent: bool = False) -> EffectRefused:
    """BRK-4: the tool's pool is full; defer (ERR_BULKHEAD_FULL). Nothing was recorded or sent."""
    return EffectRefused(
        "bulkhead-full",
        f"{exc.message} ({exc.tool} in pool {exc.pool}: {exc.why}); nothing was recorded or sent",
        headers={"Retry-After": "1"},
        code=exc.code,
        tool=exc.tool,
        pool=exc.pool,
        domain=exc.domain.value,
        retryAfterMs=0,
        pendingIntent=pending_intent,
        observation=exc.observation(),
    )
