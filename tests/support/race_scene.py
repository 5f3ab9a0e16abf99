"""A run frozen at one moment, and the two orders in which the reconciler's timers and a command can
reach it: the scenes the reconciler race tests build (EXE-4, EXE-7, EXE-8, EXE-10)."""

from __future__ import annotations

import dataclasses

from services.common.contracts import (
    CancelRun,
    ProvideInput,
    RequestInput,
    RunCommand,
    RunEvent,
)
from services.lease_coordinator.domain import (
    Decision,
    LeasePolicy,
    Rejection,
    RunState,
    RunStatus,
    decide,
    decide_timers,
    evolve,
    next_timer_at,
)
from tests.support.lease_run import T0, claim_cmd, renew_cmd, report_cmd
from tests.unit.strategies import submit_command

__all__ = [
    "GRACE_MS",
    "MAX_TIMER_ROUNDS",
    "POLICY",
    "Outcome",
    "Scene",
    "answer",
    "at_deadline",
    "cancel",
    "cancel_confirmation",
    "cancelling",
    "command_then_timers",
    "event_types",
    "request_input",
    "running",
    "success_report",
    "timers_then_command",
    "waiting_for_input",
]

GRACE_MS = 30_000
POLICY = LeasePolicy(stop_grace_ms=GRACE_MS)
MAX_TIMER_ROUNDS = 8


# --- a run frozen at one moment, and the two orders ------------------------------------------


@dataclasses.dataclass(frozen=True)
class Scene:
    """A run's state and the coordinator's `now`; immutable, so both orders start from it."""

    state: RunState
    now: int
    policy: LeasePolicy = POLICY

    def at(self, now: int) -> Scene:
        assert now >= self.now, "the coordinator's clock never goes back"
        return dataclasses.replace(self, now=now)

    def decide(self, command: RunCommand) -> Decision:
        return decide(self.state, command, self.now, self.policy)

    def accept(self, command: RunCommand) -> Scene:
        decision = self.decide(command)
        assert not isinstance(decision, Rejection), decision
        return self.applied(decision)

    def applied(self, events: tuple[RunEvent, ...]) -> Scene:
        state = self.state
        for event in events:
            state = evolve(state, event)
        return dataclasses.replace(self, state=state)

    def reconcile(self) -> tuple[tuple[RunEvent, ...], Scene]:
        """`decide_timers` until nothing is due, as the coordinator's timer tick does."""
        scene: Scene = self
        emitted: tuple[RunEvent, ...] = ()
        for _ in range(MAX_TIMER_ROUNDS):
            events = decide_timers(scene.state, scene.now, scene.policy)
            if not events:
                due = next_timer_at(scene.state)
                assert due is None or due > scene.now, "a due timer was left undecided"
                return emitted, scene
            emitted, scene = (*emitted, *events), scene.applied(events)
        raise AssertionError(f"the reconciler never settled: {emitted}")


@dataclasses.dataclass(frozen=True)
class Outcome:
    decision: Decision
    timer_events: tuple[RunEvent, ...]
    final: RunState

    @property
    def refused(self) -> Rejection:
        assert isinstance(self.decision, Rejection), f"expected a refusal, got {self.decision}"
        return self.decision

    @property
    def accepted(self) -> tuple[RunEvent, ...]:
        assert not isinstance(self.decision, Rejection), f"expected events, got {self.decision}"
        return self.decision


def command_then_timers(scene: Scene, command: RunCommand) -> Outcome:
    decision = scene.decide(command)
    after = scene if isinstance(decision, Rejection) else scene.applied(decision)
    if isinstance(decision, Rejection):
        assert after.state == scene.state
    timer_events, final = after.reconcile()
    return Outcome(decision, timer_events, final.state)


def timers_then_command(scene: Scene, command: RunCommand) -> Outcome:
    timer_events, after = scene.reconcile()
    decision = after.decide(command)
    if isinstance(decision, Rejection):
        return Outcome(decision, timer_events, after.state)
    return Outcome(decision, timer_events, after.applied(decision).state)


def event_types(events: tuple[RunEvent, ...]) -> list[str]:
    return [type(e).__name__ for e in events]


# --- building the scenes ----------------------------------------------------------------------


