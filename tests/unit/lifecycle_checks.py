"""What the Run lifecycle state machine (tests/unit/test_lifecycle_machine.py) checks after each
step: the per-event checks (`_check_step`, `_check_fenced`) and the hypothesis invariants, as a
mixin of that machine. The requirement each proves is in the machine's docstring."""

from __future__ import annotations

from typing import Any

from hypothesis.stateful import invariant

from services.common.contracts import (
    AttemptClaimed,
    AttemptReported,
    LeaseTakenOver,
    ReportAttempt,
    RunCancelled,
    RunCancelRequested,
    RunCommand,
    RunEvent,
    RunRequeued,
    RunRetried,
)
from services.lease_coordinator.domain import (
    TERMINAL_STATUSES,
    Decision,
    Rejection,
    RejectionCode,
    RunState,
    RunStatus,
    decide_timers,
    fold,
    next_timer_at,
)

__all__ = ["LifecycleChecks"]

_LIVE = (RunStatus.PREPARING, RunStatus.RUNNING, RunStatus.CANCELLING)


def _is_rejection(decision: Decision) -> bool:
    return isinstance(decision, Rejection)


class LifecycleChecks:
    """The machine's checks; the machine holds the state they read (state, events, grants, ...)."""

    state: RunState | None
    events: list[RunEvent]
    grants: list[tuple[str, str, int]]
    terminal: RunStatus | None
    first_claim_at: int | None
    cancel_ever: bool
    cancel_in_force: bool
    now: int
    policy: Any

    @property
    def run(self) -> RunState:
        raise NotImplementedError

    def _check_step(
        self, before: RunState | None, event: RunEvent, after: RunState, cause: RunCommand | None
    ) -> None:
        assert event.version == (before.version if before else 0) + 1, "versions go +1"
        assert after.version == event.version
        assert event.occurred_at == self.now, "events are stamped with the coordinator's now"
        if before is None:
            return
        assert before.status not in TERMINAL_STATUSES, (
            f"{type(event).__name__} after the run ended {before.status.value}"
        )
        if isinstance(event, (AttemptClaimed, LeaseTakenOver)):
            # LEASE-3: one holder per epoch, epoch + 1 per change of holder, never reused.
            assert event.epoch == before.epoch + 1
            assert event.epoch not in {epoch for _, _, epoch in self.grants}
            if isinstance(event, AttemptClaimed):
                assert before.lease is None or not before.lease.held, "a claim while a lease is held"
            else:
                assert before.lease is not None and before.lease.held, "a takeover of no held lease"
            self.grants.append((event.holder, event.attempt_id, event.epoch))
        if isinstance(event, AttemptClaimed):
            if before.deadline_at is not None:
                assert event.occurred_at < before.deadline_at, "EXE-10: assigned past its deadline"
            if self.first_claim_at is None:
                self.first_claim_at = event.occurred_at
            assert event.deadline_at == self.first_claim_at + self.run.timeout_seconds * 1000, (
                "EXE-10: the deadline is first assignment + timeoutSeconds"
            )
        if before.deadline_at is not None:
            assert after.deadline_at == before.deadline_at, "EXE-10: the deadline never moves"
        if isinstance(event, (RunCancelRequested, RunCancelled)):
            self.cancel_ever = self.cancel_in_force = True
        if isinstance(event, RunRetried):
            # The user's own explicit retry (EXE-5) is the only thing that reopens a cancelled run.
            self.cancel_in_force = False
        if isinstance(event, RunRequeued):
            assert not self.cancel_ever, f"EXE-7: automatic requeue ({event.reason}) after a cancel"
        if after.status is RunStatus.SUCCEEDED:
            assert not self.cancel_in_force, "EXE-7: a late success overrode an accepted cancel"
            assert isinstance(event, AttemptReported) and event.outcome == "succeeded"
            assert isinstance(cause, ReportAttempt)
            assert cause.outcome == "succeeded" and cause.manifest_verified, (
                "EXE-1: succeeded without a verified ResultManifest"
            )
        if after.status in TERMINAL_STATUSES:
            self.terminal = after.status

    def _check_fenced(self, before: RunState, epoch: int, decision: Decision) -> None:
        """EXE-4/LEASE-3: only the live lease's current epoch is ever accepted."""
        lease = before.lease
        live = lease is not None and lease.held and self.now < lease.expires_at
        if not _is_rejection(decision) and decision:
            assert live and lease is not None and epoch == lease.epoch == before.epoch
        if lease is not None and epoch < lease.epoch:
            assert isinstance(decision, Rejection) and decision.code is RejectionCode.STALE_EPOCH

    @invariant()
    def replay_equals_incremental(self) -> None:
        if self.state is None:
            return
        assert [e.version for e in self.events] == list(range(1, len(self.events) + 1))
        assert fold(self.events) == self.state, "DUR-1: replay gives the same state"

    @invariant()
    def leases_and_epochs(self) -> None:
        if self.state is None:
            return
        state = self.state
        epochs = [epoch for _, _, epoch in self.grants]
        assert epochs == list(range(1, len(epochs) + 1)), "LEASE-3: epochs 1, 2, 3, ... one per grant"
        assert state.epoch == (epochs[-1] if epochs else 0)
        held = state.lease is not None and state.lease.held
        assert held == (state.status in _LIVE), f"lease held={held} while {state.status.value}"
        if state.lease is not None:
            assert state.lease.epoch == state.epoch, "the current lease is the newest grant"

    @invariant()
    def terminal_is_forever(self) -> None:
        if self.terminal is not None:
            assert self.run.status is self.terminal, "a terminal status changed"
            assert next_timer_at(self.state) is None, "an ended run has no timer"

    @invariant()
    def nothing_is_decided_before_its_timer(self) -> None:
        """The processor wakes a run only at next_timer_at: nothing may be due before it."""
        if self.state is None:
            return
        due = next_timer_at(self.state)
        if due is None or due > self.now:
            assert decide_timers(self.state, self.now, self.policy) == ()

    @invariant()
    def event_ids_are_unique(self) -> None:
        ids = [e.event_id for e in self.events]
        assert len(ids) == len(set(ids)), f"an event id was issued twice: {ids}"

    @invariant()
    def deadline_is_first_assignment_plus_timeout(self) -> None:
        if self.state is None or self.state.deadline_at is None:
            return
        assert self.first_claim_at is not None
        assert self.state.deadline_at == self.first_claim_at + self.state.timeout_seconds * 1000
