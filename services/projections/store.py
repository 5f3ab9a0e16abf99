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
from typing import Any, Callable, Iterable
from urllib.parse import quote

from services.common.contracts import EVENT_TYPES, AttemptClaimed
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.store import KeyValueStore
from services.common.topics import RUNS_EVENTS
from services.projections.views import (
    RunFold,
    brief_of,
    decode_fold,
    decode_view,
    encode_fold,
    encode_view,
    render_run,
    step_run,
)

__all__ = ["BadCursor", "Page", "RunViewStore"]

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


class BadCursor(ValueError):
    pass


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    next_cursor: str | None


def _index_key(status: str, fold: RunFold) -> str:
    return f"idx/{status}/{fold.state.submitted_at:013d}/{fold.state.run_id}"


@functools.lru_cache(maxsize=4096)
def _held_prefix(principal: str) -> str:
    # Quoted, so that no principal's prefix is another's ("a" and "a/b"). Cached: every event
    # asks it twice (the lease held before and after), and a fleet has few principals.
    return f"held/{quote(principal, safe='')}/"


def _held(fold: RunFold | None) -> tuple[str, int] | None:
    """The held/ key of the lease the run's holder holds now, and that lease's epoch; None: none held."""
    lease = fold.state.lease if fold is not None else None
    if fold is None or lease is None or not lease.held or not fold.leases:
        return None
    mark = fold.leases[-1]
    assert mark.epoch == lease.epoch, (mark, lease)
    return f"{_held_prefix(mark.holder_principal)}{fold.state.run_id}", lease.epoch


def _history_prefix(run_id: str) -> str:
    return f"hist/{run_id}/"


def _history_key(run_id: str, version: int) -> str:
    return f"hist/{run_id}/{version:019d}"


def _offset_key(partition: int) -> str:
    return f"offset/{RUNS_EVENTS.name}/{partition}"


class RunViewStore:
    def __init__(self, store: KeyValueStore, codec: MessageCodec) -> None:
        self._store = store
        self._codec = codec
        self._layout_current = False
        # run id -> (the fold's bytes as written, the fold), least recently written first.
        self._recent: OrderedDict[str, tuple[bytes, RunFold]] = OrderedDict()

    # --- reads ------------------------------------------------------------------------------

    def get(self, run_id: str) -> dict[str, Any] | None:
        """The run's view as GET /runs/{runId} serves it, rendered from its fold and history."""
        fold = self.fold(run_id)
        return render_run(fold) if fold is not None else None

    def brief(self, run_id: str) -> dict[str, Any] | None:
        """A few fields of the view that hot paths need (heartbeats), without the whole history."""
        raw = self._store.get(f"brief/{run_id}")
        return decode_view(raw) if raw is not None else None

    def fold(self, run_id: str) -> RunFold | None:
        """The run's whole fold, its history included."""
        raw = self._store.get(f"fold/{run_id}")
        return self._with_history(run_id, raw) if raw is not None else None

    def _with_history(self, run_id: str, raw: bytes) -> RunFold:
        """The stored fold `raw` of the run, with the history entries read back."""
        prefix = _history_prefix(run_id)
        return decode_fold(raw, (decode_view(entry) for _, entry in self._store.scan(prefix)))

    def _stored_fold(self, run_id: str) -> RunFold | None:
        """What the next event of the run is applied to: the fold without its history."""
        raw = self._store.get(f"fold/{run_id}")
        return decode_fold(raw, ()) if raw is not None else None

    def offsets(self) -> dict[int, int]:
        """Where to go on reading runs.events; {} (the start) for views of an older layout."""
        if self._outdated():
            return {}
        prefix = f"offset/{RUNS_EVENTS.name}/"
        return {int(k[len(prefix) :]): int(v) for k, v in self._store.scan(prefix)}

    def _outdated(self) -> bool:
        """Whether the store holds views that no stored fold can continue (an older layout)."""
        if self._layout_current:
            return False
        if self._store.get(_LAYOUT_KEY) == _LAYOUT:
            self._layout_current = True
            return False
        return next(self._store.scan("view/"), None) is not None

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
                puts[_index_key(_ALL, after)] = b""
            if before_status != status:
                if before_status is not None:
                    deletes.append(_index_key(before_status, after))
                    puts.pop(_index_key(before_status, after), None)
                puts[_index_key(status, after)] = b""
            held_before, held_after = _held(before), _held(after)
            if held_before != held_after:
                if held_before is not None:
                    deletes.append(held_before[0])
                    puts.pop(held_before[0], None)
                if held_after is not None:
                    claimed_by = event.causation_id if isinstance(event, AttemptClaimed) else ""
                    puts[held_after[0]] = claimed_by.encode()
        written: dict[str, tuple[bytes, RunFold]] = {}
        for run_id, fold in folds.items():
            puts[f"brief/{run_id}"] = encode_view(brief_of(fold))
            encoded = puts[f"fold/{run_id}"] = encode_fold(fold)
            written[run_id] = (encoded, fold)
        if not self._layout_current:
            puts[_LAYOUT_KEY] = _LAYOUT
        if puts or deletes:
            self._store.write(puts, tuple(k for k in deletes if k not in puts))
            self._layout_current = True
        for run_id, kept in written.items():
            self._remember(run_id, kept)
        return applied

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

    def count(self) -> int:
        """How many runs have a view (none is rendered to count them)."""
        return sum(1 for _ in self._store.scan("fold/"))

    def all_views(self) -> dict[str, dict[str, Any]]:
        views = {}
        for key, raw in self._store.scan("fold/"):
            run_id = key[len("fold/") :]
            views[run_id] = render_run(self._with_history(run_id, raw))
        return views
