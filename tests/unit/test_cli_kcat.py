"""kcat's flags for `tenure tail` and `tenure replay` (issue 17): offsets, times, filters, and the
flat rows analysts load into pandas or DuckDB (JSON Lines, CSV, Parquet)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.tenure_cli.kcat import (
    OffsetSpec,
    RecordFilter,
    flatten,
    format_for,
    parse_offset,
    parse_time,
    rfc3339,
    start_offsets,
    write_rows,
)

pytestmark = pytest.mark.timeout(30)

NOW = 1_796_119_200_000  # 2026-12-01T10:00:00Z


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("beginning", OffsetSpec("beginning")),
        ("end", OffsetSpec("end")),
        ("42", OffsetSpec("absolute", 42)),
        ("-5", OffsetSpec("relative", 5)),
        ("@2026-12-01T09:45:00Z", OffsetSpec("time", NOW - 15 * 60_000)),
        ("s@1796119200000", OffsetSpec("time", NOW)),
        ("@15m", OffsetSpec("time", NOW - 15 * 60_000)),
    ],
)
def test_offsets_are_kcats(text: str, spec: OffsetSpec) -> None:
    assert parse_offset(text, NOW) == spec


@pytest.mark.parametrize("text", ["", "stored", "--5", "@yesterday", "1.5"])
def test_other_offsets_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_offset(text, NOW)


@pytest.mark.parametrize(
    ("text", "ms"),
    [("90s", NOW - 90_000), ("15m", NOW - 900_000), ("2h", NOW - 7_200_000), ("7d", NOW - 7 * 86_400_000),
     ("2026-12-01T10:00:00Z", NOW), ("2026-12-01T11:00:00+01:00", NOW), ("2026-12-01T10:00:00", NOW),
     ("1796119200000", NOW)],
)  # fmt: skip
def test_times_are_rfc3339_epoch_ms_or_relative(text: str, ms: int) -> None:
    assert parse_time(text, NOW) == ms


def test_start_offsets_per_partition() -> None:
    ends = {0: 10, 1: 3, 2: 0}
    assert start_offsets(OffsetSpec("beginning"), ends, None) == {0: 0, 1: 0, 2: 0}
    assert start_offsets(OffsetSpec("end"), ends, None) == ends
    assert start_offsets(OffsetSpec("relative", 5), ends, None) == {0: 5, 1: 0, 2: 0}
    assert start_offsets(OffsetSpec("absolute", 4), ends, None) == {0: 4, 1: 3, 2: 0}
    # A time after a partition's last record: nothing of it is read (its end).
    assert start_offsets(OffsetSpec("time", NOW), ends, {0: 7, 1: -1, 2: -1}) == {0: 7, 1: 3, 2: 0}


@given(ends=st.dictionaries(st.integers(0, 8), st.integers(0, 10**6)), n=st.integers(0, 10**7))
def test_a_start_is_never_past_the_end(ends: dict[int, int], n: int) -> None:
    for spec in (OffsetSpec("absolute", n), OffsetSpec("relative", n)):
        starts = start_offsets(spec, ends, None)
        assert all(0 <= starts[p] <= end for p, end in ends.items())


def _item(
    kind: str = "LeaseRenewed", run: str = "run_1", actor: str = "runner-a", partition: int = 0
) -> dict:
    return {
        "topic": "runs.events",
        "partition": partition,
        "offset": 7,
        "key": run,
        "type": kind,
        "fields": {"runId": run, "actor": actor, "occurredAt": NOW, "lease": {"epoch": 2, "holder": "a"},
                   "effects": [1, 2], "reason": None},
    }  # fmt: skip


def test_the_filter_keeps_a_run_types_actors_and_partitions() -> None:
    item = _item()
    assert RecordFilter().keeps(item, NOW)
    assert RecordFilter(run_id="run_1", types=("LeaseRenewed",), actors=("runner-a",), partitions=(0,)).keeps(
        item, NOW
    )
    assert not RecordFilter(run_id="run_2").keeps(item, NOW)
    assert not RecordFilter(types=("RunSubmitted",)).keeps(item, NOW)
    assert not RecordFilter(actors=("olga",)).keeps(item, NOW)
    assert not RecordFilter(partitions=(1, 2)).keeps(item, NOW)
    assert not RecordFilter(until_ms=NOW - 1).keeps(item, NOW)


def test_a_row_is_flat_with_rfc3339_beside_each_time() -> None:
    row = flatten(_item(), NOW + 3)
    assert row["timestamp"] == "2026-12-01T10:00:00.003Z" == rfc3339(NOW + 3)
    assert row["occurredAt"] == NOW and row["occurredAtTime"] == "2026-12-01T10:00:00.000Z"
    assert row["lease.epoch"] == 2 and row["lease.holder"] == "a"
    assert row["effects"] == "[1, 2]" and row["reason"] is None
    assert not any(isinstance(v, dict | list) for v in row.values())


def test_the_format_follows_the_file_name_unless_given() -> None:
    assert format_for(None, "events.csv") == "csv"
    assert format_for(None, "events.parquet") == "parquet"
    assert format_for(None, "-") == "jsonl"
    assert format_for("csv", "events.parquet") == "csv"


def test_csv_and_parquet_hold_the_union_of_columns_and_mixed_types_as_text(tmp_path: Path) -> None:
    rows = [
        flatten(_item(), NOW),
        {**flatten(_item("RunSubmitted"), NOW), "extra": "x", "lease.epoch": "two"},
    ]
    text = io.StringIO()
    assert write_rows(rows, "csv", text) == 2
    read = list(csv.DictReader(io.StringIO(text.getvalue())))
    assert read[0]["type"] == "LeaseRenewed" and read[1]["extra"] == "x" and read[0]["extra"] == ""
    path = tmp_path / "events.parquet"
    assert write_rows(iter(rows), "parquet", str(path)) == 2
    table = pq.read_table(path).to_pylist()
    assert [r["type"] for r in table] == ["LeaseRenewed", "RunSubmitted"]
    assert [r["lease.epoch"] for r in table] == ["2", "two"]  # an int and a text: text
    assert table[0]["occurredAt"] == NOW and table[0]["extra"] is None
    lines = io.StringIO()
    assert write_rows(rows, "jsonl", lines) == 2
    assert json.loads(lines.getvalue().splitlines()[1])["extra"] == "x"
