"""A Run driven through the lease protocol's pure core: command builders and the `Run` test
builder shared by the lease tests (no Kafka, no clock reads).
"""

from __future__ import annotations

import itertools
from typing import Any

from services.common.contracts import (
    AttemptClaimed,
    ClaimRun,
    LeaseExpired,
    LeaseRenewed,
    LeaseTakenOver,
    RecordEffectIntent,
    RecordEffectOutcome,
    RenewLease,
    ReportAttempt,
    RunCommand,
    RunEvent,
    TakeOverLease,
)
from services.lease_coordinator.domain import (
    DEFAULT_POLICY,
    Decision,
    LeasePolicy,
    Rejection,
    RejectionCode,
    RunState,
    RunStatus,
    decide,
    decide_timers,
    evolve,
)
from tests.unit.strategies import submit_command

__all__ = [
    "T0",
    "Run",
    "claim_cmd",
    "command_id_for",
    "events_of",
    "intent_cmd",
    "outcome_cmd",
    "rejection_of",
    "renew_cmd",
    "report_cmd",
    "takeover_cmd",
]

T0 = 1_767_225_600_000
_ids = itertools.count()


def command_id_for(kind: str) -> str:
    return f"cmd-{kind}-{next(_ids)}"


# --- command builders (shared with test_lease_timers_processor.py and test_lease_views.py) ----


def _head(run_id: str, kind: str, command_id: str | None, correlation_id: str, actor: str) -> dict[str, Any]:
    return {
        "command_id": command_id or command_id_for(kind),
        "run_id": run_id,
        "issued_at": T0,
        "correlation_id": correlation_id,
        "actor": actor,
    }


def claim_cmd(
    run_id: str,
    runner: str = "runner-a",
    *,
    command_id: str | None = None,
    holder_kind: str = "runner",
    lease_seconds: int = 0,
    heartbeat_seconds: int = 0,
) -> ClaimRun:
    return ClaimRun(
        **_head(run_id, "claim", command_id, f"corr-{run_id}", f"runner:{runner}"),
        runner_id=runner,
        holder_kind=holder_kind,
        capabilities=("checkpoint-v1",),
        lease_seconds=lease_seconds,
        heartbeat_seconds=heartbeat_seconds,
    )


def renew_cmd(
    run_id: str,
    attempt_id: str,
    epoch: int,
    sequence: int,
    *,
    command_id: str | None = None,
    issued_at: int = T0,
) -> RenewLease:
    head = {**_head(run_id, "renew", command_id, attempt_id, "runner"), "issued_at": issued_at}
    return RenewLease(**head, attempt_id=attempt_id, lease_epoch=epoch, sequence=sequence)


def report_cmd(
    run_id: str,
    attempt_id: str,
    epoch: int,
    sequence: int,
    outcome: str = "succeeded",
    *,
    command_id: str | None = None,
    error_code: str = "",
) -> ReportAttempt:
    return ReportAttempt(
        **_head(run_id, "report", command_id, attempt_id, "runner"),
        attempt_id=attempt_id,
        lease_epoch=epoch,
        sequence=sequence,
        outcome=outcome,
        error_code=error_code,
        detail=f"reported {outcome}",
        # The API verified an (empty) ResultManifest; without it a success is recorded as failed.
        manifest_verified=outcome == "succeeded",
    )


def takeover_cmd(
    run_id: str,
    reason: str = "runner wedged; operator takes over",
    new_holder: str = "operator:olga",
    *,
    holder_kind: str = "human",
    lease_seconds: int = 0,
    command_id: str | None = None,
) -> TakeOverLease:
    return TakeOverLease(
        **_head(run_id, "takeover", command_id, f"corr-{run_id}", "user:olga"),
        reason=reason,
        new_holder=new_holder,
        holder_kind=holder_kind,
        lease_seconds=lease_seconds,
    )


def intent_cmd(
    run_id: str, attempt_id: str, epoch: int, effect_id: str, *, command_id: str | None = None
) -> RecordEffectIntent:
    return RecordEffectIntent(
        **_head(run_id, "intent", command_id, attempt_id, "runner"),
        attempt_id=attempt_id,
        lease_epoch=epoch,
        effect_id=effect_id,
        idempotency_key=f"idem-{effect_id}",
        tool="payments",
        operation="refund",
    )


