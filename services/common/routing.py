"""Which partition a run's commands and events belong to.

Runs are routed by the tenant shard at the front of their id (services.common.ids.run_id_for),
not by hashing the whole key: all runs of a tenant share a partition, so one processor sees the
tenant's whole load and can admit or refuse a run atomically with the run itself (EXE-2).
Every producer of run commands must use `command_record`.

Routing is the last gate before Kafka: an id that is not a run id (services.common.ids.is_run_id)
raises `NotARunId`, and a command whose record Kafka would refuse (larger than MAX_RECORD_BYTES)
raises `RecordTooLarge` before it is handed to a producer, so neither is ever published. An HTTP
edge must have refused a malformed id already (the API answers 404 or 422); it answers
`RecordTooLarge` as 413 payload-too-large, a client error, not a retryable outage.

Every record built here carries the current trace context in its headers (`traceparent`,
services/common/tracing.py), so the processor that decides the command continues the trace of
the request that issued it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from services.common.contracts import RenewLease, RenewLeases, RunCommand, TrajectoryCommand, WatchdogCommand
from services.common.contracts.breakers import ENDPOINT_ID_PATTERN, BreakerCommand
from services.common.contracts.schedules import ScheduleCommand
from services.common.ids import is_run_id
from services.common.kafka import OutboundRecord
from services.common.messages import MAX_RECORD_BYTES, MessageCodec, record_bytes
from services.common.poison import RecordTooLarge
from services.common.topics import (
    BREAKERS_COMMANDS,
    PROGRESS_OBSERVATIONS,
    RUNS_COMMANDS,
    SCHEDULES_COMMANDS,
    TRAJECTORIES_COMMANDS,
)
from services.common.tracing import traced_record

__all__ = [
    "NotARunId",
    "NotAnEndpointId",
    "RecordTooLarge",
    "breaker_command_record",
    "command_record",
    "observation_record",
    "partition_for_endpoint",
    "partition_for_run",
    "partition_for_schedule",
    "renewal_batch_records",
    "schedule_command_record",
    "trajectory_command_record",
]


class NotARunId(ValueError):
    """The id handed to routing is not a run id; nothing was published."""


def partition_for_run(run_id: str, partitions: int = RUNS_COMMANDS.partitions) -> int:
    if not is_run_id(run_id):
        raise NotARunId(f"{run_id[:80]!r} is not a run id")
    return int(run_id[4:6], 16) % partitions


def _writable(record: OutboundRecord) -> OutboundRecord:
    record = traced_record(record)  # weighed with its trace headers: they travel with it
    size = record_bytes(record)
    if size > MAX_RECORD_BYTES:
        raise RecordTooLarge(
            f"the {record.topic} command would be a {size}-byte record; "
            f"Kafka takes at most {MAX_RECORD_BYTES}"
        )
    return record


def command_record(codec: MessageCodec, command: RunCommand) -> OutboundRecord:
    partition = partition_for_run(command.run_id)
    return _writable(codec.outbound(RUNS_COMMANDS.name, command.run_id, command, partition))


def renewal_batch_records(
    codec: MessageCodec, commands: Sequence[RenewLease], correlation_id: str
) -> list[tuple[OutboundRecord, tuple[RenewLease, ...]]]:
    """RenewLeases envelopes carrying `commands` (one request's: one issuedAt, one actor), each
    with the commands it carries: one record per partition their runs route to, split further
    only if a record would be too large for Kafka. Order within a partition is kept.

    One record instead of hundreds is what the broker stores and the coordinator consumes; each
    command inside is still decided as itself (services/lease_coordinator/processor.py)."""
    by_partition: dict[int, list[RenewLease]] = {}
    for command in commands:
        by_partition.setdefault(partition_for_run(command.run_id), []).append(command)
    records: list[tuple[OutboundRecord, tuple[RenewLease, ...]]] = []
    for partition, group in sorted(by_partition.items()):
        records.extend(_envelopes(codec, partition, tuple(group), correlation_id))
    return records


def _envelopes(
    codec: MessageCodec, partition: int, batch: tuple[RenewLease, ...], correlation_id: str
) -> list[tuple[OutboundRecord, tuple[RenewLease, ...]]]:
    envelope = RenewLeases.of(f"batch_{batch[0].command_id}", correlation_id, batch)
    try:
        record = _writable(codec.outbound(RUNS_COMMANDS.name, envelope.run_id, envelope, partition))
    except RecordTooLarge:
        if len(batch) == 1:
            raise
        half = len(batch) // 2
        return [
            *_envelopes(codec, partition, batch[:half], correlation_id),
            *_envelopes(codec, partition, batch[half:], correlation_id),
        ]
    return [(record, batch)]


def trajectory_command_record(codec: MessageCodec, command: TrajectoryCommand) -> OutboundRecord:
    """A trajectory lives on its run's partition number, routed the same way."""
    partition = partition_for_run(command.run_id)
    return _writable(codec.outbound(TRAJECTORIES_COMMANDS.name, command.run_id, command, partition))


def observation_record(codec: MessageCodec, command: WatchdogCommand) -> OutboundRecord:
    """A run's watchdog lives on its run's partition number too (progress.observations)."""
    partition = partition_for_run(command.run_id, PROGRESS_OBSERVATIONS.partitions)
    return _writable(codec.outbound(PROGRESS_OBSERVATIONS.name, command.run_id, command, partition))


class NotAnEndpointId(ValueError):
    """The id handed to routing is not a tool endpoint id; nothing was published."""


_ENDPOINT = re.compile(ENDPOINT_ID_PATTERN)


def partition_for_endpoint(endpoint: str, partitions: int = BREAKERS_COMMANDS.partitions) -> int:
    """A breaker's partition: a stable hash of its endpoint id (the same in every process, unlike
    Python's salted hash()), so every instance's reports of one endpoint reach its one writer."""
    if not _ENDPOINT.fullmatch(endpoint):
        raise NotAnEndpointId(f"{endpoint[:80]!r} is not a tool endpoint id")
    return int.from_bytes(hashlib.sha256(endpoint.encode("utf-8")).digest()[:4], "big") % partitions


def breaker_command_record(codec: MessageCodec, command: BreakerCommand) -> OutboundRecord:
    """A breaker command (BRK-1, BRK-2) on its endpoint's partition of breakers.commands."""
    partition = partition_for_endpoint(command.run_id)
    return _writable(codec.outbound(BREAKERS_COMMANDS.name, command.run_id, command, partition))


def partition_for_schedule(schedule_id: str, partitions: int = SCHEDULES_COMMANDS.partitions) -> int:
    """A schedule's partition (EXE-14): a stable hash of its id, like an endpoint's."""
    return int.from_bytes(hashlib.sha256(schedule_id.encode("utf-8")).digest()[:4], "big") % partitions


def schedule_command_record(codec: MessageCodec, command: ScheduleCommand) -> OutboundRecord:
    """A schedule command on its schedule's partition of schedules.commands."""
    partition = partition_for_schedule(command.run_id)
    return _writable(codec.outbound(SCHEDULES_COMMANDS.name, command.run_id, command, partition))
