"""Run views: the pure fold (`apply_event`) and the indexed view store over a MemoryStore.

Proves the read side of DUR-1 (a view is exactly the fold of the events before the stored
offsets; rebuilding from the log gives the same views) and that listings page every run exactly
once. The views are checked against the write side too: folding the processor's own log gives
views whose status/version/spec agree with the processor's state.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.clock import ManualClock
from services.common.contracts import RunCancelled, RunEvent, RunSubmitted
from services.common.eventlog import MemoryEventLog
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec
from services.common.sequencing import VersionGap
from services.common.store import MemoryStore
from services.common.topics import RUNS_COMMANDS, RUNS_EVENTS
from services.lease_coordinator.domain import RunState, decide, evolve
from services.lease_coordinator.processor import RunCommandProcessor
from services.projections.fold_codec import decode_view, encode_view
from services.projections.store import BadCursor, RunViewStore
from services.projections.views import apply_event

from .strategies import SPEC_TEXTS, cancel_command, submit_command

CODEC = MessageCodec()
T0 = 1_767_225_600_000


def submitted(
    key: str = "k1", now: int = T0, tenant: str = "acme", spec: str = SPEC_TEXTS[0]
) -> RunSubmitted:
    (event,) = decide(None, submit_command(tenant, key, spec, command_id=f"s-{tenant}-{key}"), now)
    assert isinstance(event, RunSubmitted)
    return event


def cancelled(first: RunSubmitted, now: int = T0 + 500, reason: str = "not needed") -> RunCancelled:
    state = evolve(None, first)
    (event,) = decide(state, cancel_command(first.run_id, command_id=f"c-{first.run_id}", reason=reason), now)
    assert isinstance(event, RunCancelled)
    return event


class EventTopic:
    """runs.events as a projection reads it: offsets increase per partition."""

    def __init__(self) -> None:
        self._next: dict[int, int] = defaultdict(int)

    def records(self, events: list[RunEvent], partition: int = 0) -> list[InboundRecord]:
        out = []
        for event in events:
            encoded = CODEC.outbound(RUNS_EVENTS.name, event.run_id, event, partition)
            offset = self._next[partition]
            self._next[partition] += 1
            out.append(
                InboundRecord(encoded.topic, partition, offset, encoded.key, encoded.value, encoded.headers)
            )
        return out

    def raw(self, value: bytes, partition: int = 0) -> InboundRecord:
        offset = self._next[partition]
        self._next[partition] += 1
        return InboundRecord(RUNS_EVENTS.name, partition, offset, b"k", value)


def fold_views(events: list[RunEvent]) -> dict[str, Any] | None:
    view: dict[str, Any] | None = None
    for event in events:
        view = apply_event(view, event)
        assert view is not None
    return view


# --- the pure fold -----------------------------------------------------------------------------


def test_submitted_then_cancelled_folds_into_a_view_with_ordered_history() -> None:
    first = submitted(now=T0)
    second = cancelled(first, now=T0 + 900, reason="budget cut")
    queued = apply_event(None, first)
    assert queued is not None
    assert queued["runId"] == first.run_id
    assert (queued["status"], queued["version"], queued["statusReason"]) == ("queued", 1, None)
    assert queued["specDigest"] == first.spec_digest
    assert queued["executionSpec"] == {
        "image": "registry.local/agent@sha256:aa",
        "resources": {"cpu": 2, "mem": "4Gi"},
    }
    assert queued["queueReservationId"] == first.queue_reservation_id
    assert (queued["submittedAt"], queued["updatedAt"], queued["submittedBy"]) == (T0, T0, first.actor)

    view = apply_event(queued, second)
    assert view is not None
    assert (view["status"], view["version"], view["statusReason"]) == ("cancelled", 2, "budget cut")
    assert view["queueReservationId"] is None, "EXE-7: the reservation was released"
    assert (view["submittedAt"], view["updatedAt"]) == (T0, T0 + 900)
    assert [h["version"] for h in view["history"]] == [1, 2]
    assert [h["type"] for h in view["history"]] == ["RunSubmitted", "RunCancelled"]
    assert [h["causationId"] for h in view["history"]] == [first.causation_id, second.causation_id]
    assert view["history"][1]["fromStatus"] == "queued"
    assert view["history"][1]["reason"] == "budget cut"


def test_apply_event_never_mutates_the_view_it_is_given() -> None:
    first = submitted()
    view = apply_event(None, first)
    assert view is not None
    frozen = copy.deepcopy(view)
    apply_event(view, cancelled(first))
    assert view == frozen


def test_cancel_without_reason_gets_a_default_status_reason() -> None:
    first = submitted()
    view = fold_views([first, cancelled(first, reason="")])
    assert view is not None and view["statusReason"]


def test_a_duplicate_event_yields_none() -> None:
    first = submitted()
    second = cancelled(first)
    view = fold_views([first, second])
    assert apply_event(view, first) is None
    assert apply_event(view, second) is None
    assert apply_event(apply_event(None, first), first) is None


def test_a_version_gap_raises() -> None:
    first = submitted()
    second = cancelled(first)
    with pytest.raises(VersionGap):
        apply_event(apply_event(None, first), dataclasses.replace(second, version=3))
    with pytest.raises(VersionGap):
        apply_event(None, second)  # version 2 before version 1


def test_view_bytes_round_trip() -> None:
    first = submitted()
    view = fold_views([first, cancelled(first)])
    assert view is not None
    assert decode_view(encode_view(view)) == view
    assert encode_view(decode_view(encode_view(view))) == encode_view(view), "stable bytes"


# --- the view store ----------------------------------------------------------------------------


def test_store_apply_then_get_and_offsets() -> None:
    topic, views = EventTopic(), RunViewStore(MemoryStore(), CODEC)
    a, b = submitted("a", T0), submitted("b", T0 + 1)
    records = topic.records([a], partition=0) + topic.records([b, cancelled(b)], partition=3)
    assert views.apply(records) == 3
    assert views.get(a.run_id)["status"] == "queued"  # type: ignore[index]
    assert views.get(b.run_id)["status"] == "cancelled"  # type: ignore[index]
    assert views.get("run_unknown") is None
    assert views.offsets() == {0: 1, 3: 2}, "offset = next offset to read, per partition"


def test_status_index_moves_on_cancel_in_later_and_in_the_same_batch() -> None:
    store = MemoryStore()
    topic, views = EventTopic(), RunViewStore(store, CODEC)
    a, b = submitted("a", T0), submitted("b", T0 + 1)
    views.apply(topic.records([a, b]))
    views.apply(topic.records([cancelled(a)]))
    c = submitted("c", T0 + 2)
    views.apply(topic.records([c, cancelled(c)]))  # submit and cancel in one batch
    index = [key for key, _ in store.scan("idx/")]
    assert sorted(k for k in index if k.startswith("idx/queued/")) == [f"idx/queued/{T0 + 1:013d}/{b.run_id}"]
    assert sorted(k for k in index if k.startswith("idx/cancelled/")) == [
        f"idx/cancelled/{T0:013d}/{a.run_id}",
        f"idx/cancelled/{T0 + 2:013d}/{c.run_id}",
    ]
    assert len([k for k in index if k.startswith("idx/*/")]) == 3
    assert [v["runId"] for v in views.list("queued", 10, None).items] == [b.run_id]
    assert [v["runId"] for v in views.list("cancelled", 10, None).items] == [a.run_id, c.run_id]
    assert [v["runId"] for v in views.list(None, 10, None).items] == [a.run_id, b.run_id, c.run_id]


def test_a_duplicate_record_changes_no_view() -> None:
    topic, views = EventTopic(), RunViewStore(MemoryStore(), CODEC)
    first = submitted()
    records = topic.records([first, cancelled(first)])
    views.apply(records)
    before = views.all_views()
    assert views.apply(records) == 0
    assert views.all_views() == before


def test_a_gap_in_a_batch_writes_nothing_not_even_offsets() -> None:
    topic, views = EventTopic(), RunViewStore(MemoryStore(), CODEC)
    first = submitted()
    views.apply(topic.records([first]))
    before_views, before_offsets = views.all_views(), views.offsets()
    other = submitted("other")
    bad = topic.records([other, dataclasses.replace(cancelled(first), version=3)])
    with pytest.raises(VersionGap):
        views.apply(bad)
    assert views.all_views() == before_views
    assert views.offsets() == before_offsets


def test_an_undecodable_record_is_skipped_but_its_offset_is_consumed() -> None:
    topic, views = EventTopic(), RunViewStore(MemoryStore(), CODEC)
    first = submitted()
    records = [topic.raw(b"garbage"), *topic.records([first])]
    assert views.apply(records) == 1
    assert views.offsets() == {0: 2}
    assert set(views.all_views()) == {first.run_id}


# --- paging ------------------------------------------------------------------------------------


def _listing(views: RunViewStore, status: str | None, limit: int) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        page = views.list(status, limit, cursor)
        pages.append([v["runId"] for v in page.items])
        assert len(page.items) <= limit
        if page.next_cursor is None:
            return pages
        assert len(page.items) == limit, "a short page is the last page"
        cursor = page.next_cursor
        assert len(pages) < 200, "paging does not terminate"


@settings(max_examples=80, deadline=None)
@given(
    runs=st.lists(st.tuples(st.integers(min_value=0, max_value=3), st.booleans()), min_size=0, max_size=14),
    limit=st.integers(min_value=1, max_value=5),
    batch_size=st.integers(min_value=1, max_value=7),
)
def test_paging_returns_every_item_exactly_once_in_submission_order(
    runs: list[tuple[int, bool]], limit: int, batch_size: int
) -> None:
    topic, views = EventTopic(), RunViewStore(MemoryStore(), CODEC)
    events: list[RunEvent] = []
    expected: dict[str | None, list[tuple[int, str]]] = defaultdict(list)
    for i, (delay, cancel) in enumerate(runs):
        first = submitted(f"k{i}", T0 + delay)  # equal submission times happen on purpose
        events.append(first)
        if cancel:
            events.append(cancelled(first))
        expected[None].append((first.occurred_at, first.run_id))
        expected["cancelled" if cancel else "queued"].append((first.occurred_at, first.run_id))
    records = topic.records(events)
    for start in range(0, len(records), batch_size):
        views.apply(records[start : start + batch_size])

    for status in (None, "queued", "cancelled", "running"):
        pages = _listing(views, status, limit)
        flat = [run_id for page in pages for run_id in page]
        assert flat == [run_id for _, run_id in sorted(expected[status])], status
        assert len(set(flat)) == len(flat), "every item exactly once"
        for run_id in flat:
            view = views.get(run_id)
            assert view is not None
            assert status is None or view["status"] == status


def test_bad_cursors_are_refused() -> None:
    topic, views = EventTopic(), RunViewStore(MemoryStore(), CODEC)
    views.apply(topic.records([submitted(f"k{i}", T0 + i) for i in range(5)]))
    queued_cursor = views.list("queued", 2, None).next_cursor
    assert queued_cursor is not None
    for garbage in (
        "%%%not-base64%%%",
        "abc",
        base64.urlsafe_b64encode(b"\xff\xfe\x00").decode(),
        base64.urlsafe_b64encode(b"view/run_x").decode(),
    ):
        with pytest.raises(BadCursor):
            views.list("queued", 2, garbage)
    with pytest.raises(BadCursor):
        views.list("cancelled", 2, queued_cursor)  # a cursor of another status
    with pytest.raises(BadCursor):
        views.list(None, 2, queued_cursor)
    assert len(views.list("queued", 2, queued_cursor).items) == 2


# --- rebuild -----------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    cancels=st.lists(st.booleans(), min_size=1, max_size=8),
    split_a=st.integers(min_value=1, max_value=5),
    split_b=st.integers(min_value=1, max_value=5),
)
def test_rebuild_into_a_fresh_store_gives_identical_views_dur_1(
    cancels: list[bool], split_a: int, split_b: int
) -> None:
    """DUR-1 (read side): views are a pure function of the log, whatever the batching was."""
    topic = EventTopic()
    records: list[InboundRecord] = []
    for i, cancel in enumerate(cancels):
        first = submitted(f"k{i}", T0 + i)
        records += topic.records([first, cancelled(first)] if cancel else [first], partition=i % 2)

    live, rebuilt = RunViewStore(MemoryStore(), CODEC), RunViewStore(MemoryStore(), CODEC)
    for start in range(0, len(records), split_a):
        live.apply(records[start : start + split_a])
    live.apply(records[: len(records) // 2])  # a redelivered prefix on top changes nothing
    for start in range(0, len(records), split_b):
        rebuilt.apply(records[start : start + split_b])
    assert rebuilt.all_views() == live.all_views()
    assert [v["runId"] for v in rebuilt.list(None, 100, None).items] == [
        v["runId"] for v in live.list(None, 100, None).items
    ]


def test_views_agree_with_the_processor_state_folded_from_the_same_log() -> None:
    """The write side (RunState) and the read side (view) fold the same log to the same facts."""
    log, store = MemoryEventLog(), MemoryStore()
    processor = RunCommandProcessor(log, store, CODEC, ManualClock())
    commands = [submit_command("acme", f"k{i}", command_id=f"s-{i}") for i in range(6)]
    commands += [cancel_command(c.run_id, command_id=f"c-{c.run_id}") for c in commands[::2]]
    offsets: dict[int, int] = defaultdict(int)
    inbound = []
    for command in commands:
        out = CODEC.outbound(RUNS_COMMANDS.name, command.run_id, command, 0)
        inbound.append(InboundRecord(out.topic, 0, offsets[0], out.key, out.value, out.headers))
        offsets[0] += 1
    processor.handle(inbound)

    views = RunViewStore(MemoryStore(), CODEC)
    views.apply(log.read(RUNS_EVENTS.name, 0, 0))
    all_views = views.all_views()
    assert set(all_views) == {c.run_id for c in commands}
    for run_id, view in all_views.items():
        state = processor.load(run_id)
        assert isinstance(state, RunState)
        assert view["status"] == state.status.value
        assert view["version"] == state.version
        assert view["specDigest"] == state.spec_digest
        assert view["queueReservationId"] == state.queue_reservation_id
        assert {h["causationId"] for h in view["history"]} == set(state.handled_commands)


def test_every_problem_slug_the_api_can_return_is_documented() -> None:
    """Each ApiProblem slug and rejection mapping names a /problems/<slug> the API serves."""
    import pathlib
    import re

    from services.command_api.problems import PROBLEM_TYPES, REJECTION_PROBLEMS

    used = set(REJECTION_PROBLEMS.values())
    for path in pathlib.Path("services/command_api").glob("*.py"):
        used |= set(re.findall(r'ApiProblem\(\s*"([a-z-]+)"', path.read_text()))
    assert used - set(PROBLEM_TYPES) == set()
