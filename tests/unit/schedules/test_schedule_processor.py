"""EXE-14 on the one runtime, in memory: a firing's SubmitRun is committed in the same transaction
as its FiringDecided; a commit that fails leaves neither, and the retry (a new incarnation that
restores from the log) submits exactly one run under the firing's key."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.clock import ManualClock
from services.common.contracts import SubmitRun
from services.common.contracts.schedules import FiringDecided
from services.common.eventlog import MemoryEventLog
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec
from services.common.routing import partition_for_schedule
from services.common.store import MemoryStore
from services.common.topics import RUNS_COMMANDS, SCHEDULES_COMMANDS, SCHEDULES_EVENTS
from services.schedules.processor import ScheduleProcessor
from tests.unit.schedules.support import SID, at, create

CODEC = MessageCodec()


def _record(command: Any) -> InboundRecord:
    out = CODEC.outbound(
        SCHEDULES_COMMANDS.name, command.run_id, command, partition_for_schedule(command.run_id)
    )
    return InboundRecord(out.topic, out.partition or 0, 0, out.key, out.value, out.headers)


def _decoded(log: MemoryEventLog, topic: str) -> list[Any]:
    return [
        CODEC.decode(r.value) for (t, _), records in sorted(log.topics.items()) if t == topic for r in records
    ]


def test_the_firing_and_its_submission_commit_together_and_only_once_EXE_14() -> None:
    log, store = MemoryEventLog(SCHEDULES_COMMANDS.partitions), MemoryStore()
    clock = ManualClock(at("2026-01-01T00:00:30"))
    processor = ScheduleProcessor(log, store, CODEC, clock)
    processor.handle([_record(create(cron="* * * * *", time_zone="UTC"))])
    clock.advance(30_000)  # 00:01:00, the firing is due
    log.fail_next_commit = True  # the broker fails the firing's transaction (or the process dies in it)
    with pytest.raises(ConnectionError):
        processor.tick()
    assert not [e for e in _decoded(log, SCHEDULES_EVENTS.name) if isinstance(e, FiringDecided)]
    assert not _decoded(log, RUNS_COMMANDS.name)
    # A new incarnation on an empty store restores from the log and decides the firing again.
    again = ScheduleProcessor(log, MemoryStore(), CODEC, clock)
    again.restore_partitions({partition_for_schedule(SID)})
    again.tick()
    again.tick()
    [decided] = [e for e in _decoded(log, SCHEDULES_EVENTS.name) if isinstance(e, FiringDecided)]
    [submitted] = _decoded(log, RUNS_COMMANDS.name)
    assert isinstance(submitted, SubmitRun)
    assert (submitted.run_id, submitted.idempotency_key) == (decided.target_run_id, decided.idempotency_key)
    assert submitted.idempotency_key == f"schedule:{SID}:2026-01-01T00:01:00Z"
    assert dict(submitted.labels)["schedule"] == SID and submitted.agent_revision_id == "agrev-1"
    # The run it names is indexed for the follower.
    assert again.load(SID).active_runs == (decided.target_run_id,)
