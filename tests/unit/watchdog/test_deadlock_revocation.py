"""WD-5 level 3 before the pivot: after the unwind, the run's lease is revoked, once.

ERR_SEMANTIC_DEADLOCK revokes the lease and the run's capabilities (an epoch bump). Before the
pivot the saga first unwinds its compensators LIFO under the current epoch (a revocation first
would fence its own compensators out), and only the ROLLED_BACK trajectory then owes a RevokeLease,
through the same work and executor path as a frozen trajectory's incident (REC-7). Its
RecordLeaseRevocation carries the intervention id in `incident_id`; a redelivery changes nothing,
and the owed revocation survives a restore (the codec, the active index, a rebuild from the log).
"""

from __future__ import annotations

import json
from typing import Any

from services.common.clock import ManualClock
from services.common.contracts import (
    AbortTrajectory,
    LeaseRevocationRecorded,
    ProposeStep,
    RecordLeaseRevocation,
    RecordWatchdogIntervention,
    ResolveIncident,
    StartTrajectory,
)
from services.common.eventlog import MemoryEventLog
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec
from services.common.routing import partition_for_run, trajectory_command_record
from services.common.store import MemoryStore
from services.common.topics import TRAJECTORIES_COMMANDS, TRAJECTORIES_EVENTS
from services.saga_orchestrator.domain import (
    RevokeLease,
    RunCompensator,
    TrajectoryState,
    TrajectoryStatus,
    fold,
    pending_work,
)
from services.saga_orchestrator.processor import TrajectoryProcessor
from services.saga_orchestrator.state_codec import decode_state, encode_state
from tests.support.trajectory_saga import CATALOG, DEPLOY, PARAMS, T0, Saga, names
from tests.unit.watchdog.test_trajectory_interventions import intervene

T = TrajectoryStatus
CODEC = MessageCodec()


def _restored_equals_rebuilt(saga: Saga) -> None:
    """What the store holds (the codec) and what a replay of the log folds are the same state."""
    assert decode_state(encode_state(saga.s)) == saga.s
    assert fold(saga.events) == saga.s


def _revoke(saga: Saga, work: RevokeLease, command_id: str = "exec-revoke") -> Any:
    """The executor's report, as services/saga_orchestrator/executor.py `_revoke` builds it."""
    return saga.send(
        saga.command(
            RecordLeaseRevocation,
            command_id=command_id,
            incident_id=work.incident_id,
            revoked_epoch=work.epoch,
        )
    )


def test_level_3_before_the_pivot_revokes_the_lease_once_after_the_unwind_wd_5() -> None:
    saga = Saga()
    saga.start()
    for tool in DEPLOY[:3]:
        saga.step(tool)
    intervene(saga, 3, "sandbox.compile")
    assert saga.status() is T.UNWINDING and saga.s.deadlock_intervention == "itv_3_1"
    # The compensators run under the current epoch: nothing is revoked while the saga unwinds.
    while saga.status() is T.UNWINDING:
        work = saga.work()
        assert isinstance(work, RunCompensator) and work.epoch == saga.epoch
        _restored_equals_rebuilt(saga)
        saga.compensate()
    assert saga.status() is T.ROLLED_BACK and saga.s.semantic_deadlock
    revoke = saga.work()
    assert isinstance(revoke, RevokeLease)
    assert (revoke.incident_id, revoke.epoch, revoke.key) == ("itv_3_1", 1, "revoke/itv_3_1")
    assert "ERR_SEMANTIC_DEADLOCK" in revoke.reason and "itv_3_1" in revoke.reason
    assert pending_work(saga.s) == revoke, "the same work every time it is asked (after a crash too)"
    _restored_equals_rebuilt(saga)

    events = _revoke(saga, revoke)
    assert names(events) == ["LeaseRevocationRecorded"]
    assert events[0].incident_id == "itv_3_1" and events[0].revoked_epoch == 1
    assert saga.status() is T.ROLLED_BACK and saga.s.deadlock_revoked_epoch == 1
    assert saga.work() is None
    _restored_equals_rebuilt(saga)

    after = saga.s
    assert _revoke(saga, revoke) == (), "a redelivered report (same command id) changes nothing"
    assert _revoke(saga, revoke, "exec-revoke-again") == (), "a repeated report changes nothing"
    assert saga.s == after and saga.work() is None


