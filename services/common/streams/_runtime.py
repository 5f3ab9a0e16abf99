"""Runs a batch handler over a Kafka topic in a faust worker.

Acknowledgement contract: faust's `take_events` acks a batch after the handler returns, even
when the handler raised. A handler failure must therefore never return normally with work
undone: the runtime retries what may pass and otherwise ends the process at once, so that the
uncommitted commands are redelivered to the next incarnation instead of being acked away.

What reaches the runtime is never one command's fault: the processors set aside a command whose
handling raises (services/common/poison.py) and go on. What does reach it is classified:
  * FENCED (WriterFenced): another incarnation owns the transactional id, so these partitions
    are someone else's. Stop deciding now: exit, and let the supervisor start a fresh one.
  * TRANSIENT (a retriable Kafka error, a RocksDB I/O error, a timeout, a lost connection):
    retried with the one capped full-jitter backoff (services/common/backoff.py), one log line
    when the work starts failing and one when it recovers. While it lasts, /readyz says so. Past
    `transient_budget_s` the process exits: a fresh incarnation restores from the log, and the
    consumer group does not wait for a member stuck in a retry loop (faust holds a rebalance
    until the batch in hand is acknowledged).
  * anything else: the same every time (a bug, a corrupt log): exit, as before.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import faust

from services.common.backoff import Backoff
from services.common.health import Check, StreamMetrics
from services.common.kafka import (
    GroupFence,
    InboundRecord,
    WriterFenced,
    client_config,
    is_transient_kafka_error,
    resource_prefix,
)
from services.common.store import is_transient_store_error
from services.common.streams._faust_client import faust_broker_url, faust_client_options

__all__ = ["CommandStream", "Failure", "StreamSettings", "classify_failure", "parts_of"]

log = logging.getLogger("tenure.streams")

BatchHandler = Callable[[Sequence[InboundRecord]], object]
_EXIT_HANDLER_FAILED = 70
_EXIT_FENCED = 75  # EX_TEMPFAIL: a supervisor restarts it; it rejoins as a fresh member


class Failure(enum.Enum):
    TRANSIENT = "transient"
    FENCED = "fenced"
    FATAL = "fatal"


def classify_failure(exc: BaseException) -> Failure:
    """FENCED, TRANSIENT or FATAL, looking through explicit causes (`raise ... from`)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, WriterFenced):
            return Failure.FENCED
        if (
            isinstance(current, (TimeoutError, ConnectionError))
            or is_transient_kafka_error(current)
            or is_transient_store_error(current)
        ):
            return Failure.TRANSIENT
        current = current.__cause__
    return Failure.FATAL


@dataclass(frozen=True)
class StreamSettings:
    app_id: str
    bootstrap_servers: str
    topic: str
    partitions: int
    instance_id: str
    # faust keeps small files of its own (it never holds our state); keep them with our state.
    data_dir: Path
    # With static membership a restarted member gets its partitions back at once as long as it
    # returns within the session timeout; a dead member is noticed only after it.
    session_timeout_s: float = 10.0
    batch_size: int = 200
    batch_window_s: float = 0.005  # TENURE_BATCH_WINDOW_MS
    # The most record bytes one transaction decides (TENURE_BATCH_MAX_BYTES): a batch taken from
    # a backlog is split into parts under it, each its own transaction, so the first command of
    # a backlog of heavy records (a batch renewal's envelope carries ~60 commands) is answered
    # after its part, not after everything that was waiting.
    batch_max_bytes: int = 262_144
    # How often timer work (lease expiry) runs: bounds how late an expiry is recorded.
    tick_interval_s: float = 0.1
    # faust's own chatter; raise to INFO/DEBUG when diagnosing rebalances.
    framework_log_level: str = "WARNING"
    # Transient failures: full jitter between 0 and min(cap, base * 2**attempt), for at most
    # the budget (well under faust's max poll interval of 1000 s, after which the group evicts).
    retry_base_s: float = 0.1
    retry_cap_s: float = 5.0
    transient_budget_s: float = 120.0


