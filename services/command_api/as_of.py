"""A run as it was at a time or a version (`GET /runs/{runId}?asOf=...`, `tenure runs describe
--as-of`), folded from the log with the Run's own fold (services/projections/views.py), never
from the current view.

The events of a run are on one partition of runs.events (the run's shard, services/common/
routing.py). The reader starts a little before the run's submission (Kafka's time index:
record timestamps are the coordinator's produce time, within milliseconds of `occurredAt`) and
stops once records are well past the asked time, so an old run on a long partition costs the
records around its life, not the partition.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from services.common.contracts import EVENT_TYPES, RunEvent
from services.common.kafka import PartitionReader, TopicFollower
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.routing import partition_for_run
from services.common.topics import RUNS_EVENTS
from services.projections.views import RunFold, apply_run_event, render_run

__all__ = ["AsOf", "BadAsOf", "fold_as_of", "parse_as_of", "read_run_events"]

# Record timestamps and occurredAt come from different calls on the coordinator: allow for it.
_CLOCK_SLACK_MS = 60_000
_MAX_VERSION = 2**63 - 1
_VERSION = re.compile(r"v(\d{1,19})")


class BadAsOf(ValueError):
    """An `asOf` that is neither an RFC 3339 time, epoch milliseconds, nor `v<version>`."""


@dataclass(frozen=True)
class AsOf:
    """At most this time (epoch ms) or at most this version: exactly one is set."""

    time_ms: int | None = None
    version: int | None = None

    def includes(self, event: RunEvent) -> bool:
        if self.version is not None:
            return event.version <= self.version
        assert self.time_ms is not None
        return event.occurred_at <= self.time_ms


def parse_as_of(text: str) -> AsOf:
    """`2026-12-01T10:00:00Z` (RFC 3339, an offset or Z required), `1764583200000` (epoch ms)
    or `v12` (the run's version 12)."""
    text = text.strip()
    if match := _VERSION.fullmatch(text):
        version = int(match.group(1))
        if not 1 <= version <= _MAX_VERSION:
            raise BadAsOf(f"asOf version must be between 1 and {_MAX_VERSION}, not {version}")
        return AsOf(version=version)
    if text.isdigit() and len(text) <= 15:
        return AsOf(time_ms=int(text))
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None or len(text) > 40:
        raise BadAsOf(
            f"asOf must be an RFC 3339 time with an offset (2026-12-01T10:00:00Z), epoch "
            f"milliseconds or v<version>, not {text[:60]!r}"
        )
    return AsOf(time_ms=int(moment.timestamp() * 1000))


def fold_as_of(events: Iterable[RunEvent], as_of: AsOf) -> dict[str, object] | None:
    """The Run view after every event `as_of` includes; None if the run did not exist yet."""
    fold: RunFold | None = None
    for event in events:
        if not as_of.includes(event):
            break
        fold = apply_run_event(fold, event) or fold
    if fold is None:
        return None
    view = render_run(fold)
    view["asOf"] = {"version": fold.state.version, "occurredAt": fold.history[-1]["occurredAt"]}
    return view


def read_run_events(
    bootstrap_servers: str, codec: MessageCodec, run_id: str, submitted_at: int, until_ms: int | None
) -> Iterator[RunEvent]:
    """The run's events in version order, from its partition of runs.events, read from just
    before `submitted_at` to just after `until_ms` (or to the partition's end when None)."""
    partition = partition_for_run(run_id)
    seeker = TopicFollower(bootstrap_servers, [RUNS_EVENTS.name], "end", client_id="tenure-api-as-of-seek")
    try:
        start = seeker.offsets_for_time(RUNS_EVENTS.name, max(0, submitted_at - _CLOCK_SLACK_MS))
    finally:
        seeker.close()
    offset = start.get(partition, -1)
    if offset < 0:  # no record at or after that time: the run's events cannot be after it either
        return
    reader = PartitionReader(bootstrap_servers, client_id="tenure-api-as-of")
    try:
        for record in reader.read(RUNS_EVENTS.name, partition, offset):
            if until_ms is not None and record.timestamp_ms > until_ms + _CLOCK_SLACK_MS:
                return
            try:
                message = codec.decode(record.value)
            except UndecodableRecord:
                continue  # the dead-letter topic has it; a view is built from what decodes
            if isinstance(message, EVENT_TYPES) and message.run_id == run_id:
                yield message
    finally:
        reader.close()
