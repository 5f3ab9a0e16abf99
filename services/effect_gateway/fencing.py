"""What the gateway knows of each run, folded from runs.events (pure): epochs and effects."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from services.common.contracts import (
    AttemptClaimed,
    AttemptReported,
    EffectIntentRecorded,
    EffectOutcomeRecorded,
    LeaseExpired,
    LeaseTakenOver,
    RunEvent,
    RunFailed,
    RunInterrupted,
)

__all__ = ["FencingView", "fold_fencing"]


@dataclass(frozen=True)
class FencingView:
    run_id: str
    version: int = 0
    epoch: int = 0
    attempt_id: str | None = None
    lease_held: bool = False
    # effect id -> "intended" | "committed" | "failed" | "unknown"
    effects: dict[str, str] = field(default_factory=dict)


def fold_fencing(view: FencingView | None, event: RunEvent) -> FencingView:
    view = view or FencingView(run_id=event.run_id)
    if event.version <= view.version:
        return view  # a redelivery
    view = replace(view, version=event.version)
    if isinstance(event, (AttemptClaimed, LeaseTakenOver)):
        return replace(view, epoch=event.epoch, attempt_id=event.attempt_id, lease_held=True)
    if isinstance(event, (LeaseExpired, AttemptReported)) and event.epoch == view.epoch:
        return replace(view, lease_held=False)
    if isinstance(event, (RunInterrupted, RunFailed)):
        return replace(view, lease_held=False)  # a stop never confirmed revokes the lease
    if isinstance(event, EffectIntentRecorded):
        return replace(view, effects={**view.effects, event.effect_id: "intended"})
    if isinstance(event, EffectOutcomeRecorded):
        return replace(view, effects={**view.effects, event.effect_id: event.outcome})
    return view
