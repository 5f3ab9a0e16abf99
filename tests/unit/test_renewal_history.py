"""LEASE-2's renewal history with renewals kept off runs.events (issue 16): the API folds
runs.renewals into small entries, and the lease record shows every renewal once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.command_api.view_reader import ViewReader
from services.common.clock import ManualClock
from services.common.contracts import LeaseRenewed
from services.common.eventlog import MemoryEventLog
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec
from services.common.store import MemoryStore
from services.common.topics import RUNS_EVENTS, RUNS_RENEWALS
from services.lease_coordinator.domain import LeasePolicy
from services.lease_coordinator.processor import RunCommandProcessor
from services.projections.renewal_store import (
    BUCKET_MS,
    RenewalHistoryStore,
    retained_since,
    with_kept_renewals,
)
from services.projections.store import RunViewStore
from tests.support.lease_run import claim_cmd, renew_cmd

from .strategies import submit_command
from .test_run_processor import CommandTopic, log_records

CODEC = MessageCodec()
RUN = "run_0123456789abcdef0123456789abcdef"


def _renewed(epoch: int, sequence: int, at: int) -> LeaseRenewed:
    return LeaseRenewed(
        event_id=f"evt-{epoch}-{sequence}",
        run_id=RUN,
        version=7,
        occurred_at=at,
        causation_id=f"renew-{sequence}",
        correlation_id="c",
        actor="runner",
        attempt_id=f"att-{epoch}",
        lease_id=f"lease-{epoch}",
        epoch=epoch,
        sequence=sequence,
        expires_at=at + 30_000,
        run_started=False,
    )


def _record(offset: int, event: LeaseRenewed) -> InboundRecord:
    out = CODEC.outbound(RUNS_RENEWALS.name, RUN, event, 2)
    return InboundRecord(out.topic, 2, offset, out.key, out.value, out.headers)


def test_kept_renewals_are_folded_by_epoch_and_sequence_with_their_offsets_lease_2() -> None:
    history = RenewalHistoryStore(MemoryStore(), CODEC)
    records = [
        _record(0, _renewed(1, 3, 1_000)),
        _record(1, _renewed(1, 2, 900)),
        _record(2, _renewed(2, 1, 5_000)),
    ]
    undecodable: list[int] = []
    bad = InboundRecord(RUNS_RENEWALS.name, 2, 3, RUN.encode(), b"not avro")
    assert history.apply([*records, bad], lambda r, _: undecodable.append(r.offset)) == 3
    assert undecodable == [3]
    assert history.offsets() == {2: 4}, "the offsets move past what could not be decoded too"
    assert history.of(RUN, 0) == {
        1: [
            {"sequence": 2, "at": 900, "expiresAt": 30_900},
            {"sequence": 3, "at": 1_000, "expiresAt": 31_000},
        ],
        2: [{"sequence": 1, "at": 5_000, "expiresAt": 35_000}],
    }
    assert history.of("run_other", 0) == {}


def test_the_lease_record_shows_every_renewal_once_and_the_last_expiry_lease_2() -> None:
    on_events = [
        {"sequence": 1, "at": 100, "expiresAt": 30_100},
        {"sequence": 4, "at": 400, "expiresAt": 30_400},
    ]
    lease = {"epoch": 1, "certainty": "active", "expiresAt": 30_400, "renewals": on_events}
    kept = {
        1: [
            {"sequence": 2, "at": 200, "expiresAt": 30_200},
            {"sequence": 4, "at": 400, "expiresAt": 30_400},
            {"sequence": 5, "at": 500, "expiresAt": 30_500},
        ],
        2: [{"sequence": 1, "at": 900, "expiresAt": 30_900}],
    }
    merged = with_kept_renewals(lease, kept)
    assert [r["sequence"] for r in merged["renewals"]] == [1, 2, 4, 5]
    assert merged["expiresAt"] == 30_500
    ended = with_kept_renewals({**lease, "certainty": "expired", "expiresAt": 30_400}, kept)
    assert ended["expiresAt"] == 30_400, "an ended lease keeps the expiry it ended with"
    assert with_kept_renewals({**lease, "epoch": 3}, kept) == {**lease, "epoch": 3}


def test_a_listed_run_shows_the_renewals_kept_off_runs_events_lease_2(tmp_path: Path) -> None:
    """Issue 16: at the default keepalive fraction (an hour) the log holds the start and the
    API's views hold every renewal; GET /runs merges them as GET /runs/{id} does."""
    log, store, clock, topic = MemoryEventLog(), MemoryStore(), ManualClock(), CommandTopic()
    processor = RunCommandProcessor(log, store, CODEC, clock, LeasePolicy())
    processor.handle([topic.record(submit_command("acme", "k1", command_id="s-1"))])
    run_id = next(key.removeprefix("run/") for key, _ in store.scan("run/"))
    claim = claim_cmd(run_id, command_id="c-1", lease_seconds=90, heartbeat_seconds=20)
    processor.handle([topic.record(claim)])
    lease = processor.load(run_id).lease  # type: ignore[union-attr]
    assert lease is not None
    for sequence in (1, 2, 3):
        renew = renew_cmd(run_id, lease.attempt_id, lease.epoch, sequence, command_id=f"r-{sequence}")
        assert processor.handle([topic.record(renew)]).accepted == 1
        clock.advance(20_000)
    views = MemoryStore()
    RunViewStore(views, CODEC).apply(log_records(log, RUNS_EVENTS.name))
    assert RenewalHistoryStore(views, CODEC).apply(log_records(log, RUNS_RENEWALS.name)) == 2
    page = ViewReader(tmp_path, CODEC, views, clock=clock).list(None, 10, None)
    [listed] = page.items
    assert [r["sequence"] for r in listed["lease"]["renewals"]] == [1, 2, 3]
    assert listed["lease"]["expiresAt"] == listed["lease"]["renewals"][-1]["expiresAt"]
    folded = RunViewStore(views, CODEC).get(run_id)
    assert folded is not None and [r["sequence"] for r in folded["lease"]["renewals"]] == [1]


