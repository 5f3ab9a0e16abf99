"""Building quarantine and graph commands for the pure core's tests."""

from __future__ import annotations

import itertools
from typing import Any

from services.common.contracts.quarantine import (
    ClearArtifacts,
    ClearQuarantine,
    RecordArtifactRead,
    RecordQuarantineStage,
    RegisterArtifact,
    StartQuarantine,
    TaintRun,
    graph_id,
)
from services.quarantine.domain import AnyState, Rejection, decide, evolve

_ids = itertools.count()
GRAPH = graph_id("acme")


def _header(aggregate: str, actor: str = "olga") -> dict[str, Any]:
    return {
        "command_id": f"cmd-{next(_ids)}",
        "run_id": aggregate,
        "issued_at": 1,
        "correlation_id": "c",
        "actor": actor,
    }


def start(
    run: str, *, step: int = -1, at: int = 0, holder: str = "runner-a", actor: str = "olga"
) -> StartQuarantine:
    return StartQuarantine(
        **_header(run, actor),
        trigger="operator",
        reason="suspected injection",
        evidence='{"ticket":1}',
        tenant="acme",
        holder=holder,
        lease_epoch=1,
        attempt_id=f"att_{run}_1",
        taint_from_step=step,
        taint_from_at=at,
    )


def stage(run: str, name: str, mechanism: str = "sigstop") -> RecordQuarantineStage:
    return RecordQuarantineStage(
        **_header(run, "runner-a"), stage=name, mechanism=mechanism, completed_at=5, host_id="h", detail=""
    )


def clear_run(run: str, actor: str = "olga", role: str = "operator") -> ClearQuarantine:
    return ClearQuarantine(**_header(run, actor), reason="reviewed", evidence="", role=role, artifact_ids=())


def register(artifact: str, run: str, *, step: int = -1, parents: tuple[str, ...] = ()) -> RegisterArtifact:
    return RegisterArtifact(
        **_header(GRAPH, "runner"),
        artifact_id=artifact,
        producer_run_id=run,
        attempt_id="",
        step=step,
        content_hash=f"sha256:{artifact}",
        size_bytes=1,
        media_type="text/plain",
        source="upload",
        location=f"k/{artifact}",
        derived_from=parents,
    )


def read(artifact: str, reader_run: str) -> RecordArtifactRead:
    return RecordArtifactRead(
        **_header(GRAPH, "peer"), artifact_id=artifact, reader_run_id=reader_run, reader="peer"
    )


def taint(run: str, *, step: int = -1, at: int = 0) -> TaintRun:
    return TaintRun(
        **_header(GRAPH), tainted_run_id=run, since_step=step, since_at=at, quarantine_event_id="q"
    )


def clear(ids: tuple[str, ...] = (), run: str = "", role: str = "operator") -> ClearArtifacts:
    return ClearArtifacts(
        **_header(GRAPH), cleared_run_id=run, artifact_ids=ids, reason="cleared", evidence="", role=role
    )


class Aggregates:
    """Decides and folds commands like the processor, one state per aggregate id."""

    def __init__(self) -> None:
        self.states: dict[str, AnyState] = {}
        self.now = 1000

    def send(self, command: Any) -> list[Any] | Rejection:
        self.now += 1
        state = self.states.get(command.run_id)
        decision = decide(state, command, self.now)
        if isinstance(decision, Rejection):
            return decision
        for event in decision:
            state = evolve(state, event)
        if state is not None:
            self.states[command.run_id] = state
        return list(decision)

    def ok(self, command: Any) -> list[Any]:
        result = self.send(command)
        assert not isinstance(result, Rejection), result
        return result

    def done(self, command: Any) -> list[Any]:
        """Accepted, or refused as changing nothing (NOTHING_TO_DO): the events, if any."""
        result = self.send(command)
        if isinstance(result, Rejection):
            assert result.code.value == "NOTHING_TO_DO", result
            return []
        return result
