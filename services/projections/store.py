"""Run views in a key-value store, with status indexes and the offsets they reflect.

Layout (one RocksDB): fold/<runId> (the Run aggregate's state and the rest of the fold the next
event is applied to, all but the history); hist/<runId>/<version, 19 digits> (one history entry
per event, written once); brief/<runId> (the few fields heartbeats read, from the fold);
idx/<status>/<submittedAt>/<runId> and idx/*/... for listing in submission order;
held/<principal, %-quoted>/<runId> = the command id that claimed the lease the principal holds on
the run now ("" for a takeover's lease), while that lease is held: a keyed claim-next repeat on
any API instance finds the grant it made among a caller's few held runs, never the whole store;
offset/<topic>/<partition> = next offset to read; meta/run-views-layout. Folds, entries, index
entries and offsets of a batch change in one atomic write, so the views always equal the fold of
exactly the events before the stored offsets.

A view (GET /runs/{runId}) is rendered when it is read, from the fold and the run's entries
(`get`). Rendering it on every event instead, as layouts before 5 did, cost each event the
run's whole history again: with renewals every few seconds that was most of the fold's CPU
(issue 16). An event now costs its entry, the fold and the brief.

Stores of an older layout cannot be continued: `offsets` then answers "from the start" and the
first batch folded replaces every view, fold, entry, index entry and offset in the same write, so
the projector refolds runs.events from offset 0 by itself.
"""

from __future__ import annotations

import base64
import functools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping
from urllib.parse import quote

from services.common.contracts import EVENT_TYPES, AttemptClaimed
from services.common.frozen import replace
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.store import KeyValueStore
from services.common.topics import RUNS_EVENTS
from services.lease_coordinator.domain import RunState
from services.projections.brief_cache import BriefCache
from services.projections.fold_codec import (
    brief_from,
    brief_of,
    decode_fold,
    decode_view,
    encode_fold,
    encode_view,
)
from services.projections.views import (
    LeaseMark,
    RunFold,
    history_entry,
    render_run,
    step_fold,
    step_run,
)

__all__ = ["SEEDED_FOLD", "BadCursor", "Page", "RebuiltRun", "RunViewStore"]

_ALL = "*"
_LAYOUT_KEY = "meta/run-views-layout"
# 2: each view is rendered from a stored fold of the Run aggregate's state (fold/<runId>).
# 3: the fold's state carries agentRevisionId (EXE-14); a layout-2 store refolds to show it.
# 4: held/<principal>/<runId> indexes the leases held now (a keyed claim-next repeat's lookup).
# 5: no view/ keys: views are rendered when read, from fold/ and the history entries in hist/.
_LAYOUT = b"5"
# The folds this store wrote last are kept decoded, so that a run's next event does not decode
# its fold again (a heartbeat is the common case). A fold holds no history: a few hundred bytes.
_RECENT_FOLDS = 50_000
# The layout key while a rebuild writes (store.begin_rebuild), and the runs per rebuild write.
_REBUILDING = b"rebuilding"
_REBUILT_PER_WRITE = 10_000
# The fold/ value of a run a seeded rebuild did not fold (seeded_rebuild.py): its brief, index
# and held entries are written, and its fold is folded again from its history when it is needed.
SEEDED_FOLD = b"seeded"


class BadCursor(ValueError):
    pass


class _FoldWritten(Exception):
    """A run read as seeded has a fold stored since (the follower folded its next event)."""


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    next_cursor: str | None


def _index_key(status: str, state: RunState) -> str:
    return f"idx/{status}/{state.submitted_at:013d}/{state.run_id}"


@dataclass(frozen=True)
class RebuiltRun:
    """One run as a rebuild leaves it: its whole fold, or (None) a seeded one, whose fold is
    folded from its history when needed; either way the state, the last stop asked for, the
    leases issued (their attempt, lease id and principal) and the command id that claimed the
    lease held now ("" for a takeover's), from which its brief, index and held entries come."""

    fold: RunFold | None
    state: RunState
    stop: Mapping[str, Any] | None
    leases: tuple[LeaseMark, ...]
    claimed_by: str


