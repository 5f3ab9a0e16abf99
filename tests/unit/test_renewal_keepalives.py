"""Renewals kept off runs.events (issue 16; services/common/aggregate/keepalives.py).

A bare renewal of an active lease whose last renewal on runs.events is younger than
`keepalive_fraction` of its TTL is committed to runs.renewals instead, and kept in memory. What
must hold, whatever happens in between (LEASE-2, LEASE-5, DUR-1):
  * the store's state is always the fold of runs.events, whose versions stay gapless;
  * an expiry is never decided earlier than the holder may believe its lease valid: the latest
    renewal it was answered, on either topic, also after a restore into an empty store;
  * every renewal is on the log: LEASE-2's history is runs.events plus runs.renewals.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.aggregate.changelog import KEEPALIVE_KEY
from services.common.aggregate.keepalives import NONE_LIVE, restore_from
from services.common.clock import ManualClock
from services.common.contracts import LeaseExpired, LeaseRenewed, RunEvent
from services.common.eventlog import MemoryEventLog
from services.common.store import MemoryStore
from services.common.topics import RUNS_EVENTS, RUNS_RENEWALS, RUNS_STATES
from services.lease_coordinator.domain import LeasePolicy
from services.lease_coordinator.processor import RunCommandProcessor, checkpoint_key
from tests.support.lease_run import claim_cmd, renew_cmd, report_cmd

from .strategies import submit_command
from .test_run_processor import (
    CODEC,
    CommandTopic,
    CrashableStore,
    SimulatedCrash,
    assert_log_is_well_formed,
    assert_state_is_fold_of_log_dur_1,
    log_records,
    partition_of,
)

LEASE_S = 30  # kept while the last renewal on runs.events is younger than 15 s
POLICY = LeasePolicy(keepalive_fraction=0.5)


class Harness:
    """One run with a held lease, its processor on in-memory twins, and what its holder was told."""

    def __init__(self) -> None:
        self.log, self.store, self.clock, self.topic = (
            MemoryEventLog(),
            MemoryStore(),
            ManualClock(),
            CommandTopic(),
        )
        self.processor = self.new_processor()
        self.processor.handle([self.topic.record(submit_command("acme", "k1", command_id="s-1"))])
        self.run_id = next(key.removeprefix("run/") for key, _ in self.store.scan("run/"))
        self.processor.handle(
            [self.topic.record(claim_cmd(self.run_id, command_id="c-1", lease_seconds=LEASE_S))]
        )
        lease = self.processor.load(self.run_id).lease  # type: ignore[union-attr]
        assert lease is not None
        self.attempt_id, self.epoch = lease.attempt_id, lease.epoch
        self.sequence = 0
        self.believed_until = lease.expires_at  # the latest expiry the holder was answered
        first = self.renew()  # it starts the run: on runs.events
        assert (first.events, first.kept) == (1, 0)

    def new_processor(self, store: MemoryStore | None = None) -> RunCommandProcessor:
        return RunCommandProcessor(self.log, store or self.store, CODEC, self.clock, POLICY)

    def renew(self) -> Any:
        self.sequence += 1
        command = renew_cmd(
            self.run_id, self.attempt_id, self.epoch, self.sequence, command_id=f"r-{self.sequence}"
        )
        outcome = self.processor.handle([self.topic.record(command)])
        answered = [e for e in self.renewals() if e.causation_id == command.command_id]
        if answered:
            self.believed_until = max(self.believed_until, answered[0].expires_at)
        return outcome

    def renew_every(self, ms: int, times: int) -> None:
        for _ in range(times):
            self.clock.advance(ms)
            self.renew()

    def events(self) -> list[RunEvent]:
        return [CODEC.decode(r.value) for r in log_records(self.log, RUNS_EVENTS.name)]

    def kept_records(self) -> list[LeaseRenewed]:
        return [CODEC.decode(r.value) for r in log_records(self.log, RUNS_RENEWALS.name)]

    def renewals(self) -> list[LeaseRenewed]:
        """Every renewal answered, on either topic."""
        on_events = [e for e in self.events() if isinstance(e, LeaseRenewed)]
        return on_events + self.kept_records()

    def expiries(self) -> list[LeaseExpired]:
        return [e for e in self.events() if isinstance(e, LeaseExpired)]

    def check(self) -> None:
        assert_log_is_well_formed(self.log)
        assert_state_is_fold_of_log_dur_1(self.log, self.store)
        for expired in self.expiries():
            assert expired.occurred_at >= self.believed_until, "expired before the holder's lease ended"


class CountingStore(MemoryStore):
    """Counts the reads of each key."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: dict[str, int] = {}

    def get(self, key: str) -> bytes | None:
        self.reads[key] = self.reads.get(key, 0) + 1
        return super().get(key)


