"""The projector: follows runs.events into the Run view store; `rebuild` refolds from offset 0."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from services.common.kafka import CommandPublisher, InboundRecord, TopicFollower
from services.common.messages import MessageCodec, UndecodableRecord, deadletter_record
from services.common.store import RocksStore
from services.common.topics import DEADLETTER, RUNS_EVENTS
from services.projections.store import RunViewStore

__all__ = ["RebuildReport", "follow", "rebuild", "views_path"]

log = logging.getLogger("tenure.projections")


def views_path(state_dir: Path) -> Path:
    return state_dir / "projections" / "run_views"


def follow(bootstrap_servers: str, path: Path, stop: threading.Event) -> None:
    """Fold new events until `stop` is set, resuming from the offsets stored with the views."""
    views = RunViewStore(RocksStore(path), MessageCodec())
    follower = TopicFollower(
        bootstrap_servers, [RUNS_EVENTS.name], start_at=views.offsets(), client_id="tenure-projections"
    )
    publisher = CommandPublisher(bootstrap_servers, client_id="tenure-projections-deadletter")

    def dead_letter(record: InboundRecord, error: UndecodableRecord) -> None:
        log.error("dead-lettering %s[%d]@%d: %s", record.topic, record.partition, record.offset, error)
        dead = deadletter_record(
            DEADLETTER.name,
            record.topic,
            record.partition,
            record.offset,
            record.key,
            record.value,
            error.reason_code,
            str(error),
        )
        publisher.publish(dead).result(30)

    try:
        while not stop.is_set():
            records = follower.poll(max_records=1000, timeout_s=0.1)
            if records:
                views.apply(records, on_undecodable=dead_letter)
    finally:
        follower.close()
        publisher.close()


@dataclass(frozen=True)
class RebuildReport:
    events: int
    runs: int
    seconds: float


def rebuild(
    bootstrap_servers: str,
    views: RunViewStore,
    progress: Callable[[int, int], None] | None = None,
) -> RebuildReport:
    """Clear `views` and fold runs.events from offset 0 up to its end as of the call."""
    started = time.monotonic()
    views.clear()
    follower = TopicFollower(bootstrap_servers, [RUNS_EVENTS.name], "beginning", "tenure-rebuild")
    try:
        targets = {p: end for p, end in follower.end_offsets(RUNS_EVENTS.name).items() if end > 0}
        total = sum(targets.values())
        seen = 0
        done: dict[int, int] = {}
        while any(done.get(p, 0) < end for p, end in targets.items()):
            records = follower.poll(max_records=5000, timeout_s=0.2)
            if records:
                views.apply(records)
                for r in records:
                    done[r.partition] = r.offset + 1
                seen += len(records)
                if progress is not None:
                    progress(seen, total)
            elif time.monotonic() - started > 600:
                raise TimeoutError("rebuild made no progress")
            else:
                # Transaction markers occupy offsets but are never delivered: ask where we are.
                _advance_past_markers(follower, targets, done)
    finally:
        follower.close()
    return RebuildReport(events=seen, runs=len(views.all_views()), seconds=time.monotonic() - started)


def _advance_past_markers(follower: TopicFollower, targets: dict[int, int], done: dict[int, int]) -> None:
    for partition, position in follower.positions(RUNS_EVENTS.name).items():
        if position >= 0 and partition in targets:
            done[partition] = max(done.get(partition, 0), position)
