"""The Run's state changelog (issue 16: restore at the speed of the log; DUR-1).

A restore into an empty store takes each run's latest state from runs.states and folds only the
events after the checkpoint it names; a changelog it cannot trust (another state format, or not
known to hold every run: written only since an upgrade) is ignored, the events are folded, and
the changelog is written again. Every path ends in the store the fold of runs.events gives.
"""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.aggregate.changelog import (
    CHECKPOINT_KEY,
    COMPLETE_KEY,
    FORMAT_HEADER,
    keepalive_record,
    read_seed,
    reseed_records,
)
from services.common.clock import ManualClock
from services.common.eventlog import MemoryEventLog
from services.common.ids import run_id_for
from services.common.kafka import InboundRecord
from services.common.store import MemoryStore
from services.common.topics import RUNS_EVENTS, RUNS_STATES
from services.lease_coordinator.processor import RunCommandProcessor
from services.lease_coordinator.state_codec import STATE_FORMAT, decode_state, encode_state
from tests.support.lease_run import claim_cmd

from .strategies import submit_command
from .test_run_processor import CommandTopic, assert_state_is_fold_of_log_dur_1, new_processor

PARTITIONS = 4


def changelog(log: MemoryEventLog) -> Iterator[InboundRecord]:
    for (topic, _), records in sorted(log.topics.items()):
        if topic == RUNS_STATES.name:
            yield from records


def taken_from_changelog(processor: RunCommandProcessor) -> float:
    value = processor.metrics.registry.get_sample_value(
        "tenure_processor_changelog_states_total", {"aggregate": "run"}
    )
    return value or 0.0


def busy_log(runs: int = 12) -> tuple[MemoryEventLog, MemoryStore]:
    """Runs submitted in two batches, half of them then claimed: several versions per run."""
    log, store, topic = MemoryEventLog(PARTITIONS), MemoryStore(), CommandTopic()
    processor = new_processor(log, store, ManualClock(1_767_225_600_000))
    processor.restore_partitions(set(range(PARTITIONS)))
    slots = [("acme" if i % 2 else "globex", f"k{i}") for i in range(runs)]
    processor.handle([topic.record(submit_command(*s, command_id=f"s-{i}")) for i, s in enumerate(slots)])
    claims = [claim_cmd(run_id_for(*s), command_id=f"c-{i}") for i, s in enumerate(slots) if i % 2 == 0]
    processor.handle([topic.record(c) for c in claims])
    return log, store


def restored(log: MemoryEventLog) -> tuple[RunCommandProcessor, MemoryStore]:
    store = MemoryStore()
    processor = new_processor(log, store)
    processor.restore_partitions(set(range(PARTITIONS)))
    return processor, store


def test_each_transaction_writes_the_states_it_changed_with_the_checkpoint_before_it() -> None:
    log, store = busy_log()
    records = list(changelog(log))
    states = [r for r in records if r.key not in (CHECKPOINT_KEY, COMPLETE_KEY)]
    assert all(dict(r.headers)[FORMAT_HEADER] == STATE_FORMAT.encode() for r in records)
    # Every state on the changelog is one the store holds or held; the last of each is the store's.
    latest = {r.key.decode(): r.value for r in states if r.key is not None}
    assert {f"run/{k}": v for k, v in latest.items()} == dict(store.scan("run/"))
    assert [decode_state(v) for v in latest.values()] == [
        decode_state(store.get(f"run/{k}") or b"") for k in latest
    ]
    # The checkpoint of the second batch is where the first batch's events ended (+1: the next).
    for partition in range(PARTITIONS):
        checkpoints = [int(r.value) for r in records if r.key == CHECKPOINT_KEY and r.partition == partition]
        if checkpoints:
            assert checkpoints[0] == 0 and checkpoints == sorted(checkpoints)
            assert checkpoints[-1] < log.end_offset(RUNS_EVENTS.name, partition)


def test_a_restore_into_an_empty_store_takes_the_states_and_equals_the_fold_dur_1() -> None:
    log, store = busy_log()
    processor, fresh = restored(log)
    assert taken_from_changelog(processor) == 12
    assert dict(fresh.scan("")) == dict(store.scan(""))
    assert_state_is_fold_of_log_dur_1(log, fresh)