def test_level_3_with_nothing_committed_owes_the_revocation_at_once_wd_5() -> None:
    saga = Saga()
    saga.start()
    intervene(saga, 3)
    assert saga.status() is T.ROLLED_BACK
    revoke = saga.work()
    assert isinstance(revoke, RevokeLease) and revoke.incident_id == "itv_3_1"
    assert names(_revoke(saga, revoke)) == ["LeaseRevocationRecorded"] and saga.work() is None


def test_a_rolled_back_trajectory_accepts_only_its_deadlock_revocation_wd_5() -> None:
    """decide() refuses every command of an ended trajectory (TRAJECTORY_ENDED) but this one."""
    saga = Saga()
    saga.start()
    saga.step("vm.provision")
    intervene(saga, 3)
    saga.compensate()
    assert saga.status() is T.ROLLED_BACK
    other = saga.refused(RecordLeaseRevocation, incident_id="itv_other", revoked_epoch=1)
    assert other.code == "TRAJECTORY_ENDED"
    proposal = saga.refused(ProposeStep, tool="ip.reserve", params=json.dumps(PARAMS["ip.reserve"]))
    assert proposal.code == "TRAJECTORY_ENDED"
    assert intervene(saga, 3, n=2).code == "TRAJECTORY_ENDED"
    assert isinstance(saga.work(), RevokeLease)


def test_a_rollback_without_a_deadlock_revokes_nothing_wd_5() -> None:
    saga = Saga()
    saga.start()
    saga.step("vm.provision")
    saga.ok(AbortTrajectory, reason="changed my mind")
    saga.compensate()
    assert saga.status() is T.ROLLED_BACK and saga.work() is None
    refused = saga.refused(RecordLeaseRevocation, incident_id="itv_3_1", revoked_epoch=1)
    assert refused.code == "TRAJECTORY_ENDED"


def _deadlock_then_corrupted_compensator(saga: Saga) -> str:
    saga.start()
    saga.step("vm.provision")
    intervene(saga, 3)
    saga.compensate("fatal", error_kind="corrupted", error_message="the disk is gone")
    assert saga.status() is T.FROZEN and saga.s.incident is not None
    return saga.s.incident.incident_id


def test_an_unwind_frozen_and_its_lease_revoked_is_not_revoked_twice_wd_5_rec_7() -> None:
    """A compensator that fails for good freezes the unwind (REC-7), whose incident revokes the
    lease; an operator's compensated-manually then ends it ROLLED_BACK, owing nothing more."""
    saga = Saga()
    incident = _deadlock_then_corrupted_compensator(saga)
    work = saga.work()
    assert isinstance(work, RevokeLease) and work.incident_id == incident
    _revoke(saga, work)
    saga.ok(ResolveIncident, incident_id=incident, resolution="compensated-manually")
    assert saga.status() is T.ROLLED_BACK and saga.s.semantic_deadlock and saga.work() is None


def test_an_unwind_resolved_before_its_incident_revoked_the_lease_still_revokes_it_wd_5() -> None:
    saga = Saga()
    incident = _deadlock_then_corrupted_compensator(saga)
    saga.ok(ResolveIncident, incident_id=incident, resolution="compensated-manually")
    assert saga.status() is T.ROLLED_BACK
    work = saga.work()
    assert isinstance(work, RevokeLease) and work.incident_id == "itv_3_1"
    assert names(_revoke(saga, work)) == ["LeaseRevocationRecorded"] and saga.work() is None
    _restored_equals_rebuilt(saga)


