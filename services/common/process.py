"""The process around an aggregate: one launcher for every `python -m services.<processor>`.

Every aggregate's process is the same machine around a different definition, in this order:
  1. logging (JSON, with the service's name) and the one settings source;
  2. the health server (/healthz, /readyz, /metrics), up before anything slow, so a supervisor
     sees a live process that is not ready yet;
  3. the state folder `<state dir>/<name>-<instance>` and its RocksDB store;
  4. the transactional event log, whose initialisation fences a previous incarnation before
     any restore reads the log;
  5. the processor, built by the aggregate's own `build` (its policy, its collaborators);
  6. the faust stream over the aggregate's command topic, handing batches, assignments and
     ticks to the processor; readiness becomes the stream's checks.
The runtime itself (services/common/aggregate) knows only ports; this module is where the real
adapters are plugged into it, once for all aggregates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from services.common.aggregate import AggregateProcessor
from services.common.eventlog import KafkaEventLog
from services.common.health import DeferredReadiness, StreamMetrics, metrics_registry, serve_health
from services.common.logs import configure_logging
from services.common.settings import TenureSettings
from services.common.store import RocksStore
from services.common.streams import CommandStream, StreamSettings
from services.common.topics import TopicSpec

__all__ = ["ProcessParts", "ProcessSpec", "serve_aggregate"]

P = TypeVar("P", bound=AggregateProcessor[Any, Any, Any, Any])


@dataclass(frozen=True)
class ProcessSpec:
    """What differs between the aggregates' processes."""

    app_id: str  # the consumer group, the transactional id's prefix, the log's service field
    health_port: int
    state_name: str  # the state folder is <state dir>/<state_name>-<instance id>
    store_name: str  # the RocksDB folder inside it
    commands: TopicSpec
    tick_interval_s: float


@dataclass(frozen=True)
class ProcessParts:
    """What `build` gets to make its processor from."""

    settings: TenureSettings
    bootstrap: str
    home: Path
    store: RocksStore
    event_log: KafkaEventLog
    registry: CollectorRegistry


def serve_aggregate(
    spec: ProcessSpec,
    build: Callable[[ProcessParts], P],
    *,
    settings: TenureSettings | None = None,
    on_tick: Callable[[P], Callable[[], object]] | None = None,
) -> None:
    """Run the aggregate's process in the foreground until SIGTERM/SIGINT (steps 1-6 above).

    `on_tick` picks what the stream's timer calls (default: the processor's `tick`, which
    decides due timers and restores partitions not yet restored)."""
    settings = settings or TenureSettings()
    configure_logging(settings.log_level, service=spec.app_id)
    registry, readiness = metrics_registry(), DeferredReadiness()
    serve_health(spec.app_id, spec.health_port, readiness, registry, settings.api_host)
    bootstrap = settings.bootstrap_servers()
    home = settings.state_dir / f"{spec.state_name}-{settings.instance_id}"
    store = RocksStore(home / spec.store_name)
    event_log = KafkaEventLog(bootstrap, transactional_id=f"{spec.app_id}-{settings.instance_id}")
    processor = build(ProcessParts(settings, bootstrap, home, store, event_log, registry))
    stream = CommandStream(
        StreamSettings(
            app_id=spec.app_id,
            bootstrap_servers=bootstrap,
            topic=spec.commands.name,
            partitions=spec.commands.partitions,
            instance_id=settings.instance_id,
            data_dir=home / "faust",
            session_timeout_s=settings.session_timeout_s,
            batch_window_s=settings.batch_window_ms / 1000,
            framework_log_level=settings.framework_log_level,
            tick_interval_s=spec.tick_interval_s,
        ),
        handler=processor.handle,
        on_revoked=processor.forget_assignment,
        on_assigned=processor.restore_partitions,
        on_tick=on_tick(processor) if on_tick is not None else processor.tick,
        restored=processor.restored_partitions,
        metrics=StreamMetrics(spec.app_id, registry),
    )
    readiness.become(stream.checks)
    stream.run()