@functools.lru_cache(maxsize=4096)
def _held_prefix(principal: str) -> str:
    # Quoted, so that no principal's prefix is another's ("a" and "a/b"). Cached: every event
    # asks it twice (the lease held before and after), and a fleet has few principals.
    return f"held/{quote(principal, safe='')}/"


def _held(fold: RunFold | None) -> tuple[str, int] | None:
    """The held/ key of the lease the run's holder holds now, and that lease's epoch; None: none held."""
    key = _held_key(fold.state, fold.leases) if fold is not None else None
    if key is None:
        return None
    assert fold is not None and fold.state.lease is not None  # a held key is of a held lease
    return key, fold.state.lease.epoch


def _held_key(state: RunState, leases: tuple[LeaseMark, ...]) -> str | None:
    lease = state.lease
    if lease is None or not lease.held or not leases:
        return None
    mark = leases[-1]
    assert mark.epoch == lease.epoch, (mark, lease)
    return f"{_held_prefix(mark.holder_principal)}{state.run_id}"


# A value holding several events' bytes in a row: this mark, then each as a 4-byte big-endian
# length and the bytes. No JSON entry (b"{") nor encoded event (Avro's b"\xc3\x01", Confluent's
# b"\x00") starts with it.
_PACKED = b"\xfftenure-events\x00"


def _packed(values: list[bytes]) -> bytes:
    if len(values) == 1:
        return values[0]
    return _PACKED + b"".join(len(value).to_bytes(4, "big") + value for value in values)


def _unpacked(stored: bytes) -> Iterator[bytes]:
    if not stored.startswith(_PACKED):
        yield stored
        return
    position = len(_PACKED)
    while position < len(stored):
        length = int.from_bytes(stored[position : position + 4], "big")
        yield stored[position + 4 : position + 4 + length]
        position += 4 + length


def _history_prefix(run_id: str) -> str:
    return f"hist/{run_id}/"


def _history_key(run_id: str, version: int) -> str:
    return f"hist/{run_id}/{version:019d}"


def _offset_key(partition: int) -> str:
    return f"offset/{RUNS_EVENTS.name}/{partition}"


