"""Run views in a key-value store, with status indexes and the offsets they reflect.

Layout (one RocksDB): view/<runId>; idx/<status>/<submittedAt>/<runId> and idx/*/... for
listing in submission order; offset/<topic>/<partition> = next offset to read. Views, index
entries and offsets of a batch change in one atomic write, so the views always equal the fold
of exactly the events before the stored offsets.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from services.common.contracts import EVENT_TYPES
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.store import KeyValueStore
from services.common.topics import RUNS_EVENTS
from services.projections.views import apply_event, decode_view, encode_view

__all__ = ["BadCursor", "Page", "RunViewStore"]

_ALL = "*"


class BadCursor(ValueError):
    pass


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    next_cursor: str | None


def _index_key(status: str, view: dict[str, Any]) -> str:
    return f"idx/{status}/{int(view['submittedAt']):013d}/{view['runId']}"


def _brief(view: dict[str, Any]) -> dict[str, Any]:
    leases = [lease for lease in (view.get("lease"), *view.get("leaseHistory", [])) if lease is not None]
    return {
        "runId": view["runId"],
        "status": view["status"],
        "version": view["version"],
        "stop": view.get("stop"),
        # attempt id -> the principal who may speak for it (current and earlier leases)
        "holders": {lease["attemptId"]: lease.get("holderPrincipal") for lease in leases},
        "leaseIds": {lease["attemptId"]: lease["leaseId"] for lease in leases},
    }


def _offset_key(partition: int) -> str:
    return f"offset/{RUNS_EVENTS.name}/{partition}"


class RunViewStore:
    def __init__(self, store: KeyValueStore, codec: MessageCodec) -> None:
        self._store = store
        self._codec = codec

    # --- reads ------------------------------------------------------------------------------

    def get(self, run_id: str) -> dict[str, Any] | None:
        raw = self._store.get(f"view/{run_id}")
        return decode_view(raw) if raw is not None else None

    def brief(self, run_id: str) -> dict[str, Any] | None:
        """A few fields of the view that hot paths need (heartbeats), without the whole history."""
        raw = self._store.get(f"brief/{run_id}")
        return decode_view(raw) if raw is not None else None

    def offsets(self) -> dict[int, int]:
        prefix = f"offset/{RUNS_EVENTS.name}/"
        return {int(k[len(prefix) :]): int(v) for k, v in self._store.scan(prefix)}

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
        views: dict[str, dict[str, Any]] = {}
        puts: dict[str, bytes] = {}
        deletes: list[str] = []
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
            before = views.get(event.run_id) or self.get(event.run_id)
            before_status = before["status"] if before is not None else None
            # The dict is this batch's own (just decoded or built here): fold in place, so a long
            # run's growing lease record is not copied on every renewal.
            after = apply_event(before, event, in_place=True)
            if after is None:
                continue
            applied += 1
            views[event.run_id] = after
            if before_status is None:
                puts[_index_key(_ALL, after)] = b""
            if before_status != after["status"]:
                if before_status is not None:
                    deletes.append(_index_key(before_status, after))
                    puts.pop(_index_key(before_status, after), None)
                puts[_index_key(after["status"], after)] = b""
        for run_id, view in views.items():
            puts[f"view/{run_id}"] = encode_view(view)
            puts[f"brief/{run_id}"] = encode_view(_brief(view))
        if puts or deletes:
            self._store.write(puts, tuple(k for k in deletes if k not in puts))
        return applied

    def clear(self) -> None:
        self._store.clear()

    def all_views(self) -> dict[str, dict[str, Any]]:
        return {k[len("view/") :]: decode_view(v) for k, v in self._store.scan("view/")}
