"""DUR-1 on real processes: SIGKILL the Run processor (and the projector) again and again while
commands stream in; afterwards the committed event log has no duplicate and no gap, the
processor's RocksDB state equals the pure fold of the log, and the projection equals a pure
replay of the log and a rebuild from offset 0."""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from services.common.contracts import CommandRejected, RunEvent
from services.common.kafka import CommandPublisher, OutboundRecord
from services.common.kafka._records import header_value
from services.common.messages import MessageCodec
from services.common.routing import command_record
from services.common.store import MemoryStore, RocksStore
from services.common.topics import DEADLETTER, RUNS_COMMANDS, RUNS_EVENTS, RUNS_REJECTIONS
from services.lease_coordinator.domain import fold
from services.lease_coordinator.state_codec import decode_state
from services.projections.service import rebuild, views_path
from services.projections.store import RunViewStore
from services.projections.views import apply_event
from tests.support.system import (
    ServiceProcess,
    cancel_command,
    decode_all,
    read_topic,
    service_env,
    submit_command,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

GARBAGE = b"\x00not avro"
SUBMITS = 240
KILLS = 4


def _stream_commands(bootstrap: str, tag: str, done: threading.Event, sent: dict[str, Any]) -> None:
    """Submits, some duplicate submits, cancels of earlier runs and one garbage record, paced."""
    codec = MessageCodec()
    publisher = CommandPublisher(bootstrap, client_id="dur1-producer")
    rng = random.Random(7)
    futures = []
    try:
        for i in range(SUBMITS):
            submit = submit_command("dur1", f"{tag}-{i}")
            sent["runs"].append(submit.run_id)
            futures.append(publisher.publish(command_record(codec, submit)))
            if rng.random() < 0.1:  # a client retry: same command again
                futures.append(publisher.publish(command_record(codec, submit)))
            if i >= 5 and rng.random() < 0.3:
                target = sent["runs"][rng.randrange(0, i)]
                cancel = cancel_command(target, f"{tag}-cancel-{i}")
                sent["cancels"].append(cancel.command_id)
                futures.append(publisher.publish(command_record(codec, cancel)))
            if i == SUBMITS // 2:
                garbage = OutboundRecord(RUNS_COMMANDS.name, key=tag.encode(), value=GARBAGE)
                futures.append(publisher.publish(garbage))
            time.sleep(0.025)
        for future in futures:
            future.result(30)
    finally:
        publisher.close()
        done.set()


def test_sigkill_of_processor_and_projector_loses_and_duplicates_nothing_DUR_1(
    tenure_topics: str, tmp_path: Path
) -> None:
    bootstrap = tenure_topics
    tag = f"dur1-{time.time_ns()}"
    env = service_env(bootstrap, tmp_path / "state")
    processor = ServiceProcess("lease-coordinator", "services.lease_coordinator", env, tmp_path).start()
    projector = ServiceProcess("projections", "services.projections", env, tmp_path).start()
    sent: dict[str, Any] = {"runs": [], "cancels": []}
    done = threading.Event()
    producer = threading.Thread(target=_stream_commands, args=(bootstrap, tag, done, sent))
    producer.start()
    kills = 0
    try:
        rng = random.Random(11)
        while not done.is_set() and kills < KILLS:
            time.sleep(rng.uniform(0.8, 1.8))
            processor.sigkill()
            if kills == 1:
                projector.sigkill()
                projector.start()
            processor.start()
            kills += 1
        producer.join(120)
        assert kills == KILLS, "the producer finished before every kill happened; slow it down"

        def all_decided() -> bool:
            events = decode_all(read_topic(bootstrap, RUNS_EVENTS.name, RUNS_EVENTS.partitions))
            rejections = decode_all(read_topic(bootstrap, RUNS_REJECTIONS.name, RUNS_REJECTIONS.partitions))
            causes = {e.causation_id for e in events} | {r.causation_id for r in rejections}
            submitted = {e.run_id for e in events if type(e).__name__ == "RunSubmitted"}
            return set(sent["runs"]) <= submitted and set(sent["cancels"]) <= causes

        try:
            wait_until(all_decided, 90, "every command to be decided", poll_s=1.0)
        except AssertionError:
            if os.environ.get("TENURE_DEBUG_HANG"):
                subprocess.run(["py-spy", "dump", "--pid", str(processor.process.pid)], check=False)  # type: ignore[union-attr]
            raise
    finally:
        processor.stop()
        projector_running = projector.alive()
    assert processor.starts == KILLS + 1

    records = read_topic(bootstrap, RUNS_EVENTS.name, RUNS_EVENTS.partitions)
    events: list[RunEvent] = decode_all(records)

    # 1. The committed log itself: exactly once per cause, versions 1..n without gaps per run.
    event_ids = [e.event_id for e in events]
    assert len(event_ids) == len(set(event_ids)), "an event was committed twice"
    by_run: dict[str, list[RunEvent]] = defaultdict(list)
    for event in events:
        by_run[event.run_id].append(event)
    for run_id, run_events in by_run.items():
        assert [e.version for e in run_events] == list(range(1, len(run_events) + 1)), run_id
    assert all(len(by_run[r]) in (1, 2) for r in sent["runs"])

    # 2. The processor's RocksDB state equals the pure fold of the log, for every run.
    store = RocksStore(tmp_path / "state" / "lease_coordinator-0" / "runs")
    try:
        stored = {k[len("run/") :]: decode_state(v) for k, v in store.scan("run/")}
    finally:
        store.close()
    assert stored.keys() == by_run.keys()
    for run_id, run_events in by_run.items():
        assert stored[run_id] == fold(run_events), run_id

    # 3. Rejections answer each refused cancel once; the garbage record went to the dead letters.
    rejections: list[CommandRejected] = decode_all(
        read_topic(bootstrap, RUNS_REJECTIONS.name, RUNS_REJECTIONS.partitions)
    )
    rejection_ids = [r.event_id for r in rejections]
    assert len(rejection_ids) == len(set(rejection_ids))
    dead = [
        r
        for r in read_topic(bootstrap, DEADLETTER.name, DEADLETTER.partitions)
        if r.key == tag.encode() and header_value(r.headers, "tenure-dlq-source-topic") == b"runs.commands"
    ]
    assert len(dead) == 1
    assert dead[0].value == GARBAGE
    assert header_value(dead[0].headers, "tenure-dlq-reason") == b"BAD_MAGIC"
    assert header_value(dead[0].headers, "tenure-dlq-source-offset") is not None

    # 4. The projection (killed once too) equals a pure replay of the log and a rebuild.
    projector.stop()
    assert projector_running
    live_views = RunViewStore(RocksStore(views_path(tmp_path / "state")), MessageCodec()).all_views()
    replayed: dict[str, dict[str, Any]] = {}
    for event in events:
        after = apply_event(replayed.get(event.run_id), event)
        if after is not None:
            replayed[event.run_id] = after
    assert live_views == replayed
    rebuilt = RunViewStore(MemoryStore(), MessageCodec())
    report = rebuild(bootstrap, rebuilt)
    assert report.events == len(records)
    assert rebuilt.all_views() == live_views
