"""Values of the Run aggregate: its state, its current lease, decisions and the lease policy."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Mapping, Union

from services.common.contracts import RejectionCode, RunEvent
from services.common.contracts.ids import attempt_id_for, lease_id_for, run_id_of_attempt
from services.common.ids import derived_id
from services.lease_coordinator.domain.lifecycle import LeaseCertainty, RunStatus

__all__ = [
    "COORDINATOR_ACTOR",
    "DEFAULT_POLICY",
    "KEEPALIVE_SUMMARY_TTLS",
    "MAX_KEEPALIVE_TTLS",
    "RECENT_COMMANDS_KEPT",
    "RECENT_RENEWALS_KEPT",
    "Decision",
    "EffectRecord",
    "InputWait",
    "LeasePolicy",
    "LeaseState",
    "Rejection",
    "RejectionCode",
    "RunState",
    "StopKind",
    "StopRequest",
    "TenantLoad",
    "attempt_id_for",
    "command_event_header",
    "event_header",
    "lease_id_for",
    "reservations",
    "run_id_of_attempt",
]

COORDINATOR_ACTOR = "tenure-coordinator"
# Redelivery after a crash only ever repeats the last batch, so a short window of recent command
# ids is enough to drop repeats; renewals have a window of their own (RECENT_RENEWALS_KEPT).
RECENT_COMMANDS_KEPT = 64
# Renewals are most of a long run's commands, so they are kept apart and fewer: a handover
# redelivers what was consumed since the last offset commit (well under a second of traffic),
# and eight renewals are minutes of heartbeats at the EXE-4 interval. A renewal redelivered
# after it left the window is refused by its sequence, as a client's resend is (issue 16).
RECENT_RENEWALS_KEPT = 8
# Issue 16: the TTLs between two renewals of an active lease on runs.events, by default (an hour
# at the default 90 s lease), and the most a policy may set (a bound, so the product stays a
# number of milliseconds Avro and JSON hold).
KEEPALIVE_SUMMARY_TTLS = 40.0
MAX_KEEPALIVE_TTLS = 1000.0


@dataclass(frozen=True)
class Rejection:
    code: RejectionCode
    detail: str


Decision = Union[tuple[RunEvent, ...], Rejection]


@dataclass(frozen=True)
class LeasePolicy:
    """Deployment-wide lease rules (EXE-4 defaults), passed into `decide` as a value."""

    default_lease_ms: int = 90_000
    default_heartbeat_ms: int = 20_000
    # Two whole-second heartbeats must fit in the shortest lease.
    min_lease_ms: int = 2_000
    max_lease_ms: int = 3_600_000
    # No confirmed renewal for this fraction of the TTL: the coordinator marks the lease at risk.
    at_risk_fraction: float = 0.5
    # How long a runner has to confirm a cancel or a deadline stop before the run is interrupted.
    stop_grace_ms: int = 30_000
    # The organisation's policy on automatic retries (EXE-5); runs must also be retry-safe.
    auto_retry: bool = True
    # EXE-2 admission, per tenant: runs waiting in the queue, runs holding an active slot
    # (0 = no limit); `tenant_limits` overrides both for named tenants.
    max_queued_per_tenant: int = 0
    max_active_per_tenant: int = 0
    tenant_limits: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # Upload grants (EXE-15): how large and how long-lived a grant may be.
    max_upload_bytes: int = 1 << 30
    upload_grant_ms: int = 15 * 60_000
    # Issue 16: a renewal stays off runs.events (kept, on runs.renewals) while the lease's last
    # renewal on runs.events is younger than this many TTLs; 0 puts every one there. The default
    # puts one there an hour at the default 90 s TTL, a periodic summary: every renewal is on
    # runs.renewals (LEASE-2's history), and the API's views merge them (docs/architecture.md).
    keepalive_fraction: float = KEEPALIVE_SUMMARY_TTLS

    def __post_init__(self) -> None:
        if not 0 < self.at_risk_fraction < 1:
            raise ValueError("at_risk_fraction must be between 0 and 1")
        if not 0 <= self.keepalive_fraction <= MAX_KEEPALIVE_TTLS:
            raise ValueError(f"keepalive_fraction must be at least 0 and at most {MAX_KEEPALIVE_TTLS}")
        if not self.min_lease_ms <= self.default_lease_ms <= self.max_lease_ms:
            raise ValueError("the default lease must lie within the bounds")

    def limits_for(self, tenant: str) -> tuple[int, int]:
        """(max queued, max active) for a tenant; 0 means unlimited."""
        return self.tenant_limits.get(tenant, (self.max_queued_per_tenant, self.max_active_per_tenant))


DEFAULT_POLICY = LeasePolicy()


@dataclass(frozen=True)
class TenantLoad:
    """A tenant's reservations right now: runs queued and runs holding an active slot (EXE-2)."""

    queued: int = 0
    active: int = 0


# Which statuses hold which reservation: a queue place while queued, the active-execution slot
# from claim to finalisation (EXE-2). Waiting for input or for a retry holds neither.
ACTIVE_STATUSES = frozenset({RunStatus.PREPARING, RunStatus.RUNNING, RunStatus.CANCELLING})


