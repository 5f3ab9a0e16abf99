"""`python -m services.saga_orchestrator`: the trajectory processor and its executor (faust worker).

Settings (TenureSettings): TENURE_GATEWAY_URL (the effect gateway, default
http://127.0.0.1:8200), TENURE_TOOL_CATALOG (the tool registrations, default the reference tools
of services/sim_environment/tools.json), TENURE_SAGA_WORKERS (concurrent effects, default 16),
TENURE_SERVICE_KEY (the key the executor presents to the gateway: a principal with the service
role in TENURE_API_KEYS).
"""

from __future__ import annotations

import logging

from services.common.clock import SystemClock
from services.common.eventlog import KafkaEventLog
from services.common.health import (
    DeferredReadiness,
    ProcessorMetrics,
    StreamMetrics,
    metrics_registry,
    serve_health,
)
from services.common.kafka import CommandPublisher
from services.common.logs import configure_logging
from services.common.messages import MessageCodec
from services.common.settings import TenureSettings, repo_root
from services.common.store import RocksStore
from services.common.streams import CommandStream, StreamSettings
from services.common.topics import TRAJECTORIES_COMMANDS
from services.saga_orchestrator.domain import load_catalog
from services.saga_orchestrator.executor import SagaExecutor
from services.saga_orchestrator.processor import TrajectoryProcessor

APP_ID = "tenure-saga-orchestrator"
DEFAULT_CATALOG = repo_root() / "services" / "sim_environment" / "tools.json"


def main() -> None:
    settings = TenureSettings()
    configure_logging(settings.log_level, service=APP_ID)
    if settings.api_keys and not settings.service_key:
        # The gateway authenticates every effect: without a service key every step would wait.
        logging.getLogger("tenure.saga_orchestrator").warning(
            "TENURE_API_KEYS is set but TENURE_SERVICE_KEY is not: the effect gateway will refuse "
            "the executor; set it to a key of a principal with the service role"
        )
    registry, readiness = metrics_registry(), DeferredReadiness()
    serve_health(APP_ID, settings.saga_health_port, readiness, registry, settings.api_host)
    bootstrap = settings.bootstrap_servers()
    home = settings.state_dir / f"saga_orchestrator-{settings.instance_id}"
    catalog = load_catalog(settings.tool_catalog or DEFAULT_CATALOG)
    codec = MessageCodec()
    clock = SystemClock()
    executor = SagaExecutor(
        settings.gateway_url,
        CommandPublisher(bootstrap, client_id=f"{APP_ID}-executor"),
        codec,
        catalog,
        clock,
        workers=settings.saga_workers,
        service_key=settings.service_key or None,
    )
    store = RocksStore(home / "trajectories")
    # Initialising the transactional writer fences a previous incarnation before any restore.
    event_log = KafkaEventLog(bootstrap, transactional_id=f"{APP_ID}-{settings.instance_id}")
    processor = TrajectoryProcessor(
        event_log,
        store,
        codec,
        clock,
        catalog,
        on_changed=executor.schedule,
        metrics=ProcessorMetrics("trajectory", registry),
    )
    stream = CommandStream(
        StreamSettings(
            app_id=APP_ID,
            bootstrap_servers=bootstrap,
            topic=TRAJECTORIES_COMMANDS.name,
            partitions=TRAJECTORIES_COMMANDS.partitions,
            instance_id=settings.instance_id,
            data_dir=home / "faust",
            session_timeout_s=settings.session_timeout_s,
            framework_log_level=settings.framework_log_level,
            tick_interval_s=1.0,
        ),
        handler=processor.handle,
        on_revoked=processor.forget_assignment,
        on_assigned=processor.restore_partitions,
        on_tick=processor.rescan,
        restored=processor.restored_partitions,
        metrics=StreamMetrics(APP_ID, registry),
    )
    readiness.become(stream.checks)
    stream.run()


if __name__ == "__main__":
    main()
