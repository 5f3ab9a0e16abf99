"""What an aggregate tells the one runtime (services/common/aggregate/processor.py) about itself.

An aggregate is a pure core (`decide`, `evolve`) plus the facts the runtime needs to keep its
state equal to the fold of its log: where its events and refusals go, what its commands and
events are, how its state is stored, and, optionally, its timers, secondary indexes, a per-batch
context, and side outputs. A new aggregate subclasses `AggregateDefinition`, fills in the
abstract members and overrides only the hooks it uses; everything else (restore, batching,
poison isolation, the one transaction, the one store write, timers, metrics) is the runtime's.

Conventions every Tenure contract follows, used as defaults here: a command or event names its
aggregate in `run_id` (the key of its records, checked by services/common/messages.py), a
command has a `command_id`, an event and a state carry a `version` (1, 2, 3 ... per aggregate),
and a state has a `status` enum.
"""

from __future__ import annotations

import dataclasses
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from services.common.contracts import CommandRejected
from services.common.kafka import OutboundRecord
from services.common.messages import MessageCodec
from services.common.store import KeyValueStore
from services.common.topics import DEADLETTER

__all__ = [
    "AggregateDefinition",
    "BatchContext",
    "Refused",
    "StateCodec",
    "StoreLayout",
    "Transition",
]

S = TypeVar("S")  # the aggregate's state
C = TypeVar("C")  # its commands
E = TypeVar("E")  # its events
X = TypeVar("X")  # what `decide` needs besides state, command and time (from the batch context)


@dataclass(frozen=True)
class Refused:
    """`decide`'s answer to a command it refuses: the record for the rejections topic (a
    CommandRejected). Like an event it is committed with the batch, and the command id joins
    the refused set, so a redelivery gets no second, different answer."""

    record: object


@dataclass(frozen=True)
class Transition(Generic[S, E]):
    """One event applied: the state before it (None for the first event), and after it."""

    before: S | None
    event: E
    after: S


@dataclass(frozen=True)
class StateCodec(Generic[S]):
    """State <-> bytes for the store (a cache of the log's fold, never the record)."""

    encode: Callable[[S], bytes]
    decode: Callable[[bytes], S]


@dataclass(frozen=True)
class StoreLayout:
    """Where the runtime keeps an aggregate's facts in its key-value store.

    state:        <state_prefix><aggregateId>                    = encode_state(state)
    checkpoints:  checkpoint/<topic>/<partition>                 = next offset to fold
    refused ids:  rejected/<commandId>                           = "1"
    timer index:  timer/<partition>/<due ms, 13 digits>/<aggregateId> (ordered by due time)
    timer skips:  timerfail/<aggregateId>                        = the version whose timer failed
    """

    state_prefix: str
    checkpoint_prefix: str = "checkpoint/"
    rejected_prefix: str = "rejected/"
    timer_prefix: str = "timer/"
    timer_failed_prefix: str = "timerfail/"

    def state_key(self, aggregate_id: str) -> str:
        return f"{self.state_prefix}{aggregate_id}"

    def checkpoint_key(self, topic: str, partition: int) -> str:
        return f"{self.checkpoint_prefix}{topic}/{partition}"

    def rejected_key(self, command_id: str) -> str:
        return f"{self.rejected_prefix}{command_id}"

    def timer_key(self, partition: int, due_ms: int, aggregate_id: str) -> str:
        return f"{self.timer_prefix}{partition}/{due_ms:013d}/{aggregate_id}"

    def timers_of(self, partition: int) -> str:
        """The prefix of a partition's timer index: a scan yields its timers by due time."""
        return f"{self.timer_prefix}{partition}/"

    def parse_timer_key(self, key: str) -> tuple[int, str]:
        """(due ms, aggregate id) of a timer index key."""
        due, aggregate_id = key.removeprefix(self.timer_prefix).split("/", 2)[1:]
        return int(due), aggregate_id

    def timer_failed_key(self, aggregate_id: str) -> str:
        return f"{self.timer_failed_prefix}{aggregate_id}"


