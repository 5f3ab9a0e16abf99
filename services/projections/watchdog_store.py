"""Watchdog views in the projector's key-value store (WD-5: the ladder, visible to operators).

They share the RocksDB of the run and trajectory views (one store for the API to follow as a
secondary) under their own prefixes: wfold/<runId> (what the next event is folded into),
wview/<runId> (the view as served), wbrief/<runId> (the pending intervention a runner's answers
carry: one small read per heartbeat) and offset/watchdog.events/<partition>. A batch changes all
of them in one atomic write, so the views always equal the fold of exactly the events before the
offsets.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from services.common.contracts import WATCHDOG_EVENT_TYPES
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.store import KeyValueStore
from services.common.topics import WATCHDOG_EVENTS
from services.projections.batch_fold import fold_batch
from services.projections.fold_codec import decode_view as _decode
from services.projections.fold_codec import encode_view as _encode
from services.projections.watchdog_views import (
    WatchdogFold,
    apply_watchdog_event,
    decode_fold,
    encode_fold,
    render_brief,
    render_watchdog,
)

__all__ = ["WATCHDOG_PREFIXES", "WatchdogViewStore"]

_FOLD = "wfold/"
_VIEW = "wview/"
_BRIEF = "wbrief/"
_OFFSET = f"offset/{WATCHDOG_EVENTS.name}/"
WATCHDOG_PREFIXES = (_FOLD, _VIEW, _BRIEF, _OFFSET)


class WatchdogViewStore:
    def __init__(self, store: KeyValueStore, codec: MessageCodec) -> None:
        self._store = store
        self._codec = codec

    # --- reads ------------------------------------------------------------------------------

    def get(self, run_id: str) -> dict[str, Any] | None:
        raw = self._store.get(f"{_VIEW}{run_id}")
        return _decode(raw) if raw is not None else None

    def brief(self, run_id: str) -> dict[str, Any] | None:
        raw = self._store.get(f"{_BRIEF}{run_id}")
        return _decode(raw) if raw is not None else None

    def fold(self, run_id: str) -> WatchdogFold | None:
        raw = self._store.get(f"{_FOLD}{run_id}")
        return decode_fold(raw) if raw is not None else None

    def offsets(self) -> dict[int, int]:
        return {int(k[len(_OFFSET) :]): int(v) for k, v in self._store.scan(_OFFSET)}

    def all_views(self) -> dict[str, dict[str, Any]]:
        return {k[len(_VIEW) :]: _decode(v) for k, v in self._store.scan(_VIEW)}

    def refresh(self) -> None:
        self._store.refresh()

    # --- writes -----------------------------------------------------------------------------

    def apply(
        self,
        records: Iterable[InboundRecord],
        on_undecodable: Callable[[InboundRecord, UndecodableRecord], None] | None = None,
    ) -> int:
        """Fold a batch of watchdog.events records; returns how many events changed a view.

        Version n+1 of a watchdog is applied, a repeat (version <= n) is dropped, a gap raises
        VersionGap. `on_undecodable` runs before the batch's offsets are stored, so a dead-letter
        write it makes can never be skipped by a crash."""
        batch = fold_batch(
            records,
            self._codec,
            WATCHDOG_EVENT_TYPES,
            _OFFSET,
            self.fold,
            apply_watchdog_event,
            on_undecodable,
        )
        puts = batch.puts
        for run_id, fold in batch.folds.items():
            puts[f"{_FOLD}{run_id}"] = encode_fold(fold)
            puts[f"{_VIEW}{run_id}"] = _encode(render_watchdog(fold))
            puts[f"{_BRIEF}{run_id}"] = _encode(render_brief(fold))
        if puts:
            self._store.write(puts, ())
        return batch.applied

    def clear(self) -> None:
        """Forget every watchdog view and offset (the run and trajectory views stay)."""
        keys = [key for prefix in WATCHDOG_PREFIXES for key, _ in self._store.scan(prefix)]
        if keys:
            self._store.write({}, tuple(keys))
