"""The trajectory's side of the watchdog's ladder (WD-5), and the saga's observations (WD-1).

RecordWatchdogIntervention level 1 refuses the runner's next proposal of the named action
(STATE_OSCILLATION_DETECTED) until it proposes something else; level 2 tombstones the action for
the run (ACTION_TOMBSTONED); level 3 (ERR_SEMANTIC_DEADLOCK) unwinds the compensators LIFO before
the pivot (after an in-flight step settles), freezes with an incident and a lease revocation
after it (REC-7). The saga emits one ObserveStep per dispatched step's outcome in the same
transaction, and the watchdog's interventions reach the trajectory in its transaction.
"""

from __future__ import annotations

import json
from typing import Any

from services.common.clock import ManualClock
from services.common.contracts import (
    InterventionIssued,
    ObserveStep,
    ProposeStep,
    RecordStepOutcome,
    RecordWatchdogIntervention,
    RecoveryDecided,
    StartTrajectory,
    TrajectoryFrozen,
    TrajectoryRolledBack,
    WatchdogInterventionRecorded,
)
from services.common.eventlog import MemoryEventLog
from services.common.ids import action_hash
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec
from services.common.routing import observation_record, partition_for_run, trajectory_command_record
from services.common.store import MemoryStore
from services.common.topics import PROGRESS_OBSERVATIONS, TRAJECTORIES_COMMANDS, WATCHDOG_EVENTS
from services.saga_orchestrator.domain import RevokeLease, TrajectoryStatus
from services.saga_orchestrator.processor import TrajectoryProcessor, step_observation
from services.saga_orchestrator.state_codec import decode_state, encode_state
from services.watchdog.processor import WatchdogProcessor
from tests.support.trajectory_saga import CATALOG, DEPLOY, PARAMS, Saga, names, of_type
from tests.unit.watchdog.support import T0, observe

T = TrajectoryStatus
CODEC = MessageCodec()


def intervene(
    saga: Saga, level: int, tool: str = "vm.provision", params: dict[str, Any] | None = None, n: int = 1
):
    hashed = action_hash(tool, PARAMS[tool] if params is None else params)
    code = {1: "STATE_OSCILLATION_DETECTED", 2: "ROLLBACK_REQUESTED", 3: "ERR_SEMANTIC_DEADLOCK"}[level]
    return saga.send(
        saga.command(
            RecordWatchdogIntervention,
            command_id=f"wd-{level}-{n}",
            intervention_id=f"itv_{level}_{n}",
            level=level,
            code=code,
            action_hash=hashed,
            period=2,
            checkpoint_step=-1,
            detector="cycle",
            detail="period-2 orbit",
            message=f"[SYSTEM ALERT: SEMANTIC_WATCHDOG_INTERRUPT] {code} (k=2)",
        )
    )


def test_level_1_refuses_the_named_action_once_until_another_is_proposed_wd_5() -> None:
    saga = Saga()
    saga.start()
    saga.step("vm.provision")
    [recorded] = intervene(saga, 1)
    assert isinstance(recorded, WatchdogInterventionRecorded)
    assert saga.s.interrupt_action == action_hash("vm.provision", PARAMS["vm.provision"])
    assert json.loads(saga.s.watchdog_intervention)["code"] == "STATE_OSCILLATION_DETECTED"
    refused = saga.refused(ProposeStep, tool="vm.provision", params=json.dumps(PARAMS["vm.provision"]))
    assert refused.code == "STATE_OSCILLATION_DETECTED" and "SEMANTIC_WATCHDOG_INTERRUPT" in refused.detail
    saga.step("ip.reserve")  # another action: accepted, and the interrupt has done its work
    assert saga.s.interrupt_action == ""
    saga.step("vm.provision")  # no longer refused
    assert intervene(saga, 1) == (), "a redelivered intervention changes nothing"


def _propose_refused(saga: Saga, tool: str, **fields: Any) -> str:
    return saga.refused(ProposeStep, tool=tool, params=json.dumps(PARAMS[tool]), **fields).code


