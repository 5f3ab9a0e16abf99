"""Which partition a run's commands and events belong to.

Runs are routed by the tenant shard at the front of their id (services.common.ids.run_id_for),
not by hashing the whole key: all runs of a tenant share a partition, so one processor sees the
tenant's whole load and can admit or refuse a run atomically with the run itself (EXE-2).
Every producer of run commands must use `command_record`.
"""

from __future__ import annotations

from services.common.contracts import RunCommand, TrajectoryCommand
from services.common.kafka import OutboundRecord
from services.common.messages import MessageCodec
from services.common.topics import RUNS_COMMANDS, TRAJECTORIES_COMMANDS

__all__ = ["command_record", "partition_for_run", "trajectory_command_record"]


def partition_for_run(run_id: str, partitions: int = RUNS_COMMANDS.partitions) -> int:
    shard = run_id[4:6]
    if not run_id.startswith("run_") or len(shard) != 2:
        raise ValueError(f"{run_id!r} is not a run id")
    try:
        return int(shard, 16) % partitions
    except ValueError:
        raise ValueError(f"{run_id!r} is not a run id") from None


def command_record(codec: MessageCodec, command: RunCommand) -> OutboundRecord:
    return codec.outbound(RUNS_COMMANDS.name, command.run_id, command, partition_for_run(command.run_id))


def trajectory_command_record(codec: MessageCodec, command: TrajectoryCommand) -> OutboundRecord:
    """A trajectory lives on its run's partition number, routed the same way."""
    return codec.outbound(
        TRAJECTORIES_COMMANDS.name, command.run_id, command, partition_for_run(command.run_id)
    )
