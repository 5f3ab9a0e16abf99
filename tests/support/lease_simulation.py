"""Competing runners driving one Run through the lease protocol's pure core: the scenarios and the
simulation the lease properties (LEASE-3, DUR-1) and the view properties share."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from services.common.contracts import (
    AttemptClaimed,
    AttemptReported,
    EffectIntentRecorded,
    LeaseExpired,
    LeaseRenewed,
    LeaseTakenOver,
    RunCommand,
    RunEvent,
    RunFailed,
    RunInterrupted,
)
from services.lease_coordinator.domain import (
    Decision,
    Rejection,
    RejectionCode,
    RunState,
    RunStatus,
    decide_timers,
)
from tests.support.lease_run import (
    Run,
    claim_cmd,
    intent_cmd,
    outcome_cmd,
    renew_cmd,
    report_cmd,
    takeover_cmd,
)
from tests.unit.strategies import cancel_command

__all__ = [
    "ACTIONS",
    "ADVANCES",
    "FAST_FINISH",
    "RUNNERS",
    "SCENARIO",
    "STALE_RUNNERS",
    "STEPS",
    "UNCONFIRMED_CANCEL",
    "CompetingRunners",
    "RunnerView",
    "Step",
    "UnfoldableDecision",
    "assert_lease_invariants_lease_3",
    "simulate",
]


RUNNERS = ("runner-a", "runner-b", "runner-c")
ACTIONS = (
    "claim",
    "claim",
    "renew",
    "renew",
    "renew",
    "report",
    "takeover",
    "takeover",
    "intent",
    "outcome",
    "tick",
    "tick",
    "cancel",
)
# Mostly heartbeat-sized steps, sometimes long enough for at-risk or expiry.
ADVANCES = (0, 0, 1_000, 2_000, 5_000, 10_000, 20_000, 46_000, 100_000)
_FENCED = ("renew", "report", "intent")
Step = tuple[str, int, int, int]  # action, runner index, ms the clock moves first, variant


class UnfoldableDecision(AssertionError):
    """`decide` returned an event that `evolve` refuses (the processor would fail the batch)."""


@dataclasses.dataclass
class RunnerView:
    """What one runner believes it holds; it keeps believing it after losing the lease."""

    attempt_id: str
    epoch: int
    sequence: int


class CompetingRunners:
    """Several runners and an operator drive one run; every decision is checked as it is made."""

    def __init__(self, retry_safe: bool, max_attempts: int, lease_seconds: int) -> None:
        self.run = Run(retry_safe=retry_safe, max_attempts=max_attempts)
        self.lease_seconds = lease_seconds
        self.views: dict[str, RunnerView | None] = dict.fromkeys(RUNNERS)
        self.effects: list[tuple[str, int]] = []
        self.states: list[RunState] = [self.run.state]
        self.fenced_accepts: list[tuple[RunnerView, RunState, RunEvent, int]] = []
        self.stale_answers: list[tuple[RunnerView, RunState, Decision]] = []

    def _guess(self, variant: int) -> RunnerView:
        # A runner that was never granted anything tries its luck with an epoch it was not given.
        # It does not forge the holder's attempt id: that is a question of who may speak for a
        # holder (authentication), not of fencing a holder whose epoch went stale.
        return RunnerView(f"att_forged_{variant + 1}", variant + 1, 1)

    def _command(self, index: int, action: str, runner: str, variant: int) -> RunCommand:
        run_id, view = self.run.run_id, self.views[runner] or self._guess(variant)
        cid = f"sim-{index}-{action}"
        if action == "claim":
            return claim_cmd(run_id, runner, command_id=cid, lease_seconds=self.lease_seconds)
        if action == "renew":
            sequence = view.sequence if variant == 0 else view.sequence + 1
            return renew_cmd(run_id, view.attempt_id, view.epoch, sequence, command_id=cid)
        if action == "report":
            outcome = ("succeeded", "failed", "cancelled", "preparation_failed")[variant]
            return report_cmd(run_id, view.attempt_id, view.epoch, view.sequence + 1, outcome, command_id=cid)
        if action == "takeover":
            kind = "human" if variant == 0 else "runner"
            return takeover_cmd(run_id, f"step {index}", runner, holder_kind=kind, command_id=cid)
        if action == "cancel":
            return cancel_command(run_id, command_id=cid, reason=f"step {index}")
        if action == "intent":
            effect = (
                self.effects[variant % len(self.effects)][0] if self.effects and variant == 0 else f"e{index}"
            )
            return intent_cmd(run_id, view.attempt_id, view.epoch, effect, command_id=cid)
        effect_id, epoch = self.effects[variant % len(self.effects)] if self.effects else ("e-none", 1)
        outcome = ("committed", "failed", "unknown", "committed")[variant]
        return outcome_cmd(run_id, view.attempt_id, epoch, effect_id, outcome, command_id=cid)

    def _apply(self, events: tuple[RunEvent, ...], why: object) -> None:
        for event in events:
            try:
                self.run.apply((event,))
            except Exception as exc:
                raise UnfoldableDecision(f"{why} produced {event!r}, which evolve refuses: {exc}") from exc

    def step(self, index: int, step: Step) -> None:
        action, who, advance, variant = step
        self.run.at(self.run.now + advance)
        before = self.run.state
        if action == "tick":
            self._apply(decide_timers(before, self.run.now, self.run.policy), "decide_timers")
            self.states.append(self.run.state)
            return
        if action == "cancel" and before.status not in (RunStatus.PREPARING, RunStatus.RUNNING):
            return  # the operator stops held runs only; a queued run's cancel has nothing to fence
        # Renewals, reports and effects come mostly from runners that were granted something
        # (current or stale); a runner that never was only speaks when nobody else can.
        speakers = [r for r in RUNNERS if self.views[r] is not None] if action in _FENCED else []
        runner = (speakers or list(RUNNERS))[who % len(speakers or RUNNERS)]
        view = self.views[runner]
        command = self._command(index, action, runner, variant)
        decision = self.run.decide(command)
        if view is not None and view.epoch < before.epoch and action in _FENCED:
            self.stale_answers.append((dataclasses.replace(view), before, decision))
        if isinstance(decision, Rejection):
            return
        self._apply(decision, command)
        self.states.append(self.run.state)
        for event in decision:
            if isinstance(event, AttemptClaimed):
                self.views[runner] = RunnerView(event.attempt_id, event.epoch, 0)
            elif isinstance(event, LeaseTakenOver):
                self.views[event.holder] = RunnerView(event.attempt_id, event.epoch, 0)
            elif isinstance(event, (LeaseRenewed, AttemptReported, EffectIntentRecorded)):
                assert view is not None, f"{runner} held nothing, yet {type(event).__name__} was accepted"
                self.fenced_accepts.append((dataclasses.replace(view), before, event, self.run.now))
                if isinstance(event, EffectIntentRecorded):
                    self.effects.append((event.effect_id, event.epoch))
                else:
                    view.sequence = event.sequence


def assert_lease_invariants_lease_3(sim: CompetingRunners) -> None:
    events = sim.run.events
    grants = [e.epoch for e in events if isinstance(e, (AttemptClaimed, LeaseTakenOver))]
    assert grants == list(range(1, len(grants) + 1)), f"epochs granted: {grants}"
    assert sim.run.state.epoch == len(grants)
    assert len({e.event_id for e in events}) == len(events), "an event id was produced twice"
    # Which leases are held, rebuilt from the events alone: never more than one at any moment.
    held: set[int] = set()
    for event in events:
        if isinstance(event, AttemptClaimed):
            assert not held, f"epoch {event.epoch} was granted while {held} was held"
            held.add(event.epoch)
        elif isinstance(event, LeaseTakenOver):
            assert held == {event.previous_epoch}
            held = {event.epoch}
        elif isinstance(event, (LeaseExpired, AttemptReported)):
            assert held == {event.epoch}
            held.clear()
        elif isinstance(event, (RunInterrupted, RunFailed)):
            held.clear()  # an unconfirmed stop or a failure revokes whatever was still held
        assert len(held) <= 1
    lease = sim.run.state.lease
    assert held == ({lease.epoch} if lease is not None and lease.held else set())
    # Every accepted renewal, report and effect came from the holder of the newest epoch, in time.
    for view, before, event, now in sim.fenced_accepts:
        assert before.lease is not None and before.lease.held
        assert (view.epoch, view.attempt_id) == (before.epoch, before.lease.attempt_id)
        assert event.epoch == before.epoch and now < before.lease.expires_at  # type: ignore[union-attr]
    for view, before, decision in sim.stale_answers:
        assert isinstance(decision, Rejection) and decision.code is RejectionCode.STALE_EPOCH, (
            f"a runner at epoch {view.epoch} (run at {before.epoch}) got {decision}"
        )


STEPS = st.lists(
    st.tuples(
        st.sampled_from(ACTIONS),
        st.integers(min_value=0, max_value=len(RUNNERS) - 1),
        st.sampled_from(ADVANCES),
        st.integers(min_value=0, max_value=3),
    ),
    min_size=8,
    max_size=50,
)
SCENARIO = {
    "retry_safe": st.booleans(),
    "max_attempts": st.integers(min_value=1, max_value=4),
    "lease_seconds": st.sampled_from((0, 10, 30)),
    "steps": STEPS,
}
# a claims and starts, b takes over, a keeps going as if nothing happened, b's lease runs out,
# c claims the requeued run, a and b both try to finish it.
STALE_RUNNERS: list[Step] = [
    ("claim", 0, 0, 1),
    ("renew", 0, 1_000, 1),
    ("intent", 0, 0, 1),
    ("takeover", 1, 1_000, 1),
    ("renew", 0, 1_000, 1),
    ("intent", 0, 0, 1),
    ("renew", 1, 1_000, 1),
    ("intent", 1, 0, 0),
    ("tick", 0, 100_000, 0),
    ("claim", 2, 1_000, 0),
    ("report", 0, 0, 0),
    ("report", 1, 0, 1),
    ("outcome", 0, 0, 0),
    ("renew", 2, 5_000, 1),
    ("report", 2, 0, 0),
]


# A task that finishes before its first heartbeat: claim, then report at once.
FAST_FINISH: list[Step] = [("claim", 0, 0, 0), ("report", 0, 1_000, 0)]
# A cancel the runner never confirms: the grace period ends and its lease is revoked in place.
UNCONFIRMED_CANCEL: list[Step] = [
    ("claim", 0, 0, 0),
    ("renew", 0, 1_000, 1),
    ("cancel", 0, 0, 0),
    ("tick", 0, 46_000, 0),
    ("renew", 0, 0, 1),
]


def simulate(
    retry_safe: bool, max_attempts: int, lease_seconds: int, steps: list[Step], check: bool = False
) -> CompetingRunners:
    sim = CompetingRunners(retry_safe, max_attempts, lease_seconds)
    for index, step in enumerate(steps):
        sim.step(index, step)
        if check:
            assert_lease_invariants_lease_3(sim)
    return sim
