"""Blast-radius quarantine (QUA-1..QUA-3): what the quarantine processor is told, and what it decides.

Two aggregates share quarantine.commands / quarantine.events / quarantine.rejections, each with
its own id in the header's `run_id` slot (the one runtime's convention):

* a run's **Quarantine**, keyed by the run id: the trigger and the four stages (suspended,
  revoked, severed, taint propagated), then perhaps its clearing;
* a tenant's **provenance graph**, keyed by `graph/<tenant>` (`graph_id`): every artifact's
  immutable envelope, its derivations, which runs read it, and its taint status. Closure over
  derivations and reads is computed in `decide` because one aggregate holds the whole graph of a
  tenant (docs/architecture.md, "Quarantine and taint").

Optional values use plain sentinels so the schemas stay free of unions: `evidence` and `detail`
are canonical JSON ("" = none), a step of -1 and a time of 0 mean "not given". Times are epoch
milliseconds; `occurredAt` of every event is on the quarantine processor's clock.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Union

from services.common.contracts._headers import CommandHeader, EventHeader

__all__ = [
    "ARTIFACT_STATUSES",
    "GRAPH_PREFIX",
    "IN_FLIGHT_NOTE",
    "MAX_EVIDENCE_CHARS",
    "MAX_REASON_CHARS",
    "MECHANISMS",
    "QUARANTINE_COMMANDS_NS",
    "QUARANTINE_COMMAND_TYPES",
    "QUARANTINE_EVENTS_NS",
    "QUARANTINE_EVENT_TYPES",
    "STAGES",
    "TRIGGERS",
    "ArtifactRead",
    "ArtifactRegistered",
    "ArtifactStatus",
    "ArtifactsCleared",
    "ClearArtifacts",
    "ClearQuarantine",
    "QuarantineCleared",
    "QuarantineCommand",
    "QuarantineEvent",
    "QuarantineRejectionCode",
    "QuarantineStageCompleted",
    "QuarantineStarted",
    "RecordArtifactRead",
    "RecordQuarantineStage",
    "RegisterArtifact",
    "StartQuarantine",
    "TaintPropagated",
    "TaintRun",
    "graph_id",
]

# What the effect gateway adds to the outcome of an effect that was in flight when its run was
# quarantined (the quarantine view lists those effects).
IN_FLIGHT_NOTE = "in flight when the run was quarantined"
QUARANTINE_COMMANDS_NS = "tenure.quarantine.commands"
QUARANTINE_EVENTS_NS = "tenure.quarantine.events"
GRAPH_PREFIX = "graph/"
MAX_REASON_CHARS = 2000
MAX_EVIDENCE_CHARS = 64_000

TRIGGERS = ("operator", "egress-policy", "verifier")
# The four stages of the seed's protocol, in its order; suspended and severed are the managed
# runner host's (services/runner_host), revoked and taint-propagated the control plane's.
STAGES = ("suspended", "revoked", "severed", "taint-propagated")
MECHANISMS = (
    "cgroup-v2-freeze",
    "cgroup-v1-freezer",
    "sigstop",
    "netns-link-down",
    "unavailable",
    "lease-takeover",
    "provenance-graph",
)


def graph_id(tenant: str) -> str:
    """The provenance graph aggregate of `tenant`."""
    return f"{GRAPH_PREFIX}{tenant}"


class ArtifactStatus(StrEnum):
    UNTAINTED = "UNTAINTED"
    SUSPECT = "SUSPECT"
    TAINTED = "TAINTED"
    CLEARED = "CLEARED"


ARTIFACT_STATUSES = tuple(s.value for s in ArtifactStatus)


class QuarantineRejectionCode(StrEnum):
    """The quarantine processor's rejection codes; the value is CommandRejected.code."""

    INVALID_COMMAND = "INVALID_COMMAND"
    ALREADY_QUARANTINED = "ALREADY_QUARANTINED"
    NOT_QUARANTINED = "NOT_QUARANTINED"
    # A read of a TAINTED artifact through the mediation gateway: nothing is served (QUA-2).
    ARTIFACT_QUARANTINED = "ARTIFACT_QUARANTINED"
    ARTIFACT_NOT_FOUND = "ARTIFACT_NOT_FOUND"
    # An envelope is immutable: the same id with another content hash or producer is refused.
    ARTIFACT_EXISTS = "ARTIFACT_EXISTS"
    # Clearing by the quarantined run's own principal, or by a role that may not clear.
    CLEARING_FORBIDDEN = "CLEARING_FORBIDDEN"
    # The command would change nothing: the stage, the envelope is recorded already, or nothing
    # is left to clear. A refusal rather than silence, so a redelivery much later cannot decide
    # differently (refused ids are remembered); the API answers it as the idempotent repeat it is.
    NOTHING_TO_DO = "NOTHING_TO_DO"


