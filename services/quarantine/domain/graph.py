"""A tenant's provenance graph (QUA-2): envelopes, derivations, reads, taint and clearing; pure.

One aggregate holds the whole graph of a tenant, so the closure of a taint (every artifact
derived from a tainted one, every run that read one, and that run's output) is computed in
`decide` from the state alone, and recorded as a fact (TaintPropagated lists what it changed):
`evolve` only applies it, and a reader folding the log needs no graph algorithm of its own.

Rules:
* an artifact is TAINTED at birth when a parent is TAINTED, or its producer is quarantined and
  it falls inside the taint window; SUSPECT at birth when a parent is SUSPECT or its producer
  is a suspect run; UNTAINTED otherwise;
* a read of a TAINTED artifact is refused (ARTIFACT_QUARANTINED) and records nothing; any other
  read is an edge (reader run -> artifact);
* TaintRun taints the run's artifacts inside the window and, transitively, their derivations;
  the runs that read any of them (other than the quarantined run) become suspect, and so do
  their artifacts and what derives from those (unless TAINTED);
* clearing makes TAINTED or SUSPECT artifacts CLEARED (operators and verifiers only; the API
  refuses the run's own principal before it gets here); clearing a whole quarantine also ends
  the birth-taint of the run and the suspicion it caused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from services.common.contracts.quarantine import (
    MAX_REASON_CHARS,
    ArtifactRead,
    ArtifactRegistered,
    ArtifactsCleared,
    ArtifactStatus,
    ClearArtifacts,
    QuarantineRejectionCode,
    RecordArtifactRead,
    RegisterArtifact,
    TaintPropagated,
    TaintRun,
)
from services.quarantine.domain.common import Rejection, header, remember
from services.quarantine.domain.lifecycle import check_artifact_transition
from services.quarantine.domain.state import MAX_RECENT, Artifact, GraphState, Window, in_window

__all__ = [
    "GraphCommand",
    "GraphEvent",
    "birth_status",
    "decide_graph",
    "descendants",
    "evolve_graph",
    "servable",
]

A = ArtifactStatus
C = QuarantineRejectionCode
GraphCommand = RegisterArtifact | RecordArtifactRead | TaintRun | ClearArtifacts
GraphEvent = ArtifactRegistered | ArtifactRead | TaintPropagated | ArtifactsCleared
SOURCES = ("upload", "manifest", "saga-step")


def servable(artifact: Artifact) -> bool:
    """The mediation gateway serves every status but TAINTED (SUSPECT is served, flagged)."""
    return artifact.status is not A.TAINTED


def descendants(state: GraphState, roots: Iterable[str]) -> list[str]:
    """`roots` and every artifact derived from them, transitively, in a deterministic order."""
    children = state.children()
    seen: set[str] = set()
    order: list[str] = []
    stack = sorted(set(roots), reverse=True)
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        order.append(current)
        stack.extend(sorted(children.get(current, ()), reverse=True))
    return order


def birth_status(state: GraphState | None, command: RegisterArtifact, now_ms: int) -> tuple[A, str]:
    """(status, taint origin) of a new artifact: see the module's rules."""
    if state is None:
        return A.UNTAINTED, ""
    parents = [state.artifacts[p] for p in command.derived_from]
    tainted = next((p for p in parents if p.status is A.TAINTED), None)
    if tainted is not None:
        return A.TAINTED, tainted.taint_origin
    window = state.quarantined.get(command.producer_run_id)
    if window is not None and in_window(command.step, now_ms, window):
        return A.TAINTED, command.producer_run_id
    suspect = next((p for p in parents if p.status is A.SUSPECT), None)
    if suspect is not None:
        return A.SUSPECT, suspect.taint_origin
    if command.producer_run_id in state.suspect_runs:
        return A.SUSPECT, state.suspect_runs[command.producer_run_id]
    return A.UNTAINTED, ""


def _invalid(command: GraphCommand) -> str:
    if isinstance(command, RegisterArtifact):
        if command.source not in SOURCES:
            return f"source must be one of {', '.join(SOURCES)}"
        if command.artifact_id in command.derived_from:
            return "an artifact cannot derive from itself"
        if command.step < -1 or command.size_bytes < 0:
            return "step must be >= -1 and sizeBytes >= 0"
    if isinstance(command, TaintRun) and command.since_step >= 0 and command.since_at > 0:
        return "t_taint is a step or a time, not both"
    if isinstance(command, ClearArtifacts) and not 1 <= len(command.reason) <= MAX_REASON_CHARS:
        return f"reason must be 1..{MAX_REASON_CHARS} characters"
    return ""