def test_a_changelog_written_only_since_an_upgrade_is_not_trusted_and_is_written_again() -> None:
    """Events from before the changelog existed: its states would miss the runs untouched since."""
    log, store = busy_log()
    # As if the first batch ran before the upgrade: its changelog records (its states, the
    # checkpoint 0 and the mark that the changelog is whole, in that order) never existed.
    upgraded = log.without(RUNS_STATES.name)
    for (topic, partition), records in log.topics.items():
        if topic == RUNS_STATES.name:
            first_end = next(i for i, r in enumerate(records) if r.key == COMPLETE_KEY)
            upgraded.topics[(topic, partition)] = records[first_end + 1 :]
    assert any(k[0] == RUNS_STATES.name and v for k, v in upgraded.topics.items()), "the second batch's"
    processor, fresh = restored(upgraded)
    assert taken_from_changelog(processor) == 0, "not whole: the events are folded"
    assert dict(fresh.scan("")) == dict(store.scan(""))
    again, fresh_again = restored(upgraded)
    assert taken_from_changelog(again) == 12, "the fold wrote it again, whole"
    assert dict(fresh_again.scan("")) == dict(store.scan(""))


def test_states_of_another_format_are_not_trusted_and_the_events_decide() -> None:
    log, store = busy_log()
    for (topic, partition), records in list(log.topics.items()):
        if topic == RUNS_STATES.name:
            # An older layout: the state bytes are wrong for today's decoder.
            log.topics[(topic, partition)] = [
                InboundRecord(r.topic, r.partition, r.offset, r.key, b"{}", ((FORMAT_HEADER, b"run/old"),))
                for r in records
            ]
    processor, fresh = restored(log)
    assert taken_from_changelog(processor) == 0
    assert dict(fresh.scan("")) == dict(store.scan(""))
    again, _ = restored(log)
    assert taken_from_changelog(again) == 12, "superseded records of the old format no longer count"


def test_a_crash_between_the_commit_and_the_store_write_restores_the_committed_states_dur_1() -> None:
    log, store = busy_log()
    topic = CommandTopic()
    processor = new_processor(log, store)
    processor.restore_partitions(set(range(PARTITIONS)))
    processor.handle([topic.record(submit_command("initech", "late", command_id="s-late"))])
    # The store of that processor is lost; a new machine restores from the changelog, then folds
    # the last transaction's events after its checkpoint: they are duplicates of its states.
    replacement, fresh = restored(log)
    assert taken_from_changelog(replacement) == 13
    assert dict(fresh.scan("")) == dict(store.scan(""))
    assert_state_is_fold_of_log_dur_1(log, fresh)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=12))
def test_any_command_stream_restores_from_the_changelog_to_the_fold(steps: list[tuple[int, bool]]) -> None:
    log, store, topic = MemoryEventLog(PARTITIONS), MemoryStore(), CommandTopic()
    processor = new_processor(log, store, ManualClock(1_767_225_600_000))
    processor.restore_partitions(set(range(PARTITIONS)))
    for n, (slot, claim) in enumerate(steps):
        run_id = run_id_for("acme", f"k{slot}")
        command = (
            claim_cmd(run_id, command_id=f"c-{n}")
            if claim
            else submit_command("acme", f"k{slot}", command_id=f"s-{n}")
        )
        processor.handle([topic.record(command)])
    from_changelog, fresh = restored(log)
    by_fold, folded = restored(log.without(RUNS_STATES.name))
    assert dict(fresh.scan("")) == dict(folded.scan("")) == dict(store.scan(""))
    assert taken_from_changelog(by_fold) == 0
    assert taken_from_changelog(from_changelog) == len(list(store.scan("run/")))


def test_the_state_format_names_the_codec_layout() -> None:
    assert STATE_FORMAT.startswith("run/") and len(STATE_FORMAT) == 20
    assert encode_state(decode_state(encode_state(_any_state()))) == encode_state(_any_state())


def _any_state() -> object:
    _, store = busy_log(2)
    return decode_state(next(raw for _, raw in store.scan("run/")))


def test_a_keepalive_mark_of_an_older_state_format_does_not_make_the_changelog_untrusted() -> None:
    """The keepalive mark is an offset of runs.renewals, not a state. A changelog written again
    after a state-format change (which rewrites states, checkpoint and the 'whole' mark, never the
    keepalive mark) must be trusted: before, its old mark kept it untrusted until the partition's
    next kept renewal, so every empty-store restore folded runs.events from 0 again."""
    topic = RUNS_STATES.name
    log = MemoryEventLog(PARTITIONS)
    log.commit([keepalive_record(topic, 0, 7, "an-older-format")])
    log.commit(reseed_records(topic, [("run_x", b"{}")], 0, 42, STATE_FORMAT))
    seed = read_seed(log, topic, 0, STATE_FORMAT)
    assert seed.usable and seed.checkpoint == 42 and seed.states == {"run_x": b"{}"}
    assert seed.keepalive_from == 7
