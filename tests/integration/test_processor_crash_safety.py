"""DUR-1 on real processes: SIGKILL the Run processor (and the projector) again and again while
commands stream in; afterwards the committed event log has no duplicate and no gap, the
processor's RocksDB state equals the pure fold of the log, and the projection equals a pure
replay of the log and a rebuild from offset 0. The same for the saga orchestrator: both run on
the one aggregate runtime (services/common/aggregate), so every aggregate is held to it."""

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

from services.common.contracts import (
    AbortTrajectory,
    CommandRejected,
    FinishTrajectory,
    RunEvent,
    StartTrajectory,
    TrajectoryCommand,
)
from services.common.ids import run_id_for
from services.common.kafka import CommandPublisher, OutboundRecord
from services.common.kafka._records import header_value
from services.common.messages import MessageCodec
from services.common.routing import command_record, trajectory_command_record
from services.common.store import MemoryStore, RocksStore
from services.common.topics import (
    DEADLETTER,
    RUNS_COMMANDS,
    RUNS_EVENTS,
    RUNS_REJECTIONS,
    TRAJECTORIES_COMMANDS,
    TRAJECTORIES_EVENTS,
    TRAJECTORIES_REJECTIONS,
)
from services.lease_coordinator.domain import fold
from services.lease_coordinator.state_codec import decode_state
from services.projections.service import rebuild, views_path
from services.projections.store import RunViewStore
from services.projections.views import apply_event
from services.saga_orchestrator import state_codec as trajectory_codec
from services.saga_orchestrator.domain import fold as fold_trajectory
from tests.support.system import (
    ServiceProcess,
    cancel_command,
    decode_all,
    read_topic,
    service_env,
    submit_command,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(240)]

# Not 0x00: a leading zero byte is the Confluent wire format's magic (issue 17), decoded by registry id.
GARBAGE = b"\x01not avro"
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


# --- the saga orchestrator on the same runtime -----------------------------------------------------

TRAJECTORIES = 160


def _trajectory(kind: type[TrajectoryCommand], run_id: str, command_id: str, **fields: Any) -> Any:
    return kind(
        command_id=command_id,
        run_id=run_id,
        issued_at=int(time.time() * 1000),
        correlation_id=run_id,
        actor="tests",
        attempt_id="att-1",
        lease_epoch=1,
        **fields,
    )


def _decoded(bootstrap: str, topic: Any) -> list[Any]:
    return decode_all(read_topic(bootstrap, topic.name, topic.partitions))


def _stream_trajectory_commands(
    bootstrap: str, tag: str, done: threading.Event, sent: dict[str, Any]
) -> None:
    """Starts, some repeated starts, finishes and aborts of earlier ones, one garbage record, paced."""
    codec = MessageCodec()
    publisher = CommandPublisher(bootstrap, client_id="dur1-saga-producer")
    rng = random.Random(13)
    futures = []
    try:
        for i in range(TRAJECTORIES):
            run_id = run_id_for("dur1s", f"{tag}-{i}")
            start = _trajectory(StartTrajectory, run_id, f"{tag}-start-{i}")
            sent["runs"].append(run_id)
            futures.append(publisher.publish(trajectory_command_record(codec, start)))
            if rng.random() < 0.1:  # a client retry: same command again
                futures.append(publisher.publish(trajectory_command_record(codec, start)))
            if i >= 5 and rng.random() < 0.4:
                target = sent["runs"][rng.randrange(0, i)]
                end: Any = (
                    _trajectory(FinishTrajectory, target, f"{tag}-finish-{i}")
                    if rng.random() < 0.5
                    else _trajectory(AbortTrajectory, target, f"{tag}-abort-{i}", reason="enough")
                )
                sent["ends"].append(end.command_id)
                futures.append(publisher.publish(trajectory_command_record(codec, end)))
            if i == TRAJECTORIES // 2:
                garbage = OutboundRecord(TRAJECTORIES_COMMANDS.name, key=tag.encode(), value=GARBAGE)
                futures.append(publisher.publish(garbage))
            time.sleep(0.03)
        for future in futures:
            future.result(30)
    finally:
        publisher.close()
        done.set()