def test_a_renewal_after_a_kept_one_is_decided_without_reading_the_state_back() -> None:
    """The kept event's durable state is the store's: with more live leases than the decoded-state
    cache holds, reading it back was a read and a decode per renewal (issue 16)."""
    h = Harness()
    store = CountingStore()
    store.write(dict(h.store.scan("")))
    h.processor = h.new_processor(store)
    h.store = store
    h.renew_every(2_000, 1)  # restores the partition, reads the state once, keeps the renewal
    reads = store.reads.get(f"run/{h.run_id}", 0)
    h.renew_every(2_000, 4)
    assert [e.sequence for e in h.kept_records()][-5:] == [2, 3, 4, 5, 6]
    assert store.reads.get(f"run/{h.run_id}", 0) == reads, "a kept renewal read the state back"
    h.clock.advance(16_000)  # past half the TTL since the last renewal on runs.events: logged
    assert h.renew().events == 1
    h.check()


def test_renewals_between_two_on_the_log_go_to_runs_renewals_and_change_no_stored_state() -> None:
    h = Harness()
    stored = h.store.get(f"run/{h.run_id}")
    for _ in range(5):
        h.clock.advance(2_000)
        outcome = h.renew()
        assert (outcome.accepted, outcome.kept, outcome.events) == (1, 1, 0)
    assert [e.sequence for e in h.kept_records()] == [2, 3, 4, 5, 6]
    assert {e.version for e in h.kept_records()} == {4}, "each decided at the durable version + 1"
    assert [e.sequence for e in h.events() if isinstance(e, LeaseRenewed)] == [1]
    assert h.store.get(f"run/{h.run_id}") == stored
    h.check()


def test_a_renewal_goes_on_runs_events_once_the_last_one_there_is_half_a_lease_old() -> None:
    h = Harness()
    h.renew_every(2_000, 20)  # every 2 s: one on the log about every 15 s
    on_log = [e for e in h.events() if isinstance(e, LeaseRenewed)]
    assert [e.sequence for e in on_log] == [1, 9, 17]
    assert len(h.kept_records()) == 18
    lease = h.processor.load(h.run_id).lease  # type: ignore[union-attr]
    assert lease is not None and lease.last_sequence == 17
    h.check()


def test_a_report_puts_the_kept_renewal_on_the_log_first_with_its_own_id() -> None:
    h = Harness()
    h.renew_every(1_000, 3)
    kept = h.kept_records()[-1]
    report = report_cmd(h.run_id, h.attempt_id, h.epoch, h.sequence + 1, command_id="rep-1")
    outcome = h.processor.handle([h.topic.record(report)])
    assert outcome.events == 2
    renewed, reported = h.events()[-2:]
    assert renewed == kept, "the very event the holder was answered with"
    assert reported.version == kept.version + 1
    h.check()


def test_a_redelivered_kept_renewal_is_dropped() -> None:
    h = Harness()
    h.clock.advance(1_000)
    command = renew_cmd(h.run_id, h.attempt_id, h.epoch, 2, command_id="r-once")
    h.processor.handle([h.topic.record(command)])
    again = h.processor.handle([h.topic.record(command)])
    assert (again.duplicates, again.kept, again.rejections) == (1, 0, 0)
    assert len(h.kept_records()) == 1


def test_the_expiry_waits_for_the_kept_renewal_and_puts_it_on_the_log_first() -> None:
    h = Harness()
    h.clock.advance(10_000)
    h.renew()  # kept: the holder believes its lease until +40 s; runs.events says +30 s
    h.clock.advance(25_000)  # 35 s after the grant
    h.processor.tick()
    assert not h.expiries()
    h.clock.advance(10_000)
    h.processor.tick()
    assert len(h.expiries()) == 1
    kept = h.kept_records()[0]
    events = h.events()
    at = events.index(kept)  # the very event the holder was answered with, on the log before them
    assert [type(e).__name__ for e in events[at + 1 :]][:2] == ["LeaseAtRisk", "LeaseExpired"]
    h.check()


