"""What `tenure tail` and `tenure replay` share, in kcat's terms: where to start, when to stop,
which records to keep, and how a record becomes a row an analyst can load.

    -o beginning | end | N | -N | @T     start at the start, the end, offset N, N before the end,
                                         or the first record at time T (kcat's `-o s@T`)
    --since 15m                          start 15 minutes ago (s, m, h, d)
    -e                                   exit at the end of every partition as it was at start-up
    -p N                                 only partition N (repeatable)
    --run R --type T --actor A           keep only records of run R, type T, actor A

Times are RFC 3339 (`2026-12-01T10:00:00Z`), epoch milliseconds, or relative (`15m` = 15 minutes
ago). Rows are flat: where the record sits (topic, partition, offset, its timestamp in RFC 3339),
its type and key, then its fields, nested ones as `outer.inner`, lists as JSON text, and every
`...At` time in milliseconds also as `...AtTime` in RFC 3339, so pandas and DuckDB read them as
they come.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from services.common.times import rfc3339, rfc3339_or_none

__all__ = [
    "FORMATS",
    "OffsetSpec",
    "RecordFilter",
    "flatten",
    "format_for",
    "parse_offset",
    "parse_time",
    "rfc3339",
    "start_offsets",
    "write_rows",
]

FORMATS = ("jsonl", "csv", "parquet")
_RELATIVE = re.compile(r"(\d{1,9})\s*(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_MAX_MS = 2**63 - 1


def parse_time(text: str, now_ms: int) -> int:
    """Epoch ms from RFC 3339 (an offset or Z, or UTC when none is given), epoch ms, or a
    relative time before `now_ms` (`90s`, `15m`, `2h`, `7d`)."""
    text = text.strip()
    if match := _RELATIVE.fullmatch(text):
        return max(0, now_ms - int(match.group(1)) * _UNIT_MS[match.group(2)])
    if text.isdigit() and len(text) <= 15:
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text[:60]!r} is not a time: use RFC 3339 (2026-12-01T10:00:00Z), epoch "
            "milliseconds, or a relative time (90s, 15m, 2h, 7d)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True)
class OffsetSpec:
    """Where a partition's reading starts: `kind` is beginning, end, absolute, relative or time."""

    kind: str
    value: int = 0

    def start(self, end: int, at_time: int | None) -> int:
        """The offset to start at in a partition whose end is `end`; `at_time` is the first
        offset at or after the spec's time there (-1 when none is)."""
        if self.kind == "beginning":
            return 0
        if self.kind == "end":
            return end
        if self.kind == "absolute":
            return min(self.value, end)
        if self.kind == "relative":
            return max(0, end - self.value)
        return end if at_time is None or at_time < 0 else at_time


def parse_offset(text: str, now_ms: int) -> OffsetSpec:
    """kcat's `-o`: beginning, end, N, -N, or @T (also kcat's s@T) for a time."""
    text = text.strip()
    if text in ("beginning", "end"):
        return OffsetSpec(text)
    if re.fullmatch(r"\d{1,19}", text):
        return OffsetSpec("absolute", min(int(text), _MAX_MS))
    if re.fullmatch(r"-\d{1,19}", text):
        return OffsetSpec("relative", min(int(text[1:]), _MAX_MS))
    if text.startswith(("@", "s@")):
        return OffsetSpec("time", parse_time(text.split("@", 1)[1], now_ms))
    raise ValueError(f"-o {text[:40]!r}: use beginning, end, N, -N or @TIME")


def start_offsets(
    spec: OffsetSpec, ends: Mapping[int, int], at_time: Mapping[int, int] | None
) -> dict[int, int]:
    """The start offset of each partition in `ends` (the ones to read)."""
    return {p: spec.start(end, (at_time or {}).get(p)) for p, end in ends.items()}


@dataclass(frozen=True)
class RecordFilter:
    """Which decoded records to keep (`decode_for_humans` items); an empty criterion keeps all."""

    run_id: str | None = None
    types: Collection[str] = ()
    actors: Collection[str] = ()
    partitions: Collection[int] = ()
    until_ms: int | None = None

    def keeps(self, item: Mapping[str, Any], timestamp_ms: int) -> bool:
        fields = item.get("fields") or {}
        if self.run_id and item.get("key") != self.run_id and fields.get("runId") != self.run_id:
            return False
        if self.types and item.get("type") not in self.types:
            return False
        if self.actors and fields.get("actor") not in self.actors:
            return False
        if self.partitions and item.get("partition") not in self.partitions:
            return False
        return self.until_ms is None or timestamp_ms <= self.until_ms


def flatten(item: Mapping[str, Any], timestamp_ms: int) -> dict[str, Any]:
    """One decoded record as one flat row (see the module docstring)."""
    row: dict[str, Any] = {
        "topic": item.get("topic"),
        "partition": item.get("partition"),
        "offset": item.get("offset"),
        "timestamp": rfc3339_or_none(timestamp_ms) if timestamp_ms > 0 else None,
        "type": item.get("type"),
        "key": item.get("key"),
    }
    _flatten_into(row, "", item.get("fields") or {})
    return row


def _flatten_into(row: dict[str, Any], prefix: str, fields: Mapping[str, Any]) -> None:
    for name, value in fields.items():
        column = f"{prefix}{name}"
        if isinstance(value, Mapping):
            _flatten_into(row, f"{column}.", value)
        elif isinstance(value, list | tuple):
            row[column] = json.dumps(value, default=str)
        elif isinstance(value, bytes):
            row[column] = value.hex()
        else:
            row[column] = value
            if name.endswith("At") and isinstance(value, int) and not isinstance(value, bool) and value > 0:
                row[f"{column}Time"] = rfc3339_or_none(value)


def format_for(requested: str | None, output: str) -> str:
    """The --format asked for, else the output file's extension, else JSON Lines."""
    if requested:
        return requested
    for fmt, suffixes in (("csv", (".csv",)), ("parquet", (".parquet", ".pq"))):
        if output.endswith(suffixes):
            return fmt
    return "jsonl"


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    return list(seen)


def write_rows(rows: Iterable[dict[str, Any]], fmt: str, out: TextIO | str) -> int:
    """Write `rows` as JSON Lines (streamed), CSV or Parquet (columns: the union of the rows'
    keys, in first-seen order; a column whose values have more than one type is text)."""
    if fmt == "jsonl":
        assert not isinstance(out, str)
        count = 0
        for row in rows:
            out.write(json.dumps(row, default=str) + "\n")
            count += 1
        return count
    table = list(rows)
    columns = _columns(table)
    if fmt == "csv":
        assert not isinstance(out, str)
        writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(table)
        return len(table)
    if fmt == "parquet":
        assert isinstance(out, str), "Parquet is written to a file (-o FILE.parquet)"
        _write_parquet(table, columns, out)
        return len(table)
    raise ValueError(f"format {fmt!r}: use one of {', '.join(FORMATS)}")


def _write_parquet(table: list[dict[str, Any]], columns: list[str], path: str) -> None:
    import pyarrow as pa  # the analysts' format only: the rest of the CLI never needs it
    import pyarrow.parquet as pq

    arrays = {}
    for column in columns:
        values = [row.get(column) for row in table]
        kinds = {type(v) for v in values if v is not None}
        if len(kinds) > 1:  # e.g. an int in one event type and a text in another
            values = [None if v is None else str(v) for v in values]
        arrays[column] = pa.array(values)
    pq.write_table(pa.table(arrays), path)
