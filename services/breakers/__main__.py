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
from services.common.eventlog import KafkaEventLog
from services.common.health import (
    DeferredReadiness,
    ProcessorMetrics,
    StreamMetrics,
    metrics_registry,
    serve_health,
)
from services.common.logs import configure_logging
from services.common.messages import MessageCodec
from services.common.settings import TenureSettings
from services.common.store import RocksStore
from services.common.streams import CommandStream, StreamSettings
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


def main() -> None:
    settings = TenureSettings()
    configure_logging(settings.log_level, service=APP_ID)
    policy = deployment_policy(settings)
    registry, readiness = metrics_registry(), DeferredReadiness()
    serve_health(APP_ID, settings.breakers_health_port, readiness, registry, settings.api_host)
    bootstrap = settings.bootstrap_servers()
    home = settings.state_dir / f"breakers-{settings.instance_id}"
    store = RocksStore(home / "breakers")
    # Initialising the transactional writer fences a previous incarnation before any restore.
    event_log = KafkaEventLog(bootstrap, transactional_id=f"{APP_ID}-{settings.instance_id}")
    processor = BreakerProcessor(
        event_log,
        store,
        MessageCodec(),
        SystemClock(),
        policy,
        metrics=ProcessorMetrics("breaker", registry),
    )
    stream = CommandStream(
        StreamSettings(
            app_id=APP_ID,
            bootstrap_servers=bootstrap,
            topic=BREAKERS_COMMANDS.name,
            partitions=BREAKERS_COMMANDS.partitions,
            instance_id=settings.instance_id,
            data_dir=home / "faust",
            session_timeout_s=settings.session_timeout_s,
            framework_log_level=settings.framework_log_level,
            tick_interval_s=settings.timer_interval_s,
        ),
        handler=processor.handle,
        on_revoked=processor.forget_assignment,
        on_assigned=processor.restore_partitions,
        on_tick=processor.tick,
        restored=processor.restored_partitions,
        metrics=StreamMetrics(APP_ID, registry),
    )
    readiness.become(stream.checks)
    stream.run()


if __name__ == "__main__":
    main()
