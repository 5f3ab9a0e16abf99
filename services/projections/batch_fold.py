"""The fold of one batch of an aggregate's event records into its views, for every view store.

Each record's offset is stored (an undecodable record or a foreign type is still read past);
each event is folded onto the latest fold of its aggregate (the batch's own, else the stored
one) by the aggregate's view `apply`, which drops a repeat (None) and raises on a gap. The caller
turns the changed folds into its keys and writes everything in one store write.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec, UndecodableRecord

__all__ = ["FoldedBatch", "fold_batch"]

F = TypeVar("F")


@dataclass
class FoldedBatch(Generic[F]):
    folds: dict[str, F] = field(default_factory=dict)  # aggregate id -> its fold after the batch
    puts: dict[str, bytes] = field(default_factory=dict)  # the offsets read so far
    applied: int = 0  # events that changed a view


def fold_batch(
    records: Iterable[InboundRecord],
    codec: MessageCodec,
    event_types: tuple[type[Any], ...],
    offset_prefix: str,
    load: Callable[[str], F | None],
    apply: Callable[[F | None, Any], F | None],
    on_undecodable: Callable[[InboundRecord, UndecodableRecord], None] | None = None,
    on_applied: Callable[[F | None, F, FoldedBatch[F]], None] | None = None,
) -> FoldedBatch[F]:
    """Fold `records` (see the module docstring). `on_undecodable` runs before the caller stores
    the offsets, so a dead-letter write it makes can never be skipped by a crash; `on_applied`
    sees each change (the fold before and after) to keep an index of its own."""
    batch: FoldedBatch[F] = FoldedBatch()
    for record in records:
        batch.puts[f"{offset_prefix}{record.partition}"] = str(record.offset + 1).encode()
        try:
            event = codec.decode(record.value)
        except UndecodableRecord as exc:
            if on_undecodable is not None:
                on_undecodable(record, exc)
            continue
        if not isinstance(event, event_types):
            continue
        before = batch.folds.get(event.run_id) or load(event.run_id)
        after = apply(before, event)
        if after is None:
            continue
        batch.applied += 1
        batch.folds[event.run_id] = after
        if on_applied is not None:
            on_applied(before, after, batch)
    return batch