class RunViewStore:
    def __init__(self, store: KeyValueStore, codec: MessageCodec, *, cached_briefs: int = 0) -> None:
        """`cached_briefs`: keep up to that many decoded briefs in memory (brief_cache.py); only
        for a store that this instance alone writes (the API's own projection): a brief written
        by another instance would not reach this one's cache."""
        self._store = store
        self._codec = codec
        self._layout_current = False
        # run id -> (the fold's bytes as written, the fold), least recently written first.
        self._recent: OrderedDict[str, tuple[bytes, RunFold]] = OrderedDict()
        self._briefs = BriefCache(cached_briefs) if cached_briefs > 0 else None

    # --- reads ------------------------------------------------------------------------------

    def get(self, run_id: str) -> dict[str, Any] | None:
        """The run's view as GET /runs/{runId} serves it, rendered from its fold and history."""
        fold = self.fold(run_id)
        return render_run(fold) if fold is not None else None

    def brief(self, run_id: str) -> dict[str, Any] | None:
        """A few fields of the view that hot paths need (heartbeats), without the whole history.
        With `cached_briefs`, the dict may be shared with other readers: do not change it."""
        cache = self._briefs
        if cache is None:
            raw = self._store.get(f"brief/{run_id}")
            return decode_view(raw) if raw is not None else None
        brief = cache.get(run_id)
        if brief is not None:
            return brief
        generation = cache.generation  # before the read: see brief_cache.py
        raw = self._store.get(f"brief/{run_id}")
        if raw is None:
            return None
        brief = decode_view(raw)
        cache.fill(run_id, brief, generation)
        return brief

    def fold(self, run_id: str) -> RunFold | None:
        """The run's whole fold, its history included."""
        raw = self._store.get(f"fold/{run_id}")
        return self._with_history(run_id, raw) if raw is not None else None

    def _with_history(self, run_id: str, raw: bytes) -> RunFold:
        """The stored fold `raw` of the run, with the history entries read back."""
        if raw == SEEDED_FOLD:
            try:
                return self.refold(run_id)
            except _FoldWritten:
                # The follower folded the run's next event between our two reads: its fold
                # is stored now, beside the entry it wrote with it.
                raw = self._store.get(f"fold/{run_id}") or SEEDED_FOLD
                if raw == SEEDED_FOLD:
                    raise
        entries = self._store.scan(_history_prefix(run_id))
        return decode_fold(raw, (entry for _, stored in entries for entry in self._entries_of(stored)))

    def _entries_of(self, stored: bytes) -> Iterator[dict[str, Any]]:
        """The history entries one stored value holds: one JSON entry (the follower's), or the
        events' own bytes, several in a row (a rebuild's), each decoded now."""
        if stored[:1] == b"{":
            yield decode_view(stored)
        else:
            for event in self._events_of(stored):
                yield history_entry(event)

    def _events_of(self, stored: bytes) -> Iterator[Any]:
        for value in _unpacked(stored):
            try:
                yield self._codec.decode(value)
            except UndecodableRecord:
                continue  # as the fold does: read past (a rebuild stored it without decoding it)

    def _stored_fold(self, run_id: str) -> RunFold | None:
        """What the next event of the run is applied to: the fold without its history."""
        raw = self._store.get(f"fold/{run_id}")
        if raw == SEEDED_FOLD:
            return self.refold(run_id, with_history=False)
        return decode_fold(raw, ()) if raw is not None else None

    def refold(self, run_id: str, *, with_history: bool = True) -> RunFold:
        """The run's whole fold, folded again from its history entries, which a seeded rebuild
        (seeded_rebuild.py) stored as the events' own bytes; without its history, unless asked."""
        fold: RunFold | None = None
        entries: list[dict[str, Any]] = []
        for _, stored in self._store.scan(_history_prefix(run_id)):
            if stored[:1] == b"{":
                raise _FoldWritten(run_id)  # only the follower writes JSON, with the run's fold
            for event in self._events_of(stored):
                after = step_fold(fold, event)
                if after is not None:
                    fold = after
                    if with_history:
                        entries.append(history_entry(event))
        if fold is None:
            raise KeyError(f"run {run_id} has a seeded fold but no history")
        return replace(fold, history=tuple(entries))

    def offsets(self) -> dict[int, int]:
        """Where to go on reading runs.events; {} (the start) for views of an older layout."""
        if self._outdated():
            return {}
        prefix = f"offset/{RUNS_EVENTS.name}/"
        return {int(k[len(prefix) :]): int(v) for k, v in self._store.scan(prefix)}

    def _outdated(self) -> bool:
        """Whether the store holds views that no stored fold can continue: an older layout, or a
        rebuild cut short (`begin_rebuild` without its `write_rebuilt`)."""
        if self._layout_current:
            return False
        layout = self._store.get(_LAYOUT_KEY)
        if layout == _LAYOUT:
            self._layout_current = True
            return False
        return layout is not None or next(self._store.scan("view/"), None) is not None

    def _outdated_keys(self) -> list[str]:
        prefixes = ("view/", "hist/", "brief/", "fold/", "idx/", "held/", f"offset/{RUNS_EVENTS.name}/")
        return [key for prefix in prefixes for key, _ in self._store.scan(prefix)]

    def list(self, status: str | None, limit: int, cursor: str | None) -> Page:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        prefix = f"idx/{status or _ALL}/"
        start_after = None
        if cursor is not None:
            try:
                start_after = base64.urlsafe_b64decode(cursor.encode()).decode()
            except (ValueError, UnicodeDecodeError) as exc:
                raise BadCursor(f"cursor {cursor!r} is not one this API issued") from exc
            if not start_after.startswith(prefix):
                raise BadCursor("cursor belongs to a different listing (status filter changed)")
        items: list[dict[str, Any]] = []
        last_key = None
        for key, _ in self._store.scan(prefix, start_after=start_after):
            view = self.get(key.rsplit("/", 1)[1])
            if view is not None:
                items.append(view)
            last_key = key
            if len(items) >= limit:
                break
        more = last_key is not None and next(self._store.scan(prefix, start_after=last_key), None)
        next_cursor = base64.urlsafe_b64encode(last_key.encode()).decode() if more and last_key else None
        return Page(items, next_cursor)

    def held_by(self, principal: str) -> dict[str, str]:
        """{run id: the command id that claimed it} of the runs whose lease `principal` holds now
        ("" for a lease a takeover gave it)."""
        prefix = _held_prefix(principal)
        return {key[len(prefix) :]: value.decode() for key, value in self._store.scan(prefix)}

    def refresh(self) -> None:
        self._store.refresh()

    # --- writes -----------------------------------------------------------------------------

    def apply(
        self,
        records: Iterable[InboundRecord],
        on_undecodable: Callable[[InboundRecord, UndecodableRecord], None] | None = None,
    ) -> int:
        """Fold a batch of runs.events records; returns how many events changed a view.

        `on_undecodable` runs for each record that cannot be decoded, before the batch's offsets
        are stored, so a dead-letter write it makes can never be skipped by a crash.
        """
        outdated = self._outdated()
        folds: dict[str, RunFold] = {}
        puts: dict[str, bytes] = {}
        deletes: list[str] = self._outdated_keys() if outdated else []
        applied = 0
        for record in records:
            puts[_offset_key(record.partition)] = str(record.offset + 1).encode()
            try:
                event = self._codec.decode(record.value)
            except UndecodableRecord as exc:
                if on_undecodable is not None:
                    on_undecodable(record, exc)
                continue
            if not isinstance(event, EVENT_TYPES):
                continue
            before = folds.get(event.run_id)
            if before is None and not outdated:  # an outdated store's folds are being replaced
                before = self._recent_fold(event.run_id) or self._stored_fold(event.run_id)
            before_status = before.state.status.value if before is not None else None
            stepped = step_run(before, event)
            if stepped is None:
                continue
            after, entry = stepped
            puts[_history_key(event.run_id, event.version)] = encode_view(entry)
            applied += 1
            folds[event.run_id] = after
            status = after.state.status.value
            if before_status is None:
                puts[_index_key(_ALL, after.state)] = b""
            if before_status != status:
                if before_status is not None:
                    deletes.append(_index_key(before_status, after.state))
                    puts.pop(_index_key(before_status, after.state), None)
                puts[_index_key(status, after.state)] = b""
            held_before, held_after = _held(before), _held(after)
            if held_before != held_after:
                if held_before is not None:
                    deletes.append(held_before[0])
                    puts.pop(held_before[0], None)
                if held_after is not None:
                    claimed_by = event.causation_id if isinstance(event, AttemptClaimed) else ""
                    puts[held_after[0]] = claimed_by.encode()
        written: dict[str, tuple[bytes, RunFold]] = {}
        briefs: dict[str, dict[str, Any]] = {}
        for run_id, fold in folds.items():
            brief = briefs[run_id] = brief_of(fold)
            puts[f"brief/{run_id}"] = encode_view(brief)
            encoded = puts[f"fold/{run_id}"] = encode_fold(fold)
            written[run_id] = (encoded, fold)
        if not self._layout_current:
            puts[_LAYOUT_KEY] = _LAYOUT
        if puts or deletes:
            self._store.write(puts, tuple(k for k in deletes if k not in puts))
            self._layout_current = True
            if self._briefs is not None:
                if outdated:  # every run's brief was deleted with the old layout
                    self._briefs.clear()
                self._briefs.written(briefs)
        for run_id, kept in written.items():
            self._remember(run_id, kept)
        return applied

    def begin_rebuild(self) -> None:
        """Mark the store as being rebuilt, until `write_rebuilt` finishes: a rebuild cut short
        leaves history without folds, which the follower must not continue, so the store then
        reads as outdated and the follower's first batch replaces everything, from offset 0."""
        self._store.write({_LAYOUT_KEY: _REBUILDING})
        self._layout_current = False
        self._recent.clear()
        self._clear_briefs()

    def write_entries(self, entries: Iterable[tuple[str, int, bytes]]) -> None:
        """A rebuild's history entries (run id, version, the event's own bytes; each run's in
        version order, without a gap), in one write: each run's as one value under the first
        one's version, so that a write costs a key per run rather than per event (issue 16)."""
        runs: dict[str, tuple[int, list[bytes]]] = {}
        for run_id, version, value in entries:
            held = runs.get(run_id)
            if held is None:
                runs[run_id] = (version, [value])
            else:
                held[1].append(value)
        self._store.write(
            {_history_key(run_id, first): _packed(values) for run_id, (first, values) in runs.items()}
        )

    def write_rebuilt(self, runs: Iterable[RebuiltRun], offsets: Mapping[int, int]) -> None:
        """A rebuild's last writes: every run's fold (or the seeded mark), brief, index and held
        entries, in writes of a bounded number of runs, then the offsets the rebuild read up to
        and the layout, which end the rebuild (`begin_rebuild`)."""
        puts: dict[str, bytes] = {}
        for count, run in enumerate(runs, start=1):
            if count % _REBUILT_PER_WRITE == 0:
                self._store.write(puts)
                puts = {}
            state = run.state
            puts[_index_key(_ALL, state)] = puts[_index_key(state.status.value, state)] = b""
            puts[f"brief/{state.run_id}"] = encode_view(brief_from(state, run.stop, run.leases))
            puts[f"fold/{state.run_id}"] = encode_fold(run.fold) if run.fold is not None else SEEDED_FOLD
            held = _held_key(state, run.leases)
            if held is not None:
                puts[held] = run.claimed_by.encode()
        for partition, offset in offsets.items():
            puts[_offset_key(partition)] = str(offset).encode()
        puts[_LAYOUT_KEY] = _LAYOUT
        self._store.write(puts)
        self._layout_current = True
        self._clear_briefs()

    def _clear_briefs(self) -> None:
        if self._briefs is not None:
            self._briefs.clear()

    def _recent_fold(self, run_id: str) -> RunFold | None:
        """The fold this store last wrote for the run, if the store still holds exactly that."""
        recent = self._recent.get(run_id)
        if recent is None:
            return None
        if self._store.get(f"fold/{run_id}") != recent[0]:
            self._forget(run_id)  # someone else wrote or cleared it: decode what is stored
            return None
        return recent[1]

    def _remember(self, run_id: str, entry: tuple[bytes, RunFold]) -> None:
        self._recent.pop(run_id, None)
        self._recent[run_id] = entry
        while len(self._recent) > _RECENT_FOLDS:
            self._recent.popitem(last=False)

    def _forget(self, run_id: str) -> None:
        self._recent.pop(run_id, None)

    def clear(self) -> None:
        self._store.clear()
        self._layout_current = False
        self._recent.clear()
        self._clear_briefs()

    def clear_runs(self) -> None:
        """Delete the Run views, their history and offsets, and nothing else: an API instance
        keeps its trajectory, watchdog and renewal views in the same store."""
        keys = self._outdated_keys()
        if keys or self._store.get(_LAYOUT_KEY) is not None:
            self._store.write({}, (*keys, _LAYOUT_KEY))
        self._layout_current = False
        self._recent.clear()
        self._clear_briefs()

    def count(self) -> int:
        """How many runs have a view (none is rendered to count them)."""
        return sum(1 for _ in self._store.scan("fold/"))

    def all_views(self) -> dict[str, dict[str, Any]]:
        views = {}
        for key, raw in self._store.scan("fold/"):
            run_id = key[len("fold/") :]
            views[run_id] = render_run(self._with_history(run_id, raw))
        return views
