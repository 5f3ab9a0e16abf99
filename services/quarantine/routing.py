"""Where the quarantine processor's commands go: a run's quarantine on its run's partition number,
a tenant's graph on a stable hash of its id (the same in every process, unlike hash())."""

from __future__ import annotations

import hashlib

from services.common.contracts.quarantine import QuarantineCommand
from services.common.kafka import OutboundRecord
from services.common.messages import MessageCodec
from services.common.routing import partition_for_run
from services.common.topics import QUARANTINE_COMMANDS
from services.quarantine.domain import is_graph

__all__ = ["partition_for_aggregate", "quarantine_command_record"]


def partition_for_aggregate(aggregate_id: str, partitions: int = QUARANTINE_COMMANDS.partitions) -> int:
    """Raises ValueError (NotARunId) for an id that is neither a run id nor a graph id."""
    if is_graph(aggregate_id):
        return int.from_bytes(hashlib.sha256(aggregate_id.encode("utf-8")).digest()[:4], "big") % partitions
    return partition_for_run(aggregate_id, partitions)


def quarantine_command_record(codec: MessageCodec, command: QuarantineCommand) -> OutboundRecord:
    partition = partition_for_aggregate(command.run_id)
    return codec.outbound(QUARANTINE_COMMANDS.name, command.run_id, command, partition)
