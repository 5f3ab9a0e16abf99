"""What one unit of work (a batch, a timer tick, a restore chunk) changes, and what a batch counts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

from services.common.aggregate.definition import BatchContext
from services.common.aggregate.keepalives import Kept
from services.common.kafka import OutboundRecord

__all__ = ["BatchOutcome", "Changes", "Decided", "Unit", "Verdict"]

S = TypeVar("S")
E = TypeVar("E")


@dataclass
class BatchOutcome:
    """Counts of one batch. `deadlettered`: undecodable or misaddressed records; `failed`:
    commands whose handling raised (dead-lettered AND refused, see services/common/poison.py);
    `published`: records published after the commit (`published_outputs`); `restored_events`:
    events folded per partition restored before the batch."""

    commands: int = 0
    events: int = 0
    rejections: int = 0
    deadlettered: int = 0
    duplicates: int = 0
    failed: int = 0
    accepted: int = 0
    kept: int = 0  # of the accepted: decisions kept off the events topic (keepalives.py)
    published: int = 0
    restored_events: dict[int, int] = field(default_factory=dict)

    def by_outcome(self) -> dict[str, int]:
        return {
            "accepted": self.accepted,
            "rejected": self.rejections,
            "duplicate": self.duplicates,
            "deadlettered": self.deadlettered,
            "failed": self.failed,
        }


@dataclass
class Decided(Generic[S, E]):
    """One command or timer decided on values only: nothing of the unit changed yet.

    `written`: its records (events, their transaction outputs, or its refusal); `events`: its
    events with their partition, in order; `after`: the state after them."""

    written: list[OutboundRecord]
    events: list[tuple[E, int]]
    after: S | None
    refused: bool = False
    # With keepalives (keepalives.py): the decision stays off the events topic (`written` holds
    # its keepalive record), or its events begin with the aggregate's kept event.
    kept: Kept[S, E] | None = None
    unkept: bool = False
    refusal: Any = None  # the definition's refusal record, when refused


@dataclass
class Changes(Generic[S, E]):
    """States, refusals, checkpoints and timer skips of one unit, persisted in ONE store write."""

    context: BatchContext[S, Any, E, Any]
    partition_of: dict[str, int] = field(default_factory=dict)
    # The state each changed aggregate had before the unit: its index entries are replaced.
    before: dict[str, S | None] = field(default_factory=dict)
    after: dict[str, S] = field(default_factory=dict)
    rejected: set[str] = field(default_factory=set)
    checkpoints: dict[str, int] = field(default_factory=dict)
    # aggregateId -> version whose timer work raised (persisted as a timer skip)
    timer_failures: dict[str, int] = field(default_factory=dict)
    # what a restore must publish before its checkpoint moves past the events they name
    published: list[OutboundRecord] = field(default_factory=list)
    # aggregateId -> its state's bytes, when already encoded for the changelog (encoded once)
    encoded: dict[str, bytes] = field(default_factory=dict)
    # The partitions whose states the unit's changelog records carry, and those it defers with
    # their events checkpoint before the unit (changelog_lag.py); None: no changelog records.
    changelog: tuple[set[int], dict[int, int]] | None = None
    dropped: list[str] = field(default_factory=list)  # store keys the unit's write deletes
    # Keepalives (keepalives.py): aggregateId -> its newest kept event; the aggregates whose kept
    # event this unit put on the events topic; the state each one's index entries were made from.
    kept: dict[str, Kept[S, E]] = field(default_factory=dict)
    unkept: set[str] = field(default_factory=set)
    indexed_before: dict[str, S | None] = field(default_factory=dict)
    # Timer keys a tick found due whose aggregate times itself elsewhere now (left behind by an
    # index entry made from a kept event's state that another owner, or a crash, replaced):
    # stale key -> (partition, aggregateId, the due its state calls for; None: no timer).
    stale_timers: dict[str, tuple[int, str, int | None]] = field(default_factory=dict)

    def settle(self, partition: int, aggregate_id: str, previous: S | None, state: S) -> None:
        """Take `state` as the aggregate's new state; `previous` is the one it was decided on."""
        if aggregate_id not in self.before:
            self.before[aggregate_id] = previous
            self.partition_of[aggregate_id] = partition
        self.after[aggregate_id] = state

    def partition(self, aggregate_id: str, default: int) -> int:
        return self.partition_of.get(aggregate_id, default)


class _VerdictFields(NamedTuple):
    outcome: str
    aggregate_id: str | None
    refusal: Any = None
    error: Exception | None = None


class Verdict(_VerdictFields):
    """What one command came to in its unit of work, for a caller that waits on it (a joint
    unit's requests, services/common/aggregate/joint.py). `refusal`: the definition's refusal
    record; `error`: what the handling of a command set aside raised. A tuple: one is made per
    command on the hot path (a renewal), where a frozen dataclass costs 2.5 times as much."""

    __slots__ = ()

    ACCEPTED = "accepted"  # decided now: its events (or its kept renewal) are in the unit
    DUPLICATE = "duplicate"  # accepted before: nothing new happens
    REFUSED = "refused"  # refused now: its refusal is in the unit
    REFUSED_BEFORE = "refused-before"  # refused (or set aside) by an earlier unit
    FAILED = "failed"  # its handling raised: dead-lettered and refused (poison.py)
    DEADLETTERED = "deadlettered"  # undecodable or misaddressed: dead-lettered

    @property
    def handled(self) -> bool:
        """The command is part of the aggregate's history (decided now or before)."""
        return self.outcome in (self.ACCEPTED, self.DUPLICATE)


@dataclass
class Unit(Generic[S, E]):
    """One unit of work of one aggregate in progress: its working set, the records its
    transaction will carry and the events among them, before the transaction."""

    changes: Changes[S, E]
    now: int
    started: float
    outcome: BatchOutcome
    out: list[OutboundRecord] = field(default_factory=list)
    events: list[tuple[E, int]] = field(default_factory=list)