def test_a_resumed_deadlock_forgets_its_intervention_wd_5() -> None:
    """An operator who resumes a frozen deadlock has judged the run (evolve `_resolved`)."""
    saga = Saga()
    saga.deploy_until_pivot()
    saga.commit()
    intervene(saga, 3, "cache.warm")
    assert saga.status() is T.FROZEN and saga.s.deadlock_intervention == "itv_3_1"
    incident = saga.s.incident
    assert incident is not None
    work = saga.work()
    assert isinstance(work, RevokeLease) and work.incident_id == incident.incident_id  # REC-7 path
    _revoke(saga, work)
    saga.ok(ResolveIncident, incident_id=incident.incident_id, resolution="resume", lease_epoch=2)
    assert not saga.s.semantic_deadlock and saga.s.deadlock_intervention == ""


def test_a_state_stored_before_the_revocation_fields_existed_decodes_to_their_defaults() -> None:
    saga = Saga()
    saga.start()
    stored = json.loads(encode_state(saga.s))
    for name in ("deadlock_intervention", "deadlock_revoked_epoch"):
        del stored[name]
    assert decode_state(json.dumps(stored).encode()) == saga.s


# --- the processor: the owed revocation survives a restore ---------------------------------------


def _handle(processor: TrajectoryProcessor, command: Any, offset: int) -> None:
    out = trajectory_command_record(CODEC, command)
    assert out.partition is not None
    record = InboundRecord(TRAJECTORIES_COMMANDS.name, out.partition, offset, out.key, out.value, out.headers)
    processor.handle([record])


def _live(processor: TrajectoryProcessor) -> list[TrajectoryState]:
    return processor.active_states(set(range(4)))


def test_the_owed_revocation_is_handed_to_the_executor_after_a_restore_wd_5() -> None:
    """The rolled-back, deadlocked trajectory stays in the active index (what a restore and a
    rescan hand the executor) until its revocation is recorded; a new incarnation rebuilding
    from the log finds the same work."""
    log, saga = MemoryEventLog(4), Saga()
    processor = TrajectoryProcessor(log, MemoryStore(), CODEC, ManualClock(T0), CATALOG)
    processor.restore_partitions(set(range(4)))
    commands = [
        saga.command(StartTrajectory),
        saga.command(
            RecordWatchdogIntervention,
            command_id="wd-3",
            intervention_id="itv_3",
            level=3,
            code="ERR_SEMANTIC_DEADLOCK",
            action_hash="",
            period=2,
            checkpoint_step=-1,
            detector="cycle",
            detail="period-2 orbit",
            message="ERR_SEMANTIC_DEADLOCK",
        ),
    ]
    for offset, command in enumerate(commands):
        _handle(processor, command, offset)
    [state] = _live(processor)
    assert state.status is T.ROLLED_BACK
    revoke = pending_work(state)
    assert isinstance(revoke, RevokeLease) and revoke.incident_id == "itv_3"

    rebuilt = TrajectoryProcessor(log, MemoryStore(), CODEC, ManualClock(T0), CATALOG)
    rebuilt.restore_partitions(set(range(4)))
    assert _live(rebuilt) == [state], "restore equals rebuild"

    report = saga.command(
        RecordLeaseRevocation, command_id="exec-revoke", incident_id="itv_3", revoked_epoch=revoke.epoch
    )
    _handle(processor, report, len(commands))
    assert _live(processor) == []
    ended = processor.load(saga.run_id)
    assert ended is not None and ended.deadlock_revoked_epoch == revoke.epoch
    assert pending_work(ended) is None
    _handle(processor, report, len(commands) + 1)  # redelivered
    assert processor.load(saga.run_id) == ended
    partition = partition_for_run(saga.run_id)
    events = [CODEC.decode(r.value) for r in log.topics[(TRAJECTORIES_EVENTS.name, partition)]]
    assert sum(isinstance(e, LeaseRevocationRecorded) for e in events) == 1
