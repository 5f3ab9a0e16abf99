"""The quarantine processor's pure core (QUA-1, QUA-2): two aggregates, one decide, one evolve.

A command or event whose aggregate id starts with graph/ belongs to a tenant's provenance graph
(domain/graph.py); any other to a run's quarantine (domain/quarantine.py). No I/O and no clock:
time comes in as a value.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.contracts.quarantine import (
    GRAPH_PREFIX,
    ClearArtifacts,
    QuarantineCommand,
    QuarantineEvent,
    QuarantineRejectionCode,
    RecordArtifactRead,
    RegisterArtifact,
    TaintRun,
)
from services.quarantine.domain.common import Rejection
from services.quarantine.domain.graph import (
    GraphCommand,
    GraphEvent,
    birth_status,
    decide_graph,
    descendants,
    evolve_graph,
    servable,
)
from services.quarantine.domain.lifecycle import (
    ARTIFACT_TRANSITIONS,
    TRANSITIONS,
    ArtifactStatus,
    IllegalTransition,
    QuarantineStatus,
    check_artifact_transition,
    check_transition,
)
from services.quarantine.domain.quarantine import CLEARING_ROLES, RunCommand, RunEvent, decide_run, evolve_run
from services.quarantine.domain.state import (
    MAX_RECENT,
    Artifact,
    GraphState,
    QuarantineState,
    Stage,
    Window,
    in_window,
)

__all__ = [
    "ARTIFACT_TRANSITIONS",
    "CLEARING_ROLES",
    "MAX_RECENT",
    "TRANSITIONS",
    "AnyState",
    "Artifact",
    "ArtifactStatus",
    "GraphCommand",
    "GraphEvent",
    "GraphState",
    "IllegalTransition",
    "QuarantineState",
    "QuarantineStatus",
    "Rejection",
    "RunCommand",
    "RunEvent",
    "Stage",
    "Window",
    "birth_status",
    "check_artifact_transition",
    "check_transition",
    "decide",
    "descendants",
    "evolve",
    "fold",
    "in_window",
    "is_graph",
    "servable",
]

AnyState = QuarantineState | GraphState
_GRAPH_COMMANDS = (RegisterArtifact, RecordArtifactRead, TaintRun, ClearArtifacts)


def is_graph(aggregate_id: str) -> bool:
    return aggregate_id.startswith(GRAPH_PREFIX)


def decide(
    state: AnyState | None, command: QuarantineCommand, now_ms: int
) -> Sequence[QuarantineEvent] | Rejection:
    graph_command = isinstance(command, _GRAPH_COMMANDS)
    if graph_command != is_graph(command.run_id):
        return Rejection(
            QuarantineRejectionCode.INVALID_COMMAND,
            f"{type(command).__name__} is not a command of aggregate {command.run_id}",
        )
    if isinstance(command, _GRAPH_COMMANDS):
        assert state is None or isinstance(state, GraphState)
        return decide_graph(state, command, now_ms)
    assert state is None or isinstance(state, QuarantineState)
    return decide_run(state, command, now_ms)


def evolve(state: AnyState | None, event: QuarantineEvent) -> AnyState:
    if is_graph(event.run_id):
        if state is not None and not isinstance(state, GraphState):
            raise ValueError(f"{event.run_id}: a graph event on a quarantine state")
        return evolve_graph(state, event)  # type: ignore[arg-type]
    if state is not None and not isinstance(state, QuarantineState):
        raise ValueError(f"{event.run_id}: a quarantine event on a graph state")
    return evolve_run(state, event)  # type: ignore[arg-type]


def fold(events: Sequence[QuarantineEvent]) -> AnyState | None:
    state: AnyState | None = None
    for event in events:
        state = evolve(state, event)
    return state
