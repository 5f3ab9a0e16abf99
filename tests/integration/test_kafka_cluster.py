"""Production Kafka (issue 16): Tenure on a three-node KRaft cluster, one node SIGKILLed mid-load.

Topics are created with replication factor 3 and min.insync.replicas=2 from the settings; the
lease coordinator, projector and API run as real processes against the cluster while commands
stream in through the API. One broker is SIGKILLed (no controlled shutdown). Afterwards every
command the API accepted is decided on runs.events with versions 1..n (no committed event lost,
none twice), and commands submitted after the kill are decided by the same, never-restarted
Tenure processes.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.ids import run_id_for
from services.common.kafka import create_topics, partition_leaders, topic_durability
from services.common.topics import RUNS_COMMANDS, RUNS_EVENTS, TOPICS
from tests.support.system import decode_all, free_port, read_topic, wait_for_ready, wait_until
from tests.support.tenure import TenureSystem

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(150)]

DURABLE = {"TENURE_TOPIC_REPLICATION_FACTOR": "3", "TENURE_TOPIC_MIN_INSYNC_REPLICAS": "2"}


class _Load:
    """`clients` callers, each submitting runs through the API one after another until stopped;
    records every answer (list.append is atomic under the GIL)."""

    def __init__(self, system: TenureSystem, clients: int = 3) -> None:
        self.system = system
        self.answers: list[tuple[str, int, float]] = []  # (idempotency key, status, sent at)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(c,), daemon=True) for c in range(clients)]

    def _run(self, caller: int) -> None:
        with self.system.client() as client:
            n = 0
            while not self._stop.is_set():
                key, sent = f"cluster-{caller}-{n}", time.monotonic()
                n += 1
                try:
                    response = client.post(
                        "/runs",
                        headers={"Idempotency-Key": key},
                        json={
                            "tenant": "acme",
                            "executionSpec": {"agent": "demo", "key": key},
                            "timeoutSeconds": 600,
                        },
                    )
                    status = response.status_code
                except httpx.HTTPError:
                    status = -1
                self.answers.append((key, status, sent))
                time.sleep(0.02)

    def accepted(self, after: float = 0.0) -> list[str]:
        # 201: decided and committed; 202: published, decided later. Both must reach the log.
        return [k for k, status, sent in self.answers if status in (201, 202) and sent >= after]

    def __enter__(self) -> _Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


def test_broker_sigkill_mid_load_loses_no_committed_event(kafka_cluster: Any, tmp_path: Path) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    create_topics(bootstrap, TOPICS, replication_factor=3, min_insync_replicas=2)
    durability = topic_durability(bootstrap, [t.name for t in TOPICS])
    assert set(durability.values()) == {(3, 2, 3)}, durability

    health = free_port()
    system = TenureSystem(
        bootstrap,
        tmp_path,
        TENURE_COORDINATOR_HEALTH_PORT=str(health),
        TENURE_PROJECTIONS_HEALTH_PORT=str(free_port()),
        **DURABLE,
    )
    system.start()
    try:
        wait_for_ready(health, 60, system.processor)
        with _Load(system) as load:
            try:
                wait_until(lambda: len(load.accepted()) >= 30, 60, "30 runs accepted before the kill")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: {load.answers[-5:]}\n{system.api.log_tail()}") from None
            # The leader of a partition the coordinator is deciding for: its writes must fail over.
            victim = partition_leaders(bootstrap, RUNS_EVENTS.name)[0]
            before = {t.name: partition_leaders(bootstrap, t.name) for t in (RUNS_COMMANDS, RUNS_EVENTS)}
            kafka_cluster.kill(victim - 1)  # node ids are 1..3
            killed_at = time.monotonic()
            assert not kafka_cluster.running(victim - 1)
            # Keep serving: runs submitted well after the kill are decided, without restarts.
            wait_until(
                lambda: len(load.accepted(after=killed_at + 5)) >= 30,
                60,
                "30 runs accepted after the broker was killed",
                poll_s=0.5,
            )
        answers_after = [s for _, s, sent in load.answers if sent >= killed_at + 5]
        accepted = load.accepted()
        statuses = defaultdict(int)
        for _, status, _ in load.answers:
            statuses[status] += 1

        expected = {run_id_for("acme", key) for key in accepted}

        def all_on_the_log() -> bool:
            events = decode_all(read_topic(bootstrap, RUNS_EVENTS.name, RUNS_EVENTS.partitions))
            return expected <= {e.run_id for e in events if type(e).__name__ == "RunSubmitted"}

        wait_until(all_on_the_log, 60, "every accepted run's RunSubmitted on runs.events", poll_s=1.0)
        after = partition_leaders(bootstrap, RUNS_EVENTS.name)
        assert victim not in after.values() and -1 not in after.values(), (before, after)
        print(f"killed node {victim} (leaders before {before}); answers {dict(statuses)}")
        assert system.processor.alive() and system.processor.starts == 1, system.processor.log_tail()
        assert system.api.alive() and system.api.starts == 1, system.api.log_tail()
    finally:
        system.stop()

    events = decode_all(read_topic(bootstrap, RUNS_EVENTS.name, RUNS_EVENTS.partitions))
    ids = [e.event_id for e in events]
    assert len(ids) == len(set(ids)), "an event was committed twice"
    by_run: dict[str, list[Any]] = defaultdict(list)
    for event in events:
        by_run[event.run_id].append(event)
    for run_id, run_events in by_run.items():
        assert [e.version for e in run_events] == list(range(1, len(run_events) + 1)), run_id
    assert expected <= by_run.keys()
    # After the fail-over settled every submission was decided (201), none refused or lost.
    assert answers_after and all(s == 201 for s in answers_after[-15:]), (statuses, answers_after[-15:])
