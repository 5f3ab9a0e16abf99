"""A Run-view rebuild seeded from the state changelog: the log read once, few events decoded.

A rebuild that decodes and folds every event of runs.events cannot pass the decoding rate
(~80k events/s here, against 150-380k/s for reading the log; issue 16). This one reads the log
without decoding most of it:

1. **The seeds.** Each partition of the Run's state changelog (runs.states, compacted; written by
   the coordinator in every unit's transaction, services/common/aggregate/changelog.py) gives the
   latest state of every run of the partition and the runs.events offset it covers (its
   checkpoint). A partition whose changelog cannot be trusted (another state format, not whole)
   gives nothing, and each of its runs is folded.
2. **The log, peeked.** Every record of runs.events is read up to where the topic ended when the
   rebuild began. Its run id and version are read from its first bytes (`EventPeek`), and the
   record's own bytes are stored as the run's history entry, decoded when a view is read. The
   versions are checked as the fold checks them: a repeat is dropped, a gap stops the rebuild.
   Only the few events that name who holds a lease or what stop was asked for (grants, cancel
   and deadline requests, retries) are decoded, for the brief and the held index; each run's
   last event is decoded once too, so that a seeded run never ends on an undecodable one.
3. **The runs.** A run whose changelog state is at its last event's version, with no event at or
   after its partition's checkpoint, is *seeded*: its brief, status index and held entry come
   from that state and the decoded events, and its fold is left to be folded from its history
   when it is first needed (`RunViewStore.refold`: a read, or its next event). Every other run
   is folded now, from its history, as `RunViewStore.apply` would have.

What the views show is the same either way (tests/integration/test_seeded_rebuild.py compares
every key and every rendered view with the full fold's).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

from services.common.aggregate.changelog import ChangelogSeed, seed_of
from services.common.contracts import (
    EVENT_TYPES,
    AttemptClaimed,
    DeadlineReached,
    LeaseTakenOver,
    RunCancelRequested,
    RunEvent,
    RunRetried,
    RunSubmitted,
    full_name_of,
    holder_principal,
)
from services.common.heap import no_cycle_collection
from services.common.kafka import CommittedEnds, PartitionReader, TopicFollower
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.sequencing import Sequencing, sequence
from services.common.topics import RUNS_EVENTS, RUNS_STATES
from services.lease_coordinator.domain import LeaseCertainty, RunState
from services.lease_coordinator.state_codec import STATE_FORMAT, decode_state
from services.projections.store import RebuiltRun, RunViewStore
from services.projections.views import LeaseMark, stop_after

__all__ = ["RebuildStopped", "SeededRebuild", "Seeds", "rebuild_seeded"]

log = logging.getLogger("tenure.projections")

# The events a seeded run's brief and held entry need, decoded; every other one is only peeked at.
_DECODED = frozenset(
    full_name_of(t) for t in (AttemptClaimed, LeaseTakenOver, RunCancelRequested, DeadlineReached, RunRetried)
)
_SUBMITTED = full_name_of(RunSubmitted)
_POLL = 10_000
# How long a poll waits for a record: the rebuild knows where the log ends, so an empty poll is
# how it learns that only transaction markers are left; waiting long for one is waiting for nothing.
_POLL_WAIT_S = 0.02
_ENTRIES_PER_WRITE = 50_000
# How often the stop event is looked at while runs are rebuilt, and while the changelog is awaited.
_RUNS_PER_STOP_CHECK = 1_000
_STOP_CHECK_S = 0.1


class RebuildStopped(Exception):
    """The caller's stop event was set: the rebuild stopped where it was. It wrote no offsets, so
    the store still reads as being rebuilt (`RunViewStore.begin_rebuild`), and the next start
    rebuilds again."""


@dataclass
class _Run:
    """What the rebuild learns of one run while reading the log."""

    partition: int
    version: int = 0
    last_offset: int = -1  # of its last event: at or past the changelog's checkpoint, it is folded
    last_value: bytes = b""  # its last event's bytes: decoded once, so a seeded run's last event is sound
    stop: Mapping[str, Any] | None = None
    leases: list[LeaseMark] = field(default_factory=list)
    claimed_by: str = ""

    def note(self, event: RunEvent) -> None:
        self.stop = stop_after(event, self.stop)
        if isinstance(event, (AttemptClaimed, LeaseTakenOver)):
            # Only the attempt, lease id, epoch and principal of a mark are read from a seeded
            # run's (brief_from, the held key); its certainty is the fold's to say.
            mark = LeaseMark(
                event.epoch,
                holder_principal(event),
                LeaseCertainty.ACTIVE,
                event.occurred_at,
                attempt_id=event.attempt_id,
                lease_id=event.lease_id,
            )
            self.leases.append(mark)
            self.claimed_by = event.causation_id if isinstance(event, AttemptClaimed) else ""


@dataclass(frozen=True)
class SeededRebuild:
    events: int  # records of runs.events read
    runs: int
    seeded: int  # runs left to be folded from their history when needed
    changelog_records: int  # records of runs.states read


def rebuild_seeded(
    bootstrap_servers: str,
    views: RunViewStore,
    codec: MessageCodec,
    progress: Callable[[int, int], None] | None = None,
    timeout_s: float = 600.0,
    *,
    stop: threading.Event | None = None,
    ends_of: Callable[[str], Mapping[int, int]] | None = None,
) -> SeededRebuild:
    """Rebuild `views` (emptied by the caller) from runs.states and runs.events (module docstring).

    `stop`: once set, the rebuild raises RebuildStopped at its next look (every poll, every
    `_RUNS_PER_STOP_CHECK` runs, every `_STOP_CHECK_S` of waiting for the changelog), so a
    process that closes is not held by a rebuild of a long log. `ends_of(topic)`: the caller's
    query of where a topic's committed records end (an API instance has one open already);
    by default a CommittedEnds of the rebuild's own."""
    started = time.monotonic()
    stopping = stop if stop is not None else threading.Event()
    follower = TopicFollower(bootstrap_servers, [RUNS_EVENTS.name], "beginning", "tenure-rebuild", bulk=True)
    with no_cycle_collection():
        with closing(follower):
            # One ListOffsets request for the committed ends: the bulk consumer's watermark
            # query per partition waits its fetch wait (~0.5 s each; a new API instance seeds
            # on every start with an empty store, so a small log must not take seconds).
            ends = (ends_of or CommittedEnds(bootstrap_servers).ends)(RUNS_EVENTS.name)
            targets = {p: end for p, end in ends.items() if end > 0}
            # The changelog is read on a thread of its own while the log is read here: both are
            # mostly waiting for fetches, and its seeds are only needed once the log is read.
            seeding = _SeedReader(bootstrap_servers, targets)
            views.begin_rebuild()
            scan = _LogScan(codec, targets)
            progressed_at = time.monotonic()
            while not scan.finished():
                _check(stopping)
                values = follower.poll_values(_POLL, _POLL_WAIT_S)
                if values:
                    scan.take(values)
                    progressed_at = time.monotonic()
                elif time.monotonic() - progressed_at > timeout_s:
                    raise TimeoutError(f"the rebuild read nothing for {timeout_s:.0f}s")
                else:  # transaction markers occupy offsets but are never delivered
                    scan.passed(follower.positions(RUNS_EVENTS.name))
                if len(scan.entries) >= _ENTRIES_PER_WRITE:
                    views.write_entries(scan.entries)
                    scan.entries = []
                if progress is not None:
                    progress(scan.seen, sum(targets.values()))
            views.write_entries(scan.entries)
        seeds = seeding.result(timeout_s, stopping)
        rebuilt = _rebuilt_runs(views, scan.runs, seeds, codec, stopping)
        _check(stopping)
        views.write_rebuilt(rebuilt, {p: scan.done.get(p, 0) for p in targets})
    seeded = sum(1 for run in rebuilt if run.fold is None)
    log.info(
        "rebuilt %d run views from %d records (%d decoded) in %.1fs: %d seeded from runs.states, %d folded",
        len(rebuilt),
        scan.seen,
        scan.decoded,
        time.monotonic() - started,
        seeded,
        len(rebuilt) - seeded,
    )
    return SeededRebuild(scan.seen, len(rebuilt), seeded, seeds.records)


