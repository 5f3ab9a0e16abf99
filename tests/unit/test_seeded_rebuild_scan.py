"""The pieces of the seeded rebuild without a broker (issue 16): the peek at an event's identity,
the scan of the log's records and the choice between a seeded and a folded run.

tests/integration/test_seeded_rebuild.py compares the whole rebuild with the full fold on a real
broker; these pin what it cannot reach there: a gap, a run that starts mid-way, a changelog in
another format, a state behind the log.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.aggregate.changelog import ChangelogSeed
from services.common.contracts import EVENT_TYPES, RunEvent, full_name_of
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec
from services.common.sequencing import VersionGap
from services.common.store import MemoryStore
from services.common.topics import RUNS_EVENTS
from services.lease_coordinator.state_codec import encode_state
from services.projections.seeded_rebuild import Seeds, _LogScan, _rebuilt_runs
from services.projections.store import SEEDED_FOLD, RunViewStore
from services.projections.views import fold_run

from .run_walks import steps, walk

_CODEC = MessageCodec()
_PEEK = _CODEC.peek(EVENT_TYPES)


def _encoded(event: RunEvent) -> bytes:
    return _CODEC.outbound(RUNS_EVENTS.name, event.run_id, event).value


@settings(max_examples=60, deadline=None)
@given(steps(min_size=1, max_size=30), st.data())
def test_a_peek_reads_every_run_events_identity_or_nothing(walk_steps: list, data: st.DataObject) -> None:
    events = walk(walk_steps).events
    for event in events:
        value = _encoded(event)
        peeked = _PEEK(value)
        assert peeked is not None
        assert (peeked.full_name, peeked.aggregate_id, peeked.version) == (
            full_name_of(event),
            event.run_id,
            event.version,
        )
        # A record cut short is either read whole (the cut is past the version) or not at all.
        cut = _PEEK(value[: data.draw(st.integers(0, len(value)))])
        assert cut is None or cut == peeked


def test_what_is_not_a_run_event_is_not_peeked_at() -> None:
    value = _encoded(walk([("claim", 0, 0)]).events[0])
    assert _PEEK(b"") is None
    assert _PEEK(b"{}") is None
    assert _PEEK(b"\x00\x00\x00\x00\x01" + value[10:]) is None  # the Confluent framing: decoded instead
    assert _PEEK(value[:2] + bytes(8) + value[10:]) is None  # a fingerprint of no Run event
    assert _PEEK(value[:10] + b"\x01" + value[11:]) is None  # a negative length


def _values(events: list[RunEvent], partition: int = 0) -> list[tuple[int, int, bytes | None]]:
    return [(partition, offset, _encoded(e)) for offset, e in enumerate(events)]


def test_the_scan_keeps_each_events_bytes_drops_repeats_and_reads_past_what_is_not_a_run_event() -> None:
    events = walk([("claim", 0, 0), ("renew", 1, 1000), ("renew", 1, 1000), ("report", 0, 0)]).events
    values = _values(events)
    values.insert(2, (0, 99, values[1][2]))  # a repeat of version 2
    values.insert(3, (0, 98, b"not avro"))
    values.insert(4, (0, 97, None))
    scan = _LogScan(_CODEC, {0: 1_000})
    scan.take(values)
    assert [(run_id, version) for run_id, version, _ in scan.entries] == [
        (e.run_id, e.version) for e in events
    ]
    assert [value for _, _, value in scan.entries] == [_encoded(e) for e in events]
    run = scan.runs[events[0].run_id]
    assert run.version == events[-1].version
    assert run.claimed_by == events[1].causation_id  # the claim that issued the lease
    assert scan.decoded < len(events)  # the renewals were only peeked at


def test_a_gap_stops_the_scan_as_it_stops_the_fold() -> None:
    events = walk([("claim", 0, 0), ("renew", 1, 1000), ("renew", 1, 1000)]).events
    scan = _LogScan(_CODEC, {0: 1_000})
    with pytest.raises(VersionGap):
        scan.take(_values([events[0], events[1], events[3]]))


def test_a_run_whose_first_event_is_not_its_submission_stops_the_scan() -> None:
    events = walk([("claim", 0, 0)]).events
    with pytest.raises(ValueError, match="before run"):
        _LogScan(_CODEC, {0: 1_000}).take(_values(events[1:]))


def test_what_was_written_after_the_rebuild_began_is_left_to_the_follower() -> None:
    events = walk([("claim", 0, 0), ("renew", 1, 1000)]).events
    scan = _LogScan(_CODEC, {0: 2})
    scan.take(_values(events))
    assert len(scan.entries) == 2
    assert scan.done == {0: 2}
    assert scan.finished()


def _scanned(events: list[RunEvent]) -> tuple[RunViewStore, _LogScan]:
    views = RunViewStore(MemoryStore(), _CODEC)
    scan = _LogScan(_CODEC, {0: 1_000})
    scan.take(_values(events))
    views.write_entries(scan.entries)
    return views, scan


def _seed(usable: bool, checkpoint: int, states: dict[str, bytes]) -> Seeds:
    return Seeds.of(
        {0: ChangelogSeed(usable=usable, checkpoint=checkpoint, states=states, records=len(states))}
    )


def test_a_run_is_seeded_only_from_a_trusted_state_at_its_last_version_before_the_checkpoint() -> None:
    events = walk([("claim", 0, 0), ("renew", 1, 1000), ("renew", 1, 1000)]).events
    run_id = events[0].run_id
    views, scan = _scanned(events)
    last = encode_state(fold_run(events).state)  # type: ignore[union-attr]
    older = encode_state(fold_run(events[:-1]).state)  # type: ignore[union-attr]

    def chosen(seeds: Seeds) -> str:
        rebuilt = _rebuilt_runs(views, scan.runs, seeds, _CODEC)
        assert [r.state for r in rebuilt] == [fold_run(events).state]  # type: ignore[union-attr]
        return "seeded" if rebuilt[0].fold is None else "folded"

    assert chosen(_seed(True, len(events), {run_id: last})) == "seeded"
    assert chosen(_seed(False, len(events), {run_id: last})) == "folded"  # another format, not whole
    assert chosen(_seed(True, len(events) - 1, {run_id: last})) == "folded"  # its last event is past it
    assert chosen(_seed(True, len(events), {run_id: older})) == "folded"  # a state behind the log
    assert chosen(_seed(True, len(events), {})) == "folded"  # no state at all


def test_records_past_the_target_end_the_partition_there_though_a_marker_was_never_delivered() -> None:
    events = walk([("claim", 0, 0), ("renew", 1, 1000)]).events
    scan = _LogScan(_CODEC, {0: 4})
    # Offsets 0-2 are the events, 3 their transaction's commit marker (never delivered), and 4
    # a record written after the rebuild began: it ends the partition at the target, 4.
    scan.take([*_values(events), (0, 4, _encoded(events[0]))])
    assert scan.done == {0: 4} and scan.finished()
    assert scan.seen == len(events)


def _fold_of(events: list[RunEvent]) -> RunViewStore:
    views = RunViewStore(MemoryStore(), _CODEC)
    views.apply(records_of(events))
    return views


def records_of(events: list[RunEvent]) -> list[InboundRecord]:
    return [
        InboundRecord(RUNS_EVENTS.name, 0, offset, e.run_id.encode(), _encoded(e), ())
        for offset, e in enumerate(events)
    ]


def test_a_rebuild_cut_short_is_refolded_by_the_follower_from_offset_0() -> None:
    events = walk([("claim", 0, 0), ("renew", 1, 1000), ("takeover", 2, 1000), ("renew", 2, 1000)]).events
    store = MemoryStore()
    views = RunViewStore(store, _CODEC)
    views.begin_rebuild()
    assert len(events) >= 5
    views.write_entries([(e.run_id, e.version, _encoded(e)) for e in events[3:]])  # then it died
    reopened = RunViewStore(store, _CODEC)
    assert reopened.offsets() == {}, "the follower starts over"
    reopened.apply(records_of(events[:3]))  # the follower's first batch replaces everything
    assert [k for k, _ in store.scan("hist/")] == [f"hist/{events[0].run_id}/{v:019d}" for v in (1, 2, 3)]
    reopened.apply(records_of(events)[3:])
    run_id = events[0].run_id
    assert reopened.fold(run_id) == _fold_of(events).fold(run_id)


def test_a_read_that_meets_the_followers_fold_after_the_seeded_mark_shows_the_stored_fold() -> None:
    events = walk([("claim", 0, 0), ("renew", 1, 1000), ("renew", 1, 1000)]).events
    run_id = events[0].run_id
    views, scan = _scanned(events[:-1])
    state = encode_state(fold_run(events[:-1]).state)  # type: ignore[union-attr]
    rebuilt = _rebuilt_runs(views, scan.runs, _seed(True, 99, {run_id: state}), _CODEC)
    views.write_rebuilt(rebuilt, {0: len(events) - 1})
    assert views._store.get(f"fold/{run_id}") == SEEDED_FOLD
    views.apply(records_of(events)[-1:])  # the follower folds the next event: JSON fold and entry
    # A reader that read the seeded mark just before that write then scans the entries:
    assert views._with_history(run_id, SEEDED_FOLD) == _fold_of(events).fold(run_id)


def test_a_run_whose_last_event_does_not_decode_is_folded_as_the_fold_reads_past_it() -> None:
    events = walk([("claim", 0, 0), ("renew", 1, 1000), ("renew", 1, 1000)]).events
    run_id = events[0].run_id
    values = _values(events)
    broken = values[-1][2]
    assert broken is not None
    values[-1] = (0, values[-1][1], broken[:-1])  # its identity reads, its body does not
    assert _PEEK(broken[:-1]) is not None
    views = RunViewStore(MemoryStore(), _CODEC)
    scan = _LogScan(_CODEC, {0: 1_000})
    scan.take(values)
    views.write_entries(scan.entries)
    state = encode_state(fold_run(events).state)  # type: ignore[union-attr]
    rebuilt = _rebuilt_runs(views, scan.runs, _seed(True, 99, {run_id: state}), _CODEC)
    assert rebuilt[0].fold is not None, "not seeded"
    assert rebuilt[0].state == fold_run(events[:-1]).state  # type: ignore[union-attr]


def test_clearing_the_run_views_leaves_the_stores_other_views() -> None:
    """An API instance seeds its Run views (projections.service.seed_run_views) in the store
    where it keeps trajectory, watchdog and renewal views too: only the Run's keys go."""
    events = walk([("claim", 0, 0), ("renew", 1, 1000)]).events
    store = MemoryStore()
    views = RunViewStore(store, _CODEC)
    views.begin_rebuild()
    views.write_entries([(e.run_id, e.version, _encoded(e)) for e in events])  # a seeding cut short
    views.apply(records_of(events))
    assert views.offsets() and any(True for _ in store.scan("fold/"))
    others = {"tfold/x": b"1", "wfold/y": b"2", "renewal/r/1": b"3", "offset/trajectories.events/0": b"4"}
    store.write(others)
    views.clear_runs()
    assert dict(store.scan("")) == others
    assert views.offsets() == {}
    views.apply(records_of(events))  # and the views build again from there
    assert views.fold(events[0].run_id) == _fold_of(events).fold(events[0].run_id)
