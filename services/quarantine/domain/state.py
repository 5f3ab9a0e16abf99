"""The states of the quarantine processor's two aggregates: the folds of their events.

`QuarantineState`: one run's quarantine (keyed by run id). `GraphState`: one tenant's provenance
graph (keyed by graph/<tenant>): every artifact's envelope and taint, who read what, which runs
are quarantined (their later artifacts are tainted at birth) or suspect.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from services.quarantine.domain.lifecycle import ArtifactStatus, QuarantineStatus

__all__ = ["MAX_RECENT", "Artifact", "GraphState", "QuarantineState", "Stage", "Window", "in_window"]

# Ids of the accepted commands kept per aggregate, so a redelivery is answered with nothing.
MAX_RECENT = 256


@dataclass(frozen=True)
class Stage:
    """One stage done. `recorded_at`: our clock; `completed_at`: the reporter's."""

    stage: str
    mechanism: str
    completed_at: int
    recorded_at: int
    host_id: str
    detail: str
    actor: str


@dataclass(frozen=True)
class QuarantineState:
    run_id: str
    version: int
    status: QuarantineStatus
    tenant: str = ""
    trigger: str = ""
    reason: str = ""
    evidence: str = ""
    triggered_by: str = ""
    triggered_at: int = 0
    quarantine_event_id: str = ""
    holder: str = ""
    lease_epoch: int = 0
    attempt_id: str = ""
    taint_from_step: int = -1
    taint_from_at: int = 0
    stages: tuple[Stage, ...] = ()
    cleared_by: str = ""
    cleared_role: str = ""
    cleared_reason: str = ""
    cleared_evidence: str = ""
    cleared_at: int = 0
    episodes: int = 0
    recent: tuple[str, ...] = ()

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.stage == name), None)

    @property
    def owes_revocation(self) -> bool:
        """The control plane's stage 2 is not recorded yet (the executor's work, re-driven)."""
        return self.status is QuarantineStatus.QUARANTINED and self.stage("revoked") is None


@dataclass(frozen=True)
class Window:
    """t_taint: from a step index (>= 0), or from a time (> 0), or the whole run (neither)."""

    since_step: int = -1
    since_at: int = 0


def in_window(step: int, registered_at: int, window: Window) -> bool:
    """Is an artifact of `step` (-1: unknown) registered at `registered_at` inside the taint?
    An unknown step is inside any step window: what cannot be placed is not trusted."""
    if window.since_step >= 0:
        return step < 0 or step >= window.since_step
    if window.since_at > 0:
        return registered_at >= window.since_at
    return True


@dataclass(frozen=True)
class Artifact:
    """The immutable envelope (the first nine fields) and the mutable taint after it."""

    artifact_id: str
    producer_run_id: str
    attempt_id: str
    step: int
    content_hash: str
    size_bytes: int
    media_type: str
    source: str
    derived_from: tuple[str, ...]
    registered_at: int
    location: str = ""
    status: ArtifactStatus = ArtifactStatus.UNTAINTED
    taint_origin: str = ""
    status_version: int = 0
    cleared_by: str = ""
    cleared_role: str = ""
    cleared_reason: str = ""
    cleared_evidence: str = ""

    @property
    def tombstoned(self) -> bool:
        """Hidden from normal listings, kept for audit (QUA-2's soft delete)."""
        return self.status is ArtifactStatus.TAINTED

    def same_envelope(self, other: Artifact) -> bool:
        return (
            self.producer_run_id,
            self.attempt_id,
            self.step,
            self.content_hash,
            self.size_bytes,
            self.media_type,
            self.derived_from,
        ) == (
            other.producer_run_id,
            other.attempt_id,
            other.step,
            other.content_hash,
            other.size_bytes,
            other.media_type,
            other.derived_from,
        )


@dataclass(frozen=True)
class GraphState:
    """`reads`: reader run -> artifacts it read; `quarantined`: run -> its taint window;
    `suspect_runs`: run -> the quarantined run whose taint made it suspect."""

    graph_id: str
    version: int
    artifacts: Mapping[str, Artifact] = field(default_factory=dict)
    reads: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    quarantined: Mapping[str, Window] = field(default_factory=dict)
    suspect_runs: Mapping[str, str] = field(default_factory=dict)
    recent: tuple[str, ...] = ()

    @property
    def run_id(self) -> str:
        """The aggregate id under the runtime's conventional name."""
        return self.graph_id

    @property
    def status(self) -> str:
        return "graph"

    @property
    def tenant(self) -> str:
        return self.graph_id.split("/", 1)[1]

    def children(self) -> dict[str, list[str]]:
        """parent -> the artifacts derived from it (in id order, so decisions are deterministic)."""
        out: dict[str, list[str]] = {}
        for artifact_id in sorted(self.artifacts):
            for parent in self.artifacts[artifact_id].derived_from:
                out.setdefault(parent, []).append(artifact_id)
        return out

    def produced_by(self, run_id: str) -> Iterator[Artifact]:
        for artifact_id in sorted(self.artifacts):
            artifact = self.artifacts[artifact_id]
            if artifact.producer_run_id == run_id:
                yield artifact
