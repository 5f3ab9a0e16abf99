"""The one aggregate runtime: every event-sourced aggregate is a definition run by one processor.

`AggregateDefinition` (definition.py) says what an aggregate is: topics, codec types, `decide`,
`evolve`, store layout, and optionally timers, secondary indexes, a per-batch context and side
outputs. `AggregateProcessor` (processor.py) runs any definition through the one commit path:
restore, decide, one Kafka transaction, one store write, acknowledge; its module docstring holds
the crash-safety argument every aggregate shares. tests/contract/test_aggregate_contract.py is
the suite every definition must pass. `JointUnit` (joint.py) commits what several co-located
processors decide in one transaction, and `GroupCommitter` (group_commit.py) decides the requests
that wait together as one such unit: the owner's core (issue 11).

The runtime is pure of infrastructure libraries: it reaches Kafka and RocksDB only through the
EventLog and KeyValueStore ports (services/common/eventlog.py, services/common/store).
"""

from services.common.aggregate.changes import BatchOutcome
from services.common.aggregate.definition import (
    AggregateDefinition,
    BatchContext,
    Refused,
    StateCodec,
    StoreLayout,
    Transition,
)
from services.common.aggregate.group_commit import Answer, Ask, GroupCommitter
from services.common.aggregate.joint import JointUnit
from services.common.aggregate.processor import AggregateProcessor

__all__ = [
    "AggregateDefinition",
    "AggregateProcessor",
    "Answer",
    "Ask",
    "BatchContext",
    "BatchOutcome",
    "GroupCommitter",
    "JointUnit",
    "Refused",
    "StateCodec",
    "StoreLayout",
    "Transition",
]
