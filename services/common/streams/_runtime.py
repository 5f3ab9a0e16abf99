"""Runs a batch handler over a Kafka topic in a faust worker.

Acknowledgement contract: faust's `take_events` acks a batch after the handler returns, even
when the handler raised. A handler failure must therefore never return normally with work
undone: we retry transient failures and otherwise end the process at once, so that the
uncommitted commands are redelivered to the next incarnation instead of being acked away.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import faust

from services.common.kafka import InboundRecord

__all__ = ["CommandStream", "StreamSettings"]

log = logging.getLogger("tenure.streams")

BatchHandler = Callable[[Sequence[InboundRecord]], object]
_EXIT_HANDLER_FAILED = 70


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
    batch_window_s: float = 0.005
    handler_attempts: int = 5
    # How often timer work (lease expiry) runs: bounds how late an expiry is recorded.
    tick_interval_s: float = 0.1
    # faust's own chatter; raise to INFO/DEBUG when diagnosing rebalances.
    framework_log_level: str = "WARNING"


class CommandStream:
    def __init__(
        self,
        settings: StreamSettings,
        handler: BatchHandler,
        on_revoked: Callable[[], None],
        on_assigned: Callable[[set[int]], object],
        on_tick: Callable[[], object] | None = None,
    ) -> None:
        self._settings = settings
        self._handler = handler
        self._on_revoked = on_revoked
        self._on_assigned = on_assigned
        self._on_tick = on_tick
        self.app = self._build_app()

    def _build_app(self) -> faust.App:
        s = self._settings
        app = faust.App(
            s.app_id,
            broker=f"kafka://{s.bootstrap_servers}",
            store="memory://",
            datadir=str(s.data_dir),
            # Topics are created by the catalog (services/common/topics.py), never by faust.
            topic_allow_declare=False,
            topic_disable_leader=True,
            consumer_group_instance_id=f"{s.app_id}-{s.instance_id}",
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
            self._on_revoked()

        async def assigned(_sender: Any, /, *args: Any, signal: Any, **__: Any) -> None:
            partitions = args[0] if args else ()
            mine = {tp.partition for tp in partitions if tp.topic == s.topic}
            if mine:
                # Restore before the first command of these partitions is handed over, so the
                # state is current even for partitions that receive no command for a while.
                await asyncio.to_thread(self._on_assigned, mine)

        app.on_partitions_revoked.connect(revoked)
        app.on_partitions_assigned.connect(assigned)

        async def process(stream: Any) -> None:
            async for events in stream.take_events(s.batch_size, within=s.batch_window_s):
                records = [_record_of(e.message) for e in events]
                await asyncio.to_thread(self._handle_or_die, records)

        app.agent(topic, name=f"{s.app_id}.process")(process)
        if self._on_tick is not None:
            on_tick = self._on_tick

            async def tick() -> None:
                await asyncio.to_thread(self._call_or_die, on_tick)

            app.timer(s.tick_interval_s, on_leader=False)(tick)
        return app

    def _call_or_die(self, work: Callable[[], object]) -> None:
        try:
            work()
        except Exception:
            # Same rule as for batches: never carry on with state this process cannot trust.
            log.critical("timer work failed; exiting so a fresh incarnation restores", exc_info=True)
            os._exit(_EXIT_HANDLER_FAILED)

    def _handle_or_die(self, records: list[InboundRecord]) -> None:
        delay = 0.1
        for attempt in range(1, self._settings.handler_attempts + 1):
            try:
                self._handler(records)
                return
            except Exception:
                log.exception("batch handler failed (attempt %d)", attempt)
                if attempt == self._settings.handler_attempts:
                    break
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        log.critical("giving up on a batch; exiting so the commands are redelivered")
        os._exit(_EXIT_HANDLER_FAILED)

    def run(self) -> None:
        """Run the worker in the foreground until SIGTERM/SIGINT."""
        worker = faust.Worker(
            self.app, loglevel=self._settings.framework_log_level, quiet=True, redirect_stdouts=False
        )
        worker.execute_from_commandline()


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