def test_every_instance_shows_the_renewals_younger_than_the_topics_retention_lease_2() -> None:
    """An instance that followed runs.renewals for longer holds renewals the topic has since
    dropped; a newer instance never read them. Both show only those the topic must still hold,
    so two instances behind one load balancer give the same answer (issue 16)."""
    retention = int(RUNS_RENEWALS.config["retention.ms"])
    now = 10 * retention
    aged = _record(0, _renewed(1, 1, now - retention - 1))
    young = _record(1, _renewed(1, 2, now - retention))
    long_running, new = RenewalHistoryStore(MemoryStore(), CODEC), RenewalHistoryStore(MemoryStore(), CODEC)
    long_running.apply([aged, young])
    new.apply([young])  # its first read came after the topic dropped the segment of `aged`
    since = retained_since(now)
    expected = {1: [{"sequence": 2, "at": now - retention, "expiresAt": now - retention + 30_000}]}
    assert long_running.of(RUN, since) == new.of(RUN, since) == expected


def _stored(store: MemoryStore) -> list[tuple[int, int]]:
    """(epoch, sequence) of every renewal the store holds, oldest bucket first."""
    return [(int(key.split("/")[-2]), int(key.split("/")[-1])) for key, _ in store.scan("renewals/")]


def test_renewals_past_the_retention_are_reclaimed_a_bucket_at_a_time_lease_2() -> None:
    """At 5,000 renewals/s an instance would store 430 million entries a day: a bucket whose
    renewals are all past runs.renewals' retention is deleted by the batch that passes it."""
    retention = int(RUNS_RENEWALS.config["retention.ms"])
    store = MemoryStore()
    history = RenewalHistoryStore(store, CODEC)
    start = 100 * BUCKET_MS
    history.apply([_record(0, _renewed(1, 1, start)), _record(1, _renewed(1, 2, start + BUCKET_MS))])
    assert _stored(store) == [(1, 1), (1, 2)]
    history.apply([_record(2, _renewed(1, 3, start + retention + BUCKET_MS - 1))])
    assert _stored(store) == [(1, 1), (1, 2), (1, 3)], (
        "every bucket still holds a renewal inside the retention"
    )
    history.apply([_record(3, _renewed(1, 4, start + retention + BUCKET_MS))])
    assert _stored(store) == [(1, 2), (1, 3), (1, 4)], "bucket 1 is wholly past it now"
    since = retained_since(start + retention + BUCKET_MS)
    assert [r["sequence"] for r in history.of(RUN, since)[1]] == [2, 3, 4]
    assert history.offsets() == {2: 4}


