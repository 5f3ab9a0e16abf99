"""The semantic watchdog's interventions as the runner receives them (WD-5), and their callback.

The command API puts the intervention in force on the runner's next answers (`watchdog` on a
refused or accepted proposal, a heartbeat, an observation): level 1 STATE_OSCILLATION_DETECTED
(a synthetic observation for the model's context: `message`, the period, the step the
environment returned to, the action), level 2 ROLLBACK_REQUESTED (restore the checkpoint before
the cycle, acknowledge it; the action is tombstoned), level 3 ERR_SEMANTIC_DEADLOCK (stop).

`InterventionInbox` calls the runner's `on_intervention` once per intervention, however many
answers carry it; give one inbox to every client of a run to share that memory.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEADLOCK",
    "INTERRUPT",
    "ROLLBACK",
    "Intervention",
    "InterventionInbox",
    "as_inbox",
]

log = logging.getLogger("tenure.runner_sdk.watchdog")

INTERRUPT, ROLLBACK, DEADLOCK = "STATE_OSCILLATION_DETECTED", "ROLLBACK_REQUESTED", "ERR_SEMANTIC_DEADLOCK"
_REMEMBERED = 256


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


@dataclass(frozen=True)
class Intervention:
    """One rung of the ladder. `checkpoint_step` -1 is the run's start; `returned_to_step` is
    the step whose state (or metrics, or failing action) the loop returned to, when known."""

    intervention_id: str
    level: int
    code: str
    action_hash: str
    period: int
    message: str
    detector: str = ""
    returned_to_step: int | None = None
    checkpoint_step: int = -1
    checkpoint_state_hash: str = ""
    truncated_steps: tuple[int, ...] = ()
    rollbacks_used: int = 0
    rollback_budget: int = 0
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_interrupt(self) -> bool:
        return self.level == 1

    @property
    def is_rollback(self) -> bool:
        return self.level == 2

    @property
    def is_deadlock(self) -> bool:
        return self.level >= 3

    @classmethod
    def from_json(cls, body: Any) -> Intervention | None:
        """The intervention an answer's `watchdog` member carries; None when it carries none."""
        if not isinstance(body, Mapping) or not isinstance(body.get("interventionId"), str):
            return None
        returned = body.get("returnedToStep")
        truncated = body.get("truncatedSteps")
        return cls(
            intervention_id=str(body["interventionId"]),
            level=_int(body.get("level"), 0),
            code=str(body.get("code") or ""),
            action_hash=str(body.get("actionHash") or ""),
            period=_int(body.get("period"), 0),
            message=str(body.get("message") or ""),
            detector=str(body.get("detector") or ""),
            returned_to_step=returned
            if isinstance(returned, int) and not isinstance(returned, bool)
            else None,
            checkpoint_step=_int(body.get("checkpointStep"), -1),
            checkpoint_state_hash=str(body.get("checkpointStateHash") or ""),
            truncated_steps=tuple(s for s in truncated if isinstance(s, int))
            if isinstance(truncated, list)
            else (),
            rollbacks_used=_int(body.get("rollbacksUsed"), 0),
            rollback_budget=_int(body.get("rollbackBudget"), 0),
            raw=dict(body),
        )


class InterventionInbox:
    """Hands each intervention to `on_intervention` (and every listener added with `listen`, a
    LoopGuard for one) once, by id, from whichever answer carried it first. Thread-safe: a
    LeaseKeeper renews on its own thread, so a callback may run there. A callback that raises
    is logged, never allowed to break the call whose answer carried the intervention."""

    def __init__(self, on_intervention: Callable[[Intervention], None] | None = None) -> None:
        self._listeners: list[Callable[[Intervention], None]] = []
        if on_intervention is not None:
            self._listeners.append(on_intervention)
        self._lock = threading.Lock()
        self._seen: dict[str, None] = {}
        self.latest: Intervention | None = None

    def __call__(self, intervention: Intervention) -> None:
        self.deliver(intervention)

    def listen(self, callback: Callable[[Intervention], None]) -> None:
        """Also hand every new intervention to `callback` (after those added before it)."""
        with self._lock:
            self._listeners.append(callback)

    def deliver(self, intervention: Intervention) -> bool:
        """True when `intervention` was new (and the callback was called)."""
        with self._lock:
            if intervention.intervention_id in self._seen:
                return False
            self._seen[intervention.intervention_id] = None
            while len(self._seen) > _REMEMBERED:
                self._seen.pop(next(iter(self._seen)))
            self.latest = intervention
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(intervention)
            except Exception:
                log.exception("on_intervention failed for %s", intervention.intervention_id)
        return True

    def notice(self, answer: Mapping[str, Any] | None) -> Intervention | None:
        """The intervention an answer body carries (its `watchdog` member), delivered if new."""
        intervention = Intervention.from_json((answer or {}).get("watchdog"))
        if intervention is not None:
            self.deliver(intervention)
        return intervention


def as_inbox(on_intervention: Callable[[Intervention], None] | None) -> InterventionInbox:
    """An inbox for a client: the one given (to share it between clients), else a new one."""
    if isinstance(on_intervention, InterventionInbox):
        return on_intervention
    return InterventionInbox(on_intervention)