# --- a run's quarantine -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StartQuarantine(CommandHeader):
    """A trigger. `holder`/`lease_epoch`/`attempt_id`: the run's lease when it was triggered, as
    the caller saw it ("" / 0 when none). `taint_from_step` / `taint_from_at`: t_taint as given
    (-1 / 0: not given; then the default of the caller's choosing is already resolved here)."""

    trigger: str
    reason: str
    evidence: str
    tenant: str
    holder: str
    lease_epoch: int
    attempt_id: str
    taint_from_step: int
    taint_from_at: int


@dataclass(frozen=True, kw_only=True)
class RecordQuarantineStage(CommandHeader):
    """A stage done: by the runner host (suspended, severed) or the control plane (revoked,
    taint-propagated). `completed_at`: the reporter's own clock; the event's occurredAt is ours."""

    stage: str
    mechanism: str
    completed_at: int
    host_id: str
    detail: str


@dataclass(frozen=True, kw_only=True)
class ClearQuarantine(CommandHeader):
    """An operator or an independent verifier lifts the quarantine (never the run's principal)."""

    reason: str
    evidence: str
    role: str
    artifact_ids: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class QuarantineStarted(EventHeader):
    trigger: str
    reason: str
    evidence: str
    tenant: str
    holder: str
    lease_epoch: int
    attempt_id: str
    taint_from_step: int
    taint_from_at: int


@dataclass(frozen=True, kw_only=True)
class QuarantineStageCompleted(EventHeader):
    stage: str
    mechanism: str
    completed_at: int
    host_id: str
    detail: str


@dataclass(frozen=True, kw_only=True)
class QuarantineCleared(EventHeader):
    reason: str
    evidence: str
    role: str
    artifact_ids: tuple[str, ...]


# --- a tenant's provenance graph ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RegisterArtifact(CommandHeader):
    """An artifact's immutable envelope. `step` -1: not known (treated as inside any taint)."""

    artifact_id: str
    producer_run_id: str
    attempt_id: str
    step: int
    content_hash: str
    size_bytes: int
    media_type: str
    source: str
    location: str
    derived_from: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class RecordArtifactRead(CommandHeader):
    """A run asks to read an artifact through the mediation gateway: the edge, or a refusal."""

    artifact_id: str
    reader_run_id: str
    reader: str


@dataclass(frozen=True, kw_only=True)
class TaintRun(CommandHeader):
    """Stage 4 of a run's quarantine: taint what it produced since t_taint, and what follows."""

    tainted_run_id: str
    since_step: int
    since_at: int
    quarantine_event_id: str


@dataclass(frozen=True, kw_only=True)
class ClearArtifacts(CommandHeader):
    """Clear artifacts (none named: every artifact the quarantine of `cleared_run_id` tainted)."""

    cleared_run_id: str
    artifact_ids: tuple[str, ...]
    reason: str
    evidence: str
    role: str


@dataclass(frozen=True, kw_only=True)
class ArtifactRegistered(EventHeader):
    """`status`: its taint at birth (TAINTED when derived from a tainted artifact or produced by a
    quarantined run within its taint, SUSPECT likewise for suspect ones). `taint_origin`: the run
    whose quarantine the taint comes from ("")."""

    artifact_id: str
    producer_run_id: str
    attempt_id: str
    step: int
    content_hash: str
    size_bytes: int
    media_type: str
    source: str
    location: str
    derived_from: tuple[str, ...]
    status: str
    taint_origin: str


@dataclass(frozen=True, kw_only=True)
class ArtifactRead(EventHeader):
    artifact_id: str
    reader_run_id: str
    reader: str
    status: str


@dataclass(frozen=True, kw_only=True)
class TaintPropagated(EventHeader):
    """The closure, computed in decide: `tainted` artifacts (the run's since t_taint and every
    derivation of them), `suspect_runs` (they read a tainted artifact) and `suspect` artifacts
    (the output of suspect runs, and what derives from it)."""

    tainted_run_id: str
    since_step: int
    since_at: int
    quarantine_event_id: str
    tainted: tuple[str, ...]
    suspect: tuple[str, ...]
    suspect_runs: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ArtifactsCleared(EventHeader):
    cleared_run_id: str
    artifact_ids: tuple[str, ...]
    reason: str
    evidence: str
    role: str


QuarantineCommand = Union[
    StartQuarantine,
    RecordQuarantineStage,
    ClearQuarantine,
    RegisterArtifact,
    RecordArtifactRead,
    TaintRun,
    ClearArtifacts,
]
QuarantineEvent = Union[
    QuarantineStarted,
    QuarantineStageCompleted,
    QuarantineCleared,
    ArtifactRegistered,
    ArtifactRead,
    TaintPropagated,
    ArtifactsCleared,
]
QUARANTINE_COMMAND_TYPES: tuple[type[Any], ...] = typing.get_args(QuarantineCommand)
QUARANTINE_EVENT_TYPES: tuple[type[Any], ...] = typing.get_args(QuarantineEvent)