def test_level_2_tombstones_the_action_for_the_run_wd_5() -> None:
    saga = Saga()
    saga.start()
    saga.step("vm.provision")
    intervene(saga, 2, "ip.reserve")
    assert saga.s.tombstones == (action_hash("ip.reserve", PARAMS["ip.reserve"]),)
    for _ in range(2):
        assert _propose_refused(saga, "ip.reserve") == "ACTION_TOMBSTONED"
        saga.step("cache.warm")
    # The same tool with other parameters is another action.
    saga.propose("ip.reserve", {"region": "us-east"})


def test_level_3_before_the_pivot_unwinds_the_compensators_lifo_wd_5() -> None:
    saga = Saga()
    saga.start()
    for tool in DEPLOY[:3]:
        saga.step(tool)
    events = intervene(saga, 3, "sandbox.compile")
    decided = of_type(events, RecoveryDecided)
    assert names(events) == ["WatchdogInterventionRecorded", "RecoveryDecided"]
    assert (decided[0].action, decided[0].gate) == ("BACKWARD_ROLLBACK", "semantic-watchdog")
    assert "ERR_SEMANTIC_DEADLOCK" in decided[0].reason and saga.status() is T.UNWINDING
    assert _propose_refused(saga, "cache.warm") == "TRAJECTORY_UNWINDING"  # nothing more is proposed
    order = []
    while saga.status() is T.UNWINDING:
        order.append(saga.compensator().step_index)
        saga.compensate()
    assert order == [2, 1, 0] and saga.status() is T.ROLLED_BACK


def test_level_3_waits_for_the_step_in_flight_then_unwinds_wd_5() -> None:
    saga = Saga()
    saga.start()
    saga.step("vm.provision")
    saga.propose("ip.reserve")  # in flight
    assert names(intervene(saga, 3)) == ["WatchdogInterventionRecorded"]
    assert saga.s.semantic_deadlock and saga.status() is T.FORWARD
    assert _propose_refused(saga, "cache.warm") == "ERR_SEMANTIC_DEADLOCK"
    events = saga.commit()
    assert names(events)[-2:] == ["StepCommitted", "RecoveryDecided"] and saga.status() is T.UNWINDING
    assert saga.compensator().step_index == 1  # the step that was in flight is undone first


def test_level_3_with_nothing_committed_rolls_back_at_once_wd_5() -> None:
    saga = Saga()
    saga.start()
    events = intervene(saga, 3)
    assert of_type(events, TrajectoryRolledBack) and saga.status() is T.ROLLED_BACK


def test_level_3_after_the_pivot_freezes_with_an_incident_and_revokes_the_lease_wd_5_rec_7() -> None:
    saga = Saga()
    saga.deploy_until_pivot()
    saga.commit()  # the pivot committed
    assert saga.status() is T.POST_PIVOT
    events = intervene(saga, 3, "cache.warm")
    [frozen] = of_type(events, TrajectoryFrozen)
    assert frozen.failure_mode == "POST_PIVOT_STALLED"
    assert json.loads(frozen.error_context)["kind"] == "ERR_SEMANTIC_DEADLOCK"
    assert saga.status() is T.FROZEN
    work = saga.work()
    assert isinstance(work, RevokeLease) and work.incident_id == frozen.incident_id


def test_the_trajectory_state_keeps_the_watchdog_fields_through_its_codec() -> None:
    saga = Saga()
    saga.start()
    saga.step("vm.provision")
    intervene(saga, 2, "ip.reserve")
    intervene(saga, 1, "cache.warm", n=2)
    assert decode_state(encode_state(saga.s)) == saga.s


# --- the processors: the saga's observations, the watchdog's interventions -----------------------


def _record(topic: str, out: Any, offset: int) -> InboundRecord:
    return InboundRecord(topic, out.partition, offset, out.key, out.value, out.headers)


