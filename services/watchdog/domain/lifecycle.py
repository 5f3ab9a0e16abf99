"""The lifecycle of a run's watchdog (WD-5) as an enum with an explicit transition table.

WATCHING            no intervention in force.
INTERRUPTED         level 1 issued: the next violation within the ladder epoch escalates.
ROLLBACK_REQUESTED  level 2 issued, its acknowledgement pending: every violation escalates.
ROLLED_BACK         the runner restored the checkpoint: on probation for one ladder epoch.
DEADLOCKED          level 3 (ERR_SEMANTIC_DEADLOCK): terminal, observations are refused.

`evolve` moves only along this table and raises IllegalTransition otherwise, so a defect in the
ladder shows up as an error instead of a silent state.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

__all__ = ["TRANSITIONS", "IllegalTransition", "WatchdogStatus", "check_transition"]


class WatchdogStatus(enum.Enum):
    WATCHING = "watching"
    INTERRUPTED = "interrupted"
    ROLLBACK_REQUESTED = "rollback-requested"
    ROLLED_BACK = "rolled-back"
    DEADLOCKED = "deadlocked"

    @property
    def is_terminal(self) -> bool:
        return self is WatchdogStatus.DEADLOCKED

    @property
    def on_probation(self) -> bool:
        """A violation now escalates instead of starting the ladder again at level 1."""
        return self in (W.INTERRUPTED, W.ROLLBACK_REQUESTED, W.ROLLED_BACK)


W = WatchdogStatus
TRANSITIONS: Mapping[WatchdogStatus, frozenset[WatchdogStatus]] = {
    # A first violation: level 1.
    W.WATCHING: frozenset({W.INTERRUPTED}),
    # The epoch passed quietly; or a second violation: level 2, or level 3 without budget.
    W.INTERRUPTED: frozenset({W.WATCHING, W.ROLLBACK_REQUESTED, W.DEADLOCKED}),
    # Acknowledged; or another violation before it: level 2 again, or level 3.
    W.ROLLBACK_REQUESTED: frozenset({W.ROLLED_BACK, W.ROLLBACK_REQUESTED, W.DEADLOCKED}),
    # Probation passed quietly; or a violation during it: level 2 again, or level 3.
    W.ROLLED_BACK: frozenset({W.WATCHING, W.ROLLBACK_REQUESTED, W.DEADLOCKED}),
    W.DEADLOCKED: frozenset(),
}


class IllegalTransition(ValueError):
    pass


def check_transition(before: WatchdogStatus, after: WatchdogStatus) -> WatchdogStatus:
    if after not in TRANSITIONS[before]:
        raise IllegalTransition(f"watchdog: {before.value} -> {after.value} is not allowed")
    return after
