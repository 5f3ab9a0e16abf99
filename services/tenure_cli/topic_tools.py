"""`tenure tail` and `tenure replay`: Tenure's topics decoded for people and for analysts, with kcat's
flags (services/tenure_cli/kcat.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from typing import Any, Literal

from services.common.kafka import InboundRecord, TopicFollower, resource_prefix
from services.common.kafka._records import header_value
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.settings import TenureSettings
from services.common.times import rfc3339_or_none
from services.common.topics import (
    BREAKERS_EVENTS,
    DEADLETTER,
    INCIDENTS,
    RUNS_EVENTS,
    RUNS_REJECTIONS,
    TOPICS,
    TRAJECTORIES_EVENTS,
    TRAJECTORIES_REJECTIONS,
    WATCHDOG_EVENTS,
)
from services.tenure_cli.breakers import breaker_sentence
from services.tenure_cli.kcat import (
    FORMATS,
    OffsetSpec,
    RecordFilter,
    flatten,
    format_for,
    parse_offset,
    parse_time,
    start_offsets,
    write_rows,
)

__all__ = [
    "DEFAULT_REPLAY_TOPIC",
    "DEFAULT_TAIL_TOPICS",
    "add_parsers",
    "decode_for_humans",
    "replay",
    "resolve_topic",
    "tail",
]

# What an operator watches: facts and refusals of runs and of their trajectories, incidents
# (REC-7), the semantic watchdog's ladder (WD-5), the tool endpoints' circuit breakers (BRK-1,
# BRK-2: each one a line of its own) and dead letters. `tenure tail --help` names these from this
# same tuple.
DEFAULT_TAIL_TOPICS = (
    RUNS_EVENTS.name,
    RUNS_REJECTIONS.name,
    TRAJECTORIES_EVENTS.name,
    TRAJECTORIES_REJECTIONS.name,
    INCIDENTS.name,
    WATCHDOG_EVENTS.name,
    BREAKERS_EVENTS.name,
    DEADLETTER.name,
)
DEFAULT_REPLAY_TOPIC = RUNS_EVENTS.name

_TIME_FIELDS = ("occurredAt", "issuedAt")


def resolve_topic(name: str) -> str:
    """A catalog name as the operator knows it (`runs.events`) to this deployment's name
    (`<TENURE_TOPIC_PREFIX>runs.events`); any other name is used as given."""
    for spec in TOPICS:
        if name == spec.name or spec.name == resource_prefix() + name:
            return spec.name
    return name


def decode_for_humans(codec: MessageCodec, record: InboundRecord) -> dict[str, Any]:
    """A JSON-ready dict: where the record sits, its schema, and its fields (or why not)."""
    out: dict[str, Any] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "key": record.key.decode("utf-8", "replace") if record.key else None,
    }
    if record.topic == DEADLETTER.name:
        out["type"] = "DeadLetter"
        out["fields"] = {
            k.removeprefix("tenure-dlq-"): v.decode("utf-8", "replace")
            for k, v in record.headers
            if k.startswith("tenure-dlq-")
        }
        return out
    try:
        full_name, fields = codec.decode_record(record.value)
    except UndecodableRecord as exc:
        schema = header_value(record.headers, "tenure-schema")
        out["type"] = "Undecodable"
        out["fields"] = {"reason": str(exc), "schemaHeader": schema.decode() if schema else None}
        return out
    out["type"] = full_name.rsplit(".", 1)[-1]
    out["schema"] = full_name
    out["fields"] = fields
    return out


def _pretty(item: dict[str, Any]) -> str:
    fields = dict(item["fields"])
    when = next((fields.pop(f) for f in _TIME_FIELDS if isinstance(fields.get(f), int)), None)
    stamp = (rfc3339_or_none(when) if when is not None else None) or "-" * 24
    head = f"{stamp}  {item['type']:<16} {item.get('key') or '':<36}"
    version = fields.pop("version", None)
    if version is not None:
        head += f" v{version}"
    for noisy in ("eventId", "runId", "correlationId", "executionSpec"):
        fields.pop(noisy, None)
    sentence = breaker_sentence(item["type"], fields) if item["topic"] == BREAKERS_EVENTS.name else None
    if sentence is not None:
        return f"{head}  {sentence}  [{item['topic']}/{item['partition']}@{item['offset']}]"
    detail = "  ".join(f"{k}={v}" for k, v in fields.items() if v not in (None, "", {}, []))
    return f"{head}  {detail}  [{item['topic']}/{item['partition']}@{item['offset']}]"


class _Reader:
    """Follows `topics` from where `spec` says, in kcat's terms (services/tenure_cli/kcat.py).

    From the beginning or the end of every partition one follower serves all topics; a start
    computed per partition (N, -N, a time) or a choice of partitions needs each topic's ends
    first, so each topic gets its own follower. `at_end()` is true once every partition has
    been read to where it ended at start-up (for -e)."""

    def __init__(
        self, bootstrap: str, topics: list[str], spec: OffsetSpec, partitions: list[int], client_id: str
    ) -> None:
        self._followers: list[tuple[list[str], TopicFollower]] = []
        self._pending: dict[tuple[str, int], int] = {}
        if (spec.kind == "beginning" or spec.kind == "end") and not partitions:
            edge: Literal["beginning", "end"] = "beginning" if spec.kind == "beginning" else "end"
            follower = TopicFollower(bootstrap, topics, edge, client_id=client_id)
            self._followers.append((topics, follower))
            if spec.kind == "beginning":
                for topic in topics:
                    self._pending.update(
                        {(topic, p): e for p, e in follower.end_offsets(topic).items() if e > 0}
                    )
            return
        for topic in topics:
            probe = TopicFollower(bootstrap, [topic], "end", client_id=f"{client_id}-probe")
            try:
                ends = probe.end_offsets(topic)
                at_time = probe.offsets_for_time(topic, spec.value) if spec.kind == "time" else None
            finally:
                probe.close()
            chosen = {p: e for p, e in ends.items() if not partitions or p in partitions}
            starts = {**ends, **start_offsets(spec, chosen, at_time)}  # the others: from their end
            self._pending.update({(topic, p): chosen[p] for p in chosen if starts[p] < chosen[p]})
            self._followers.append(([topic], TopicFollower(bootstrap, [topic], starts, client_id=client_id)))

    def poll(self, timeout_s: float) -> list[InboundRecord]:
        records: list[InboundRecord] = []
        for _, follower in self._followers:
            records.extend(follower.poll(max_records=2000, timeout_s=timeout_s / len(self._followers)))
        return sorted(records, key=lambda r: r.timestamp_ms)  # in the order it happened

    def at_end(self) -> bool:
        for topics, follower in self._followers:
            for topic in topics:
                for partition, position in follower.positions(topic).items():
                    end = self._pending.get((topic, partition))
                    if end is not None and position >= end:
                        del self._pending[(topic, partition)]
        return not self._pending

    def close(self) -> None:
        for _, follower in self._followers:
            follower.close()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _offset_spec(args: argparse.Namespace, default: str) -> OffsetSpec:
    if getattr(args, "since", None):
        return OffsetSpec("time", parse_time(args.since, _now_ms()))
    if getattr(args, "from_beginning", False):
        return OffsetSpec("beginning")
    return parse_offset(args.offset or default, _now_ms())


def _record_filter(args: argparse.Namespace, until_ms: int | None = None) -> RecordFilter:
    return RecordFilter(
        run_id=args.run_id,
        types=tuple(args.types or ()),
        actors=tuple(args.actors or ()),
        partitions=tuple(args.partitions or ()),
        until_ms=until_ms,
    )


def _bootstrap(args: argparse.Namespace) -> str:
    return args.bootstrap_server or TenureSettings().bootstrap_servers()


def tail(args: argparse.Namespace) -> int:
    codec = MessageCodec()
    topics = [resolve_topic(t) for t in args.topics] if args.topics else list(DEFAULT_TAIL_TOPICS)
    keep = _record_filter(args)
    reader = _Reader(
        _bootstrap(args), topics, _offset_spec(args, "end"), args.partitions or [], "tenure-tail"
    )
    shown = 0
    idle_since = time.monotonic()
    try:
        while args.max is None or shown < args.max:
            records = reader.poll(timeout_s=0.25)
            if not records:
                if args.exit_at_end and reader.at_end():
                    break
                if args.idle_exit is not None and time.monotonic() - idle_since > args.idle_exit:
                    break
                continue
            idle_since = time.monotonic()
            for record in records:
                item = decode_for_humans(codec, record)
                if not keep.keeps(item, record.timestamp_ms):
                    continue
                print(json.dumps(item, default=str) if args.json else _pretty(item), flush=True)
                shown += 1
                if args.max is not None and shown >= args.max:
                    break
    finally:
        reader.close()
    return 0


def replay(args: argparse.Namespace) -> int:
    """The records of one topic from a start to the end as it was at start-up (or to --to), as
    JSON Lines (nested, as `tail --json` prints them), or as flat rows in CSV or Parquet."""
    topic = resolve_topic(args.topic) if args.topic else DEFAULT_REPLAY_TOPIC
    if args.from_offset is not None:
        spec = OffsetSpec("absolute", args.from_offset)
    elif args.from_time is not None:
        spec = OffsetSpec("time", parse_time(args.from_time, _now_ms()))
    else:
        spec = _offset_spec(args, "beginning")
    until = parse_time(args.to, _now_ms()) if args.to else None
    fmt = format_for(args.format, args.output)
    if fmt == "parquet" and args.output == "-":
        raise ValueError("Parquet is written to a file: --output FILE.parquet")
    reader = _Reader(_bootstrap(args), [topic], spec, args.partitions or [], "tenure-replay")
    rows = _replayed(reader, _record_filter(args, until), topic, flat=fmt != "jsonl")
    try:
        if fmt == "parquet":
            written = write_rows(rows, fmt, args.output)
        else:
            with contextlib.ExitStack() as stack:
                out = sys.stdout
                if args.output != "-":
                    out = stack.enter_context(open(args.output, "w", encoding="utf-8", newline=""))
                written = write_rows(rows, fmt, out)
    finally:
        reader.close()
    print(f"wrote {written} records from {topic} as {fmt}", file=sys.stderr)
    return 0


def _replayed(reader: _Reader, keep: RecordFilter, topic: str, *, flat: bool) -> Iterator[dict[str, Any]]:
    from tqdm import tqdm

    codec = MessageCodec()
    idle_polls = 0
    with tqdm(unit="record", desc=f"replaying {topic}", file=sys.stderr) as bar:
        # Transaction markers take offsets but are never delivered: the end is reached by
        # positions, not by counting records.
        while not reader.at_end() and idle_polls < 40:
            records = reader.poll(timeout_s=0.25)
            idle_polls = 0 if records else idle_polls + 1
            for record in records:
                bar.update()
                item = decode_for_humans(codec, record)
                if keep.keeps(item, record.timestamp_ms):
                    yield flatten(item, record.timestamp_ms) if flat else item


def _kcat_flags(parser: argparse.ArgumentParser, default_offset: str) -> None:
    parser.add_argument("-b", "--bootstrap-server", default=None, help="Kafka (default: the deployment's)")
    parser.add_argument(
        "-p",
        "--partition",
        dest="partitions",
        type=int,
        action="append",
        help="only this partition (repeatable)",
    )
    parser.add_argument(
        "-o",
        "--offset",
        default=None,
        help=f"beginning, end, N, -N (N before the end) or @TIME (default {default_offset})",
    )
    parser.add_argument(
        "--since", default=None, help="start at this time: 15m, 2h, 7d ago, RFC 3339 or epoch ms"
    )
    parser.add_argument("--run", dest="run_id", help="only this run id")
    parser.add_argument("--type", dest="types", action="append", help="only this record type (repeatable)")
    parser.add_argument(
        "--actor", dest="actors", action="append", help="only records of this actor (repeatable)"
    )


def add_parsers(sub: Any) -> None:
    """`tenure tail` and `tenure replay` under the CLI's subcommands."""
    tailing = sub.add_parser("tail", help="decode and pretty-print records as they arrive (kcat -C)")
    tailing.add_argument(
        "topics", nargs="*", default=None, help=f"topics (default: {' '.join(DEFAULT_TAIL_TOPICS)})"
    )
    _kcat_flags(tailing, "end")
    tailing.add_argument("--from-beginning", action="store_true", help="the same as -o beginning")
    tailing.add_argument(
        "-e", "--exit", dest="exit_at_end", action="store_true", help="exit at the end of the log"
    )
    tailing.add_argument("-J", "--json", action="store_true", help="one JSON object per line")
    tailing.add_argument("--max", type=int, default=None, help="stop after this many records")
    tailing.add_argument("--idle-exit", type=float, default=None, help="stop after this many idle seconds")
    tailing.set_defaults(func=tail)

    replaying = sub.add_parser(
        "replay", help="write a topic's records for analysts: JSON Lines, CSV or Parquet"
    )
    replaying.add_argument("--topic", default=None, help=f"topic (default {DEFAULT_REPLAY_TOPIC})")
    _kcat_flags(replaying, "beginning")
    start = replaying.add_mutually_exclusive_group()
    start.add_argument(
        "--from-offset", type=int, default=None, help="start at this offset in every partition"
    )
    start.add_argument("--from-time", "--from", default=None, help="start at this time (as --since)")
    replaying.add_argument("--to", default=None, help="stop after this time (RFC 3339, epoch ms or 15m ago)")
    replaying.add_argument(
        "--format", choices=FORMATS, default=None, help="jsonl, csv or parquet (default: from the file name)"
    )
    replaying.add_argument(
        "--output", default="-", help="file to write (default stdout; Parquet needs a file)"
    )
    replaying.set_defaults(func=replay)
