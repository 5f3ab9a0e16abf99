"""`tenure tail` and `tenure replay`: Tenure's topics decoded for people and for analysts."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import sys
import time
from typing import Any, TextIO

from services.common.kafka import InboundRecord, TopicFollower
from services.common.kafka._records import header_value
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.settings import TenureSettings
from services.common.topics import (
    BREAKERS_EVENTS,
    DEADLETTER,
    INCIDENTS,
    RUNS_EVENTS,
    RUNS_REJECTIONS,
    TRAJECTORIES_EVENTS,
    TRAJECTORIES_REJECTIONS,
    WATCHDOG_EVENTS,
)
from services.tenure_cli.breakers import breaker_sentence

__all__ = ["DEFAULT_REPLAY_TOPIC", "DEFAULT_TAIL_TOPICS", "decode_for_humans", "replay", "tail"]

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


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).isoformat(timespec="milliseconds")


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
    stamp = _iso(when) if when is not None else "-" * 29
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


def tail(args: argparse.Namespace) -> int:
    codec = MessageCodec()
    topics = list(args.topics or DEFAULT_TAIL_TOPICS)
    follower = TopicFollower(
        TenureSettings().bootstrap_servers(),
        topics,
        "beginning" if args.from_beginning else "end",
        client_id="tenure-tail",
    )
    shown = 0
    idle_since = time.monotonic()
    try:
        while args.max is None or shown < args.max:
            records = follower.poll(timeout_s=0.25)
            if not records:
                if args.idle_exit is not None and time.monotonic() - idle_since > args.idle_exit:
                    break
                continue
            idle_since = time.monotonic()
            # One poll spans several topics and partitions: show it in the order it happened.
            for record in sorted(records, key=lambda r: r.timestamp_ms):
                item = decode_for_humans(codec, record)
                if args.run_id and item.get("key") != args.run_id:
                    continue
                if args.types and item["type"] not in args.types:
                    continue
                print(json.dumps(item, default=str) if args.json else _pretty(item), flush=True)
                shown += 1
                if args.max is not None and shown >= args.max:
                    break
    finally:
        follower.close()
    return 0


def _start_time_ms(text: str) -> int:
    if text.isdigit():
        return int(text)
    parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return int(parsed.timestamp() * 1000)


def replay(args: argparse.Namespace) -> int:
    topic = args.topic or DEFAULT_REPLAY_TOPIC
    bootstrap = TenureSettings().bootstrap_servers()
    probe = TopicFollower(bootstrap, [topic], "end", client_id="tenure-replay-probe")
    ends = probe.end_offsets(topic)
    if args.from_time is not None:
        starts = probe.offsets_for_time(topic, _start_time_ms(args.from_time))
        starts = {p: (o if o >= 0 else ends[p]) for p, o in starts.items()}
    else:
        starts = {p: min(args.from_offset or 0, ends[p]) for p in ends}
    probe.close()
    todo = {p: ends[p] for p in ends if starts.get(p, 0) < ends[p]}
    total = sum(ends[p] - starts.get(p, 0) for p in todo)
    sink = (
        contextlib.nullcontext(sys.stdout) if args.output == "-" else open(args.output, "w", encoding="utf-8")  # noqa: SIM115 - entered below
    )
    with sink as out:
        written = _copy_as_json_lines(bootstrap, topic, starts, todo, total, out)
    print(f"wrote {written} records from {topic}", file=sys.stderr)
    return 0


def _copy_as_json_lines(
    bootstrap: str, topic: str, starts: dict[int, int], todo: dict[int, int], total: int, out: TextIO
) -> int:
    from tqdm import tqdm

    codec = MessageCodec()
    follower = TopicFollower(bootstrap, [topic], starts, client_id="tenure-replay")
    written = 0
    idle_polls = 0
    ends = dict(todo)
    with tqdm(total=total, unit="offset", desc=f"replaying {topic}", file=sys.stderr) as bar:
        try:
            while todo and idle_polls < 20:
                records = follower.poll(max_records=2000, timeout_s=0.25)
                idle_polls = 0 if records else idle_polls + 1
                for record in records:
                    if record.partition in todo and record.offset < todo[record.partition]:
                        out.write(json.dumps(decode_for_humans(codec, record), default=str) + "\n")
                        written += 1
                # Transaction markers take offsets but are never delivered: progress is measured
                # in positions, not in records.
                positions = follower.positions(topic)
                for partition, position in positions.items():
                    if partition in todo and position >= todo[partition]:
                        del todo[partition]
                bar.n = sum(
                    max(0, min(positions.get(p, starts.get(p, 0)), end) - starts.get(p, 0))
                    for p, end in ends.items()
                )
                bar.refresh()
        finally:
            follower.close()
    return written
