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
from services.common.health import ProcessorMetrics
from services.common.kafka import CommandPublisher
from services.common.messages import MessageCodec
from services.common.process import ProcessParts, ProcessSpec, serve_aggregate
from services.common.settings import TenureSettings, repo_root
from services.common.topics import TRAJECTORIES_COMMANDS
from services.saga_orchestrator.domain import load_catalog
from services.saga_orchestrator.executor import SagaExecutor
from services.saga_orchestrator.processor import TrajectoryProcessor

APP_ID = "tenure-saga-orchestrator"
DEFAULT_CATALOG = repo_root() / "services" / "sim_environment" / "tools.json"


def build(parts: ProcessParts) -> TrajectoryProcessor:
    settings = parts.settings
    if settings.api_keys and not settings.service_key:
        # The gateway authenticates every effect: without a service key every step would wait.
        logging.getLogger("tenure.saga_orchestrator").warning(
            "TENURE_API_KEYS is set but TENURE_SERVICE_KEY is not: the effect gateway will refuse "
            "the executor; set it to a key of a principal with the service role"
        )
    catalog = load_catalog(settings.tool_catalog or DEFAULT_CATALOG)
    codec = MessageCodec()
    clock = SystemClock()
    executor = SagaExecutor(
        settings.gateway_url,
        CommandPublisher(parts.bootstrap, client_id=f"{APP_ID}-executor"),
        codec,
        catalog,
        clock,
        workers=settings.saga_workers,
        service_key=settings.service_key or None,
    )
    return TrajectoryProcessor(
        parts.event_log,
        parts.store,
        codec,
        clock,
        catalog,
        on_changed=executor.schedule,
        metrics=ProcessorMetrics("trajectory", parts.registry),
    )


def main() -> None:
    settings = TenureSettings()
    spec = ProcessSpec(
        app_id=APP_ID,
        health_port=settings.saga_health_port,
        state_name="saga_orchestrator",
        store_name="trajectories",
        commands=TRAJECTORIES_COMMANDS,
        # The tick hands every live trajectory to the executor again (work whose report was lost).
        tick_interval_s=1.0,
    )
    serve_aggregate(spec, build, settings=settings, on_tick=lambda processor: processor.rescan)


if __name__ == "__main__":
    main()
