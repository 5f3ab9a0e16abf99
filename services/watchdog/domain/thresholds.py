"""The watchdog's thresholds: deployment defaults (TenureSettings), per-run overrides, one set of bounds.

Every threshold has fixed bounds; the deployment picks its defaults inside them (TENURE_WATCHDOG_*),
and a run may pick its own inside them too (ConfigureWatchdog, -1 = keep). The thresholds in force
are recorded in a WatchdogConfigured event, so a replay never depends on today's deployment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

__all__ = ["BOUNDS", "DEFAULT_THRESHOLDS", "KEEP", "Thresholds", "out_of_bounds", "with_overrides"]

KEEP = -1  # "keep the deployment's value" in a ConfigureWatchdog


@dataclass(frozen=True)
class Thresholds:
    """K, W, E and the ladder's numbers (WD-2..WD-5).

    max_period:      K, the longest cycle period looked for: H_t == H_{t-k}, k in 1..K (WD-2).
    window:          W, state hashes of mutating steps kept in the ring buffer (> K).
    epoch_steps:     E, mutating steps without a gain in any metric before stagnation (WD-3).
    repeat_count:    repeats of a failing action that are a violation; 1 = the first (WD-4).
    rollback_budget: level-2 rollbacks a run may get; the next escalation is level 3 (WD-5).
    ladder_epoch:    a violation within this many steps of the last intervention escalates (the
                     seed's "second violation within a 3-step epoch").
    poll_patience:   consecutive polls of one action with an unchanged observation tolerated.
    """

    max_period: int = 8
    window: int = 32
    epoch_steps: int = 6
    repeat_count: int = 1
    rollback_budget: int = 1
    ladder_epoch: int = 3
    poll_patience: int = 5


DEFAULT_THRESHOLDS = Thresholds()
# Inclusive bounds of each threshold, for the deployment's defaults and a run's overrides alike.
BOUNDS: Mapping[str, tuple[int, int]] = {
    "max_period": (1, 32),
    "window": (2, 256),
    "epoch_steps": (2, 100),
    "repeat_count": (1, 10),
    "rollback_budget": (0, 5),
    "ladder_epoch": (1, 10),
    "poll_patience": (1, 100),
}


def out_of_bounds(thresholds: Thresholds) -> list[str]:
    """What is wrong with `thresholds`, for humans; empty when every value is within bounds."""
    problems = []
    for field in fields(Thresholds):
        low, high = BOUNDS[field.name]
        value = getattr(thresholds, field.name)
        if not low <= value <= high:
            problems.append(f"{field.name}={value} is outside [{low}, {high}]")
    if thresholds.window <= thresholds.max_period:
        # H_{t-1} == H_{t-k-1} needs k + 1 earlier states in the buffer.
        problems.append(f"window={thresholds.window} must exceed max_period={thresholds.max_period}")
    return problems


def with_overrides(base: Thresholds, overrides: Mapping[str, int]) -> Thresholds:
    """`base` with every override that is not KEEP applied (not checked: see out_of_bounds)."""
    return replace(base, **{name: value for name, value in overrides.items() if value != KEEP})
