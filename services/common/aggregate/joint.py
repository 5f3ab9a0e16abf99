"""One unit of work across co-located aggregates: one Kafka transaction for what one request
decides of several aggregates (issue 11).

An owner of a partition holds the Run and the Trajectory of its runs (docs/architecture.md,
"The owner's core, measured"). A step's intent (the Trajectory) and the effect's intent fenced
by the lease (the Run) are decided in one unit: one serial commit instead of two, and the
fencing check reads the lease as the same unit leaves it. Each participant is an
`AggregateProcessor` running its own definition unchanged; the joint unit only shares step 3 of
the commit path (processor.py):

  1. Lock every participant, in the order of their names (two joint units never wait on each
     other in a cycle), and restore what each has not restored of the unit's partitions.
  2. Decide. Each participant decides its commands on its own working set (`decide_into`). A
     later command may be made from what an earlier one came to, in the same unit (`Deciding`).
  3. One Kafka transaction carries every participant's records: all of them land, or none.
  4. Each participant writes its own store (states, indexes, refused ids, checkpoints) and
     publishes what its events name, as after a batch of its own.
  5. The caller answers its requests; the participants' `on_changed` hooks hear their states.

A crash before 3 leaves no trace. A crash between 3 and the last participant's store write
leaves some stores behind the log: each participant's next restore (step 1 of processor.py)
folds its own events and rejections topics from its own checkpoints, so each comes back to the
fold of what the transaction committed, whichever store writes were made. Two conditions make
that argument hold, and the constructor checks both:
  * the participants share one event log, that is one transactional writer: the transaction is
    the unit, and it fences a zombie owner out of every participant's topics at once;
  * the participants' events, rejections, changelog and keepalive topics are distinct, so each
    one's offsets in the transaction are its own (its checkpoints and published outputs name
    exact offsets). Transaction outputs (observations, dead letters) may share topics.
If anything raises before step 4 ends, every participant forgets what it restored and the next
unit restores from the log, which may hold the commit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

from services.common.aggregate.changes import BatchOutcome, Unit, Verdict
from services.common.aggregate.processor import AggregateProcessor
from services.common.eventlog import EventLog
from services.common.kafka import InboundRecord, OutboundRecord
from services.common.tracing import commit_span

__all__ = ["Deciding", "JointUnit"]

Participant = AggregateProcessor[Any, Any, Any, Any]


def _owned_topics(processor: Participant) -> set[str]:
    d = processor.definition
    return {t for t in (d.events_topic, d.rejections_topic, d.changelog_topic, d.keepalive_topic) if t}


class Deciding:
    """Step 2 of one joint unit: the participants' decisions, before the transaction."""

    def __init__(
        self,
        participants: dict[str, Participant],
        units: dict[str, Unit[Any, Any]],
        partitions: frozenset[int],
    ) -> None:
        self._participants = participants
        self._units = units
        self.partitions = partitions  # restored for this unit: a command of another is not decided here

    def decide(self, aggregate: str, records: Sequence[InboundRecord]) -> list[Verdict]:
        """What each command of `records` came to, decided by the participant named `aggregate`."""
        return self._participants[aggregate].decide_into(self._units[aggregate], records)

    def state(self, aggregate: str, aggregate_id: str) -> Any:
        """An aggregate's state as the unit leaves it so far (None if it has none)."""
        return self._participants[aggregate].unit_state(self._units[aggregate], aggregate_id)


class JointUnit:
    """Units of work across `participants`, committed through `log` (module docstring)."""

    def __init__(
        self, log: EventLog, participants: Sequence[Participant], owned: frozenset[int] = frozenset()
    ) -> None:
        by_name = {p.definition.name: p for p in participants}
        if len(by_name) != len(participants):
            raise ValueError("a joint unit's participants run distinct definitions")
        seen: set[str] = set()
        for processor in participants:
            if processor.event_log is not log:
                raise ValueError(f"{processor.definition.name} does not write through the unit's log")
            topics = _owned_topics(processor)
            if shared := topics & seen:
                name = processor.definition.name
                raise ValueError(f"{name} shares {sorted(shared)} with another participant")
            seen |= topics
        self._log = log
        self._participants = dict(sorted(by_name.items()))  # the lock order
        self.owned = owned  # the partitions every unit restores first (the owner's assignment)

    @property
    def aggregates(self) -> tuple[str, ...]:
        return tuple(self._participants)

    def participant(self, aggregate: str) -> Participant:
        return self._participants[aggregate]

    def run(self, partitions: set[int], work: Callable[[Deciding], None]) -> dict[str, BatchOutcome]:
        """Steps 1 to 4 around `work` (step 2); each participant's counts for the unit."""
        changed: dict[str, list[Any]] = {}
        outcomes: dict[str, BatchOutcome] = {}
        with ExitStack() as held:
            for processor in self._participants.values():
                held.enter_context(processor.lock)
            try:
                partitions = partitions | self.owned
                units = {name: p.open_unit(partitions) for name, p in self._participants.items()}
                work(Deciding(self._participants, units, frozenset(partitions)))
                committing_since = time.monotonic()
                parts: dict[str, list[OutboundRecord]] = {
                    name: p.unit_records(units[name]) for name, p in self._participants.items()
                }
                records = [record for part in parts.values() for record in part]
                with commit_span("joint", len(records)):
                    written = self._log.commit(records)
                for name, processor in self._participants.items():
                    committed = processor.unit_committed(units[name], parts[name], written, committing_since)
                    outcomes[name], changed[name] = committed
            except BaseException:
                for processor in self._participants.values():
                    processor.forget_restored()
                raise
        for name, states in changed.items():
            if states:
                self._participants[name].notify_changed(states)
        return outcomes
