"""The breaker's deployment policy (TENURE_BREAKER_*) and what counts as a failure (BRK-1).

Everything `decide` needs to know about the deployment comes in as a `BreakerPolicy` value; what
it decided with (W, the classification of each outcome, the cooldown) is recorded in the
events, so a replay never depends on today's settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from services.common.contracts.breakers import SLOW, SUCCESS, TRANSPORT_FAILURE

__all__ = ["BOUNDS", "DEFAULT_POLICY", "BreakerPolicy", "is_failure", "out_of_bounds", "outcome_for_status"]


@dataclass(frozen=True)
class BreakerPolicy:
    """window:          W, the outcomes the ring keeps (>= 20, BRK-1).
    min_calls:       outcomes in the ring before its error rate counts.
    failure_rate:    tau_fail: a rate strictly above it opens the breaker (0.5-0.7).
    cooldown_ms:     T_cooldown after the breaker opens (the spec's 30-120 s).
    cooldown_max_ms: T_cooldown_max: a failed canary re-opens with min(2 * T, this).
    slow_call_ms:    a call at least this slow counts as a failure; 0 = slow calls never do.
    canary_lease_ms: how long the one canary slot is held before it is free again: longer than a
                     tool call's timeout, so a live holder reports before it runs out.
    """

    window: int = 20
    min_calls: int = 10
    failure_rate: float = 0.5
    cooldown_ms: int = 30_000
    cooldown_max_ms: int = 120_000
    slow_call_ms: int = 0
    canary_lease_ms: int = 15_000


DEFAULT_POLICY = BreakerPolicy()
# Inclusive bounds, the same as TenureSettings' (a test checks they agree).
BOUNDS: Mapping[str, tuple[float, float]] = {
    "window": (20, 1000),
    "min_calls": (1, 1000),
    "failure_rate": (0.5, 0.7),
    "cooldown_ms": (500, 600_000),
    "cooldown_max_ms": (500, 3_600_000),
    "slow_call_ms": (0, 600_000),
    "canary_lease_ms": (100, 600_000),
}


def out_of_bounds(policy: BreakerPolicy) -> list[str]:
    """What is wrong with `policy`, for humans; empty when it is usable."""
    problems = []
    for field in fields(BreakerPolicy):
        low, high = BOUNDS[field.name]
        value = getattr(policy, field.name)
        if not low <= value <= high:
            problems.append(f"{field.name}={value} is outside [{low:g}, {high:g}]")
    if policy.min_calls > policy.window:
        problems.append(
            f"min_calls={policy.min_calls} exceeds window={policy.window}: the rate would never count"
        )
    if policy.cooldown_max_ms < policy.cooldown_ms:
        problems.append(f"cooldown_max_ms={policy.cooldown_max_ms} is below cooldown_ms={policy.cooldown_ms}")
    return problems


def is_failure(outcome: str, duration_ms: int, policy: BreakerPolicy) -> bool:
    """Only transport failures count (timeouts, connect errors, 5xx, 429, malformed frames), and
    slow calls when the policy counts them; an application error is a success (BRK-1)."""
    if outcome == TRANSPORT_FAILURE:
        return True
    slow_counts = policy.slow_call_ms > 0
    return slow_counts and (outcome == SLOW or duration_ms >= policy.slow_call_ms)


def outcome_for_status(status: int) -> str:
    """The outcome class of an HTTP answer: 5xx and 429 are the endpoint failing (transport);
    any other status, 404 and 422 included, is the endpoint answering (a success to the breaker).
    Timeouts, connect errors and malformed frames have no status: the caller says TRANSPORT_FAILURE."""
    return TRANSPORT_FAILURE if status >= 500 or status == 429 else SUCCESS
