"""Runs submitted the way the API does it, and timed: SubmitRun records built and produced
straight to runs.commands, and a tracker of when each run's RunSubmitted became readable and its
Run view existed (bench.foundation's (b) phase; the lease bench submits its runs with it too)."""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path
from typing import Iterable, Iterator

from confluent_kafka import KafkaError, Message, Producer

from bench._foundation_toolkit import Service, say
from services.common.clock import SystemClock
from services.common.contracts import SubmitRun
from services.common.ids import canonical_json, command_id_for, run_id_for
from services.common.kafka import OutboundRecord, TopicFollower
from services.common.messages import MessageCodec
from services.common.routing import command_record
from services.common.store import RocksStore
from services.common.topics import RUNS_EVENTS
from services.projections.store import RunViewStore

__all__ = [
    "RUN_SUBMITTED",
    "SPEC",
    "VIEW_POLL_S",
    "ViewTracker",
    "Wire",
    "publish_all",
    "send_all",
    "submit_command",
]

RUN_SUBMITTED = b"tenure.runs.events.RunSubmitted"
# How often the tracker asks the views' secondary RocksDB to catch up: the API's poll interval.
VIEW_POLL_S = 0.01
# (topic, key, value, headers, partition) as confluent-kafka's produce() takes them; -1 = by key.
Wire = tuple[str, bytes, bytes, list[tuple[str, str | bytes | None]], int]
SPEC = {"image": "ghcr.io/tenure/bench-agent:1", "entrypoint": ["python", "-m", "agent"]}


def send_all(producer: Producer, records: Iterable[Wire]) -> None:
    """Produce (topic, key, value, headers) records as fast as librdkafka takes them, then flush."""
    failures: list[str] = []

    def on_delivery(err: KafkaError | None, _: Message) -> None:
        if err is not None:
            failures.append(str(err))

    for topic, key, value, headers, partition in records:
        while True:
            try:
                producer.produce(
                    topic, value=value, key=key, headers=headers, partition=partition, on_delivery=on_delivery
                )
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(120.0) != 0 or failures:
        raise RuntimeError(f"producing failed: {len(failures)} errors, e.g. {failures[:1]}")


def submit_command(
    codec: MessageCodec, tenant: str, key: str, timeout_seconds: int = 600
) -> tuple[str, OutboundRecord]:
    run_id = run_id_for(tenant, key)
    command = SubmitRun(
        command_id=command_id_for(run_id, "SubmitRun", key),
        run_id=run_id,
        issued_at=SystemClock().now_ms(),
        correlation_id=run_id,
        actor="bench",
        tenant=tenant,
        idempotency_key=key,
        execution_spec=canonical_json({**SPEC, "args": [key]}),
        timeout_seconds=timeout_seconds,
    )
    return run_id, command_record(codec, command)


class ViewTracker:
    """Times, per run, when its RunSubmitted became readable and when its Run view existed.

    Decided: a read_committed consumer of runs.events returned the RunSubmitted (the processor's
    transaction committed). Viewed: the projector's stored offset for the partition passed the
    event's offset, read from its RocksDB opened as a read-only secondary; views and offsets
    change in one atomic write, so that is when the view exists. Resolution: ~VIEW_POLL_S.
    """

    def __init__(self, bootstrap: str, views_dir: Path, link_dir: Path) -> None:
        probe = TopicFollower(bootstrap, [RUNS_EVENTS.name], "end", client_id="tenure-bench-probe")
        ends = probe.end_offsets(RUNS_EVENTS.name)
        probe.close()
        self._follower = TopicFollower(bootstrap, [RUNS_EVENTS.name], ends, client_id="tenure-bench-tracker")
        # RocksStore puts a secondary's folder next to the path; a symlinked path keeps ours apart
        # from the API's, which opens the same views as a secondary too.
        link_dir.mkdir(parents=True, exist_ok=True)
        (link_dir / views_dir.name).symlink_to(views_dir, target_is_directory=True)
        self._rocks = RocksStore(link_dir / views_dir.name, secondary=True)
        self._views = RunViewStore(self._rocks, MessageCodec())
        self.sent: dict[str, float] = {}
        self.decided: dict[str, float] = {}
        self.viewed: dict[str, float] = {}
        self._pending: dict[int, deque[tuple[int, str]]] = {}
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="view-tracker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            last_refresh = 0.0
            while not self._stop.is_set():
                records = self._follower.poll(max_records=5000, timeout_s=0.005)
                now = time.monotonic()
                for r in records:
                    run_id = r.key.decode() if r.key else ""
                    schema = next((v for k, v in r.headers if k == "tenure-schema"), b"")
                    if schema == RUN_SUBMITTED and run_id in self.sent and run_id not in self.decided:
                        self.decided[run_id] = now
                        self._pending.setdefault(r.partition, deque()).append((r.offset, run_id))
                if any(self._pending.values()) and now - last_refresh >= VIEW_POLL_S:
                    self._views.refresh()
                    offsets = self._views.offsets()
                    last_refresh = time.monotonic()
                    for partition, queue in self._pending.items():
                        while queue and queue[0][0] < offsets.get(partition, 0):
                            self.viewed[queue.popleft()[1]] = last_refresh
        except BaseException as exc:  # raised by wait(): a silently dead tracker would hang the bench
            self._error = exc

    def wait(self, run_ids: list[str], timeout_s: float, label: str, services: list[Service]) -> None:
        deadline, next_report = time.monotonic() + timeout_s, time.monotonic() + 2.0
        while True:
            if self._error is not None:
                raise RuntimeError(f"view tracker failed: {self._error!r}") from self._error
            missing = sum(1 for r in run_ids if r not in self.viewed)
            if missing == 0:
                return
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"{label}: {missing}/{len(run_ids)} views missing after {timeout_s:.0f}s")
            if now >= next_report:
                total, decided = len(run_ids), sum(1 for r in run_ids if r in self.decided)
                say(f"{label}: decided {decided}/{total}, viewed {total - missing}/{total}")
                for service in services:
                    service.check_alive()
                next_report = now + 2.0
            time.sleep(0.002 if len(run_ids) == 1 else 0.05)

    def verify(self, run_ids: list[str]) -> int:
        """How many of `run_ids` have a queued Run view, read back rather than inferred."""
        self._views.refresh()
        return sum(1 for r in run_ids if (v := self._views.get(r)) is not None and v["status"] == "queued")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10.0)
        self._follower.close()
        self._rocks.close()


def publish_all(producer: Producer, tracker: ViewTracker, prepared: list[tuple[str, OutboundRecord]]) -> None:
    def stamped() -> Iterator[Wire]:
        for run_id, record in prepared:
            tracker.sent[run_id] = time.monotonic()
            yield (
                record.topic,
                record.key,
                record.value,
                list(record.headers),
                (-1 if record.partition is None else record.partition),
            )

    send_all(producer, stamped())
