"""A committed saga step's output is an artifact of the tenant's provenance graph (QUA-2).

The pure parts: the envelope of a StepCommitted (deterministic id and command id, the content
hash of the output, producing run, attempt, step index), the tenant carried from StartTrajectory
v2 into the trajectory, the RegisterArtifact in the same transaction as the commit (the
processor's outputs on quarantine.commands, on the graph's partition), and the graph's taint
window over the registered step outputs: a quarantine from step k taints steps >= k only.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from services.common.contracts import StepCommitted
from services.common.contracts.quarantine import (
    ArtifactRegistered,
    RegisterArtifact,
    TaintPropagated,
    TaintRun,
    graph_id,
)
from services.common.topics import PROGRESS_OBSERVATIONS, QUARANTINE_COMMANDS, TRAJECTORIES_EVENTS
from services.quarantine.domain import Rejection, decide, evolve
from services.quarantine.domain.state import GraphState
from services.quarantine.routing import partition_for_aggregate
from services.saga_orchestrator.processor import ACTOR
from services.saga_orchestrator.step_artifacts import (
    MEDIA_TYPE,
    SOURCE,
    TEXT_MEDIA_TYPE,
    parse_step_location,
    step_artifact,
    step_artifact_id,
    step_location,
)

from .test_trajectory_processor import CODEC, Client, Harness, records


def _run(tenant: str | None, steps: int = 3) -> tuple[Harness, Client]:
    harness = Harness()
    client = Client(harness, "acme", key=f"art-{tenant}")
    harness.handle(client.start(tenant=tenant))
    for _ in range(steps):
        client.run_step("vm.provision")
    return harness, client


def _registrations(harness: Harness) -> list[RegisterArtifact]:
    found = [CODEC.decode(r.value) for r in records(harness.log, QUARANTINE_COMMANDS.name)]
    assert all(isinstance(c, RegisterArtifact) for c in found)
    return found


def test_the_tenant_of_start_trajectory_v2_is_the_trajectorys_QUA_2() -> None:
    _, client = _run("acme", steps=0)
    assert client.state().tenant == "acme"
    _, old = _run(None, steps=0)  # a writer before v2: no tenant, no graph
    assert old.state().tenant == ""


def test_every_committed_step_registers_its_output_in_the_same_transaction_QUA_2() -> None:
    harness, client = _run("acme")
    registered = _registrations(harness)
    assert [c.step for c in registered] == [0, 1, 2]
    state = client.state()
    for command, step in zip(registered, state.steps, strict=True):
        data = step.output.encode("utf-8")
        assert command.run_id == graph_id("acme") and command.producer_run_id == client.run_id
        assert command.content_hash == "sha256:" + hashlib.sha256(data).hexdigest()
        assert command.size_bytes == len(data) and command.media_type == MEDIA_TYPE
        assert command.source == SOURCE and command.attempt_id == "att-1" and command.derived_from == ()
        assert command.artifact_id == step_artifact_id(client.run_id, command.step, "att-1")
        assert parse_step_location(command.location) == (client.run_id, command.step)
    on_graph = {r.partition for r in records(harness.log, QUARANTINE_COMMANDS.name)}
    assert on_graph == {partition_for_aggregate(graph_id("acme"))}
    # The watchdog's observation is still there beside it (WD-1).
    assert len(records(harness.log, PROGRESS_OBSERVATIONS.name)) == 3


def test_a_trajectory_without_a_tenant_registers_nothing_QUA_2() -> None:
    harness, _ = _run(None)
    assert _registrations(harness) == []
    assert len(records(harness.log, PROGRESS_OBSERVATIONS.name)) == 3


def test_the_envelope_is_a_function_of_the_commit_so_a_re_decided_commit_is_the_same_QUA_2() -> None:
    harness, client = _run("acme", steps=1)
    committed = [
        e
        for e in (CODEC.decode(r.value) for r in records(harness.log, TRAJECTORIES_EVENTS.name))
        if isinstance(e, StepCommitted)
    ]
    once = step_artifact(committed[0], client.state(), ACTOR)
    again = step_artifact(committed[0], client.state(), ACTOR)
    assert once is not None and once == again
    assert _registrations(harness) == [once]
    # Another attempt or step is another artifact; the id never collides with an upload's shape.
    assert step_artifact_id(client.run_id, 0, "att-2") != once.artifact_id
    assert step_artifact_id(client.run_id, 1, "att-1") != once.artifact_id


def test_step_locations_and_media_types() -> None:
    assert parse_step_location(step_location("run_ab12", 7)) == ("run_ab12", 7)
    assert parse_step_location("tenants/acme/runs/run_ab12/out.txt") is None
    assert parse_step_location("trajectory:run_ab12/steps/x") is None
    event = StepCommitted(
        event_id="e",
        run_id="run_ab12",
        version=3,
        occurred_at=1,
        causation_id="c",
        correlation_id="run_ab12",
        actor="t",
        step_index=0,
        dispatch=1,
        output="not json",
        compensation="",
        reconciled=False,
        stack_depth=1,
    )
    _, client = _run("acme", steps=0)
    command = step_artifact(event, client.state(), "x")
    assert command is not None and command.media_type == TEXT_MEDIA_TYPE


def test_a_quarantine_from_step_k_taints_the_outputs_of_steps_k_and_later_only_QUA_2() -> None:
    harness, client = _run("acme")
    graph: GraphState | None = None
    now = 10_000
    for command in _registrations(harness):
        decided = decide(graph, command, now)
        assert not isinstance(decided, Rejection)
        for event in decided:
            assert isinstance(event, ArtifactRegistered) and event.status == "UNTAINTED"
            graph = evolve(graph, event)  # type: ignore[assignment]
        # The same registration again (a re-decided commit) records nothing.
        again = decide(graph, command, now + 1)
        assert again == () or isinstance(again, Rejection)
    assert graph is not None
    taint = TaintRun(
        command_id="cmd-taint",
        run_id=graph_id("acme"),
        issued_at=now,
        correlation_id=client.run_id,
        actor="q",
        tainted_run_id=client.run_id,
        since_step=1,
        since_at=0,
        quarantine_event_id="evt-q",
    )
    decided = decide(graph, taint, now + 2)
    assert not isinstance(decided, Rejection)
    (propagated,) = decided
    assert isinstance(propagated, TaintPropagated)
    ids = [step_artifact_id(client.run_id, i, "att-1") for i in range(3)]
    assert sorted(propagated.tainted) == sorted(ids[1:])
    graph = evolve(graph, propagated)  # type: ignore[assignment]
    assert isinstance(graph, GraphState)
    assert [graph.artifacts[i].status.value for i in ids] == ["UNTAINTED", "TAINTED", "TAINTED"]
    json.dumps([graph.artifacts[i].content_hash for i in ids])  # plain strings, renderable


def test_v1_goldens_decode_with_no_tenant_and_v2_goldens_with_one_QUA_2() -> None:
    golden = Path(__file__).resolve().parents[1] / "golden"
    for name in ("StartTrajectory", "TrajectoryStarted"):
        old = CODEC.decode((golden / f"{name}.v1.bin").read_bytes())
        new = CODEC.decode((golden / f"{name}.v2.bin").read_bytes())
        assert type(old).__name__ == type(new).__name__ == name
        assert old.tenant is None and new.tenant == "acme"
