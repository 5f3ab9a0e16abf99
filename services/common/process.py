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

Several instances of one processor (issue 16) share its consumer group. Each needs an identity
of its own, TENURE_INSTANCE_ID: it names the static member (`group.instance.id`), the
transactional id and the state folder, so two live processes with one id would fence each other
in turn. It is validated here (`instance_identity`), and a second process with the id of one
already running on the same state dir stops at once (the RocksDB lock is held) with a message
that says so. A numeric id n moves the health port by n * TENURE_INSTANCE_PORT_STRIDE
(`instance_health_port`), so `tenure up --instances 3` runs three coordinators on one machine
while instance 0 keeps the default port.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from services.common.aggregate import AggregateProcessor
from services.common.eventlog import KafkaEventLog
from services.common.health import DeferredReadiness, StreamMetrics, metrics_registry, serve_health
from services.common.heap import freeze_startup_heap
from services.common.kafka import committed_offsets, resource_prefix
from services.common.logs import configure_logging
from services.common.settings import TenureSettings
from services.common.store import RocksStore
from services.common.streams import CommandStream, StreamSettings
from services.common.topics import TopicSpec

__all__ = [
    "InstanceIdInvalid",
    "ProcessParts",
    "ProcessSpec",
    "instance_health_port",
    "instance_identity",
    "serve_aggregate",
]

# Kafka accepts more in a group.instance.id or transactional.id; this is what also names a
# folder safely and reads well in a log line.
_INSTANCE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class InstanceIdInvalid(ValueError):
    """TENURE_INSTANCE_ID cannot name a consumer-group member, a transactional id and a folder."""


def instance_identity(instance_id: str) -> str:
    """The instance id, checked: 1-64 of letters, digits, '.', '_' and '-', starting with a letter
    or digit (it becomes part of `group.instance.id`, `transactional.id` and a folder name)."""
    if not _INSTANCE_ID.fullmatch(instance_id):
        raise InstanceIdInvalid(
            f"TENURE_INSTANCE_ID {instance_id[:80]!r} must be 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return instance_id


def instance_health_port(base_port: int, instance_id: str, stride: int) -> int:
    """The health port of instance `instance_id`: `base_port` + n * `stride` for a numeric id n
    (0 stays 0 = off; a non-numeric id, e.g. a container's hostname, keeps `base_port`)."""
    if base_port == 0 or not instance_id.isdigit():
        return base_port
    port = base_port + int(instance_id) * stride
    if port > 65535:
        raise InstanceIdInvalid(
            f"instance {instance_id} would serve health on port {port} (base {base_port} + "
            f"{instance_id} x TENURE_INSTANCE_PORT_STRIDE {stride}); lower the stride or the id"
        )
    return port


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
    instance = instance_identity(settings.instance_id)
    registry, readiness = metrics_registry(), DeferredReadiness()
    port = instance_health_port(spec.health_port, instance, settings.instance_port_stride)
    serve_health(spec.app_id, port, readiness, registry, settings.api_host)
    bootstrap = settings.bootstrap_servers()
    home = settings.state_dir / f"{spec.state_name}-{instance}"
    store = _open_store(home / spec.store_name, spec.app_id, instance)
    event_log = KafkaEventLog(bootstrap, transactional_id=f"{spec.app_id}-{instance}")
    processor = build(ProcessParts(settings, bootstrap, home, store, event_log, registry))
    stream = CommandStream(
        StreamSettings(
            app_id=spec.app_id,
            bootstrap_servers=bootstrap,
            topic=spec.commands.name,
            partitions=spec.commands.partitions,
            instance_id=instance,
            data_dir=home / "faust",
            session_timeout_s=settings.session_timeout_s,
            batch_window_s=settings.batch_window_ms / 1000,
            batch_max_bytes=settings.batch_max_bytes,
            framework_log_level=settings.framework_log_level,
            tick_interval_s=spec.tick_interval_s,
        ),
        handler=processor.handle,
        on_revoked=processor.forget_assignment,
        on_assigned=processor.restore_partitions,
        on_tick=on_tick(processor) if on_tick is not None else processor.tick,
        restored=processor.restored_partitions,
        # The group faust joins: prefixed like the topics (services/common/streams/_runtime.py).
        committed=lambda owned: committed_offsets(
            bootstrap, resource_prefix() + spec.app_id, spec.commands.name, owned
        ),
        metrics=StreamMetrics(spec.app_id, registry),
    )
    # With TENURE_GROUP_FENCE, every transaction carries the generation of its assignment (issue 16).
    if settings.group_fence:
        event_log.fence = stream.group_fence
        stream.fence_required = True  # and timer work waits until it can be fenced
    readiness.become(stream.checks)
    freeze_startup_heap(settings.collector_schedule())
    stream.run()


def _open_store(path: Path, app_id: str, instance: str) -> RocksStore:
    """The instance's store; a second process with the same instance id on this state dir is
    told so and exits (2) instead of fencing the live one in a restart loop."""
    try:
        return RocksStore(path)
    except Exception as exc:
        if "lock" not in str(exc).lower():
            raise
        print(
            f"{app_id}: instance {instance!r} already runs on this state dir (its store {path} is "
            "locked); give every instance its own TENURE_INSTANCE_ID",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(2) from exc
