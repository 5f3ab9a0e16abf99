"""Tells each schedule what its runs did: follows runs.events and runs.rejections (EXE-14).

Overlap needs to know whether a schedule's previous run is still active. The follower, a thread
of the schedules process, reads every partition of runs.events and runs.rejections and sends
the schedule a RecordScheduledRun for:
  * RunSubmitted whose idempotency key is a schedule's ("schedule:<id>:...")  -> submitted;
  * the end of a run of one of its schedules (found in the processor's schedrun/<runId> index):
    RunCancelled, RunFailed, or an AttemptReported other than preparation_failed (that one is
    followed by RunRequeued or RunFailed)                                       -> ended;
  * the coordinator's refusal of a schedule's SubmitRun                          -> refused.
Command ids derive from the run event's id, so re-reading after a crash sends the same commands
(the schedule answers a repeat with nothing). Positions are stored after the commands were
acknowledged: at-least-once, never lost. Each instance follows everything and speaks only for
the schedules its store holds (the partitions it owns).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from services.common.backoff import Backoff
from services.common.contracts import AttemptReported, CommandRejected, RunCancelled, RunFailed, RunSubmitted
from services.common.contracts.schedules import FIRING_KEY_PREFIX, RecordScheduledRun
from services.common.ids import derived_id
from services.common.kafka import CommandPublisher, TopicFollower
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.routing import schedule_command_record
from services.common.store import KeyValueStore
from services.common.topics import RUNS_EVENTS, RUNS_REJECTIONS
from services.schedules.domain import ACTOR
from services.schedules.processor import RUN_INDEX_PREFIX

__all__ = ["FOLLOWED", "RunFollower", "outcome_of"]

log = logging.getLogger("tenure.schedules.follower")
FOLLOWED = (RUNS_EVENTS.name, RUNS_REJECTIONS.name)
_POSITION_PREFIX = "follow/"


def outcome_of(
    message: Any, schedule_of_run: Callable[[str], str | None], now_ms: int
) -> RecordScheduledRun | None:
    """The command a run event or refusal means for its schedule, or None (pure but for the lookup)."""
    schedule_id: str | None = None
    outcome, status, detail = "", "", ""
    if isinstance(message, RunSubmitted):
        if not message.idempotency_key.startswith(FIRING_KEY_PREFIX):
            return None
        schedule_id = message.idempotency_key.split(":")[1]
        outcome = "submitted"
    elif isinstance(message, (RunCancelled, RunFailed, AttemptReported, CommandRejected)):
        if isinstance(message, AttemptReported) and message.outcome == "preparation_failed":
            return None
        if isinstance(message, CommandRejected) and message.command_type != "SubmitRun":
            return None
        schedule_id = schedule_of_run(message.run_id)
        if isinstance(message, CommandRejected):
            outcome, status, detail = "refused", message.code, message.detail
        elif isinstance(message, RunCancelled):
            outcome, status = "ended", "cancelled"
        elif isinstance(message, RunFailed):
            outcome, status, detail = "ended", "failed", message.code
        else:
            outcome, status = "ended", "succeeded" if message.outcome == "succeeded" else "failed"
    if not schedule_id:
        return None
    return RecordScheduledRun(
        command_id=derived_id("cmd", "schedule-follower", message.event_id),
        run_id=schedule_id,
        issued_at=now_ms,
        correlation_id=message.correlation_id,
        actor=ACTOR,
        target_run_id=message.run_id,
        outcome=outcome,
        status=status,
        detail=detail[:500],
    )


class RunFollower:
    def __init__(self, bootstrap: str, store: KeyValueStore, clock: Callable[[], int]) -> None:
        self._bootstrap = bootstrap
        self._store = store
        self._clock = clock
        self._codec = MessageCodec()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="schedules-run-follower")
        self.failure: str | None = None

    def start(self) -> RunFollower:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _schedule_of(self, run_id: str) -> str | None:
        raw = self._store.get(f"{RUN_INDEX_PREFIX}{run_id}")
        return raw.decode() if raw is not None else None

    def _positions(self, topic: str) -> dict[int, int]:
        prefix = f"{_POSITION_PREFIX}{topic}/"
        return {int(k.removeprefix(prefix)): int(v) for k, v in self._store.scan(prefix)}

    def _run(self) -> None:
        backoff = Backoff(base_s=0.2, cap_s=10.0)
        while not self._stop.is_set():
            try:
                self._follow()
            except Exception as exc:  # the broker went away: try again, with the one backoff
                if self.failure is None:
                    log.warning("following %s failed: %s; retrying with backoff", FOLLOWED, exc)
                self.failure = f"{type(exc).__name__}: {exc}"
                self._stop.wait(backoff.next_delay())

    def _follow(self) -> None:
        followers = [
            TopicFollower(self._bootstrap, [t], self._positions(t), "tenure-schedules") for t in FOLLOWED
        ]
        publisher = CommandPublisher(self._bootstrap, client_id="tenure-schedules-follower")
        try:
            self.failure = None
            while not self._stop.is_set():
                for topic, follower in zip(FOLLOWED, followers, strict=True):
                    self._batch(topic, follower, publisher)
        finally:
            for follower in followers:
                follower.close()
            publisher.close()

    def _batch(self, topic: str, follower: TopicFollower, publisher: CommandPublisher) -> None:
        records = follower.poll(max_records=2000, timeout_s=0.05)
        if not records:
            return
        futures = []
        positions: dict[str, bytes] = {}
        for record in records:
            positions[f"{_POSITION_PREFIX}{topic}/{record.partition}"] = str(record.offset + 1).encode()
            try:
                message = self._codec.decode(record.value)
            except UndecodableRecord:
                continue
            command = outcome_of(message, self._schedule_of, self._clock())
            if command is not None:
                futures.append(publisher.publish(schedule_command_record(self._codec, command)))
        for future in futures:
            future.result(timeout=30)
        self._store.write(positions)