def test_a_restore_into_an_empty_store_keeps_the_kept_renewals() -> None:
    h = Harness()
    h.renew_every(2_000, 4)
    fresh = MemoryStore()
    h.processor, h.store = h.new_processor(fresh), fresh  # another instance takes the partition
    h.processor.restore(partition_of(h.run_id))
    h.clock.advance(27_000)  # 35 s: past what runs.events says (30 s), before what was answered (38 s)
    h.processor.tick()
    assert not h.expiries()
    h.renew()  # fenced against the kept renewal, accepted, and on runs.events (35 s after the last there)
    assert [e.sequence for e in h.events() if isinstance(e, LeaseRenewed)] == [1, 5, 6]
    h.clock.advance(LEASE_S * 1000)
    h.processor.tick()
    assert len(h.expiries()) == 1
    h.check()


def test_the_low_water_mark_moves_past_renewals_no_longer_kept() -> None:
    h = Harness()
    partition = partition_of(h.run_id)
    mark = checkpoint_key(partition, RUNS_RENEWALS.name)
    h.renew_every(2_000, 39)
    kept_offsets = [r.offset for r in log_records(h.log, RUNS_RENEWALS.name)]
    low = int(h.store.get(mark) or b"0")
    # Past the renewals since put on runs.events, never past the one still kept (the last).
    assert 0 < low <= kept_offsets[-1]
    assert h.kept_records()[-1].sequence == 40 and h.kept_records()[-1] not in h.events()
    changelog = [r for r in log_records(h.log, RUNS_STATES.name) if r.key == KEEPALIVE_KEY]
    assert int(changelog[-1].value) == low, "an empty store's restore starts there too"
    h.check()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("renew"), st.sampled_from([0, 1_000, 5_000, 10_000, 14_000])),
            st.tuples(st.just("tick"), st.sampled_from([0, 1_000, 5_000, 15_000, 25_000, 40_000])),
            # "empty": a new instance; "same": a restart on its own store; "other": the partition
            # handed back to the other instance, whose store is as stale as its last restore left it
            st.tuples(st.just("restart"), st.sampled_from(["empty", "same", "other"])),
        ),
        max_size=12,
    )
)
def test_whatever_the_order_no_expiry_is_earlier_than_the_holder_believes(
    steps: list[tuple[str, Any]],
) -> None:
    h = Harness()
    other = MemoryStore()
    for kind, arg in steps:
        if kind == "renew":
            h.clock.advance(arg)
            h.renew()
        elif kind == "tick":
            h.clock.advance(arg)
            h.processor.tick()
        else:
            store = {"empty": MemoryStore(), "same": h.store, "other": other}[arg]
            if arg == "other":
                other = h.store
            h.processor, h.store = h.new_processor(store), store
            h.processor.restore(partition_of(h.run_id))
        h.check()
    by_sequence: dict[int, set[str]] = {}
    for renewed in h.renewals():
        by_sequence.setdefault(renewed.sequence, set()).add(renewed.event_id)
    assert all(len(ids) == 1 for ids in by_sequence.values()), "one renewal, one event, wherever it is"


def test_each_accepted_renewal_is_counted_once_wherever_it_is() -> None:
    h = Harness()  # one renewal on runs.events
    h.renew_every(2_000, 9)  # kept, or on runs.events every 15 s
    h.processor.handle([h.topic.record(report_cmd(h.run_id, h.attempt_id, h.epoch, h.sequence + 1))])
    assert len({e.event_id for e in h.renewals()}) == 10, "the last kept one went on runs.events too"
    counted = h.processor.metrics.registry.get_sample_value("tenure_lease_renewals_total")
    assert counted == 10


def _topics_read(log: MemoryEventLog) -> list[str]:
    """The topics `log` is asked to read from now on, in order."""
    read: list[str] = []
    original = log.read

    def counting(topic: str, partition: int, start: int) -> Any:
        read.append(topic)
        return original(topic, partition, start)

    log.read = counting  # type: ignore[method-assign]
    return read