def reservations(state: RunState | None) -> TenantLoad:
    if state is None:
        return TenantLoad()
    return TenantLoad(
        queued=1 if state.status is RunStatus.QUEUED else 0,
        active=1 if state.status in ACTIVE_STATUSES else 0,
    )


@dataclass(frozen=True, kw_only=True)
class LeaseState:
    attempt_id: str
    lease_id: str
    epoch: int
    holder: str
    holder_kind: str
    lease_ms: int
    heartbeat_ms: int
    at_risk_after_ms: int
    issued_at: int
    expires_at: int
    last_renewal_at: int
    last_sequence: int
    certainty: LeaseCertainty
    capabilities: tuple[str, ...] = ()

    @property
    def held(self) -> bool:
        return self.certainty in (LeaseCertainty.ACTIVE, LeaseCertainty.AT_RISK)


class StopKind(StrEnum):
    CANCEL = "cancel"
    DEADLINE = "deadline"


@dataclass(frozen=True)
class StopRequest:
    """A stop the runner was asked to confirm (EXE-7 cancel, EXE-10 deadline)."""

    kind: StopKind
    requested_at: int
    grace_until: int
    reason: str


@dataclass(frozen=True)
class InputWait:
    """EXE-8: what the run waits for while `waiting_input`, and until when."""

    request_id: str
    checkpoint_digest: str
    expires_at: int


@dataclass(frozen=True)
class EffectRecord:
    effect_id: str
    epoch: int
    outcome: str  # "intended" until an outcome is recorded


@dataclass(frozen=True, kw_only=True)
class RunState:
    run_id: str
    version: int
    status: RunStatus
    tenant: str
    idempotency_key: str
    execution_spec: str
    spec_digest: str
    retry_safe: bool
    timeout_seconds: int
    max_attempts: int
    submitted_at: int
    # The queue place and budget reserved at submission (EXE-2); None once released.
    queue_reservation_id: str | None
    # The most recent command ids decided for this run, oldest first (see RECENT_COMMANDS_KEPT).
    handled_commands: tuple[str, ...] = ()
    # The highest fencing epoch ever issued for this run (LEASE-3); 0 before the first claim.
    epoch: int = 0
    attempts_used: int = 0
    # The current or most recently ended lease; its record is the evidence for a takeover.
    lease: LeaseState | None = None
    effects: tuple[EffectRecord, ...] = field(default_factory=tuple)
    # EXE-10: fixed at the first assignment, never moved by a continuation.
    deadline_at: int | None = None
    stop: StopRequest | None = None
    # EXE-7: once a cancel was accepted, no automatic retry ever happens.
    cancel_accepted_at: int | None = None
    parent_run_id: str | None = None
    input_wait: InputWait | None = None
    # Response ids already accepted: a repeated responseId creates no further attempt (EXE-8).
    input_responses: tuple[str, ...] = ()
    # Set by an accepted input: the next claim continues the run (EXE-5) and uses no retry.
    continuation_of: str | None = None
    attempts_started: int = 0
    # The principal who submitted the run: the block policy is re-checked for it at claim (EXE-2).
    submitted_by: str = ""
    # EXE-14: what the run runs (the agent revision a schedule or the submitter named); None when
    # none was named. States stored before this field existed decode with None.
    agent_revision_id: str | None = None
    # The most recent accepted renewals' command ids, oldest first (RECENT_RENEWALS_KEPT), across
    # attempts: a redelivered renewal is dropped like any handled command (issue 16). States
    # stored before this field existed decode with ().
    handled_renewals: tuple[str, ...] = ()

    def remember(self, command_id: str) -> tuple[str, ...]:
        if command_id in self.handled_commands:
            return self.handled_commands
        return (*self.handled_commands, command_id)[-RECENT_COMMANDS_KEPT:]

    def remember_renewal(self, command_id: str) -> tuple[str, ...]:
        if command_id in self.handled_renewals:
            return self.handled_renewals
        return (*self.handled_renewals, command_id)[-RECENT_RENEWALS_KEPT:]

    def handled(self, command_id: str) -> bool:
        """Whether this command was decided already: its redelivery changes nothing."""
        return command_id in self.handled_commands or command_id in self.handled_renewals

    def effect(self, effect_id: str) -> EffectRecord | None:
        return next((e for e in self.effects if e.effect_id == effect_id), None)


def event_header(
    state: RunState, cause: str, kind: str, correlation_id: str, actor: str, now_ms: int, offset: int = 1
) -> dict[str, Any]:
    """The fields every Run event carries: an id derived from its cause and kind (so re-deciding
    gives the same event), the next version (`offset` for a second event of one decision), and
    the coordinator's `now`."""
    return {
        "event_id": derived_id("evt", cause, kind),
        "run_id": state.run_id,
        "version": state.version + offset,
        "occurred_at": now_ms,
        "causation_id": cause,
        "correlation_id": correlation_id,
        "actor": actor,
    }


def command_event_header(state: RunState, command: Any, kind: str, now_ms: int) -> dict[str, Any]:
    """`event_header` for an event a command caused, by that command's actor."""
    return event_header(state, command.command_id, kind, command.correlation_id, command.actor, now_ms)
