"""A state changelog written less often than every unit (issue 11: one partition fewer per
transaction; services/common/aggregate/changelog_lag.py; DUR-1).

What must hold whatever happens: a restore into an empty store that takes the changelog ends
with exactly the states the fold of runs.events gives. Units defer their states until a flush,
which writes every state changed since with the checkpoint of the first deferred unit. A
restart, and a crash between a deferring unit's transaction and its store write, must not
lose track of what the changelog lacks.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.aggregate.changelog import CHECKPOINT_KEY, COMPLETE_KEY
from services.common.clock import ManualClock
from services.common.eventlog import MemoryEventLog
from services.common.ids import run_id_for
from services.common.store import MemoryStore
from services.common.topics import RUNS_STATES
from services.lease_coordinator.processor import RunCommandProcessor
from tests.contract.test_aggregate_contract import KillableLog, KillableStore, Killed
from tests.support.lease_run import claim_cmd

from .strategies import submit_command
from .test_run_processor import CODEC, CommandTopic, assert_state_is_fold_of_log_dur_1
from .test_state_changelog import PARTITIONS, changelog, restored, taken_from_changelog

EVERY_MS = 1_000
T0 = 1_767_225_600_000


def lagging(log: MemoryEventLog, store: MemoryStore, clock: ManualClock) -> RunCommandProcessor:
    processor = RunCommandProcessor(log, store, CODEC, clock, changelog_every_ms=EVERY_MS)
    processor.restore_partitions(set(range(PARTITIONS)))
    return processor


def states(store: MemoryStore) -> dict[str, bytes]:
    return dict(store.scan("run/"))


def assert_the_changelog_restores_the_fold(log: MemoryEventLog) -> None:
    """An empty store from the changelog equals an empty store from the events alone."""
    _, from_changelog = restored(log)
    _, by_fold = restored(log.without(RUNS_STATES.name))
    assert states(from_changelog) == states(by_fold)
    assert_state_is_fold_of_log_dur_1(log, from_changelog)


def test_deferred_units_write_no_states_until_a_flush_writes_all_since_with_the_older_checkpoint() -> None:
    log, store, clock, topic = MemoryEventLog(PARTITIONS), MemoryStore(), ManualClock(T0), CommandTopic()
    processor = lagging(log, store, clock)
    run_id = run_id_for("acme", "k1")
    processor.handle([topic.record(submit_command("acme", "k1", command_id="s-1"))])
    processor.handle([topic.record(submit_command("acme", "k2", command_id="s-2"))])
    assert not list(changelog(log)), "deferred: no changelog record in either transaction"
    clock.advance(EVERY_MS)
    processor.handle([topic.record(claim_cmd(run_id, command_id="c-1"))])
    records = list(changelog(log))
    written = {r.key.decode() for r in records if r.key not in (CHECKPOINT_KEY, COMPLETE_KEY) and r.key}
    assert written == {run_id, run_id_for("acme", "k2")}, "both runs of the partition: k2 changed before"
    assert [int(r.value) for r in records if r.key == CHECKPOINT_KEY] == [0], "the first deferred unit's"
    assert any(r.key == COMPLETE_KEY for r in records)
    reader, fresh = restored(log)
    assert taken_from_changelog(reader) == 2, "both states from the changelog"
    assert states(fresh) == states(store)
    assert_the_changelog_restores_the_fold(log)


def test_a_restart_while_lagging_still_flushes_what_changed_before_it_dur_1() -> None:
    log, store, clock, topic = MemoryEventLog(PARTITIONS), MemoryStore(), ManualClock(T0), CommandTopic()
    first = lagging(log, store, clock)
    first.handle([topic.record(submit_command("acme", "k1", command_id="s-1"))])
    clock.advance(EVERY_MS)
    first.handle([topic.record(submit_command("acme", "k2", command_id="s-2"))])  # the flush
    first.handle([topic.record(submit_command("acme", "k3", command_id="s-3"))])  # deferred again
    again = lagging(log, store, clock)  # a restart: what k3 changed is known only to the store
    for n in (4, 5):  # a flush, then another whose checkpoint is past k3's event
        clock.advance(EVERY_MS)
        again.handle([topic.record(submit_command("acme", f"k{n}", command_id=f"s-{n}"))])
    assert_the_changelog_restores_the_fold(log)
    _, fresh = restored(log)
    assert run_id_for("acme", "k3") in {k.removeprefix("run/") for k in states(fresh)}


def test_a_crash_between_a_deferring_commit_and_its_store_write_is_not_forgotten_dur_1() -> None:
    store, clock, topic = KillableStore(), ManualClock(T0), CommandTopic()
    log = KillableLog(store)
    first = lagging(log, store, clock)
    first.handle([topic.record(submit_command("acme", "k1", command_id="s-1"))])
    clock.advance(EVERY_MS)
    first.handle([topic.record(submit_command("acme", "k2", command_id="s-2"))])  # the flush
    log.kill_after_next_commit = True
    try:
        first.handle([topic.record(submit_command("acme", "k3", command_id="s-3"))])
    except Killed:
        pass
    else:
        raise AssertionError("the store write was to be cut")
    again = lagging(log, store, clock)  # folds k3's committed event; its `since` was never stored
    for n in (4, 5, 6):  # deferred or flushed, then flushes whose checkpoints are past k3's event
        clock.advance(EVERY_MS)
        again.handle([topic.record(submit_command("acme", f"k{n}", command_id=f"s-{n}"))])
    assert_the_changelog_restores_the_fold(log)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.integers(0, 5),  # which run
            st.booleans(),  # claim (else submit)
            st.sampled_from([0, 0, 400, EVERY_MS]),  # time passing before it
            st.sampled_from(["on", "on", "on", "restart", "crash"]),  # what happens to the process
        ),
        min_size=1,
        max_size=14,
    )
)
def test_any_stream_of_commands_restarts_and_crashes_restores_from_the_changelog_to_the_fold(
    steps: list[tuple[int, bool, int, str]],
) -> None:
    store, clock, topic = KillableStore(), ManualClock(T0), CommandTopic()
    log = KillableLog(store)
    processor = lagging(log, store, clock)
    for n, (slot, claim, later, fate) in enumerate(steps):
        clock.advance(later)
        run_id = run_id_for("acme", f"k{slot}")
        command = (
            claim_cmd(run_id, command_id=f"c-{n}")
            if claim
            else submit_command("acme", f"k{slot}", command_id=f"s-{n}")
        )
        log.kill_after_next_commit = fate == "crash"
        try:
            processor.handle([topic.record(command)])
        except Killed:
            processor = lagging(log, store, clock)
            continue
        # Nothing to commit, or nothing to store after it: the kill did not come.
        log.kill_after_next_commit = store.kill_on_next_write = False
        if fate == "restart":
            processor = lagging(log, store, clock)
    assert_the_changelog_restores_the_fold(log)
