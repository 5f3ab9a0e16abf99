"""`tenure tail` and `tenure replay` with kcat's flags on a real broker (issue 17): start at the
beginning, an offset, N before the end or a time; only one partition; exit at the end; filters
by run, type and actor; replay as Parquet with flat columns."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from services.common.ids import run_id_for
from services.common.kafka import CommandPublisher, TopicFollower
from services.common.messages import MessageCodec
from services.common.routing import partition_for_run
from services.common.topics import RUNS_EVENTS
from services.tenure_cli import main as cli
from tests.support.lease_run import Run, renew_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def published(tenure_topics: str) -> dict[str, object]:
    """One run's five events on its partition of runs.events, with their offsets."""
    run = Run()
    claimed = run.claim()
    for sequence in (1, 2, 3):
        run.at(run.now + 1_000)
        run.accept(renew_cmd(run.run_id, claimed.attempt_id, claimed.epoch, sequence))
    run_id = run_id_for("kcat", uuid.uuid4().hex)
    events = [dataclasses.replace(e, run_id=run_id, event_id=f"{e.event_id}-{run_id}") for e in run.events]
    codec = MessageCodec()
    partition = partition_for_run(run_id)
    publisher = CommandPublisher(tenure_topics, client_id="test-kcat")
    try:
        offsets = [
            publisher.publish(codec.outbound(RUNS_EVENTS.name, run_id, e, partition)).result(timeout=30)
            for e in events
        ]
    finally:
        publisher.close()
    return {"run_id": run_id, "partition": partition, "offsets": offsets, "events": events}


def _tail(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, bootstrap: str, *argv: str
) -> list[dict]:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", bootstrap)
    assert cli.main(["tail", "runs.events", "-e", "-J", *argv]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_from_the_beginning_to_the_end_of_one_runs_events(
    tenure_topics: str, published: dict, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = _tail(capsys, monkeypatch, tenure_topics, "-o", "beginning", "--run", published["run_id"])
    assert [line["type"] for line in lines] == [type(e).__name__ for e in published["events"]]
    assert [line["offset"] for line in lines] == published["offsets"]


def test_an_offset_n_before_the_end_one_partition_and_a_time(
    tenure_topics: str, published: dict, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, partition, offsets = published["run_id"], published["partition"], published["offsets"]
    at_fourth = ("-p", str(partition), "-o", str(offsets[3]), "--run", run_id)
    assert [line["offset"] for line in _tail(capsys, monkeypatch, tenure_topics, *at_fourth)] == offsets[3:]
    probe = TopicFollower(tenure_topics, [RUNS_EVENTS.name], "end", client_id="test-kcat-probe")
    end = probe.end_offsets(RUNS_EVENTS.name)[partition]
    probe.close()
    before_end = ("-p", str(partition), "-o", f"-{end - offsets[2]}", "--run", run_id)
    assert [line["offset"] for line in _tail(capsys, monkeypatch, tenure_topics, *before_end)] == offsets[2:]
    other = str((partition + 1) % RUNS_EVENTS.partitions)
    assert _tail(capsys, monkeypatch, tenure_topics, "-p", other, "-o", "beginning", "--run", run_id) == []
    since = _tail(capsys, monkeypatch, tenure_topics, "--since", "10m", "--run", run_id)
    assert [line["offset"] for line in since] == offsets


def test_filters_by_type_and_actor(
    tenure_topics: str, published: dict, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = published["run_id"]
    renewals = _tail(
        capsys, monkeypatch, tenure_topics, "-o", "beginning", "--run", run_id, "--type", "LeaseRenewed"
    )
    assert len(renewals) == 3
    actor = published["events"][0].actor
    by_actor = _tail(capsys, monkeypatch, tenure_topics, "-o", "beginning", "--run", run_id, "--actor", actor)
    assert [line["fields"]["actor"] for line in by_actor] == [actor] * len(by_actor) and by_actor


def test_replay_as_parquet_has_flat_columns_an_analyst_can_load(
    tenure_topics: str, published: dict, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", tenure_topics)
    out = tmp_path / "run.parquet"
    assert cli.main(["replay", "--run", published["run_id"], "--output", str(out)]) == 0
    rows = pq.read_table(out).to_pylist()
    assert [r["type"] for r in rows] == [type(e).__name__ for e in published["events"]]
    assert [r["offset"] for r in rows] == published["offsets"]
    assert all(r["occurredAtTime"].endswith("Z") and r["timestamp"].endswith("Z") for r in rows)
    assert rows[0]["runId"] == published["run_id"] and isinstance(rows[0]["version"], int)
