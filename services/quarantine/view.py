"""Quarantines and provenance graphs as every reader sees them: quarantine.events, folded.

`QuarantineFold` holds each aggregate's state, folded with the processor's own `evolve` (one
fold per aggregate: a reader cannot drift from the writer), and answers from memory, in
microseconds: is this run quarantined (the gateway asks before every effect), what is this
artifact's envelope and taint (the API's mediation gateway asks before every read). Listeners
hear every folded state (the API's long-poll wakes on them). `QuarantineBoard` feeds it from
Kafka: one thread follows quarantine.events from the beginning (read_committed), and readiness
waits until it has folded what was on the log when it started.

`render_quarantine` and `render_artifact` are the JSON of GET /runs/{id}/quarantine and of an
artifact's envelope (the API adds what only the run and trajectory views know).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from services.common.contracts.quarantine import QUARANTINE_EVENT_TYPES, QuarantineEvent, graph_id
from services.common.decisions import FollowerHealth
from services.common.feed import TopicFeed
from services.common.messages import MessageCodec
from services.common.times import rfc3339
from services.common.topics import QUARANTINE_EVENTS
from services.quarantine.domain import (
    AnyState,
    Artifact,
    ArtifactStatus,
    GraphState,
    QuarantineState,
    QuarantineStatus,
    evolve,
)

__all__ = [
    "STAGE_FIELDS",
    "QuarantineBoard",
    "QuarantineFold",
    "iso",
    "render_artifact",
    "render_quarantine",
]

log = logging.getLogger("tenure.quarantine.view")
Listener = Callable[[AnyState], None]
# The stages by wire name, as the view's "stages" object names them.
STAGE_FIELDS = {
    "suspended": "suspended",
    "revoked": "revoked",
    "severed": "severed",
    "taint-propagated": "taintPropagated",
}


def iso(ms: int) -> str:
    """Epoch millis as RFC 3339 (UTC, millisecond precision)."""
    return rfc3339(ms)


def _parsed(text: str) -> Any:
    return json.loads(text) if text else None


class QuarantineFold:
    """Every quarantine and graph state, the fold of quarantine.events as it arrives."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, AnyState] = {}
        # artifact id -> graph id, so a read needs no tenant
        self._graph_of: dict[str, str] = {}
        self._listeners: list[Listener] = []
        self.folded = 0
        self.broken: dict[str, str] = {}

    def apply(self, event: QuarantineEvent) -> AnyState | None:
        key = event.run_id
        with self._lock:
            state = self._states.get(key)
            if state is not None and event.version <= state.version:
                return None
            try:
                after = evolve(state, event)
            except ValueError as exc:
                if key not in self.broken:
                    log.error("%s: cannot fold %s: %s", key, type(event).__name__, exc)
                self.broken[key] = str(exc)
                return None
            self._states[key] = after
            if isinstance(after, GraphState):
                artifact_id = getattr(event, "artifact_id", None)
                if isinstance(artifact_id, str) and artifact_id in after.artifacts:
                    self._graph_of[artifact_id] = key
            self.folded += 1
            listeners = list(self._listeners)
        for listener in listeners:
            listener(after)
        return after

    def subscribe(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def quarantine(self, run_id: str) -> QuarantineState | None:
        with self._lock:
            state = self._states.get(run_id)
        return state if isinstance(state, QuarantineState) else None

    def is_quarantined(self, run_id: str) -> bool:
        state = self.quarantine(run_id)
        return state is not None and state.status is QuarantineStatus.QUARANTINED

    def graph(self, tenant: str) -> GraphState | None:
        with self._lock:
            state = self._states.get(graph_id(tenant))
        return state if isinstance(state, GraphState) else None

    def artifact(self, artifact_id: str) -> tuple[GraphState, Artifact] | None:
        with self._lock:
            key = self._graph_of.get(artifact_id)
            state = self._states.get(key) if key is not None else None
        if not isinstance(state, GraphState):
            return None
        artifact = state.artifacts.get(artifact_id)
        return (state, artifact) if artifact is not None else None

    # A fold fed by hand (tests) is always current; QuarantineBoard follows Kafka.
    def wait_until_current(self, timeout_s: float = 30.0) -> bool:
        return True

    def health(self) -> FollowerHealth:
        return FollowerHealth(True, f"folded in memory: {self.folded} events")

    def close(self) -> None:
        """Nothing to stop."""


class QuarantineBoard(QuarantineFold):
    """A QuarantineFold fed by a thread that follows quarantine.events from the beginning."""

    def __init__(self, bootstrap_servers: str, codec: MessageCodec | None = None, *, client_id: str) -> None:
        super().__init__()
        self._feed = TopicFeed(
            bootstrap_servers,
            QUARANTINE_EVENTS.name,
            QUARANTINE_EVENT_TYPES,
            self.apply,
            what="quarantine",
            client_id=client_id,
            codec=codec,
            poll_timeout_s=0.05,
        )

    def wait_until_current(self, timeout_s: float = 30.0) -> bool:
        return self._feed.wait_until_current(timeout_s)

    def health(self) -> FollowerHealth:
        return self._feed.health()

    def close(self) -> None:
        self._feed.close()


def render_artifact(artifact: Artifact) -> dict[str, Any]:
    cleared = None
    if artifact.cleared_by:
        cleared = {
            "by": artifact.cleared_by,
            "role": artifact.cleared_role,
            "reason": artifact.cleared_reason,
            "evidence": _parsed(artifact.cleared_evidence),
        }
    return {
        "artifactId": artifact.artifact_id,
        "envelope": {
            "contentHash": artifact.content_hash,
            "producerRunId": artifact.producer_run_id,
            "attemptId": artifact.attempt_id or None,
            "step": artifact.step if artifact.step >= 0 else None,
            "sizeBytes": artifact.size_bytes,
            "mediaType": artifact.media_type,
            "source": artifact.source,
            "derivedFrom": list(artifact.derived_from),
            "registeredAt": iso(artifact.registered_at),
        },
        "taint": artifact.status.value,
        "taintOrigin": artifact.taint_origin or None,
        "tombstoned": artifact.tombstoned,
        "cleared": cleared,
    }


def render_quarantine(run_id: str, state: QuarantineState | None, graph: GraphState | None) -> dict[str, Any]:
    """The fold's part of the quarantine view (GET /runs/{runId}/quarantine)."""
    stages: dict[str, Any] = {name: None for name in STAGE_FIELDS.values()}
    if state is None:
        return {
            "runId": run_id,
            "status": QuarantineStatus.NONE.value,
            "version": 0,
            "trigger": None,
            "stages": stages,
            "taintFrom": None,
            "holder": None,
            "leaseEpoch": None,
            "cleared": None,
            "taintedArtifacts": [],
            "suspectArtifacts": [],
            "suspectRuns": [],
        }
    for stage in state.stages:
        stages[STAGE_FIELDS[stage.stage]] = {
            "at": iso(stage.recorded_at),
            "mechanism": stage.mechanism,
            "completedAt": iso(stage.completed_at) if stage.completed_at > 0 else None,
            "hostId": stage.host_id,
            "detail": _parsed(stage.detail),
            "latencyMs": stage.recorded_at - state.triggered_at,
        }
    tainted, suspect_runs = [], []
    if graph is not None:
        tainted = [a for a in graph.artifacts.values() if a.taint_origin == run_id]
        suspect_runs = sorted(r for r, o in graph.suspect_runs.items() if o == run_id)
    cleared = None
    if state.status is QuarantineStatus.CLEARED:
        cleared = {
            "by": state.cleared_by,
            "role": state.cleared_role,
            "reason": state.cleared_reason,
            "evidence": _parsed(state.cleared_evidence),
            "at": iso(state.cleared_at),
        }
    taint_from: dict[str, Any] = {"whole": True}
    if state.taint_from_step >= 0:
        taint_from = {"step": state.taint_from_step}
    elif state.taint_from_at > 0:
        taint_from = {"at": iso(state.taint_from_at)}
    return {
        "runId": run_id,
        "status": state.status.value,
        "version": state.version,
        "trigger": {
            "kind": state.trigger,
            "reason": state.reason,
            "actor": state.triggered_by,
            "at": iso(state.triggered_at),
            "evidence": _parsed(state.evidence),
        },
        "stages": stages,
        "taintFrom": taint_from,
        "holder": state.holder or None,
        "leaseEpoch": state.lease_epoch or None,
        "cleared": cleared,
        "taintedArtifacts": [
            {"artifactId": a.artifact_id, "taint": a.status.value}
            for a in sorted(tainted, key=lambda a: a.artifact_id)
            if a.status in (ArtifactStatus.TAINTED, ArtifactStatus.CLEARED)
        ],
        "suspectArtifacts": sorted(a.artifact_id for a in tainted if a.status is ArtifactStatus.SUSPECT),
        "suspectRuns": suspect_runs,
    }