def test_the_saga_observes_every_dispatched_step_in_the_outcomes_transaction_wd_1() -> None:
    saga = Saga()
    saga.start()
    saga.step("vm.provision")
    saga.propose("ip.reserve")
    saga.fail("unavailable", "upstream 503", 503)  # transient (REC-2): retried by the saga
    state = saga.s
    commit, failure = [e for e in saga.events if type(e).__name__ in ("StepCommitted", "StepFailed")]
    committed = step_observation(commit, state)
    failed = step_observation(failure, state)
    assert isinstance(committed, ObserveStep) and isinstance(failed, ObserveStep)
    assert (committed.source, committed.step_seq, committed.error_kind) == ("saga", commit.version, "none")
    assert committed.action_hash == action_hash("vm.provision", PARAMS["vm.provision"])
    assert (failed.error_kind, failed.tool, failed.step_seq) == ("transient", "ip.reserve", failure.version)
    assert step_observation(saga.events[0], state) is None  # only step outcomes are observations
    record = observation_record(CODEC, committed)
    assert (record.topic, record.partition) == (PROGRESS_OBSERVATIONS.name, partition_for_run(saga.run_id))


def test_the_trajectory_processor_commits_the_observation_with_the_outcome_wd_1() -> None:
    log, saga = MemoryEventLog(4), Saga()
    processor = TrajectoryProcessor(log, MemoryStore(), CODEC, ManualClock(T0), CATALOG)
    processor.restore_partitions(set(range(4)))
    commands = [saga.command(StartTrajectory)]
    commands.append(saga.command(ProposeStep, tool="vm.provision", params=json.dumps(PARAMS["vm.provision"])))
    commands.append(
        saga.command(
            RecordStepOutcome, step_index=0, dispatch=1, outcome="committed", output='{"vmId":"vm-1"}'
        )
    )
    for offset, command in enumerate(commands):
        processor.handle(
            [_record(TRAJECTORIES_COMMANDS.name, trajectory_command_record(CODEC, command), offset)]
        )
    partition = partition_for_run(saga.run_id)
    [observed] = [CODEC.decode(r.value) for r in log.topics[(PROGRESS_OBSERVATIONS.name, partition)]]
    assert isinstance(observed, ObserveStep) and observed.tool == "vm.provision" and observed.source == "saga"


def test_the_watchdogs_intervention_reaches_the_trajectory_in_its_transaction_wd_5() -> None:
    """A looping run's observations in, InterventionIssued out, and in the same commit the
    RecordWatchdogIntervention on the run's partition of trajectories.commands; fed to the saga it
    refuses the looping action. A restore sends nothing again."""
    log, store = MemoryEventLog(4), MemoryStore()
    saga = Saga()
    processor = WatchdogProcessor(log, store, CODEC, ManualClock(T0))
    processor.restore_partitions(set(range(4)))
    loop = [observe(1, "fs.read", {}, "A", run_id=saga.run_id, mutating=False)]
    loop += [
        observe(
            i,
            "vm.provision",
            PARAMS["vm.provision"] if i % 2 else {"name": "db"},
            "B" if i % 2 else "A",
            run_id=saga.run_id,
        )
        for i in range(2, 6)
    ]
    for offset, command in enumerate(loop):
        processor.handle([_record(PROGRESS_OBSERVATIONS.name, observation_record(CODEC, command), offset)])
    partition = partition_for_run(saga.run_id)
    events = [CODEC.decode(r.value) for r in log.topics[(WATCHDOG_EVENTS.name, partition)]]
    issued = [e for e in events if isinstance(e, InterventionIssued)]
    sent = [CODEC.decode(r.value) for r in log.topics[(TRAJECTORIES_COMMANDS.name, partition)]]
    assert [i.level for i in issued] == [1, 2] and [c.level for c in sent] == [1, 2]
    assert [c.intervention_id for c in sent] == [i.intervention_id for i in issued]
    # The saga takes them in: the revert of the orbit is tombstoned for the run.
    saga.start()
    for command in sent:
        saga.send(command)
    assert saga.s.tombstones == (issued[1].action_hash,)
    # A new incarnation on an empty disk restores from the log and sends nothing again.
    before = len(log.topics[(TRAJECTORIES_COMMANDS.name, partition)])
    WatchdogProcessor(log, MemoryStore(), CODEC, ManualClock(T0)).restore_partitions(set(range(4)))
    assert len(log.topics[(TRAJECTORIES_COMMANDS.name, partition)]) == before