class BatchContext(Generic[S, C, E, X]):
    """What one batch, tick or restore chunk knows beyond the states it changes (optional).

    The runtime asks `begin` of the definition for a fresh one per unit of work, hands `decide`
    what `decide_context` returns for each command, reports each decided command's transitions
    to `accept` (inside the command's guard: `accept` must change nothing before it is sure not
    to raise), adds `writes()` to the one store write, and calls `committed()` once that write
    succeeded. A unit of work that fails is dropped with its context. The default knows nothing.
    """

    def decide_context(self, command: C, state: S | None) -> X:
        """Read before the command's guard: a failure here is the infrastructure's."""
        return None  # type: ignore[return-value]  # X is None for an aggregate without context

    def accept(self, partition: int, transitions: Sequence[Transition[S, E]]) -> None:
        """The events of one command (or timer, or restored event), in order, as applied."""

    def accept_state(self, partition: int, state: S) -> None:
        """A state a restore took from the changelog (`changelog_topic`) into an empty store: the
        context learns what the fold of its events would have taught it (a definition with a
        changelog must make this equal to `accept` of those events)."""

    def writes(self) -> tuple[Mapping[str, bytes], Sequence[str]]:
        """(puts, deletes) joining the unit's one store write."""
        return {}, ()

    def committed(self) -> None:
        """The store write that carried `writes()` succeeded."""


