"""Message contracts: frozen value types for every command, event and rejection on the wire."""

from services.common.contracts.runs import (
    COMMAND_TYPES,
    EVENT_TYPES,
    CancelRun,
    CommandRejected,
    RunCancelled,
    RunCommand,
    RunEvent,
    RunSubmitted,
    SubmitRun,
    from_record,
    full_name_of,
    to_record,
)

__all__ = [
    "COMMAND_TYPES",
    "EVENT_TYPES",
    "CancelRun",
    "CommandRejected",
    "RunCancelled",
    "RunCommand",
    "RunEvent",
    "RunSubmitted",
    "SubmitRun",
    "from_record",
    "full_name_of",
    "to_record",
]