def decide_graph(
    state: GraphState | None, command: GraphCommand, now_ms: int
) -> Sequence[GraphEvent] | Rejection:
    if state is not None and command.command_id in state.recent:
        return ()
    invalid = _invalid(command)
    if invalid:
        return Rejection(C.INVALID_COMMAND, invalid)
    version = (state.version if state is not None else 0) + 1
    artifacts = state.artifacts if state is not None else {}
    if isinstance(command, RegisterArtifact):
        missing = sorted(p for p in command.derived_from if p not in artifacts)
        if missing:
            names = ", ".join(missing)
            return Rejection(C.ARTIFACT_NOT_FOUND, f"derivedFrom names unknown artifacts: {names}")
        known = artifacts.get(command.artifact_id)
        if known is not None:
            if known.same_envelope(_envelope(command, known.registered_at)):
                # The same envelope again (a retried upload): nothing new to record.
                return Rejection(C.NOTHING_TO_DO, f"artifact {command.artifact_id} is registered")
            return Rejection(
                C.ARTIFACT_EXISTS, f"artifact {command.artifact_id} exists with another envelope (immutable)"
            )
        status, origin = birth_status(state, command, now_ms)
        return (
            ArtifactRegistered(
                **header(command, version, ArtifactRegistered, now_ms),
                artifact_id=command.artifact_id,
                producer_run_id=command.producer_run_id,
                attempt_id=command.attempt_id,
                step=command.step,
                content_hash=command.content_hash,
                size_bytes=command.size_bytes,
                media_type=command.media_type,
                source=command.source,
                location=command.location,
                derived_from=command.derived_from,
                status=status.value,
                taint_origin=origin,
            ),
        )
    if isinstance(command, RecordArtifactRead):
        artifact = artifacts.get(command.artifact_id)
        if artifact is None:
            return Rejection(C.ARTIFACT_NOT_FOUND, f"no artifact {command.artifact_id}")
        if not servable(artifact):
            return Rejection(
                C.ARTIFACT_QUARANTINED,
                f"artifact {command.artifact_id} is TAINTED (quarantine of run {artifact.taint_origin}); "
                "nothing is served until an operator or an independent verifier clears it",
            )
        return (
            ArtifactRead(
                **header(command, version, ArtifactRead, now_ms),
                artifact_id=command.artifact_id,
                reader_run_id=command.reader_run_id,
                reader=command.reader,
                status=artifact.status.value,
            ),
        )
    if isinstance(command, TaintRun):
        assert state is not None or not artifacts
        graph = state or GraphState(graph_id=command.run_id, version=0)
        return (_taint(graph, command, version, now_ms),)
    return _clear(state, command, version, now_ms)


def _envelope(command: RegisterArtifact, registered_at: int) -> Artifact:
    return Artifact(
        command.artifact_id,
        command.producer_run_id,
        command.attempt_id,
        command.step,
        command.content_hash,
        command.size_bytes,
        command.media_type,
        command.source,
        command.derived_from,
        registered_at,
        command.location,
    )


def _taint(state: GraphState, command: TaintRun, version: int, now_ms: int) -> TaintPropagated:
    window = Window(command.since_step, command.since_at)
    seeds = [
        a.artifact_id
        for a in state.produced_by(command.tainted_run_id)
        if in_window(a.step, a.registered_at, window)
    ]
    closure = descendants(state, seeds)
    tainted_now = set(closure) | {i for i, a in state.artifacts.items() if a.status is A.TAINTED}
    suspect_runs = sorted(
        run
        for run, read in state.reads.items()
        if run != command.tainted_run_id
        and run not in state.suspect_runs
        and run not in state.quarantined
        and tainted_now.intersection(read)
    )
    produced = [a.artifact_id for run in suspect_runs for a in state.produced_by(run)]
    suspect = [
        i
        for i in descendants(state, produced)
        if i not in tainted_now and state.artifacts[i].status is not A.SUSPECT
    ]
    return TaintPropagated(
        **header(command, version, TaintPropagated, now_ms),
        tainted_run_id=command.tainted_run_id,
        since_step=command.since_step,
        since_at=command.since_at,
        quarantine_event_id=command.quarantine_event_id,
        tainted=tuple(i for i in closure if state.artifacts[i].status is not A.TAINTED),
        suspect=tuple(suspect),
        suspect_runs=tuple(suspect_runs),
    )