class AggregateDefinition(ABC, Generic[S, C, E, X]):
    """One aggregate, as the runtime sees it. Subclass, fill in the abstract members."""

    # Names: `name` labels metrics ("run"); `processor_name` signs dead letters and log lines.
    name: str
    processor_name: str
    log: logging.Logger
    # Topics. Events and rejections go to the partition of their command; only this aggregate's
    # processor writes them, which is what makes their offsets and the restore exact.
    events_topic: str
    rejections_topic: str
    deadletter_topic: str = DEADLETTER.name
    # Codec types: what a command record must decode to (else it is dead-lettered), what the
    # restore folds; `command_kind` names the commands in a dead letter ("Run command").
    command_types: tuple[type[Any], ...]
    event_types: tuple[type[Any], ...]
    command_kind: str
    # Envelopes: record types that carry several of this aggregate's commands, for aggregates of
    # one partition (e.g. a runner host's renewals, issue 16). `commands_in` opens one before
    # anything is decided, and each command inside is decided exactly as if it had come alone.
    envelope_types: tuple[type[Any], ...] = ()
    layout: StoreLayout
    state_codec: StateCodec[S]
    # True: the runtime keeps a timer index from `next_timer_at` and `tick` runs `decide_timers`.
    has_timers: bool = False
    # A compacted topic co-partitioned with the events, or None: each transaction also writes the
    # latest state of every aggregate it changed there, so that a restore into an empty store
    # reads one record per aggregate instead of folding every event (Kafka Streams' changelog;
    # services/common/aggregate/changelog.py). Only for an aggregate whose batch context can be
    # rebuilt from states alone (`BatchContext.accept_state`).
    changelog_topic: str | None = None
    # Names the layout of `state_codec`'s bytes. A restore trusts a changelog only when every
    # state in it was written in this format; otherwise it folds the events and writes the
    # changelog again. Change it whenever decoding an older state could be wrong.
    state_format: str = "1"
    # A topic co-partitioned with the events, or None: decisions `is_keepalive` accepts are
    # committed there instead of on the events topic and kept in memory until the aggregate's
    # next other decision puts them on the log (services/common/aggregate/keepalives.py). Only
    # for an aggregate with a changelog (it carries the keepalives' low-water mark).
    keepalive_topic: str | None = None

    # --- the pure core -------------------------------------------------------------------------

    @abstractmethod
    def decide(self, state: S | None, command: C, now_ms: int, context: X) -> Sequence[E] | Refused:
        """The events of `command` against `state`, or its refusal. A command the aggregate has
        accepted before (its id is in the state) must be answered with no events: that is how a
        redelivered batch is dropped (refused ids are the runtime's to remember)."""

    @abstractmethod
    def evolve(self, state: S | None, event: E) -> S:
        """The state after `event`."""

    def refused(self, command: C, code: str, detail: str, state: S | None, now_ms: int) -> Refused:
        """`decide`'s refusal of `command` as every aggregate words one: a CommandRejected with
        the code, the detail, and the aggregate's status and version when it was refused."""
        status = self.status(state) if state is not None else None
        version = self.version(state) if state is not None else 0
        return Refused(CommandRejected.of(command, code, detail, status, version, now_ms))

    def is_keepalive(self, durable: S, events: Sequence[E]) -> bool:
        """Whether `events` (one event, decided against `durable`, the fold of the events topic, or
        against it with a kept event applied) may stay off the events topic (`keepalive_topic`)."""
        return False

    def replaces_kept(self, events: Sequence[E]) -> bool:
        """Whether `events`, decided against a kept event's state at the durable version, may go
        on the events topic right after the durable state, the kept event staying on the
        keepalive topic alone (the Run: the next renewal there): their content must not depend
        on what the kept event changed, only their validity."""
        return False

    def at_version(self, state: S, version: int) -> S:
        """`state` with its version set (a kept event's successor is decided at the durable one)."""
        return dataclasses.replace(state, version=version)  # type: ignore[type-var]

    # --- identities (the contracts' conventions; override for an aggregate that differs) -------

    def aggregate_id(self, message: C | E) -> str:
        return str(getattr(message, "run_id"))  # noqa: B009 - any aggregate's message

    def command_id(self, command: C) -> str:
        return str(getattr(command, "command_id"))  # noqa: B009

    def event_version(self, event: E) -> int:
        return int(getattr(event, "version"))  # noqa: B009

    def version(self, state: S) -> int:
        return int(getattr(state, "version"))  # noqa: B009

    def status(self, state: S) -> str | None:
        """What a refusal reports as the aggregate's current status."""
        status = getattr(state, "status", None)
        return None if status is None else str(getattr(status, "value", status))

    # --- the store -----------------------------------------------------------------------------

    def index_entries(self, partition: int, aggregate_id: str, state: S | None) -> Mapping[str, bytes]:
        """Secondary-index entries `state` holds (none for None). The runtime writes the entries
        that appear and deletes those that go, in the same store write as the state."""
        return {}

    # --- routing, timers, context, side outputs (optional) -------------------------------------

    def commands_in(self, envelope: Any) -> Sequence[C]:
        """The commands an envelope (one of `envelope_types`) carries, in order."""
        raise TypeError(f"{type(self).__name__} opens no {type(envelope).__name__}")

    def expected_partition(self, aggregate_id: str) -> int | None:
        """The partition this aggregate's commands must arrive on, or None for no rule. Raises
        ValueError for an id no partition owns. A command elsewhere is counted as misrouted."""
        return None

    def next_timer_at(self, state: S | None) -> int | None:
        """When `decide_timers` has work for `state` next (with `has_timers`)."""
        return None

    def decide_timers(self, state: S, now_ms: int) -> Sequence[E]:
        """The events of `state`'s due timers at `now_ms` (pure, like `decide`)."""
        return ()

    def begin(self, store: KeyValueStore) -> BatchContext[S, C, E, X]:
        """A fresh context for one batch, tick or restore chunk."""
        return BatchContext()

    def transaction_outputs(
        self, event: E, codec: MessageCodec, state: S | None = None
    ) -> Sequence[OutboundRecord]:
        """Records committed in the batch's transaction beside `event` (never on the events
        topic), e.g. a copy on another topic, or a command to another aggregate. `state` is the
        aggregate's state after `event`, for outputs the event alone does not describe."""
        return ()

    def published_outputs(
        self, event: E, partition: int, offset: int, codec: MessageCodec
    ) -> Sequence[OutboundRecord]:
        """Records published after the commit that name `event`'s exact log position, and
        again for every event a restore folds (at-least-once: their consumers drop repeats)."""
        return ()
