"""`python -m services.lease_coordinator`: the Run command processor as a faust worker."""

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
from services.common.policy import BlockList
from services.common.settings import TenureSettings
from services.common.store import RocksStore
from services.common.streams import CommandStream, StreamSettings
from services.common.topics import RUNS_COMMANDS
from services.lease_coordinator.domain import LeasePolicy
from services.lease_coordinator.processor import RunCommandProcessor

APP_ID = "tenure-lease-coordinator"


def main() -> None:
    settings = TenureSettings()
    configure_logging(settings.log_level, service=APP_ID)
    registry, readiness = metrics_registry(), DeferredReadiness()
    serve_health(APP_ID, settings.coordinator_health_port, readiness, registry, settings.api_host)
    bootstrap = settings.bootstrap_servers()
    home = settings.state_dir / f"lease_coordinator-{settings.instance_id}"
    store = RocksStore(home / "runs")
    # Initialising the transactional writer fences a previous incarnation before any restore.
    event_log = KafkaEventLog(bootstrap, transactional_id=f"{APP_ID}-{settings.instance_id}")
    policy = LeasePolicy(
        default_lease_ms=settings.lease_seconds * 1000,
        default_heartbeat_ms=settings.heartbeat_seconds * 1000,
        at_risk_fraction=settings.lease_at_risk_fraction,
        stop_grace_ms=int(settings.stop_grace_seconds * 1000),
        auto_retry=settings.auto_retry,
        max_queued_per_tenant=settings.max_queued_per_tenant,
        max_active_per_tenant=settings.max_active_per_tenant,
        tenant_limits=settings.parsed_tenant_limits(),
    )
    blocks = BlockList(bootstrap, client_id=f"{APP_ID}-policy")
    blocks.wait_until_current()
    processor = RunCommandProcessor(
        event_log,
        store,
        MessageCodec(),
        SystemClock(),
        policy,
        blocks.blocked,
        ProcessorMetrics("run", registry),
    )
    stream = CommandStream(
        StreamSettings(
            app_id=APP_ID,
            bootstrap_servers=bootstrap,
            topic=RUNS_COMMANDS.name,
            partitions=RUNS_COMMANDS.partitions,
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