def running(
    *, timeout_seconds: int = 3600, retry_safe: bool = False, lease_seconds: int = 60, max_attempts: int = 3
) -> Scene:
    """Submitted and claimed at T0 by runner-a, first heartbeat at T0 + 1 s: running."""
    submit = submit_command(
        command_id=f"race-submit-{timeout_seconds}-{retry_safe}-{lease_seconds}",
        timeout_seconds=timeout_seconds,
        retry_safe=retry_safe,
        max_attempts=max_attempts,
    )
    decision = decide(None, submit, T0, POLICY)
    assert not isinstance(decision, Rejection)
    state = None
    for event in decision:
        state = evolve(state, event)
    assert state is not None
    scene = Scene(state, T0).accept(
        claim_cmd(state.run_id, "runner-a", lease_seconds=lease_seconds, command_id="race-claim")
    )
    lease = scene.state.lease
    assert lease is not None
    scene = scene.at(T0 + 1_000).accept(
        renew_cmd(state.run_id, lease.attempt_id, lease.epoch, 1, command_id="race-renew-1")
    )
    assert scene.state.status is RunStatus.RUNNING
    return scene


def success_report(scene: Scene, *, sequence: int = 2, verified: bool = True) -> RunCommand:
    lease = scene.state.lease
    assert lease is not None
    command = report_cmd(
        scene.state.run_id, lease.attempt_id, lease.epoch, sequence, "succeeded", command_id="race-report"
    )
    return dataclasses.replace(command, manifest_verified=verified)


def cancel_confirmation(scene: Scene, *, outcome: str = "cancelled") -> RunCommand:
    lease = scene.state.lease
    assert lease is not None
    return report_cmd(
        scene.state.run_id, lease.attempt_id, lease.epoch, 2, outcome, command_id=f"race-confirm-{outcome}"
    )


def cancel(scene: Scene, command_id: str = "race-cancel") -> CancelRun:
    return CancelRun(
        command_id=command_id,
        run_id=scene.state.run_id,
        issued_at=scene.now,
        correlation_id="corr-cancel",
        actor="user:alice",
        reason="not needed any more",
    )


def request_input(scene: Scene, expires_at: int) -> RequestInput:
    lease = scene.state.lease
    assert lease is not None
    return RequestInput(
        command_id="race-input",
        run_id=scene.state.run_id,
        issued_at=scene.now,
        correlation_id=lease.attempt_id,
        actor="runner",
        attempt_id=lease.attempt_id,
        lease_epoch=lease.epoch,
        sequence=2,
        checkpoint_digest="sha256:" + "c" * 64,
        input_schema='{"type":"string"}',
        prompt="Which branch should I deploy?",
        expires_at=expires_at,
    )


def answer(scene: Scene, response_id: str = "resp-1", command_id: str = "race-answer") -> ProvideInput:
    return ProvideInput(
        command_id=command_id,
        run_id=scene.state.run_id,
        issued_at=scene.now,
        correlation_id="corr-answer",
        actor="user:alice",
        response_id=response_id,
        answer='"main"',
    )


def waiting_for_input(*, expires_in_ms: int = 10_000, timeout_seconds: int = 3600) -> Scene:
    scene = running(timeout_seconds=timeout_seconds).at(T0 + 2_000)
    scene = scene.accept(request_input(scene, expires_at=scene.now + expires_in_ms))
    assert scene.state.status is RunStatus.WAITING_INPUT
    return scene


def cancelling(*, grace_ms: int = GRACE_MS) -> Scene:
    """Running with a 60 s lease renewed at T0 + 1 s; the user cancels at T0 + 2 s."""
    scene = running(lease_seconds=60).at(T0 + 2_000)
    scene = dataclasses.replace(scene, policy=LeasePolicy(stop_grace_ms=grace_ms)).accept(cancel(scene))
    assert scene.state.status is RunStatus.CANCELLING and scene.state.stop is not None
    return scene


def at_deadline(offset_ms: int = 0) -> Scene:
    scene = running(timeout_seconds=20, lease_seconds=60)  # deadline T0 + 20 s, lease to T0 + 61 s
    deadline = scene.state.deadline_at
    assert deadline == T0 + 20_000
    return scene.at(deadline + offset_ms)