def test_sigkill_of_the_saga_orchestrator_loses_and_duplicates_nothing_DUR_1(
    tenure_topics: str, tmp_path: Path
) -> None:
    bootstrap = tenure_topics
    tag = f"dur1s-{time.time_ns()}"
    env = service_env(bootstrap, tmp_path / "state")
    orchestrator = ServiceProcess("saga-orchestrator", "services.saga_orchestrator", env, tmp_path).start()
    sent: dict[str, Any] = {"runs": [], "ends": []}
    done = threading.Event()
    producer = threading.Thread(target=_stream_trajectory_commands, args=(bootstrap, tag, done, sent))
    producer.start()
    kills = 0
    try:
        rng = random.Random(17)
        while not done.is_set() and kills < KILLS:
            time.sleep(rng.uniform(0.8, 1.8))
            orchestrator.sigkill()
            orchestrator.start()
            kills += 1
        producer.join(120)
        assert kills == KILLS, "the producer finished before every kill happened; slow it down"

        def all_decided() -> bool:
            events = _decoded(bootstrap, TRAJECTORIES_EVENTS)
            refusals = _decoded(bootstrap, TRAJECTORIES_REJECTIONS)
            causes = {e.causation_id for e in events} | {r.causation_id for r in refusals}
            started = {e.run_id for e in events if type(e).__name__ == "TrajectoryStarted"}
            return set(sent["runs"]) <= started and set(sent["ends"]) <= causes

        wait_until(all_decided, 90, "every trajectory command to be decided", poll_s=1.0)
    finally:
        orchestrator.stop()
    assert orchestrator.starts == KILLS + 1

    events = [e for e in _decoded(bootstrap, TRAJECTORIES_EVENTS) if e.run_id in set(sent["runs"])]
    # 1. The committed log: exactly once per cause, versions 1..n without gaps per trajectory.
    assert len({e.event_id for e in events}) == len(events), "an event was committed twice"
    by_run: dict[str, list[Any]] = defaultdict(list)
    for event in events:
        by_run[event.run_id].append(event)
    for run_id, run_events in by_run.items():
        assert [e.version for e in run_events] == list(range(1, len(run_events) + 1)), run_id
    # 2. The RocksDB state is the fold of the log, and the live index holds exactly the live ones.
    store = RocksStore(tmp_path / "state" / "saga_orchestrator-0" / "trajectories")
    try:
        scanned = store.scan("trajectory/")
        stored = {k.removeprefix("trajectory/"): trajectory_codec.decode_state(v) for k, v in scanned}
        live = {k.rsplit("/", 1)[-1] for k, _ in store.scan("active/")}
    finally:
        store.close()
    assert {r for r in stored if r in by_run} == set(by_run) == set(sent["runs"])
    for run_id, run_events in by_run.items():
        assert stored[run_id] == fold_trajectory(run_events), run_id
    assert {r for r in live if r in by_run} == {r for r in by_run if not stored[r].status.is_terminal}
    # 3. Each end was answered once; the garbage went to the dead letters, once.
    refusals = [r for r in _decoded(bootstrap, TRAJECTORIES_REJECTIONS) if r.run_id in by_run]
    assert len({r.event_id for r in refusals}) == len(refusals)
    answers = [e.causation_id for e in events if e.causation_id in set(sent["ends"])]
    answers += [r.causation_id for r in refusals]
    assert sorted(set(answers)) == sorted(set(sent["ends"]))
    dead = [
        r
        for r in read_topic(bootstrap, DEADLETTER.name, DEADLETTER.partitions)
        if r.key == tag.encode()
        and header_value(r.headers, "tenure-dlq-source-topic") == TRAJECTORIES_COMMANDS.name.encode()
    ]
    assert len(dead) == 1 and dead[0].value == GARBAGE