def _check(stop: threading.Event) -> None:
    if stop.is_set():
        raise RebuildStopped("the rebuild was asked to stop")


class _LogScan:
    """Step 2 of the module docstring, one polled batch at a time."""

    def __init__(self, codec: MessageCodec, targets: Mapping[int, int]) -> None:
        self._codec = codec
        self._peek = codec.peek(EVENT_TYPES)
        self._targets = dict(targets)
        self.runs: dict[str, _Run] = {}
        self.entries: list[tuple[str, int, bytes]] = []
        self.done: dict[int, int] = {}  # partition -> the next offset to read
        self.seen = 0
        self.decoded = 0

    def finished(self) -> bool:
        return all(self.done.get(p, 0) >= end for p, end in self._targets.items())

    def passed(self, positions: Mapping[int, int]) -> None:
        for partition, position in positions.items():
            if position >= 0 and partition in self._targets:
                self.done[partition] = max(
                    self.done.get(partition, 0), min(position, self._targets[partition])
                )

    def take(self, values: list[tuple[int, int, bytes | None]]) -> None:
        targets, done, runs, peek, entries = self._targets, self.done, self.runs, self._peek, self.entries
        for partition, offset, value in values:
            target = targets.get(partition, 0)
            if offset >= target:
                # Written after the rebuild began: left to the follower, from the target on. The
                # partition is read up to there (what lies between is a transaction marker).
                done[partition] = max(done.get(partition, 0), target)
                continue
            done[partition] = offset + 1
            self.seen += 1
            if value is None:
                continue
            peeked = peek(value)
            event: RunEvent | None = None
            if peeked is None or peeked.full_name in _DECODED:
                event = self._decoded(value)
                if event is None:
                    continue  # as the fold: an undecodable record or another type is read past
                run_id, version, kind = event.run_id, event.version, full_name_of(event)
            else:
                run_id, version, kind = peeked.aggregate_id, peeked.version, peeked.full_name
            run = runs.get(run_id)
            if run is None:
                if kind != _SUBMITTED:
                    raise ValueError(f"an event of version {version} arrived before run {run_id} exists")
                run = runs[run_id] = _Run(partition)
            if sequence(run_id, run.version, version) is Sequencing.DUPLICATE:
                continue
            run.version, run.last_offset, run.last_value = version, offset, value
            if event is not None:
                run.note(event)
            entries.append((run_id, version, value))

    def _decoded(self, value: bytes) -> RunEvent | None:
        try:
            message = self._codec.decode(value)
        except UndecodableRecord:
            return None
        if not isinstance(message, EVENT_TYPES):
            return None
        self.decoded += 1
        event: RunEvent = message
        return event