def test_a_restarted_instance_finds_its_oldest_bucket_and_reclaims_from_there_lease_2() -> None:
    retention = int(RUNS_RENEWALS.config["retention.ms"])
    store = MemoryStore()
    start = 100 * BUCKET_MS
    RenewalHistoryStore(store, CODEC).apply([_record(0, _renewed(1, 1, start))])
    later = start + retention + 5 * BUCKET_MS
    restarted = RenewalHistoryStore(store, CODEC)
    late = _record(1, _renewed(1, 2, start + BUCKET_MS))  # on the topic, read after a newer one
    restarted.apply([_record(2, _renewed(2, 1, later)), late])
    assert _stored(store) == [(2, 1)], (
        "the old bucket went, and a renewal already past the retention is not kept"
    )
    assert restarted.of(RUN, retained_since(later)) == {
        2: [{"sequence": 1, "at": later, "expiresAt": later + 30_000}]
    }


def test_a_runs_renewals_across_buckets_are_read_in_sequence_order_lease_2() -> None:
    history = RenewalHistoryStore(MemoryStore(), CODEC)
    edge = 200 * BUCKET_MS
    history.apply([_record(0, _renewed(1, 1, edge - 1)), _record(1, _renewed(1, 2, edge))])
    history.apply([_record(2, _renewed(1, 3, edge + 1))])
    assert [r["sequence"] for r in history.of(RUN, edge - 10)[1]] == [1, 2, 3]
    assert [r["sequence"] for r in history.of(RUN, edge)[1]] == [2, 3]


def test_the_layout_before_buckets_is_dropped_and_the_topic_read_again_lease_2() -> None:
    """An API instance upgraded in place held renewal/<runId>/... entries that nothing could
    reclaim: they go, with the offsets, so its follower reads runs.renewals from the start."""
    store = MemoryStore()
    store.write(
        {
            f"renewal/{RUN}/0000000001/0000000000000000001": b"{}",
            "offset/runs.renewals/2": b"17",
            "offset/runs.events/0": b"5",
            "fold/x": b"1",
        }
    )
    history = RenewalHistoryStore(store, CODEC)
    assert history.discard_legacy_layout() is True
    assert dict(store.scan("")) == {"offset/runs.events/0": b"5", "fold/x": b"1"}
    assert history.offsets() == {}
    assert history.discard_legacy_layout() is False


class _FailsOnce(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.fail_next = False

    def write(self, puts: Any, deletes: tuple[str, ...] = (), delete_ranges: Any = ()) -> None:
        if self.fail_next:
            self.fail_next = False
            raise OSError("disk full")
        super().write(puts, deletes, delete_ranges)


def test_a_bucket_whose_delete_failed_is_deleted_by_the_next_batch_lease_2() -> None:
    retention = int(RUNS_RENEWALS.config["retention.ms"])
    store = _FailsOnce()
    history = RenewalHistoryStore(store, CODEC)
    start = 100 * BUCKET_MS
    history.apply([_record(0, _renewed(1, 1, start))])
    store.fail_next = True
    with pytest.raises(OSError):
        history.apply([_record(1, _renewed(1, 2, start + retention + BUCKET_MS))])
    assert _stored(store) == [(1, 1)], "the failed write changed nothing"
    history.apply([_record(1, _renewed(1, 2, start + retention + BUCKET_MS))])
    assert _stored(store) == [(1, 2)]