def _clear(
    state: GraphState | None, command: ClearArtifacts, version: int, now_ms: int
) -> Sequence[GraphEvent] | Rejection:
    """`cleared_run_id` set: the run's quarantine is lifted (its birth-taint and the suspicion it
    caused end), with the named artifacts, or all it tainted when none are named. Unset: only
    the named artifacts (at least one)."""
    if command.role not in ("operator", "verifier"):
        return Rejection(C.CLEARING_FORBIDDEN, "only an operator or an independent verifier may clear")
    if not command.cleared_run_id and not command.artifact_ids:
        return Rejection(C.INVALID_COMMAND, "name the artifacts to clear, or the quarantined run")
    artifacts = state.artifacts if state is not None else {}
    missing = sorted(i for i in command.artifact_ids if i not in artifacts)
    if missing:
        return Rejection(C.ARTIFACT_NOT_FOUND, f"no artifacts {', '.join(missing)}")
    if command.artifact_ids:
        chosen = sorted(set(command.artifact_ids))
    else:
        chosen = sorted(i for i, a in artifacts.items() if a.taint_origin == command.cleared_run_id)
    cleared = tuple(i for i in chosen if artifacts[i].status in (A.TAINTED, A.SUSPECT))
    lifts = (
        state is not None
        and bool(command.cleared_run_id)
        and (
            command.cleared_run_id in state.quarantined
            or command.cleared_run_id in state.suspect_runs.values()
        )
    )
    if not cleared and not lifts:
        return Rejection(C.NOTHING_TO_DO, "nothing tainted or suspect to clear")
    return (
        ArtifactsCleared(
            **header(command, version, ArtifactsCleared, now_ms),
            cleared_run_id=command.cleared_run_id,
            artifact_ids=cleared,
            reason=command.reason,
            evidence=command.evidence,
            role=command.role,
        ),
    )


def _set(artifact: Artifact, status: A, version: int, origin: str | None = None) -> Artifact:
    check_artifact_transition(artifact.status, status)
    return replace(
        artifact,
        status=status,
        status_version=version,
        taint_origin=artifact.taint_origin if origin is None else origin,
    )


def evolve_graph(state: GraphState | None, event: GraphEvent) -> GraphState:
    state = state or GraphState(graph_id=event.run_id, version=0)
    if event.version != state.version + 1:
        raise ValueError(f"graph {event.run_id}: version {event.version} after {state.version}")
    recent = remember(state.recent, event.causation_id, MAX_RECENT)
    state = replace(state, version=event.version, recent=recent)
    if isinstance(event, ArtifactRegistered):
        artifact = Artifact(
            event.artifact_id,
            event.producer_run_id,
            event.attempt_id,
            event.step,
            event.content_hash,
            event.size_bytes,
            event.media_type,
            event.source,
            tuple(event.derived_from),
            event.occurred_at,
            event.location,
            A(event.status),
            event.taint_origin,
            event.version,
        )
        return replace(state, artifacts={**state.artifacts, event.artifact_id: artifact})
    if isinstance(event, ArtifactRead):
        read = state.reads.get(event.reader_run_id, ())
        if event.artifact_id in read:
            return state
        return replace(state, reads={**state.reads, event.reader_run_id: (*read, event.artifact_id)})
    if isinstance(event, TaintPropagated):
        artifacts = dict(state.artifacts)
        for i in event.tainted:
            artifacts[i] = _set(artifacts[i], A.TAINTED, event.version, event.tainted_run_id)
        for i in event.suspect:
            artifacts[i] = _set(artifacts[i], A.SUSPECT, event.version, event.tainted_run_id)
        window = Window(event.since_step, event.since_at)
        suspects = {**state.suspect_runs, **{run: event.tainted_run_id for run in event.suspect_runs}}
        return replace(
            state,
            artifacts=artifacts,
            quarantined={**state.quarantined, event.tainted_run_id: window},
            suspect_runs=suspects,
        )
    artifacts = dict(state.artifacts)
    for i in event.artifact_ids:
        artifacts[i] = replace(
            _set(artifacts[i], A.CLEARED, event.version),
            cleared_by=event.actor,
            cleared_role=event.role,
            cleared_reason=event.reason,
            cleared_evidence=event.evidence,
        )
    if not event.cleared_run_id:
        return replace(state, artifacts=artifacts)
    lifted = event.cleared_run_id
    quarantined = {run: w for run, w in state.quarantined.items() if run != lifted}
    suspects = {run: origin for run, origin in state.suspect_runs.items() if origin != lifted}
    return replace(state, artifacts=artifacts, quarantined=quarantined, suspect_runs=suspects)