def test_once_no_renewal_is_kept_the_mark_says_so_and_a_restore_reads_nothing() -> None:
    h = Harness()
    partition = partition_of(h.run_id)
    h.renew_every(2_000, 3)
    h.processor.handle([h.topic.record(report_cmd(h.run_id, h.attempt_id, h.epoch, h.sequence + 1))])
    assert h.store.get(checkpoint_key(partition, RUNS_RENEWALS.name)) == str(NONE_LIVE).encode()
    changelog = [r for r in log_records(h.log, RUNS_STATES.name) if r.key == KEEPALIVE_KEY]
    assert int(changelog[-1].value) == NONE_LIVE

    read = _topics_read(h.log)
    fresh = MemoryStore()
    h.processor, h.store = h.new_processor(fresh), fresh
    h.processor.restore(partition)
    assert RUNS_RENEWALS.name not in read, "nothing kept is live: runs.renewals is not read"
    h.check()


def _none_live_then_handed_over(h: Harness) -> MemoryStore:
    """This instance's store says no renewal is kept (its last kept one went on runs.events);
    then another instance (an empty store, seeded from the changelog) takes the partition."""
    mark = checkpoint_key(partition_of(h.run_id), RUNS_RENEWALS.name)
    h.clock.advance(2_000)
    assert h.renew().kept == 1
    h.clock.advance(14_000)  # half a lease after the last renewal on runs.events
    assert h.renew().events == 1, "on runs.events, in place of the kept one"
    assert h.store.get(mark) == str(NONE_LIVE).encode()
    stale = h.store
    fresh = MemoryStore()
    h.processor, h.store = h.new_processor(fresh), fresh
    h.processor.restore(partition_of(h.run_id))
    return stale


def test_a_partition_handed_back_to_a_stale_store_keeps_what_the_other_owner_answered_LEASE_5() -> None:
    """The hole the first version of keepalives had: an instance that gets a partition back
    restored from its own mark (none live) and missed the renewals another owner kept since."""
    h = Harness()
    stale = _none_live_then_handed_over(h)
    h.clock.advance(2_000)
    assert h.renew().kept == 1  # answered by the other owner: valid until 18 s + 30 s
    h.processor, h.store = h.new_processor(stale), stale  # handed back
    h.processor.restore(partition_of(h.run_id))
    h.clock.advance(29_000)  # 1 s before what the holder was answered, after what runs.events says
    h.processor.tick()
    assert not h.expiries(), "the renewal the other owner answered is not forgotten"
    h.clock.advance(2_000)
    h.processor.tick()
    assert len(h.expiries()) == 1
    h.check()


def test_a_commit_whose_store_write_a_crash_cut_is_restored_with_its_kept_renewal_DUR_1() -> None:
    """Step 3 landed (the kept renewal was answered), step 4 did not: the store still says none
    is kept, and the restart restores from the topic's growth past the end the store knew."""
    h = Harness()
    disk = MemoryStore()
    crashable = CrashableStore(disk)
    h.processor, h.store = h.new_processor(crashable), disk  # type: ignore[arg-type]
    h.processor.restore(partition_of(h.run_id))
    _none_live_then_handed_over(h)  # the same moves; only the instance's store matters here
    h.processor, h.store = h.new_processor(crashable), disk  # type: ignore[arg-type]
    h.processor.restore(partition_of(h.run_id))
    h.clock.advance(2_000)
    crashable.crash_on_next_write = True
    with pytest.raises(SimulatedCrash):
        h.renew()
    assert len(h.kept_records()) == 2, "committed before the crash: the holder may have its answer"
    h.believed_until = max(h.believed_until, h.kept_records()[-1].expires_at)
    h.processor = h.new_processor(crashable)  # type: ignore[arg-type]  # restarted on its disk
    h.processor.restore(partition_of(h.run_id))
    h.clock.advance(29_000)
    h.processor.tick()
    assert not h.expiries(), "the committed renewal is restored though the store never saw it"
    h.clock.advance(2_000)
    h.processor.tick()
    assert len(h.expiries()) == 1
    h.check()


def _timer_keys(store: MemoryStore, run_id: str) -> list[str]:
    return [key for key, _ in store.scan("timer/") if key.endswith(f"/{run_id}")]


