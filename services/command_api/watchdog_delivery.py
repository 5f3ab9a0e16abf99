"""Reading the semantic watchdog's views, and delivering its interventions to the runner (WD-5).

Level 1 must reach the runner before its next action is dispatched: the synthetic observation
STATE_OSCILLATION_DETECTED (the period, the step the environment returned to, the action) rides
on every answer the runner gets next:

* a refused proposal (STATE_OSCILLATION_DETECTED, ACTION_TOMBSTONED, ERR_SEMANTIC_DEADLOCK): the
  problem carries `watchdog`, the intervention that caused the refusal (the trajectory's own
  record of it, completed from the watchdog's view when that has caught up);
* an accepted proposal, a heartbeat, an observation: `watchdog` is the pending intervention (a
  level-1 interrupt until the ladder epoch passes, a level-2 rollback until acknowledged, a
  level-3 deadlock for good), or null.

The runner SDK hands each one to its `on_intervention` callback once (by interventionId).
Delivery never fails the answer it rides on: a watchdog view that cannot be read is left out.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from services.command_api.context import ApiContext
from services.common.contracts import TrajectoryRejectionCode
from services.common.decisions import Rejected
from services.common.logs import log_fields

__all__ = [
    "WATCHDOG_REFUSALS",
    "pending_for_runner",
    "refusal_intervention",
    "watchdog_after",
    "watchdog_brief",
    "watchdog_view",
]

log = logging.getLogger("tenure.command_api.watchdog")

# The saga's refusals that an intervention caused (services/saga_orchestrator/domain/interventions.py).
WATCHDOG_REFUSALS = frozenset(
    {
        TrajectoryRejectionCode.STATE_OSCILLATION_DETECTED,
        TrajectoryRejectionCode.ACTION_TOMBSTONED,
        TrajectoryRejectionCode.ERR_SEMANTIC_DEADLOCK,
    }
)
# How long a refusal waits for the trajectory view to show the state that refused (it lags the
# decision by the projection's few milliseconds).
_REFUSAL_VIEW_WAIT_S = 1.0
_LAST_READ_S = 0.2


async def watchdog_view(ctx: ApiContext, run_id: str) -> dict[str, Any] | None:
    return await ctx.in_thread("the watchdog views", ctx.deps.views.watchdog, run_id)


async def watchdog_brief(ctx: ApiContext, run_id: str) -> dict[str, Any] | None:
    return await ctx.in_thread("the watchdog views", ctx.deps.views.watchdog_brief, run_id)


async def watchdog_after(ctx: ApiContext, run_id: str, after: int, wait_s: float) -> dict[str, Any] | None:
    """The watchdog view once its version is above `after`, or as it is when `wait_s` (bounded
    by the request's deadline) has passed: a long-poll, like the trajectory's. The watchdog
    follower wakes the request the moment an event past `after` is on the log."""
    view = await watchdog_view(ctx, run_id)
    book = ctx.deps.watchdog_decisions
    if (view is not None and int(view["version"]) > after) or wait_s <= 0 or book is None:
        return view
    wait_s = min(wait_s, max(0.0, ctx.remaining() - _LAST_READ_S))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    newer = await book.wait_past(run_id, after, wait_s)
    if newer is not None:
        shown = await ctx.deps.views.wait_for_watchdog_version(
            run_id, min(newer, after + 1), max(0.0, deadline - loop.time())
        )
        if shown is not None:
            return shown
    return await watchdog_view(ctx, run_id)


async def pending_for_runner(ctx: ApiContext, run_id: str) -> dict[str, Any] | None:
    """The intervention the runner must act on now (see the module doc), or None."""
    try:
        brief = await watchdog_brief(ctx, run_id)
    except Exception as exc:  # the answer it rides on must not fail for want of it
        log.warning(
            "the watchdog view of %s could not be read: %s", run_id, exc, extra=log_fields(run_id=run_id)
        )
        return None
    if brief is None:
        return None
    pending = brief.get("pendingIntervention")
    return dict(pending) if isinstance(pending, dict) else None


async def refusal_intervention(ctx: ApiContext, rejected: Rejected) -> dict[str, Any] | None:
    """The intervention behind a watchdog refusal of a proposal: the trajectory's record of it
    (what the orchestrator refused by), with the watchdog view's fields of the same intervention
    (returnedToStep, checkpoint, truncated steps) once that view shows it."""
    r = rejected.rejection
    try:
        view = await ctx.deps.views.wait_for_trajectory_version(
            r.run_id, r.current_version, min(_REFUSAL_VIEW_WAIT_S, max(ctx.remaining(), _LAST_READ_S))
        )
        if view is None:
            view = await ctx.trajectory_view(r.run_id)
        recorded = ((view or {}).get("watchdog") or {}).get("intervention")
        brief = await watchdog_brief(ctx, r.run_id)
    except Exception as exc:
        log.warning(
            "the intervention behind a refusal of %s could not be read: %s",
            r.run_id,
            exc,
            extra=log_fields(run_id=r.run_id),
        )
        return None
    latest = (brief or {}).get("latestIntervention")
    if not isinstance(recorded, dict):
        return dict(latest) if isinstance(latest, dict) else None
    if isinstance(latest, dict) and latest.get("interventionId") == recorded.get("interventionId"):
        return {**recorded, **latest}
    return dict(recorded)
