"""`python -m services.quarantine`: the quarantine processor and its executor (QUA-1, QUA-2).

Consumes quarantine.commands (runs' quarantines and tenants' provenance graphs), writes
quarantine.events and quarantine.rejections, and sends the control plane's stages in the same
transactions (the lease takeover, the trajectory's freeze, the taint). Settings
(TenureSettings): TENURE_QUARANTINE_HEALTH_PORT (default 8306), TENURE_GATEWAY_URL (whose fencing
confirms stage 2), TENURE_TOOLS (the recipients fenced with the new epoch), TENURE_SERVICE_KEY.
"""

from __future__ import annotations

from services.common.clock import SystemClock
from services.common.health import ProcessorMetrics
from services.common.kafka import CommandPublisher
from services.common.messages import MessageCodec
from services.common.process import ProcessParts, ProcessSpec, serve_aggregate
from services.common.settings import TenureSettings
from services.common.topics import QUARANTINE_COMMANDS
from services.effect_gateway.tools import parse_tools
from services.quarantine.executor import RevocationExecutor
from services.quarantine.processor import QuarantineProcessor

APP_ID = "tenure-quarantine"


def build(parts: ProcessParts) -> QuarantineProcessor:
    settings = parts.settings
    codec = MessageCodec()
    clock = SystemClock()
    executor = RevocationExecutor(
        settings.gateway_url,
        parse_tools(settings.tools),
        CommandPublisher(parts.bootstrap, client_id=f"{APP_ID}-executor"),
        codec,
        clock,
        service_key=settings.service_key or None,
    )
    return QuarantineProcessor(
        parts.event_log,
        parts.store,
        codec,
        clock,
        on_changed=executor.schedule,
        metrics=ProcessorMetrics("quarantine", parts.registry),
    )


def main() -> None:
    settings = TenureSettings()
    spec = ProcessSpec(
        app_id=APP_ID,
        health_port=settings.quarantine_health_port,
        state_name="quarantine",
        store_name="quarantine",
        commands=QUARANTINE_COMMANDS,
        # The tick hands every quarantine still owing stage 2 to the executor again.
        tick_interval_s=1.0,
    )
    serve_aggregate(spec, build, settings=settings, on_tick=lambda processor: processor.rescan)


if __name__ == "__main__":
    main()
