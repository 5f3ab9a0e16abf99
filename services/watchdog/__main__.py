"""`python -m services.watchdog`: the semantic watchdog's processor (faust worker, WD-1..WD-6).

Consumes progress.observations, writes watchdog.events and watchdog.rejections, and sends every
intervention to the run's trajectory (trajectories.commands) in the same transaction. Settings
(TenureSettings): TENURE_WATCHDOG_HEALTH_PORT (default 8304) and the deployment thresholds
TENURE_WATCHDOG_MAX_PERIOD, _WINDOW, _EPOCH_STEPS, _REPEAT_COUNT, _ROLLBACK_BUDGET,
_LADDER_EPOCH, _POLL_PATIENCE.
"""

from __future__ import annotations

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
from services.common.topics import PROGRESS_OBSERVATIONS
from services.watchdog.domain import Thresholds, out_of_bounds
from services.watchdog.processor import WatchdogProcessor

APP_ID = "tenure-watchdog"


def deployment_thresholds(settings: TenureSettings) -> Thresholds:
    thresholds = Thresholds(
        max_period=settings.watchdog_max_period,
        window=settings.watchdog_window,
        epoch_steps=settings.watchdog_epoch_steps,
        repeat_count=settings.watchdog_repeat_count,
        rollback_budget=settings.watchdog_rollback_budget,
        ladder_epoch=settings.watchdog_ladder_epoch,
        poll_patience=settings.watchdog_poll_patience,
    )
    problems = out_of_bounds(thresholds)
    if problems:
        # Each value is bounded by its setting already; what is left is how they combine.
        raise SystemExit("TENURE_WATCHDOG_* thresholds: " + "; ".join(problems))
    return thresholds


def main() -> None:
    settings = TenureSettings()
    configure_logging(settings.log_level, service=APP_ID)
    thresholds = deployment_thresholds(settings)
    registry, readiness = metrics_registry(), DeferredReadiness()
    serve_health(APP_ID, settings.watchdog_health_port, readiness, registry, settings.api_host)
    bootstrap = settings.bootstrap_servers()
    home = settings.state_dir / f"watchdog-{settings.instance_id}"
    store = RocksStore(home / "watchdogs")
    # Initialising the transactional writer fences a previous incarnation before any restore.
    event_log = KafkaEventLog(bootstrap, transactional_id=f"{APP_ID}-{settings.instance_id}")
    processor = WatchdogProcessor(
        event_log,
        store,
        MessageCodec(),
        SystemClock(),
        thresholds,
        metrics=ProcessorMetrics("watchdog", registry),
    )
    stream = CommandStream(
        StreamSettings(
            app_id=APP_ID,
            bootstrap_servers=bootstrap,
            topic=PROGRESS_OBSERVATIONS.name,
            partitions=PROGRESS_OBSERVATIONS.partitions,
            instance_id=settings.instance_id,
            data_dir=home / "faust",
            session_timeout_s=settings.session_timeout_s,
            framework_log_level=settings.framework_log_level,
            tick_interval_s=1.0,  # no timers: the tick only restores partitions not yet restored
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
