"""The command API's 2xx bodies for runs, leases and a runner's work, as documentation models.

These models are only written into the OpenAPI document (see `responses.py`); no route filters
or re-serialises its answer through them, so they cost the hot path nothing and cannot change
what is sent. They declare the fields the view builders really return
(services/projections/views.py `render_run`, routes_leases.py, routes_work.py, lease_batch.py)
and allow more (`additionalProperties`), so a field added later does not break a client.

Epoch-millisecond times are named `<x>At`; each has an optional RFC 3339 sibling
`<x>AtRfc3339` (string, date-time) for the views that carry one.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AttemptView",
    "BatchRenewalAnswer",
    "Body",
    "EffectRecord",
    "ExpiryRule",
    "HeartbeatAnswer",
    "HistoryEntry",
    "InputAcknowledgement",
    "LeaseGrant",
    "LeaseRecordAnswer",
    "LeaseView",
    "Ms",
    "PendingAnswer",
    "QueueGrant",
    "Renewal",
    "RenewalResult",
    "Rfc3339",
    "RunListPage",
    "RunView",
    "UploadAnswer",
    "UploadGrantAnswer",
]


class Body(BaseModel):
    """The base of every documented answer: the fields named, and any others a later version adds."""

    model_config = ConfigDict(extra="allow")


Ms = Annotated[int, Field(description="Epoch milliseconds (UTC).")]
# The RFC 3339 sibling of an epoch-millisecond field (issue 17 with the RFC 3339 views).
Rfc3339 = Annotated[
    str | None, Field(default=None, json_schema_extra={"format": "date-time"}, description="RFC 3339 (UTC).")
]
Intervention = Annotated[
    dict[str, Any] | None,
    Field(
        description="The semantic watchdog's intervention in force (WD-5), without its evidence; "
        "null if none."
    ),
]


class PendingAnswer(Body):
    """202: the command is durable but no decision arrived in time; poll, or repeat it (same key)."""

    status: str = Field(description='"pending"')
    commandId: str
    runId: str | None = None
    detail: str | None = None


class HistoryEntry(Body):
    type: str = Field(description="The event's type (RunSubmitted, AttemptClaimed, ...).")
    version: int
    eventId: str
    occurredAt: Ms
    occurredAtRfc3339: Rfc3339
    actor: str | None = None
    causationId: str | None = None
    correlationId: str | None = None
    details: dict[str, Any] | None = Field(default=None, description="The event's own fields.")


class AttemptView(Body):
    attemptId: str
    attemptNumber: int | None = Field(description="null for a takeover's attempt (EXE-5)")
    epoch: int
    holder: str
    claimedAt: Ms
    claimedAtRfc3339: Rfc3339
    outcome: str | None
    takeover: bool | None = None


class ExpiryRule(Body):
    leaseSeconds: int
    heartbeatSeconds: int
    atRiskAfterMs: int
    clock: str = Field(description='"coordinator": expiry is judged on the coordinator\'s clock')


class Renewal(Body):
    sequence: int
    at: Ms
    expiresAt: Ms
    expiresAtRfc3339: Rfc3339


class EffectRecord(Body):
    effectId: str
    idempotencyKey: str
    tool: str
    operation: str
    epoch: int
    status: str
    recordedAt: Ms
    recordedAtRfc3339: Rfc3339
    detail: str | None = None
    decidedAt: int | None = None
    decidedAtRfc3339: Rfc3339


class LeaseView(Body):
    """The LEASE-2 record of one lease."""

    leaseId: str
    workId: str
    attemptId: str
    holder: str
    holderKind: str
    holderPrincipal: str | None
    epoch: int = Field(description="The fencing epoch (LEASE-3).")
    issuedAt: Ms
    issuedAtRfc3339: Rfc3339
    expiresAt: Ms
    expiresAtRfc3339: Rfc3339
    expiryRule: ExpiryRule
    certainty: str = Field(description="active, at_risk, expired, released or revoked")
    certaintyChangedAt: int | None
    certaintyChangedAtRfc3339: Rfc3339
    renewals: list[Renewal]
    takeoverReason: str | None
    takeoverEvidence: dict[str, Any] | None
    endedAt: int | None
    endedAtRfc3339: Rfc3339
    effects: list[EffectRecord]


class RunView(Body):
    """A run as GET /runs/{runId} shows it (and every command on a run answers)."""

    runId: str
    tenant: str
    status: str
    statusReason: str | None
    version: int
    idempotencyKey: str | None
    executionSpec: dict[str, Any]
    specDigest: str
    retrySafe: bool
    timeoutSeconds: int
    maxAttempts: int
    labels: dict[str, str]
    agentRevisionId: str | None
    parentRunId: str | None
    deadlineAt: int | None
    deadlineAtRfc3339: Rfc3339
    stop: dict[str, Any] | None
    queueReservationId: str | None
    attempts: list[AttemptView]
    lease: LeaseView | None
    leaseHistory: list[LeaseView]
    submittedAt: Ms
    submittedAtRfc3339: Rfc3339
    updatedAt: Ms
    updatedAtRfc3339: Rfc3339
    submittedBy: str
    history: list[HistoryEntry]
    uploadGrants: list[dict[str, Any]] | None = None
    input: dict[str, Any] | None = None
    resultManifest: list[dict[str, Any]] | None = None
    watchdog: dict[str, Any] | None = Field(
        default=None, description="GET /runs/{runId}: the watchdog's ladder, once it has one (WD-5)."
    )
    asOf: dict[str, Any] | None = Field(default=None, description="With ?asOf: the version shown.")


class RunListPage(Body):
    items: list[RunView]
    nextCursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last.")


class LeaseGrant(Body):
    """A claim's (or takeover's) grant: the Attempt, its lease and fencing epoch."""

    runId: str
    attemptId: str
    attemptNumber: int | None
    leaseId: str
    epoch: int
    holder: str
    holderKind: str
    expiresAt: Ms
    expiresAtRfc3339: Rfc3339
    leaseSeconds: int
    heartbeatIntervalSeconds: int
    serverTime: Ms
    assignment: dict[str, Any] | None = Field(default=None, description="executionSpec and specDigest")
    attemptContext: dict[str, Any] | None = None


class QueueGrant(LeaseGrant):
    queue: str
    tenant: str
    waitedMs: int = Field(
        ge=0,
        description="How long the request waited before its claim was sent; a repeat under the "
        "same Idempotency-Key answers the first request's wait (count it from the first send).",
    )


class HeartbeatAnswer(Body):
    """The renewal; a repeated sequence is answered from the lease as it stands (`replayed`),
    with the same fields: the stop flags (EXE-7/EXE-10) and `watchdog` (WD-5) are always there."""

    attemptId: str
    epoch: int
    sequence: int
    expiresAt: int | None = Field(description="Epoch milliseconds (UTC), on the coordinator's clock.")
    expiresAtRfc3339: Rfc3339
    serverTime: Ms
    certainty: str | None
    runStatus: str
    stopRequested: bool = Field(description="The run is being stopped: finish and report (EXE-7).")
    stopKind: str | None = Field(description="Why it is stopped (cancel, deadline); null if it is not.")
    stopGraceUntil: int | None = Field(description="Epoch ms the stop must be confirmed by; null if none.")
    watchdog: Intervention
    replayed: bool | None = Field(default=None, description="true: this sequence was renewed already.")


class RenewalResult(Body):
    """One item; `accepted` and `replayed` carry the fields of a heartbeat's answer (stop flags
    and `watchdog` included), the other statuses only theirs (`problem`, `commandId`)."""

    attemptId: str
    epoch: int | None = None
    sequence: int | None = None
    status: str = Field(description="accepted, replayed, refused, pending or unavailable")
    expiresAt: int | None = None
    expiresAtRfc3339: Rfc3339
    serverTime: int | None = None
    certainty: str | None = None
    runStatus: str | None = None
    stopRequested: bool | None = None
    stopKind: str | None = None
    stopGraceUntil: int | None = None
    watchdog: Intervention = None
    commandId: str | None = None
    problem: dict[str, Any] | None = Field(default=None, description="A refusal, as a problem body.")


class BatchRenewalAnswer(Body):
    results: list[RenewalResult] = Field(description="One per renewal, in the request's order.")
    accepted: int
    replayed: int
    refused: int
    pending: int
    unavailable: int


class LeaseRecordAnswer(Body):
    runId: str
    runStatus: str
    lease: LeaseView | None
    previousLeases: list[LeaseView]


class InputAcknowledgement(Body):
    acknowledged: bool
    requestId: str
    runStatus: str
    leaseReleased: bool


class UploadGrantAnswer(Body):
    grantId: str
    uploadUrl: str = Field(description="PUT the bytes here.")
    key: str
    artifactId: str
    maxBytes: int
    mediaType: str
    expiresAt: Ms
    expiresAtRfc3339: Rfc3339


class UploadAnswer(Body):
    artifactId: str
    key: str
    digest: str
    sizeBytes: int
    mediaType: str
    artifactRef: str | None = Field(default=None, description="The artifact as the taint graph knows it.")
    taint: str | None = Field(default=None, description="Its taint status (QUA-2).")