def parts_of(records: Sequence[InboundRecord], max_bytes: int) -> list[Sequence[InboundRecord]]:
    """`records` in order, cut into parts of at most `max_bytes` of values (a record larger than
    that is a part of its own). Each part is decided and committed on its own: its transaction
    carries its own offsets, so a crash after one part redelivers only what came after it."""
    parts: list[Sequence[InboundRecord]] = []
    start, size = 0, 0
    for index, record in enumerate(records):
        weight = len(record.value or b"")
        if index > start and size + weight > max_bytes:
            parts.append(records[start:index])
            start, size = index, 0
        size += weight
    if start < len(records):
        parts.append(records[start:])
    return parts


class _Retrying:
    """One kind of work's transient failures: backoff, budget, and a log line per change."""

    def __init__(self, work: str, settings: StreamSettings, metrics: StreamMetrics) -> None:
        self.work = work
        self._backoff = Backoff(settings.retry_base_s, settings.retry_cap_s)
        self._budget_s = settings.transient_budget_s
        self._metrics = metrics
        self.failing_since: float | None = None
        self.last_error = ""
        self.retries = 0
        self.next_attempt_at = 0.0

    def failed(self, exc: BaseException) -> float | None:
        """The delay before the next attempt, or None once the budget is spent."""
        now = time.monotonic()
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]
        if self.failing_since is None:
            self.failing_since = now
            log.warning("%s failing transiently (%s); retrying with backoff", self.work, self.last_error)
        self.retries += 1
        self._metrics.retried(self.work)
        if now - self.failing_since > self._budget_s:
            return None
        delay = self._backoff.next_delay()
        self.next_attempt_at = now + delay
        return delay

    def succeeded(self) -> None:
        if self.failing_since is not None:
            log.info(
                "%s recovered after %d retries in %.1f s",
                self.work,
                self.retries,
                time.monotonic() - self.failing_since,
            )
        self.failing_since = None
        self.retries = 0
        self.next_attempt_at = 0.0
        self._backoff.reset()


