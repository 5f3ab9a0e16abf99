"""The semantic watchdog as a real process on the real broker (WD-1..WD-5, DUR-1).

A looping run's observations go to progress.observations; the watchdog process answers with
level 1, 2 and 3 on watchdog.events and, in the same transactions, RecordWatchdogIntervention
commands on the run's partition of trajectories.commands. The process is SIGKILLed mid-ladder
(right after the observation that must raise level 2 is published) and restarted: no detection
is lost, no intervention is repeated, the run's versions stay contiguous, and a redelivered
observation changes nothing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.contracts import (
    InterventionIssued,
    LoopDetected,
    ObserveStep,
    RecordWatchdogIntervention,
)
from services.common.ids import action_hash, run_id_for
from services.common.kafka import CommandPublisher
from services.common.messages import MessageCodec
from services.common.routing import observation_record, partition_for_run
from services.common.topics import TRAJECTORIES_COMMANDS, WATCHDOG_EVENTS
from tests.support.system import (
    ServiceProcess,
    decode_all,
    free_port,
    read_topic,
    service_env,
    wait_for_ready,
    wait_until,
)
from tests.unit.watchdog.support import state_hash

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CODEC = MessageCodec()


def _observation(run_id: str, seq: int) -> ObserveStep:
    """The seed's loop: read the config (state A), then edit line 42 (B), revert (A), edit ..."""
    if seq == 1:
        tool, args, state, mutating = "fs.read", {"path": "config.py"}, "A", False
    else:
        edit = seq % 2 == 0
        tool, args, state, mutating = "fs.edit", {"line": 42, "strict": edit}, "B" if edit else "A", True
    return ObserveStep(
        command_id=f"obs-{run_id}-{seq}",
        run_id=run_id,
        issued_at=int(time.time() * 1000),
        correlation_id=run_id,
        actor="runner:wd-test",
        source="runner",
        step_seq=seq,
        tool=tool,
        action_hash=action_hash(tool, args),
        state_hash=state_hash(state),
        summary=f"step {seq}",
        mutating=mutating,
    )


def _run_events(bootstrap: str, run_id: str) -> list[Any]:
    partition = partition_for_run(run_id, WATCHDOG_EVENTS.partitions)
    records = [
        r
        for r in read_topic(bootstrap, WATCHDOG_EVENTS.name, WATCHDOG_EVENTS.partitions)
        if r.partition == partition and r.key == run_id.encode()
    ]
    return [e for e in decode_all(records) if e.run_id == run_id]


def _sent_to_trajectory(bootstrap: str, run_id: str) -> list[RecordWatchdogIntervention]:
    # Only this run's records: the topic is shared with the other tests of the session, and some
    # of them put garbage on it on purpose (the poison-command tests).
    records = [
        r
        for r in read_topic(bootstrap, TRAJECTORIES_COMMANDS.name, TRAJECTORIES_COMMANDS.partitions)
        if r.key == run_id.encode()
    ]
    return [
        c
        for r, c in zip(records, decode_all(records), strict=True)
        if isinstance(c, RecordWatchdogIntervention)
        and c.run_id == run_id
        and r.partition == partition_for_run(run_id, TRAJECTORIES_COMMANDS.partitions)
    ]


def _levels(events: list[Any]) -> list[int]:
    return [e.level for e in events if isinstance(e, InterventionIssued)]


def test_a_sigkill_mid_ladder_loses_no_detection_and_repeats_no_intervention_wd_5_dur_1(
    tenure_topics: str, tmp_path: Path
) -> None:
    bootstrap = tenure_topics
    run_id = run_id_for("wd-it", f"loop-{time.time_ns()}")
    port = free_port()
    env = service_env(bootstrap, tmp_path / "state", TENURE_WATCHDOG_HEALTH_PORT=str(port))
    watchdog = ServiceProcess("watchdog", "services.watchdog", env, tmp_path).start()
    publisher = CommandPublisher(bootstrap, client_id="wd-it")

    def publish(*seqs: int) -> None:
        for seq in seqs:
            publisher.publish(observation_record(CODEC, _observation(run_id, seq))).result(30)

    def levels_reach(count: int) -> list[Any] | None:
        events = _run_events(bootstrap, run_id)
        return events if len(_levels(events)) >= count else None

    try:
        ready = wait_for_ready(port, 90, watchdog)
        assert ready["service"] == "tenure-watchdog"
        publish(1, 2, 3, 4)
        events = wait_until(lambda: levels_reach(1), 60, "level 1 on watchdog.events", poll_s=0.5)
        assert _levels(events) == [1]
        publish(5)  # the second violation within the epoch: level 2 ...
        watchdog.sigkill()  # ... and the process dies around its decision
        publish(6, 7, 8)  # the loop goes on while the watchdog is down: level 3 at step 8
        watchdog.start()
        wait_for_ready(port, 90, watchdog)
        events = wait_until(lambda: levels_reach(3), 90, "level 3 after the restart", poll_s=0.5)
        publish(5, 8)  # redelivered observations: nothing new
        time.sleep(2.0)
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        publisher.close()
        watchdog.stop()
    assert watchdog.starts == 2

    events = _run_events(bootstrap, run_id)
    assert [e.version for e in events] == list(range(1, len(events) + 1)), "versions contiguous"
    issued = [e for e in events if isinstance(e, InterventionIssued)]
    assert [(i.level, i.turn) for i in issued] == [(1, 4), (2, 5), (3, 8)], "one intervention per level"
    detections = [e for e in events if isinstance(e, LoopDetected)]
    assert [d.step_seq for d in detections] == [4, 5, 8], "no detection lost"
    assert {i.detection_id for i in issued} == {d.detection_id for d in detections}
    assert [type(e).__name__ for e in events].count("StepObserved") == 8, "each observation once"
    sent = _sent_to_trajectory(bootstrap, run_id)
    assert [(c.level, c.intervention_id) for c in sent] == [(i.level, i.intervention_id) for i in issued]
    assert sent[1].code == "ROLLBACK_REQUESTED" and sent[2].code == "ERR_SEMANTIC_DEADLOCK"
    assert 'tenure_processor_restores_total{aggregate="watchdog"}' in metrics