class _SeedReader:
    """Step 1 of the module docstring, on a thread: each partition's changelog seed."""

    def __init__(self, bootstrap_servers: str, partitions: Mapping[int, int]) -> None:
        self._seeds: Seeds | None = None
        self._failure: Exception | None = None
        self._thread = threading.Thread(
            target=self._read, args=(bootstrap_servers, sorted(partitions)), name="rebuild-seeds", daemon=True
        )
        self._thread.start()

    def _read(self, bootstrap_servers: str, partitions: list[int]) -> None:
        try:
            reader = PartitionReader(bootstrap_servers, client_id="tenure-rebuild-changelog")
            try:
                seeds = {
                    p: seed_of(reader.read_raw(RUNS_STATES.name, p, 0), STATE_FORMAT) for p in partitions
                }
            finally:
                reader.close()
            # Decoded here too: this thread is done with the changelog long before the log is
            # read, and the reading thread waits for fetches often enough to let it run.
            self._seeds = Seeds.of(seeds)
            seeds.clear()
        except Exception as exc:  # reported by result(), which then seeds nothing
            self._failure = exc

    def result(self, timeout_s: float, stop: threading.Event) -> Seeds:
        """The seeds; none when the changelog could not be read (a missing topic, an outage):
        every run is then folded from its history, which gives the same views, only slower.
        RebuildStopped when `stop` is set while waiting (the reading thread is a daemon, and
        ends with its reads)."""
        deadline = time.monotonic() + timeout_s
        while self._thread.is_alive() and time.monotonic() < deadline:
            _check(stop)
            self._thread.join(min(_STOP_CHECK_S, max(0.0, deadline - time.monotonic())))
        if self._thread.is_alive() or self._failure is not None or self._seeds is None:
            why = "not read in time" if self._thread.is_alive() else f"unreadable: {self._failure!r}"
            log.warning("the state changelog was %s; every run is folded from its history", why)
            return Seeds.of({})
        return self._seeds


@dataclass(frozen=True)
class Seeds:
    """What the changelog seeds: the decoded state of each run of a trusted partition, each
    partition's checkpoint (None: not trusted), and how many records were read. The encoded
    states are not kept: a rebuild holds one decoded state per run, not two copies."""

    states: Mapping[str, RunState]
    checkpoints: Mapping[int, int | None]
    records: int = 0

    @classmethod
    def of(cls, by_partition: Mapping[int, ChangelogSeed]) -> Seeds:
        usable = [seed for seed in by_partition.values() if seed.usable]
        states = {run_id: decode_state(raw) for seed in usable for run_id, raw in seed.states.items()}
        checkpoints = {p: seed.checkpoint if seed.usable else None for p, seed in by_partition.items()}
        return cls(states, checkpoints, sum(seed.records for seed in by_partition.values()))

    def state_of(self, run_id: str, run: _Run) -> RunState | None:
        """The run's changelog state, if the changelog covers every event the run has."""
        checkpoint = self.checkpoints.get(run.partition)
        if checkpoint is None or run.last_offset >= checkpoint:
            return None
        return self.states.get(run_id)


def _decodes(codec: MessageCodec, value: bytes) -> bool:
    """Whether a peeked event also decodes: the fold would read past one that does not (a
    version lower), so a run whose last event does not is folded, not seeded."""
    try:
        codec.decode(value)
    except UndecodableRecord:
        return False
    return True


def _rebuilt_runs(
    views: RunViewStore,
    runs: Mapping[str, _Run],
    seeds: Seeds,
    codec: MessageCodec,
    stop: threading.Event | None = None,
) -> list[RebuiltRun]:
    """Each run seeded from its changelog state when that state is at its last version, else
    folded from its history."""
    rebuilt: list[RebuiltRun] = []
    for count, (run_id, run) in enumerate(runs.items()):
        if stop is not None and count % _RUNS_PER_STOP_CHECK == 0:
            _check(stop)
        state = seeds.state_of(run_id, run)
        if state is not None and state.version == run.version and _decodes(codec, run.last_value):
            rebuilt.append(RebuiltRun(None, state, run.stop, tuple(run.leases), run.claimed_by))
            continue
        fold = views.refold(run_id, with_history=False)
        rebuilt.append(RebuiltRun(fold, fold.state, fold.stop, fold.leases, run.claimed_by))
    return rebuilt
