"""EXE-13 state ownership: the platform's log owns Run, Attempt, reservations and their outbox;
one writer per system of record; finalising an attempt is one atomic decision.

What the spec asks and where it is proven:

* Run, Attempt, reservations and their outbox belong to the platform's store, here the event
  log and the processors' state. Only the lease coordinator writes runs.events and
  runs.rejections, only the saga orchestrator writes trajectories.events and its rejections,
  and only those two build a transactional event log; every other process (API, gateway,
  projector, CLI) can only publish *commands* or read
  (`test_only_the_owning_processors_write_the_systems_of_record_EXE_13`).
* Each run's state has exactly one owner at a time: its commands, its events and its
  trajectory's commands all go to the one partition fixed by the run id, so the processor that
  owns that partition is the single writer of that run
  (`test_a_run_and_everything_about_it_live_on_one_partition_EXE_13`; that the processor writes
  a run's events to its command's partition is
  tests/unit/test_run_processor.py::test_events_go_to_the_partition_of_their_command).
* No second source of truth: the coordinator's own RocksDB state is nothing but the fold of the
  log, and the read models are rebuilt from it: tests/integration/test_processor_crash_safety.py::
  test_sigkill_of_processor_and_projector_loses_and_duplicates_nothing_DUR_1 asserts
  `stored[run_id] == fold(run_events)` for every run after four SIGKILLs, and
  `rebuilt.all_views() == live_views`. The execution side (the runner SDK) keeps only its lease
  (attempt id, epoch) and its journal; the attempt id names its run, so no attemptId -> run table
  exists anywhere to drift (`test_a_run_and_everything_about_it_live_on_one_partition_EXE_13`).
* Finalising Attempt and Run and releasing the active slot (and the outbox: the events
  themselves) are atomic: `test_finalising_attempt_run_and_slot_is_one_decision_in_one_commit_EXE_13`.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import pytest

from services.common.clock import ManualClock
from services.common.contracts import AbortTrajectory, AttemptReported, RunFailed
from services.common.eventlog import MemoryEventLog
from services.common.kafka import OutboundRecord
from services.common.messages import MessageCodec
from services.common.routing import command_record, partition_for_run, trajectory_command_record
from services.common.store import MemoryStore
from services.common.topics import RUNS_COMMANDS, RUNS_EVENTS
from services.lease_coordinator.domain import (
    LeaseCertainty,
    RunStatus,
    TenantLoad,
    attempt_id_for,
    fold,
    reservations,
    run_id_of_attempt,
)
from services.lease_coordinator.processor import RunCommandProcessor
from services.lease_coordinator.state_codec import decode_state
from tests.support.lease_run import claim_cmd, renew_cmd, report_cmd

from .strategies import submit_command
from .test_run_processor import CommandTopic, logged_events

SERVICES = Path(__file__).resolve().parents[2] / "services"
CODEC = MessageCodec()

# Each system of record and the one service package allowed to write it.
OWNERS = {
    "RUNS_EVENTS": "lease_coordinator",
    "RUNS_REJECTIONS": "lease_coordinator",
    "RUNS_STATES": "lease_coordinator",
    "TRAJECTORIES_EVENTS": "saga_orchestrator",
    "TRAJECTORIES_REJECTIONS": "saga_orchestrator",
    "WATCHDOG_EVENTS": "watchdog",
    "WATCHDOG_REJECTIONS": "watchdog",
    "BREAKERS_EVENTS": "breakers",
    "BREAKERS_REJECTIONS": "breakers",
    "QUARANTINE_EVENTS": "quarantine",
    "QUARANTINE_REJECTIONS": "quarantine",
    "SCHEDULES_EVENTS": "schedules",
    "SCHEDULES_REJECTIONS": "schedules",
}
TRANSACTIONAL_WRITERS = {"KafkaEventLog", "TransactionalWriter"}
# The one launcher of an aggregate's process (services/common/process.py) builds its log.
PROCESS_LAUNCHER = "serve_aggregate"
# The attributes by which an aggregate definition names the topics the runtime writes for it.
DEFINITION_TOPICS = {"events_topic", "rejections_topic", "deadletter_topic", "changelog_topic"}


def _called(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _topic_argument(node: ast.Call) -> ast.expr | None:
    if node.args:
        return node.args[0]
    return next((k.value for k in node.keywords if k.arg == "topic"), None)


def _writes() -> tuple[dict[str, set[str]], dict[str, set[str]], list[str]]:
    """(topic constant -> packages writing it, writer class -> packages building it, calls whose
    topic is not a constant), over every module of services/."""
    writes: dict[str, set[str]] = defaultdict(set)
    builders: dict[str, set[str]] = defaultdict(set)
    opaque: list[str] = []
    for path in sorted(SERVICES.rglob("*.py")):
        package = path.relative_to(SERVICES).parts[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            # An aggregate definition names the topics the one runtime (services/common/aggregate)
            # writes for it: `events_topic = RUNS_EVENTS.name` is that package's write.
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id in DEFINITION_TOPICS for t in node.targets
            ):
                for constant in {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}:
                    if constant.isupper():
                        writes[constant].add(package)
            if not isinstance(node, ast.Call):
                continue
            called = _called(node)
            if called in TRANSACTIONAL_WRITERS or called == PROCESS_LAUNCHER:
                builders[called].add(package)
            if called not in ("outbound", "OutboundRecord"):
                continue
            topic = _topic_argument(node)
            names = {n.id for n in ast.walk(topic) if isinstance(n, ast.Name)} if topic is not None else set()
            constants = {n for n in names if n.isupper()}
            for constant in constants:
                writes[constant].add(package)
            if not constants:
                opaque.append(f"{path.relative_to(SERVICES)}:{node.lineno}")
    return writes, builders, opaque


def test_only_the_owning_processors_write_the_systems_of_record_EXE_13() -> None:
    writes, builders, opaque = _writes()
    assert writes["RUNS_EVENTS"], "the scan must see the coordinator's own writes"
    for topic, owner in OWNERS.items():
        assert writes[topic] <= {owner}, f"{topic} is written outside {owner}: {sorted(writes[topic])}"
    # Everyone else publishes commands, through the one routing helper.
    assert writes["RUNS_COMMANDS"] == {"common"} and writes["TRAJECTORIES_COMMANDS"] == {"common"}
    assert writes["PROGRESS_OBSERVATIONS"] == {"common"}
    assert writes["BREAKERS_COMMANDS"] == {"common"}
    assert writes["SCHEDULES_COMMANDS"] == {"common"}
    # Only the processors hold a transactional log: the one launcher builds it for them (and the
    # adapter builds the writer for it), and only the processors call the launcher.
    processors = {"lease_coordinator", "saga_orchestrator", "watchdog", "breakers", "quarantine", "schedules"}
    assert builders[PROCESS_LAUNCHER] == processors, builders
    assert builders["KafkaEventLog"] == {"common"}, builders
    assert builders["TransactionalWriter"] == {"common"}, builders
    # A write whose topic is a variable is library code handed its topic by an owner.
    assert all(call.startswith("common/") for call in opaque), opaque


def test_a_run_and_everything_about_it_live_on_one_partition_EXE_13() -> None:
    for tenant in ("acme", "globex", "initech", "umbrella"):
        runs = [submit_command(tenant, f"k-{i}", command_id=f"s-{tenant}-{i}").run_id for i in range(5)]
        partitions = {partition_for_run(run_id) for run_id in runs}
        assert len(partitions) == 1, "all runs of a tenant have one owner, so admission is atomic too"
        for run_id in runs:
            attempt = attempt_id_for(run_id, 1)
            assert run_id_of_attempt(attempt) == run_id, "the attempt id names its run: no lookup table"
            for command in (
                claim_cmd(run_id),
                renew_cmd(run_id, attempt, 1, 1),
                report_cmd(run_id, attempt, 1, 2),
            ):
                record = command_record(CODEC, command)
                assert (record.topic, record.partition) == (RUNS_COMMANDS.name, partition_for_run(run_id))
    abort = AbortTrajectory(
        command_id="a-1",
        run_id=runs[0],
        issued_at=0,
        correlation_id="c",
        actor="runner",
        attempt_id=attempt_id_for(runs[0], 1),
        lease_epoch=1,
        reason="why",
    )
    assert trajectory_command_record(CODEC, abort).partition == partition_for_run(runs[0])


class RecordingLog(MemoryEventLog):
    """The in-memory log, remembering which records went out in which commit (transaction)."""

    def __init__(self) -> None:
        super().__init__()
        self.commits: list[list[OutboundRecord]] = []

    def commit(self, records: Sequence[OutboundRecord]) -> dict[tuple[str, int], int]:
        fails = self.fail_next_commit
        written = super().commit(records)
        if not fails:
            self.commits.append(list(records))
        return written


def test_finalising_attempt_run_and_slot_is_one_decision_in_one_commit_EXE_13() -> None:
    log, store, topic = RecordingLog(), MemoryStore(), CommandTopic()
    processor = RunCommandProcessor(log, store, CODEC, ManualClock())
    submit = submit_command("acme", "final", command_id="s-final", max_attempts=1)
    run_id = submit.run_id
    processor.handle([topic.record(submit), topic.record(claim_cmd(run_id, command_id="c-final"))])
    held = decode_state(dict(store.scan("run/"))[f"run/{run_id}"])
    assert held.status is RunStatus.PREPARING and reservations(held) == TenantLoad(0, 1)

    # The last attempt fails in preparation: the attempt ends, the run ends, the slot is freed.
    report = topic.record(report_cmd(run_id, attempt_id_for(run_id, 1), 1, 1, "preparation_failed"))
    log.fail_next_commit = True
    with pytest.raises(ConnectionError):
        processor.handle([report])
    still = decode_state(dict(store.scan("run/"))[f"run/{run_id}"])
    assert still == held, "a failed commit leaves the attempt, the run and the slot as they were"

    commits_before = len(log.commits)
    processor.handle([report])  # redelivered
    [commit] = log.commits[commits_before:]
    events = [CODEC.decode(r.value) for r in commit if r.topic == RUNS_EVENTS.name]
    assert [type(e) for e in events] == [AttemptReported, RunFailed], "both in ONE transaction"
    final = decode_state(dict(store.scan("run/"))[f"run/{run_id}"])
    assert final.status is RunStatus.FAILED
    assert final.lease is not None and final.lease.certainty is LeaseCertainty.RELEASED
    assert reservations(final) == TenantLoad(0, 0), "the active slot is released with the run's end"
    assert final == fold(logged_events(log)[run_id]), "the state is the log's fold, nothing more"
