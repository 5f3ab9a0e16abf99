"""`python -m services.watchdog`: the semantic watchdog's processor (faust worker, WD-1..WD-6).

Consumes progress.observations, writes watchdog.events and watchdog.rejections, and sends every
intervention to the run's trajectory (trajectories.commands) in the same transaction. Settings
(TenureSettings): TENURE_WATCHDOG_HEALTH_PORT (default 8304) and the deployment thresholds
TENURE_WATCHDOG_MAX_PERIOD, _WINDOW, _EPOCH_STEPS, _REPEAT_COUNT, _ROLLBACK_BUDGET,
_LADDER_EPOCH, _POLL_PATIENCE.
"""

from __future__ import annotations

from services.common.clock import SystemClock
from services.common.health import ProcessorMetrics
from services.common.messages import MessageCodec
from services.common.process import ProcessParts, ProcessSpec, serve_aggregate
from services.common.settings import TenureSettings
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


def build(parts: ProcessParts, thresholds: Thresholds) -> WatchdogProcessor:
    return WatchdogProcessor(
        parts.event_log,
        parts.store,
        MessageCodec(),
        SystemClock(),
        thresholds,
        metrics=ProcessorMetrics("watchdog", parts.registry),
    )


def main() -> None:
    settings = TenureSettings()
    thresholds = deployment_thresholds(settings)  # bad thresholds stop it before anything starts
    spec = ProcessSpec(
        app_id=APP_ID,
        health_port=settings.watchdog_health_port,
        state_name="watchdog",
        store_name="watchdogs",
        commands=PROGRESS_OBSERVATIONS,
        tick_interval_s=1.0,  # no timers: the tick only restores partitions not yet restored
    )
    serve_aggregate(spec, lambda parts: build(parts, thresholds), settings=settings)


if __name__ == "__main__":
    main()