def test_a_timer_entry_left_behind_by_a_replaced_kept_renewal_is_re_indexed_by_the_tick() -> None:
    """A's store indexed its kept renewal's expiry; another owner replaced that renewal on the
    log, and A's restore re-indexed from the durable state it knew. The entry A made for the kept
    renewal stays behind; the first tick past it deletes it and keeps the run's current one."""
    h = Harness()
    partition = partition_of(h.run_id)
    h.clock.advance(2_000)
    assert h.renew().kept == 1
    stale = h.store
    left_behind = _timer_keys(stale, h.run_id)
    fresh = MemoryStore()
    h.processor, h.store = h.new_processor(fresh), fresh
    h.processor.restore(partition)
    h.clock.advance(14_000)
    assert h.renew().events == 1, "the other owner's renewal goes on runs.events"
    h.processor, h.store = h.new_processor(stale), stale  # handed back
    h.processor.restore(partition)
    assert set(left_behind) <= set(_timer_keys(stale, h.run_id)), "the kept renewal's entry is still there"
    current = _timer_keys(fresh, h.run_id)
    h.clock.advance(10_000)  # past the left-behind entry, before the run's current one
    h.processor.tick()
    assert not h.expiries()
    assert _timer_keys(stale, h.run_id) == current
    h.check()


def test_where_a_restore_reads_the_keepalive_topic_from() -> None:
    assert restore_from(NONE_LIVE, None, 10) == NONE_LIVE  # an empty store seeded: the mark as is
    assert restore_from(4, None, 10) == 4
    assert restore_from(NONE_LIVE, 10, 10) == NONE_LIVE, "nothing written since: nothing read"
    assert restore_from(4, 10, 10) == 4
    assert restore_from(NONE_LIVE, 10, 12) == 10, "someone wrote since: read what they wrote"
    assert restore_from(4, 10, 12) == 4
    assert restore_from(11, 10, 12) == 10


class _KafkaLikeLog(MemoryEventLog):
    """The twin, saying what Kafka's log says: a commit ends with a control record per partition."""

    markers_per_commit = 1

    def commit(self, records: Any) -> dict[tuple[str, int], int]:
        last = super().commit(records)
        for topic, partition in last:  # the commit marker: an offset no reader is given
            self.topics[(topic, partition)].append(self.topics[(topic, partition)][-1])
        return last

    def read(self, topic: str, partition: int, start_offset: int) -> Any:
        seen: set[int] = set()
        for record in super().read(topic, partition, start_offset):
            if id(record) not in seen:
                seen.add(id(record))
                yield record


def test_the_end_a_store_remembers_counts_the_commit_marker_so_a_quiet_restart_reads_nothing() -> None:
    """Kafka's end after a commit is the last record + 2: remembering + 1 made every restore
    after a kept renewal read runs.renewals (a fetch round each), as if someone had written."""
    h = Harness()
    h.log = _KafkaLikeLog()
    h.processor = h.new_processor(MemoryStore())
    h.store = h.processor._store  # type: ignore[assignment]
    h.processor.handle([h.topic.record(submit_command("acme", "k2", command_id="s-2"))])
    run_id = next(key.removeprefix("run/") for key, _ in h.store.scan("run/"))
    h.processor.handle([h.topic.record(claim_cmd(run_id, command_id="c-2", lease_seconds=LEASE_S))])
    lease = h.processor.load(run_id).lease  # type: ignore[union-attr]
    assert lease is not None
    for sequence in (1, 2):
        h.clock.advance(1_000)
        renew = renew_cmd(run_id, lease.attempt_id, lease.epoch, sequence, command_id=f"q-{sequence}")
        h.processor.handle([h.topic.record(renew)])
    partition = partition_of(run_id)
    end = h.log.end_offset(RUNS_RENEWALS.name, partition)
    assert end == 2 and h.store.get(f"checkpoint/{RUNS_RENEWALS.name}@end/{partition}") == b"2"
    report = report_cmd(run_id, lease.attempt_id, lease.epoch, 3, command_id="rep-2")
    h.processor.handle([h.topic.record(report)])  # the kept renewal goes on runs.events: none live
    assert h.store.get(checkpoint_key(partition, RUNS_RENEWALS.name)) == str(NONE_LIVE).encode()
    read = _topics_read(h.log)
    h.processor = h.new_processor(h.store)  # type: ignore[arg-type]
    h.processor.restore(partition)
    assert RUNS_RENEWALS.name not in read, "nobody wrote runs.renewals since: it is not read"
    assert h.processor.load(run_id) is not None
