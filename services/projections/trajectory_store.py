"""Trajectory views and the open-incidents index, in the projector's key-value store.

They share the RocksDB of the run views (one store for the API to follow as a secondary) under
their own prefixes: tfold/<runId> (what the next event is folded into), tview/<runId> (the view
as served), incident/<incidentId> (open incidents across runs, REC-7) and
offset/trajectories.events/<partition> (the next offset to read). A batch changes all of them in
one atomic write, so the views always equal the fold of exactly the events before the offsets.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from services.common.contracts import TRAJECTORY_EVENT_TYPES
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.store import KeyValueStore
from services.common.topics import TRAJECTORIES_EVENTS
from services.projections.batch_fold import FoldedBatch, fold_batch
from services.projections.fold_codec import decode_view as _decode
from services.projections.fold_codec import encode_view as _encode
from services.projections.trajectory_views import (
    TrajectoryFold,
    apply_trajectory_event,
    decode_fold,
    encode_fold,
    open_incident,
    render_trajectory,
)

__all__ = ["TRAJECTORY_PREFIXES", "TrajectoryViewStore"]

_FOLD = "tfold/"
_VIEW = "tview/"
_INCIDENT = "incident/"
_OFFSET = f"offset/{TRAJECTORIES_EVENTS.name}/"
TRAJECTORY_PREFIXES = (_FOLD, _VIEW, _INCIDENT, _OFFSET)


class TrajectoryViewStore:
    def __init__(self, store: KeyValueStore, codec: MessageCodec) -> None:
        self._store = store
        self._codec = codec

    # --- reads ------------------------------------------------------------------------------

    def get(self, run_id: str) -> dict[str, Any] | None:
        raw = self._store.get(f"{_VIEW}{run_id}")
        return _decode(raw) if raw is not None else None

    def fold(self, run_id: str) -> TrajectoryFold | None:
        raw = self._store.get(f"{_FOLD}{run_id}")
        return decode_fold(raw) if raw is not None else None

    def incident(self, incident_id: str) -> dict[str, Any] | None:
        raw = self._store.get(f"{_INCIDENT}{incident_id}")
        return _decode(raw) if raw is not None else None

    def open_incidents(self) -> list[dict[str, Any]]:
        """Every open incident across runs, oldest first."""
        incidents = [_decode(raw) for _, raw in self._store.scan(_INCIDENT)]
        return sorted(incidents, key=lambda i: (int(i["openedAt"]), str(i["incidentId"])))

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
        """Fold a batch of trajectories.events records; returns how many events changed a view.

        Version n+1 of a trajectory is applied, a repeat (version <= n) is dropped, a gap
        raises VersionGap. `on_undecodable` runs before the batch's offsets are stored, so a
        dead-letter write it makes can never be skipped by a crash.
        """
        deletes: set[str] = set()

        def track_incidents(
            before: TrajectoryFold | None, after: TrajectoryFold, batch: FoldedBatch[TrajectoryFold]
        ) -> None:
            was_open = open_incident(before) if before is not None else None
            now_open = open_incident(after)
            closed = was_open is not None and (
                now_open is None or now_open["incidentId"] != was_open["incidentId"]
            )
            if was_open is not None and closed:
                key = f"{_INCIDENT}{was_open['incidentId']}"
                batch.puts.pop(key, None)
                deletes.add(key)
            if now_open is not None:
                key = f"{_INCIDENT}{now_open['incidentId']}"
                deletes.discard(key)
                batch.puts[key] = _encode(now_open)

        batch = fold_batch(
            records,
            self._codec,
            TRAJECTORY_EVENT_TYPES,
            _OFFSET,
            self.fold,
            apply_trajectory_event,
            on_undecodable,
            track_incidents,
        )
        puts = batch.puts
        for run_id, fold in batch.folds.items():
            puts[f"{_FOLD}{run_id}"] = encode_fold(fold)
            puts[f"{_VIEW}{run_id}"] = _encode(render_trajectory(fold))
        if puts or deletes:
            self._store.write(puts, tuple(sorted(deletes)))
        return batch.applied

    def clear(self) -> None:
        """Forget every trajectory view, incident and offset (the run views stay)."""
        keys = [key for prefix in TRAJECTORY_PREFIXES for key, _ in self._store.scan(prefix)]
        if keys:
            self._store.write({}, tuple(keys))
