"""The lease holder's side of a Run: claims, heartbeats, reports with their ResultManifest,
announced external effects and upload grants, as immutable values.

Times are epoch millis. Avro arrays are tuples here (of strings, or of ArtifactEntry records),
so values stay immutable and hashable; runs.py maps them to and from the wire.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.contracts._headers import CommandHeader, EventHeader

__all__ = [
    "ArtifactEntry",
    "AttemptClaimed",
    "AttemptReported",
    "BatchedRenewal",
    "ClaimRun",
    "EffectIntentRecorded",
    "EffectOutcomeRecorded",
    "LeaseAtRisk",
    "LeaseExpired",
    "LeaseRenewed",
    "LeaseTakenOver",
    "RecordEffectIntent",
    "RecordEffectOutcome",
    "RenewLease",
    "RenewLeases",
    "ReportAttempt",
    "RequestUploadGrant",
    "RunRequeued",
    "TakeOverLease",
    "UploadGrantIssued",
    "holder_principal",
]


@dataclass(frozen=True, kw_only=True)
class ArtifactEntry:
    """One object of a ResultManifest (Avro record tenure.runs.ArtifactEntry, EXE-15).

    `digest` is "sha256:<lowercase hex>"; an artifact is named by id and digest, never a URL.
    """

    artifact_id: str
    digest: str
    size_bytes: int
    media_type: str


# --- commands -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ClaimRun(CommandHeader):
    """A runner or human asks for a queued Run; 0 seconds means the deployment default."""

    runner_id: str
    holder_kind: str = "runner"
    capabilities: tuple[str, ...] = ()
    lease_seconds: int = 0
    heartbeat_seconds: int = 0


@dataclass(frozen=True, kw_only=True)
class RenewLease(CommandHeader):
    """The holder's heartbeat, fenced by attempt id and lease epoch (EXE-4)."""

    attempt_id: str
    lease_epoch: int
    sequence: int


@dataclass(frozen=True, kw_only=True)
class BatchedRenewal:
    """One RenewLease of a RenewLeases batch (Avro record tenure.runs.commands.BatchedRenewal):
    its own fields, without the ones the envelope carries for every entry."""

    command_id: str
    run_id: str
    correlation_id: str
    attempt_id: str
    lease_epoch: int
    sequence: int


@dataclass(frozen=True, kw_only=True)
class RenewLeases(CommandHeader):
    """Many RenewLease commands in one record, for runs of one runs.commands partition (issue 16).

    Not a command of the Run aggregate: a transport envelope. The coordinator opens it with
    `commands()` and decides each entry as the RenewLease it is, by the entry's own command id,
    so a batch is fenced, deduplicated and answered exactly as its heartbeats one by one would
    be. `run_id` is the first entry's (the record key); `command_id` names the envelope."""

    renewals: tuple[BatchedRenewal, ...]

    def commands(self) -> tuple[RenewLease, ...]:
        return tuple(
            RenewLease(
                command_id=entry.command_id,
                run_id=entry.run_id,
                issued_at=self.issued_at,
                correlation_id=entry.correlation_id,
                actor=self.actor,
                attempt_id=entry.attempt_id,
                lease_epoch=entry.lease_epoch,
                sequence=entry.sequence,
            )
            for entry in self.renewals
        )

    @staticmethod
    def of(command_id: str, correlation_id: str, commands: tuple[RenewLease, ...]) -> RenewLeases:
        """The envelope of `commands`, which share one issuedAt and actor (as one request's do)."""
        first = commands[0]
        if any(c.issued_at != first.issued_at or c.actor != first.actor for c in commands):
            raise ValueError("a RenewLeases batch carries one issuedAt and one actor for all its entries")
        return RenewLeases(
            command_id=command_id,
            run_id=first.run_id,
            issued_at=first.issued_at,
            correlation_id=correlation_id,
            actor=first.actor,
            renewals=tuple(
                BatchedRenewal(
                    command_id=c.command_id,
                    run_id=c.run_id,
                    correlation_id=c.correlation_id,
                    attempt_id=c.attempt_id,
                    lease_epoch=c.lease_epoch,
                    sequence=c.sequence,
                )
                for c in commands
            ),
        )


@dataclass(frozen=True, kw_only=True)
class ReportAttempt(CommandHeader):
    """The holder's terminal report of its Attempt: outcome "succeeded" or "failed".

    `manifest_verified` and `manifest_problem` are set by the API after it checked the stored
    objects, never by the runner: "succeeded" needs a verified manifest (EXE-1, EXE-15).
    """

    attempt_id: str
    lease_epoch: int
    sequence: int
    outcome: str
    error_code: str = ""
    detail: str = ""
    manifest: tuple[ArtifactEntry, ...] = ()
    manifest_verified: bool = False
    manifest_problem: str = ""


