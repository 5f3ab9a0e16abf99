"""Envelopes: one record carrying several commands of one partition's aggregates (issue 16).

A runner host renews hundreds of leases at once. As hundreds of records, each is produced,
stored, fetched and decoded on its own; as one record per partition, those costs are paid once.
The runtime opens an envelope (`AggregateDefinition.envelope_types`, `commands_in`) before step
2, and each command inside is decided exactly as if it had come alone: by its own command id,
so fencing, deduplication and every answer are unchanged, and the envelope's offset is
acknowledged with the batch like any record's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from services.common.aggregate.definition import AggregateDefinition
from services.common.kafka import InboundRecord, OutboundRecord
from services.common.messages import command_headers, deadletter_into

__all__ = ["open_envelope"]

C = TypeVar("C")


def open_envelope(
    definition: AggregateDefinition[Any, C, Any, Any],
    record: InboundRecord,
    envelope: object,
    out: list[OutboundRecord],
    on_deadletter: Callable[[str], None],
) -> Sequence[C]:
    """The envelope's commands if every one is the record's partition's to decide; otherwise
    none, after the envelope's dead letter was appended to `out`.

    Unlike a lone command on the wrong partition (counted as misrouted and decided), an envelope
    carrying another partition's command is set aside whole: no producer builds one (services.
    common.routing), so it is a bug or hostile, and deciding a run on a partition that does not
    own it could let two processors decide one run."""
    d = definition
    commands = d.commands_in(envelope)
    strays = []
    for command in commands:
        try:
            expected = d.expected_partition(d.aggregate_id(command))
        except ValueError:
            expected = -1  # an id no partition owns
        if expected is not None and expected != record.partition:
            strays.append(d.aggregate_id(command))
    if commands and not strays:
        return commands
    if strays:
        code = "MISROUTED_BATCH"
        detail = (
            f"{len(strays)} of {len(commands)} commands are not partition {record.partition}'s "
            f"(first: {strays[0][:80]!r}); none was decided"
        )
    else:
        code, detail = "EMPTY_BATCH", "the envelope carries no command"
    deadletter_into(
        out, d.deadletter_topic, record, code, detail, d.log, on_deadletter, command_headers(envelope)
    )
    return ()