def outcome_cmd(
    run_id: str,
    attempt_id: str,
    epoch: int,
    effect_id: str,
    outcome: str = "committed",
    *,
    command_id: str | None = None,
) -> RecordEffectOutcome:
    return RecordEffectOutcome(
        **_head(run_id, "outcome", command_id, attempt_id, "runner"),
        attempt_id=attempt_id,
        lease_epoch=epoch,
        effect_id=effect_id,
        outcome=outcome,
        detail=f"gateway said {outcome}",
    )


def events_of(decision: Decision) -> tuple[RunEvent, ...]:
    assert not isinstance(decision, Rejection), f"expected events, got {decision}"
    return decision


def rejection_of(decision: Decision) -> Rejection:
    assert isinstance(decision, Rejection), f"expected a rejection, got {decision}"
    return decision


class Run:
    """One run driven through the pure aggregate on a hand-moved clock, keeping its event log."""

    def __init__(
        self,
        *,
        retry_safe: bool = False,
        max_attempts: int = 3,
        now: int = T0,
        policy: LeasePolicy = DEFAULT_POLICY,
    ) -> None:
        self.now = now
        self.policy = policy
        submit = submit_command(
            retry_safe=retry_safe, max_attempts=max_attempts, command_id=command_id_for("submit")
        )
        self.run_id = submit.run_id
        self.events: list[RunEvent] = []
        self._state: RunState | None = None
        self.apply(events_of(decide(None, submit, now)))

    @property
    def state(self) -> RunState:
        assert self._state is not None
        return self._state

    def at(self, ms: int) -> Run:
        assert ms >= self.now, "the coordinator's clock never goes back"
        self.now = ms
        return self

    def decide(self, command: RunCommand) -> Decision:
        return decide(self.state, command, self.now, self.policy)

    def accept(self, command: RunCommand) -> tuple[RunEvent, ...]:
        events = events_of(self.decide(command))
        self.apply(events)
        return events

    def refuse(self, command: RunCommand, code: RejectionCode) -> Rejection:
        before = self.state
        rejection = rejection_of(self.decide(command))
        assert rejection.code is code, rejection
        assert self.state == before
        return rejection

    def tick(self) -> tuple[RunEvent, ...]:
        events = decide_timers(self.state, self.now, self.policy)
        self.apply(events)
        return events

    def apply(self, events: tuple[RunEvent, ...]) -> None:
        for event in events:
            self._state = evolve(self._state, event)
            self.events.append(event)

    # --- the common moves -----------------------------------------------------------------------

    def claim(self, runner: str = "runner-a", **kwargs: Any) -> AttemptClaimed:
        (event,) = self.accept(claim_cmd(self.run_id, runner, **kwargs))
        assert isinstance(event, AttemptClaimed)
        return event

    def renew(self, sequence: int, attempt_id: str | None = None, epoch: int | None = None) -> LeaseRenewed:
        lease = self.state.lease
        assert lease is not None
        (event,) = self.accept(
            renew_cmd(self.run_id, attempt_id or lease.attempt_id, epoch or lease.epoch, sequence)
        )
        assert isinstance(event, LeaseRenewed)
        return event

    def take_over(self, **kwargs: Any) -> LeaseTakenOver:
        (event,) = self.accept(takeover_cmd(self.run_id, **kwargs))
        assert isinstance(event, LeaseTakenOver)
        return event

    def reach(self, status: RunStatus) -> Run:
        """Drive the run to `status` the ordinary way: claim, renew, report, or let it expire."""
        if status is not RunStatus.QUEUED:
            self.claim()
        if status in (RunStatus.RUNNING, RunStatus.SUCCEEDED):
            self.renew(1)
        if status is RunStatus.INTERRUPTED:
            self.expire()
        if status in (RunStatus.SUCCEEDED, RunStatus.FAILED):
            lease = self.state.lease
            assert lease is not None
            self.accept(report_cmd(self.run_id, lease.attempt_id, lease.epoch, 2, status.value))
        assert self.state.status is status
        return self

    def expire(self) -> tuple[RunEvent, ...]:
        """Let the current lease run out and the coordinator's timer see it."""
        lease = self.state.lease
        assert lease is not None
        self.at(max(self.now, lease.expires_at))
        events = self.tick()
        assert events and isinstance(events[0], LeaseExpired)
        return events