@dataclass(frozen=True, kw_only=True)
class TakeOverLease(CommandHeader):
    """Revoke the current lease and issue a new one to `new_holder` (LEASE-6, LEASE-7)."""

    reason: str
    new_holder: str
    holder_kind: str = "runner"
    lease_seconds: int = 0


@dataclass(frozen=True, kw_only=True)
class RecordEffectIntent(CommandHeader):
    """The holder announces an external effect before causing it (intent before action)."""

    attempt_id: str
    lease_epoch: int
    effect_id: str
    idempotency_key: str
    tool: str
    operation: str


@dataclass(frozen=True, kw_only=True)
class RecordEffectOutcome(CommandHeader):
    """How an announced effect ended: "committed", "failed" or "unknown"."""

    attempt_id: str
    lease_epoch: int
    effect_id: str
    outcome: str
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class RequestUploadGrant(CommandHeader):
    """The holder asks to upload one artifact to the relative file name `destination` (EXE-15)."""

    attempt_id: str
    lease_epoch: int
    destination: str
    max_bytes: int
    media_type: str


# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AttemptClaimed(EventHeader):
    """A new Attempt and its lease, issued together; times are epoch millis.

    `deadline_at` is fixed at the Run's first assignment and repeated on later claims (EXE-10).
    """

    attempt_id: str
    attempt_number: int
    lease_id: str
    epoch: int
    holder: str
    holder_kind: str
    capabilities: tuple[str, ...]
    lease_seconds: int
    heartbeat_seconds: int
    at_risk_after_ms: int
    expires_at: int
    deadline_at: int | None = None


@dataclass(frozen=True, kw_only=True)
class LeaseRenewed(EventHeader):
    """An accepted heartbeat; `run_started` when it moved the Run preparing -> running."""

    attempt_id: str
    lease_id: str
    epoch: int
    sequence: int
    expires_at: int
    run_started: bool = False


@dataclass(frozen=True, kw_only=True)
class LeaseAtRisk(EventHeader):
    """No renewal for the lease's at-risk interval: jeopardy, not yet expiry (LEASE-4)."""

    attempt_id: str
    lease_id: str
    epoch: int
    last_renewal_at: int
    expires_at: int


@dataclass(frozen=True, kw_only=True)
class LeaseExpired(EventHeader):
    """The lease passed `expires_at` (the rule's deadline; `occurred_at` is the timer's decision)."""

    attempt_id: str
    lease_id: str
    epoch: int
    expires_at: int
    last_renewal_at: int
    last_sequence: int


@dataclass(frozen=True, kw_only=True)
class RunRequeued(EventHeader):
    """The Run went back to the queue for another Attempt, e.g. reason "LEASE_EXPIRED"."""

    reason: str
    attempts_used: int
    attempts_remaining: int


@dataclass(frozen=True, kw_only=True)
class LeaseTakenOver(EventHeader):
    """The previous lease revoked and a new one issued with a higher epoch, and why."""

    previous_attempt_id: str
    previous_lease_id: str
    previous_epoch: int
    previous_holder: str
    attempt_id: str
    lease_id: str
    epoch: int
    holder: str
    holder_kind: str
    reason: str
    last_renewal_at: int
    last_sequence: int
    effects_attempted: tuple[str, ...]
    lease_seconds: int
    heartbeat_seconds: int
    at_risk_after_ms: int
    expires_at: int


def holder_principal(event: AttemptClaimed | LeaseTakenOver) -> str:
    """Who may speak for the lease `event` issued (LEASE-1): the principal that claimed it, or
    the holder a takeover named. The one rule for the projections and the effect gateway."""
    return event.actor if isinstance(event, AttemptClaimed) else event.holder


@dataclass(frozen=True, kw_only=True)
class AttemptReported(EventHeader):
    """The holder's accepted terminal report of its Attempt, with the manifest it carried."""

    attempt_id: str
    lease_id: str
    epoch: int
    sequence: int
    outcome: str
    error_code: str
    detail: str
    manifest: tuple[ArtifactEntry, ...] = ()


@dataclass(frozen=True, kw_only=True)
class EffectIntentRecorded(EventHeader):
    """An external effect announced under a lease before it was caused."""

    attempt_id: str
    lease_id: str
    epoch: int
    effect_id: str
    idempotency_key: str
    tool: str
    operation: str


@dataclass(frozen=True, kw_only=True)
class EffectOutcomeRecorded(EventHeader):
    """The recorded outcome of an announced effect."""

    attempt_id: str
    lease_id: str
    epoch: int
    effect_id: str
    outcome: str
    detail: str


@dataclass(frozen=True, kw_only=True)
class UploadGrantIssued(EventHeader):
    """A grant to upload one object under `key_prefix`, at most `max_bytes`, until `expires_at`
    (EXE-15). A grant alone never makes the Run succeed; a verified manifest does (EXE-1)."""

    grant_id: str
    attempt_id: str
    epoch: int
    destination: str
    key_prefix: str
    max_bytes: int
    media_type: str
    expires_at: int