class CommandStream:
    def __init__(
        self,
        settings: StreamSettings,
        handler: BatchHandler,
        on_revoked: Callable[[], None],
        on_assigned: Callable[[set[int]], object],
        on_tick: Callable[[], object] | None = None,
        *,
        restored: Callable[[], frozenset[int]] | None = None,
        committed: Callable[[set[int]], dict[int, int]] | None = None,
        metrics: StreamMetrics | None = None,
        classify: Callable[[BaseException], Failure] = classify_failure,
        sleep: Callable[[float], None] = time.sleep,
        exit_process: Callable[[int], None] = os._exit,
    ) -> None:
        self._settings = settings
        self._handler = handler
        self._on_revoked = on_revoked
        self._on_assigned = on_assigned
        self._on_tick = on_tick
        self._restored = restored
        self._committed = committed
        self._metrics = metrics or StreamMetrics(settings.app_id)
        self._classify = classify
        self._sleep = sleep
        self._exit = exit_process
        self._retrying = {w: _Retrying(w, settings, self._metrics) for w in ("batch", "tick")}
        # None until the group assigns partitions (and again during a rebalance).
        self.assignment: frozenset[int] | None = None
        self._assignment_known = threading.Event()
        # The generation fence (services/common/kafka/_group.py): the group generation and member
        # id of the current assignment, the next command offset of each owned partition, and,
        # per thread, the offsets of the batch that thread has in hand.
        self._member: tuple[int, str] | None = None
        self._positions: dict[int, int] = {}
        self._revocations = 0  # tells a late answer of `_fetch_positions` apart
        self._in_hand = threading.local()
        self._fence_unavailable_logged = False
        # Set with TENURE_GROUP_FENCE (services/common/process.py): timer work runs only fenced.
        self.fence_required = False
        self.app = self._build_app()

    def _build_app(self) -> faust.App:
        s = self._settings
        app = faust.App(
            resource_prefix() + s.app_id,  # the consumer group: prefixed like the topics
            # The operator's TLS/SASL/client id (TENURE_KAFKA_CONFIG, mapped to faust's names).
            **faust_client_options(client_config()),
            broker=faust_broker_url(s.bootstrap_servers),
            store="memory://",
            datadir=str(s.data_dir),
            # Topics are created by the catalog (services/common/topics.py), never by faust.
            topic_allow_declare=False,
            topic_disable_leader=True,
            consumer_group_instance_id=f"{s.app_id}-{s.instance_id}",
            # No faust tables, so no standbys: with its default of one standby replica faust's
            # sticky assignor lets every member keep up to ceil(partitions/members) partitions,
            # and an instance added to two owning 2+2 of 4 partitions got none (issue 16).
            table_standby_replicas=0,
            broker_session_timeout=s.session_timeout_s,
            broker_heartbeat_interval=max(1.0, s.session_timeout_s / 5),
            broker_request_timeout=max(40.0, s.session_timeout_s + 5),
            broker_commit_interval=0.5,
            consumer_auto_offset_reset="earliest",
            web_enabled=False,
            autodiscover=False,
        )
        topic = app.topic(
            s.topic,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=s.partitions,
            internal=False,
        )

        async def revoked(_sender: Any, /, *_: Any, signal: Any, **__: Any) -> None:
            # Rebalance ordering (issue 16): faust sends this signal after it stopped fetching,
            # cleared the agents' buffers and waited for the batch in hand to be acknowledged;
            # `_on_revoked` then waits (the processor's lock) for a tick in progress, so when it
            # returns this instance decides nothing more for these partitions. Only then does
            # the member rejoin, and the group's next generation, where another instance may
            # get them, cannot start without it (eager protocol). In a thread: a long tick must
            # not stall the event loop and its heartbeats.
            self._assignment_known.clear()
            self._revocations += 1
            self._metrics.revoked()
            await asyncio.to_thread(self._on_revoked)
            # Only now, under no tick: a tick in progress held the processor's lock until
            # `_on_revoked` got it, and committed under the generation it started in (still the
            # group's until this member rejoins; refused as fenced if not). Cleared before,
            # that tick's transaction would have carried no fence at all.
            self.assignment = None
            self._member = None
            self._positions.clear()

        async def assigned(_sender: Any, /, *args: Any, signal: Any, **__: Any) -> None:
            partitions = args[0] if args else ()
            mine = {tp.partition for tp in partitions if tp.topic == s.topic}
            if mine:
                # Restore before the first command of these partitions is handed over, so the
                # state is current even for partitions that receive no command for a while.
                await asyncio.to_thread(self._assign, mine)
            self._member = self._group_member()
            self.assignment = frozenset(mine)
            self._assignment_known.set()
            if mine and self._committed is not None:
                self._fetch_positions(mine, self._revocations)
            self._metrics.assigned(len(mine))

        app.on_partitions_revoked.connect(revoked)
        app.on_partitions_assigned.connect(assigned)

        async def process(stream: Any) -> None:
            async for events in stream.take_events(s.batch_size, within=s.batch_window_s):
                records = [_record_of(e.message) for e in events]
                for part in parts_of(records, s.batch_max_bytes):
                    await asyncio.to_thread(self.handle_or_die, part)
                self._metrics.consumed(records, self._highwater)

        app.agent(topic, name=f"{s.app_id}.process")(process)
        if self._on_tick is not None:
            on_tick = self._on_tick

            async def tick() -> None:
                await asyncio.to_thread(self.timer_work, on_tick)

            app.timer(s.tick_interval_s, on_leader=False)(tick)
        return app

    def _highwater(self, topic: str, partition: int) -> int | None:
        # The partition's end as the consumer's last fetch saw it: no request of its own.
        end = self.app.consumer.highwater(faust.types.TP(topic, partition))
        return int(end) if end is not None else None

    # --- the three kinds of work, each classified -----------------------------------------------

    def handle_or_die(self, records: Sequence[InboundRecord]) -> None:
        """Hand `records` to the handler until it succeeds; exit rather than return with them undone."""
        owned = self._owned(records)
        if records and not owned:
            return
        records = owned
        retrying = self._retrying["batch"]
        in_hand: dict[int, int] = {}
        for record in records:
            in_hand[record.partition] = max(in_hand.get(record.partition, 0), record.offset + 1)
        self._in_hand.offsets = in_hand
        try:
            while True:
                try:
                    self._handler(records)
                except Exception as exc:
                    delay = self._retry_or_die(retrying, exc, "a batch")
                    self._sleep(delay)
                    continue
                retrying.succeeded()
                for partition, offset in in_hand.items():
                    self._positions[partition] = max(self._positions.get(partition, 0), offset)
                return
        finally:
            self._in_hand.offsets = None

    # --- the generation fence -------------------------------------------------------------------

    def group_fence(self) -> GroupFence | None:
        """What the calling thread's next transaction is fenced with: the group generation of
        the current assignment and the command offsets it consumes (the batch in hand; for
        timer work, the owned partitions' current positions, committed again unchanged).
        None when nothing identifies the assignment yet (then the transaction is unfenced, as
        are the re-publications of a restore, which are at-least-once anyway)."""
        member, assignment = self._member, self.assignment
        if member is None or assignment is None:
            return None
        offsets = getattr(self._in_hand, "offsets", None)
        if offsets is None:
            offsets = {p: o for p, o in list(self._positions.items()) if p in assignment}
        if not offsets:
            return None
        s = self._settings
        generation, member_id = member
        group = resource_prefix() + s.app_id  # the consumer group faust joined (above)
        return GroupFence(group, generation, member_id, f"{s.app_id}-{s.instance_id}", s.topic, offsets)

    def _fetch_positions(self, partitions: set[int], revocations: int) -> None:
        """Where the group stands on `partitions`, fetched beside the rebalance, not in its path:
        timer work of a partition with no command yet in this assignment is fenced with these
        offsets, committed again unchanged (until they arrive it is unfenced, a moment)."""
        committed = self._committed
        assert committed is not None

        def fetch() -> None:
            backoff = Backoff(0.2, 5.0)
            while self._revocations == revocations:  # not revoked meanwhile
                try:
                    found = committed(partitions)
                except Exception as exc:
                    # Until they arrive, timer work of partitions without a command yet waits
                    # (with the fence on) or is unfenced (off): ask again, not once.
                    log.warning("could not read the group's committed offsets (%s); asking again", exc)
                    time.sleep(backoff.next_delay())
                    continue
                if self._revocations == revocations:
                    for partition, offset in found.items():
                        self._positions.setdefault(partition, offset)
                return

        threading.Thread(target=fetch, name=f"{self._settings.app_id}-positions", daemon=True).start()

    def _group_member(self) -> tuple[int, str] | None:
        """The generation and member id aiokafka joined with (faust exposes no accessor)."""
        try:
            consumer: Any = self.app.consumer
            coordinator = consumer._thread._ensure_consumer()._coordinator
            generation, member_id = int(coordinator.generation), str(coordinator.member_id)
        except (AttributeError, TypeError, ValueError) as exc:
            if not self._fence_unavailable_logged:
                self._fence_unavailable_logged = True
                log.error("cannot read the consumer group generation (%s); transactions are unfenced", exc)
            return None
        return (generation, member_id) if generation >= 0 and member_id else None

    def _owned(self, records: Sequence[InboundRecord]) -> Sequence[InboundRecord]:
        """Only records of partitions this instance owns, once the rebalance in progress (if any)
        has told which those are.

        faust hands over records it fetched before a rebalance even after it revoked their
        partitions (seen in tests/integration/test_scale_out_coordinator.py). Deciding one then
        would make two deciders of a partition whose new owner restored without it; acknowledging
        one unhandled would let faust commit past it if the partition stays ours. So the batch
        waits for the new assignment: records of partitions still ours are handled (restored in
        `assigned`; a copy faust fetches again from the committed offset is a duplicate the
        processor drops), the others are dropped (their new owner consumes them from the
        committed offset, and faust forgot their acknowledgements with the revocation)."""
        if records and not self._assignment_known.is_set():
            limit = max(60.0, 3 * self._settings.session_timeout_s)
            if not self._assignment_known.wait(limit):
                log.critical("no partition assignment for %.0f s with records in hand; exiting", limit)
                self._die(_EXIT_FENCED)
        assignment = self.assignment
        owned = [r for r in records if assignment is not None and r.partition in assignment]
        if len(owned) < len(records):
            stale = sorted({r.partition for r in records} - set(assignment or ()))
            log.warning(
                "dropped %d record(s) of partitions %s this instance no longer owns (rebalance)",
                len(records) - len(owned),
                stale,
            )
        return owned if len(owned) < len(records) else records

    def timer_work(self, work: Callable[[], object]) -> bool:
        """One tick's timer work; False when it waited for the next tick instead: the generation
        fence is on but the assignment is not known yet (a restore in progress, the group's
        positions still on their way), and a transaction nothing fences must not be committed."""
        if self.fence_required and self.group_fence() is None:
            self._metrics.retried("tick-unfenced")
            return False
        self.tick_or_die(work)
        return True

    def tick_or_die(self, work: Callable[[], object]) -> None:
        """Timer work: a transient failure skips ticks until its backoff has passed."""
        retrying = self._retrying["tick"]
        if time.monotonic() < retrying.next_attempt_at:
            return
        try:
            work()
        except Exception as exc:
            self._retry_or_die(retrying, exc, "timer work")
            return
        retrying.succeeded()

    def _assign(self, partitions: set[int]) -> None:
        try:
            self._on_assigned(partitions)
        except Exception as exc:
            self._die_unless_transient(exc, "restoring assigned partitions")
            # Left to the lazy restore: the next batch or tick restores every partition that is
            # assigned but not restored (and /readyz says "restore" until then).
            log.warning(
                "restoring partitions %s failed transiently (%s); the next batch or tick retries",
                sorted(partitions),
                exc,
            )
            self._metrics.retried("assign")

    def _retry_or_die(self, retrying: _Retrying, exc: Exception, what: str) -> float:
        self._die_unless_transient(exc, what)
        delay = retrying.failed(exc)
        if delay is not None:
            return delay
        log.critical(
            "%s kept failing for %.0f s (%s); exiting so a fresh incarnation restores",
            what,
            self._settings.transient_budget_s,
            retrying.last_error,
        )
        self._die(_EXIT_HANDLER_FAILED)

    def _die_unless_transient(self, exc: Exception, what: str) -> None:
        kind = self._classify(exc)
        if kind is Failure.FENCED:
            log.critical(
                "%s: the transactional writer was fenced (another instance owns these partitions); "
                "exiting without deciding anything more",
                what,
                exc_info=exc,
            )
            self._die(_EXIT_FENCED)
        elif kind is Failure.FATAL:
            log.critical("%s failed and a retry would fail the same way; exiting", what, exc_info=exc)
            self._die(_EXIT_HANDLER_FAILED)

    def _die(self, code: int) -> NoReturn:
        self._exit(code)
        # Only reached when exit_process is a test double that returns: never carry on.
        raise SystemExit(code)

    # --- readiness ------------------------------------------------------------------------------

    def checks(self) -> list[Check]:
        """Readiness: partitions assigned, all of them restored, and no work failing transiently."""
        assignment = self.assignment
        topic = self._settings.topic
        if assignment is None:
            checks = [Check("assignment", False, f"waiting for the group to assign {topic} partitions")]
        else:
            checks = [Check("assignment", True, f"{topic} partitions {sorted(assignment)}")]
            if self._restored is not None:
                pending = sorted(assignment - self._restored())
                checks.append(
                    Check("restore", False, f"partitions {pending} not restored yet")
                    if pending
                    else Check("restore", True, f"partitions {sorted(assignment)} restored")
                )
        failing = [r for r in self._retrying.values() if r.failing_since is not None]
        if failing:
            now = time.monotonic()
            detail = "; ".join(
                f"{r.work} failing for {now - (r.failing_since or now):.1f} s ({r.last_error})"
                for r in failing
            )
            checks.append(Check("dependencies", False, detail))
        else:
            checks.append(Check("dependencies", True, "Kafka and the state store answering"))
        return checks

    def run(self) -> None:
        """Run the worker in the foreground until SIGTERM/SIGINT."""
        worker = _QuietWorker(
            self.app, loglevel=self._settings.framework_log_level, quiet=True, redirect_stdouts=False
        )
        worker.execute_from_commandline()


class _QuietWorker(faust.Worker):
    """faust's worker without its terminal progress spinner.

    At a log level of WARNING or above, faust feeds its spinner by setting the root logger to
    DEBUG with a handler of its own, so every debug line of aiokafka, faust and mode became a
    log record that nobody reads: CPU on every fetch and every command (issue 11). The root
    logger keeps the level mode's set-up gives it (`framework_log_level`)."""

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        self.spinner = None


def _record_of(message: Any) -> InboundRecord:
    headers = tuple((str(k), bytes(v)) for k, v in (message.headers or ()))
    return InboundRecord(
        topic=str(message.topic),
        partition=int(message.partition),
        offset=int(message.offset),
        key=message.key,
        value=message.value or b"",
        headers=headers,
        timestamp_ms=int((message.timestamp or 0) * 1000),
    )
