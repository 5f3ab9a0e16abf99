"""What the gateway knows of each run, folded from runs.events (pure): epochs, holders, effects.

It also holds the gateway's commit-time authorization rule (LEASE-1): who may act under a lease
is decided from the same fold, with the same rule as the projections (`holder_principal`); and
the run's tombstoned actions, folded from watchdog.events (WD-5 level 2): an effect whose action
is tombstoned is refused before anything is recorded or dispatched.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from services.common.auth import Principal
from services.common.contracts import (
    AttemptClaimed,
    AttemptReported,
    EffectIntentRecorded,
    EffectOutcomeRecorded,
    InterventionIssued,
    LeaseExpired,
    LeaseTakenOver,
    RunEvent,
    RunFailed,
    RunInterrupted,
    holder_principal,
)
from services.common.ids import action_hash

__all__ = [
    "FencingView",
    "Refusal",
    "authorize_effect",
    "authorize_verify",
    "effect_action_hashes",
    "fold_fencing",
    "fold_tombstones",
    "tombstoned_action",
]


@dataclass(frozen=True)
class FencingView:
    run_id: str
    version: int = 0
    epoch: int = 0
    attempt_id: str | None = None
    lease_held: bool = False
    # effect id -> "intended" | "committed" | "failed" | "unknown"
    effects: dict[str, str] = field(default_factory=dict)
    # attempt id -> the principal who may speak for that attempt's lease (every lease of the run)
    holders: dict[str, str] = field(default_factory=dict)

    @property
    def holder(self) -> str | None:
        """The holder principal of the current lease."""
        return self.holders.get(self.attempt_id) if self.attempt_id is not None else None


def fold_fencing(view: FencingView | None, event: RunEvent) -> FencingView:
    view = view or FencingView(run_id=event.run_id)
    if event.version <= view.version:
        return view  # a redelivery
    view = replace(view, version=event.version)
    if isinstance(event, (AttemptClaimed, LeaseTakenOver)):
        return replace(
            view,
            epoch=event.epoch,
            attempt_id=event.attempt_id,
            lease_held=True,
            holders={**view.holders, event.attempt_id: holder_principal(event)},
        )
    if isinstance(event, (LeaseExpired, AttemptReported)) and event.epoch == view.epoch:
        return replace(view, lease_held=False)
    if isinstance(event, (RunInterrupted, RunFailed)):
        return replace(view, lease_held=False)  # a stop never confirmed revokes the lease
    if isinstance(event, EffectIntentRecorded):
        return replace(view, effects={**view.effects, event.effect_id: "intended"})
    if isinstance(event, EffectOutcomeRecorded):
        return replace(view, effects={**view.effects, event.effect_id: event.outcome})
    return view


@dataclass(frozen=True)
class Refusal:
    """Why a caller may not act: a problem slug of the gateway's catalog and its detail."""

    slug: str
    detail: str


def authorize_effect(
    caller: Principal | None, view: FencingView, attempt_id: str, epoch: int
) -> Refusal | None:
    """May `caller` send an effect under `attempt_id` of this run? None when it may.

    `caller` None is development mode (no API keys): nothing is authenticated, so nothing is
    authorized either; the coordinator still fences by attempt and epoch. A `service` principal
    (the saga orchestrator acting for a trajectory) may act under any lease; the coordinator
    checks that the lease it names still rules the run. Anyone else must be the principal that
    holds that attempt's lease: knowing an attempt id and an epoch is not enough.
    """
    if caller is None or caller.is_service:
        return None
    holder = view.holders.get(attempt_id)
    if holder is None:
        # Every lease of the run up to view.epoch has been folded: an attempt not among them at
        # such an epoch does not hold it; above it, the gateway has not seen that lease (the
        # caller waited for it already), so it was not issued as far as anyone can show.
        if epoch <= view.epoch:
            return Refusal(
                "stale-epoch", f"attempt {attempt_id} does not hold epoch {epoch} of run {view.run_id}"
            )
        return Refusal("unknown-attempt", f"attempt {attempt_id} with epoch {epoch} was never issued")
    if holder != caller.name:
        return Refusal("not-lease-holder", f"{caller.name} does not hold the lease of attempt {attempt_id}")
    return None


def authorize_verify(caller: Principal | None, view: FencingView) -> Refusal | None:
    """The pre-pivot verifiers (SAGA-6): the service role, or the holder of the run's lease."""
    if caller is None or caller.is_service:
        return None
    if view.holder != caller.name:
        return Refusal(
            "not-lease-holder", f"{caller.name} does not hold the current lease of run {view.run_id}"
        )
    return None


# --- tombstones (WD-5 level 2) ------------------------------------------------------------------


def fold_tombstones(tombstones: frozenset[str], event: InterventionIssued) -> frozenset[str]:
    """A run's tombstoned action hashes after `event`: level 2 and 3 name the action they mask
    for the run (level 1 only refuses the runner's next proposal, at the orchestrator)."""
    if event.level >= 2 and event.action_hash:
        return tombstones | {event.action_hash}
    return tombstones


def effect_action_hashes(
    tool: str, operation: str, payload: dict[str, Any], given: str = ""
) -> frozenset[str]:
    """The names an effect's action may go by (services.common.ids.action_hash, WD-4):

    * `given`: the hash the caller says the effect is (the saga sends its step's);
    * hash(operation, payload): the action as the saga names a step of the reference catalog,
      whose tool names are the gateway operations (services/sim_environment/tools.json);
    * hash(f"{tool}/{operation}", payload): the gateway's own name for it, the one a runner
      reports for an effect it sends itself (services.runner_sdk.effect_action_hash).
    """
    names = {action_hash(operation, payload), action_hash(f"{tool}/{operation}", payload)}
    if given:
        names.add(given)
    return frozenset(names)


def tombstoned_action(tombstones: frozenset[str], names: frozenset[str]) -> str | None:
    """The tombstoned hash among an effect's `names`, or None."""
    hit = sorted(names & tombstones)
    return hit[0] if hit else None
