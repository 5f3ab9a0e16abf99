"""`python -m services.lease_coordinator`: the Run command processor as a faust worker."""

from __future__ import annotations

from services.common.clock import SystemClock
from services.common.health import ProcessorMetrics
from services.common.messages import MessageCodec
from services.common.policy import BlockList
from services.common.process import ProcessParts, ProcessSpec, serve_aggregate
from services.common.settings import TenureSettings
from services.common.topics import RUNS_COMMANDS
from services.lease_coordinator.domain import LeasePolicy
from services.lease_coordinator.processor import RunCommandProcessor

APP_ID = "tenure-lease-coordinator"


def lease_policy(settings: TenureSettings) -> LeasePolicy:
    return LeasePolicy(
        default_lease_ms=settings.lease_seconds * 1000,
        default_heartbeat_ms=settings.heartbeat_seconds * 1000,
        at_risk_fraction=settings.lease_at_risk_fraction,
        keepalive_fraction=settings.lease_keepalive_fraction,
        stop_grace_ms=int(settings.stop_grace_seconds * 1000),
        auto_retry=settings.auto_retry,
        max_queued_per_tenant=settings.max_queued_per_tenant,
        max_active_per_tenant=settings.max_active_per_tenant,
        tenant_limits=settings.parsed_tenant_limits(),
    )


def build(parts: ProcessParts) -> RunCommandProcessor:
    blocks = BlockList(parts.bootstrap, client_id=f"{APP_ID}-policy")
    blocks.wait_until_current()
    return RunCommandProcessor(
        parts.event_log,
        parts.store,
        MessageCodec(),
        SystemClock(),
        lease_policy(parts.settings),
        blocks.blocked,
        ProcessorMetrics("run", parts.registry),
        changelog_every_ms=parts.settings.changelog_every_ms,
    )


def main() -> None:
    settings = TenureSettings()
    spec = ProcessSpec(
        app_id=APP_ID,
        health_port=settings.coordinator_health_port,
        state_name="lease_coordinator",
        store_name="runs",
        commands=RUNS_COMMANDS,
        tick_interval_s=settings.timer_interval_s,
    )
    serve_aggregate(spec, build, settings=settings)


if __name__ == "__main__":
    main()
