"""`python -m services.schedules`: the schedules processor (faust worker, EXE-14).

Consumes schedules.commands, writes schedules.events and schedules.rejections (and, in the same
transactions, the SubmitRun of every firing to runs.commands), decides the firings every
TENURE_TIMER_INTERVAL_S, and follows runs.events/runs.rejections for the runs it started.
Settings (TenureSettings): TENURE_SCHEDULES_HEALTH_PORT (default 8307) and, for tests and
drills only, TENURE_SCHEDULES_CLOCK_OFFSET_FILE.
"""

from __future__ import annotations

from services.common.clock import Clock, SystemClock
from services.common.health import ProcessorMetrics
from services.common.messages import MessageCodec
from services.common.process import ProcessParts, ProcessSpec, serve_aggregate
from services.common.settings import TenureSettings
from services.common.topics import SCHEDULES_COMMANDS
from services.schedules.clock import OffsetFileClock
from services.schedules.follower import RunFollower
from services.schedules.processor import ScheduleProcessor

__all__ = ["APP_ID", "build", "main"]

APP_ID = "tenure-schedules"


def build(parts: ProcessParts) -> ScheduleProcessor:
    offset_file = parts.settings.schedules_clock_offset_file
    clock: Clock = OffsetFileClock(offset_file) if offset_file is not None else SystemClock()
    processor = ScheduleProcessor(
        parts.event_log,
        parts.store,
        MessageCodec(),
        clock,
        metrics=ProcessorMetrics("schedule", parts.registry),
    )
    RunFollower(parts.bootstrap, parts.store, clock.now_ms).start()
    return processor


def main() -> None:
    settings = TenureSettings()
    spec = ProcessSpec(
        app_id=APP_ID,
        health_port=settings.schedules_health_port,
        state_name="schedules",
        store_name="schedules",
        commands=SCHEDULES_COMMANDS,
        tick_interval_s=settings.timer_interval_s,
    )
    serve_aggregate(spec, build, settings=settings)


if __name__ == "__main__":
    main()
