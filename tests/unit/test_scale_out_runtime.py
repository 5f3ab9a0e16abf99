"""The stream runtime's part in moving partitions between instances (issue 16).

A batch holding records of a partition this instance no longer owns never reaches the handler
(its new owner restored without them), and every transaction is fenced with the group
generation of the assignment: the batch's own offsets in the thread that handles it, the
owned partitions' positions in the timer thread, nothing before an assignment is known."""

from __future__ import annotations

import asyncio
import itertools
import threading
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from services.common.kafka import GroupFence, InboundRecord
from services.common.streams import CommandStream, StreamSettings, parts_of


def _record(partition: int, offset: int) -> InboundRecord:
    return InboundRecord("runs.commands", partition, offset, b"k", b"v", ())


def _stream(tmp_path: Path, handler: Any, on_revoked: Any = lambda: None) -> CommandStream:
    settings = StreamSettings(
        app_id="tenure-test-scale",
        bootstrap_servers="127.0.0.1:1",
        topic="runs.commands",
        partitions=4,
        instance_id="3",
        data_dir=tmp_path,
    )
    return CommandStream(settings, handler, on_revoked=on_revoked, on_assigned=lambda _: None)


def _owning(stream: CommandStream, partitions: set[int], generation: int = 5) -> None:
    """What the `assigned` signal leaves behind (faust's consumer is not started in unit tests)."""
    stream._member = (generation, "member-x")
    stream.assignment = frozenset(partitions)
    stream._assignment_known.set()


def test_records_of_partitions_not_owned_are_never_handled(tmp_path: Path) -> None:
    seen: list[list[tuple[int, int]]] = []
    stream = _stream(tmp_path, lambda records: seen.append([(r.partition, r.offset) for r in records]))
    _owning(stream, {0, 2})
    stream.handle_or_die([_record(0, 10), _record(1, 4), _record(2, 7), _record(0, 11)])
    stream.handle_or_die([_record(3, 1)])
    assert seen == [[(0, 10), (2, 7), (0, 11)]]


def test_a_batch_arriving_mid_rebalance_waits_for_the_new_assignment(tmp_path: Path) -> None:
    seen: list[int] = []
    stream = _stream(tmp_path, lambda records: seen.extend(r.partition for r in records))
    worker = threading.Thread(target=stream.handle_or_die, args=([_record(1, 0), _record(2, 0)],))
    worker.start()
    worker.join(0.3)
    assert worker.is_alive() and seen == [], "handled before the group said who owns what"
    _owning(stream, {2})
    worker.join(5)
    assert seen == [2]


def test_the_fence_carries_the_batch_offsets_in_its_thread_and_positions_elsewhere(tmp_path: Path) -> None:
    fences: dict[str, GroupFence | None] = {}
    stream: CommandStream

    def handler(_: Any) -> None:
        fences["batch"] = stream.group_fence()
        other = threading.Thread(target=lambda: fences.__setitem__("timer", stream.group_fence()))
        other.start()
        other.join()

    stream = _stream(tmp_path, handler)
    assert stream.group_fence() is None  # no assignment yet: nothing to fence with
    _owning(stream, {0, 1})
    stream._positions.update({0: 3, 3: 99})  # 3: not owned, never committed by this instance
    stream.handle_or_die([_record(1, 40), _record(1, 41)])
    batch, timer = fences["batch"], fences["timer"]
    assert batch is not None and timer is not None
    assert dict(batch.offsets) == {1: 42}  # exactly what this batch consumed
    assert dict(timer.offsets) == {0: 3}  # the timer thread never commits the batch in hand
    assert (batch.generation, batch.member_id, batch.group_instance_id) == (
        5,
        "member-x",
        "tenure-test-scale-3",
    )
    after = stream.group_fence()
    assert after is not None and dict(after.offsets) == {0: 3, 1: 42}


def test_with_the_fence_on_timer_work_waits_until_it_can_be_fenced(tmp_path: Path) -> None:
    """An instance the group evicted while it restored must not commit its first tick unfenced
    (the duplicate events of the keepalives' scale-out failure): no assignment known, or no
    position to fence with yet, and the tick waits for the next one."""
    ran: list[int] = []
    stream = _stream(tmp_path, lambda records: None)
    stream.fence_required = True
    assert stream.timer_work(lambda: ran.append(1)) is False  # no assignment yet
    _owning(stream, {0, 1})
    assert stream.timer_work(lambda: ran.append(2)) is False  # assigned, positions not yet known
    assert ran == []
    stream._positions.update({0: 3})
    assert stream.timer_work(lambda: ran.append(3)) is True
    assert ran == [3]
    unfenced = _stream(tmp_path / "off", lambda records: None)  # fence off: as before
    assert unfenced.timer_work(lambda: ran.append(4)) is True and ran == [3, 4]


def test_a_revocation_clears_the_fence_only_after_the_processor_let_go(tmp_path: Path) -> None:
    """`on_revoked` waits for a tick in progress (the processor's lock); until it returns, that
    tick's transaction must still find the generation it started under."""
    seen: list[GroupFence | None] = []
    stream: CommandStream

    def on_revoked() -> None:
        seen.append(stream.group_fence())

    stream = _stream(tmp_path, lambda records: None, on_revoked)
    _owning(stream, {0})
    stream._positions.update({0: 7})
    asyncio.run(stream.app.on_partitions_revoked.send(set()))
    assert seen and seen[0] is not None and seen[0].generation == 5
    assert stream.group_fence() is None and stream.assignment is None


@given(st.lists(st.integers(min_value=0, max_value=5_000), max_size=60), st.integers(1_024, 8_192))
def test_a_backlog_is_decided_in_parts_under_the_byte_cap_in_order_and_whole(
    sizes: list[int], cap: int
) -> None:
    """TENURE_BATCH_MAX_BYTES: every record lands in exactly one part, in order; a part is over
    the cap only when it is one record that alone is (issue 16, the renewal envelopes' backlog)."""
    records = [InboundRecord("runs.commands", 0, i, b"k", b"x" * size, ()) for i, size in enumerate(sizes)]
    parts = parts_of(records, cap)
    assert [r for part in parts for r in part] == records
    assert all(part for part in parts)
    for part in parts:
        weight = sum(len(r.value) for r in part)
        assert weight <= cap or len(part) == 1
    for before, after in itertools.pairwise(parts):  # no part could have taken the next record
        assert sum(len(r.value) for r in before) + len(after[0].value) > cap
