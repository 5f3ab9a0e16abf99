"""`python -m services.breakers`: the circuit breakers' processor (faust worker, BRK-1, BRK-2).

Consumes breakers.commands, writes breakers.events and breakers.rejections, and decides the
breakers' timers (cooldowns, canary leases) every TENURE_TIMER_INTERVAL_S. Settings
(TenureSettings): TENURE_BREAKERS_HEALTH_PORT (default 8305) and the policy TENURE_BREAKER_WINDOW,
_MIN_CALLS, _FAILURE_RATE, _COOLDOWN_MS, _COOLDOWN_MAX_MS, _SLOW_CALL_MS, _CANARY_LEASE_MS.
"""

from __future__ import annotations

from services.breakers.domain import BreakerPolicy, out_of_bounds
from services.breakers.processor import BreakerProcessor
from services.common.clock import SystemClock
from services.common.health import ProcessorMetrics
from services.common.messages import MessageCodec
from services.common.process import ProcessParts, ProcessSpec, serve_aggregate
from services.common.settings import TenureSettings
from services.common.topics import BREAKERS_COMMANDS

APP_ID = "tenure-breakers"


def deployment_policy(settings: TenureSettings) -> BreakerPolicy:
    policy = BreakerPolicy(
        window=settings.breaker_window,
        min_calls=settings.breaker_min_calls,
        failure_rate=settings.breaker_failure_rate,
        cooldown_ms=settings.breaker_cooldown_ms,
        cooldown_max_ms=settings.breaker_cooldown_max_ms,
        slow_call_ms=settings.breaker_slow_call_ms,
        canary_lease_ms=settings.breaker_canary_lease_ms,
    )
    problems = out_of_bounds(policy)
    if problems:
        # Each value is bounded by its setting already; what is left is how they combine.
        raise SystemExit("TENURE_BREAKER_* settings: " + "; ".join(problems))
    return policy


def build(parts: ProcessParts, policy: BreakerPolicy) -> BreakerProcessor:
    return BreakerProcessor(
        parts.event_log,
        parts.store,
        MessageCodec(),
        SystemClock(),
        policy,
        metrics=ProcessorMetrics("breaker", parts.registry),
    )


def main() -> None:
    settings = TenureSettings()
    policy = deployment_policy(settings)  # bad settings stop it before anything starts
    spec = ProcessSpec(
        app_id=APP_ID,
        health_port=settings.breakers_health_port,
        state_name="breakers",
        store_name="breakers",
        commands=BREAKERS_COMMANDS,
        tick_interval_s=settings.timer_interval_s,
    )
    serve_aggregate(spec, lambda parts: build(parts, policy), settings=settings)


if __name__ == "__main__":
    main()
