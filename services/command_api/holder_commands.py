"""What every route that sends an aggregate a command on a run holder's behalf shares.

The header of the command (ids, the API's clock, correlation, actor), the check that the caller
holds the run's current lease, and the problem a refusal is answered with. The trajectory and
watchdog routes used to carry copies of these.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from services.command_api.auth import Principal
from services.command_api.context import ApiContext
from services.command_api.problems import ApiProblem, problem_response
from services.common.contracts import TrajectoryRejectionCode
from services.common.contracts.ids import run_id_of_attempt
from services.common.decisions import Rejected

__all__ = ["command_header", "current_lease", "rejection_response"]


def command_header(
    ctx: ApiContext, request: Request, who: Principal, run_id: str, command_id: str
) -> dict[str, Any]:
    """The header fields of a command the API sends for `who` on run `run_id`."""
    return {
        "command_id": command_id,
        "run_id": run_id,
        "issued_at": ctx.deps.clock.now_ms(),
        "correlation_id": request.headers.get("x-correlation-id") or run_id,
        "actor": who.name,
    }


def rejection_response(
    rejected: Rejected, path: str, problems: Mapping[str, str], default: str, **extensions: Any
) -> JSONResponse:
    """The aggregate's refusal as the problem its code maps to (`default` for an unmapped one)."""
    r = rejected.rejection
    return problem_response(
        problems.get(r.code, default),
        r.detail,
        path,
        code=r.code,
        runId=r.run_id,
        currentStatus=r.current_status,
        commandId=r.causation_id,
        **extensions,
    )


async def current_lease(
    ctx: ApiContext, run_id: str, attempt_id: str, epoch: int, who: Principal | None
) -> dict[str, Any]:
    """The run record the check read (its brief, or its whole view; both carry `tenant` and the
    current `lease`) when (attempt, epoch) is its lease, still active, held by `who`; else a
    problem.

    A grant is answered before the projection shows it, so a lease newer than the view is
    waited for (within the request's deadline) rather than refused.

    It reads the run's brief, whose `lease` is the view's current lease record cut to what is
    checked here (services/projections/fold_codec.py), as a heartbeat's holder check does: used
    as found when this instance has heard of no newer version of the run, else read after the
    fold caught up with the log. The whole view waited for the log's end on every call: a query
    of the broker and a decode of the run's history per step proposal (issue 11). A brief
    stored before it carried `lease` sends the check to the whole view, as before."""
    if run_id_of_attempt(attempt_id) != run_id or not attempt_id.endswith(f"_{epoch}"):
        raise ApiProblem(
            "unknown-attempt",
            f"{attempt_id!r} at epoch {epoch} was never issued for run {run_id}",
            runId=run_id,
        )
    while True:
        found = await ctx.brief(run_id)
        if found is not None and "lease" not in found:
            found = await ctx.view(run_id)
        if found is None:
            raise ApiProblem("run-not-found", f"run {run_id} does not exist", runId=run_id)
        lease = found.get("lease") or {}
        if int(lease.get("epoch", 0)) >= epoch or ctx.remaining() <= 0.02:
            break
        await asyncio.sleep(0.02)
    current = int(lease.get("epoch", 0))
    if current < epoch:
        raise ApiProblem("unknown-attempt", f"epoch {epoch} was never issued for run {run_id}", runId=run_id)
    if current > epoch or lease.get("attemptId") != attempt_id:
        raise ApiProblem(
            "stale-epoch",
            f"attempt {attempt_id} at epoch {epoch} no longer holds run {run_id}: lease "
            f"{lease.get('leaseId')} at epoch {current} does",
            runId=run_id,
            code=TrajectoryRejectionCode.STALE_EPOCH,
        )
    certainty = lease.get("certainty")
    if certainty not in ("active", "at_risk"):
        slug = {"expired": "lease-expired", "released": "lease-released"}.get(str(certainty), "lease-revoked")
        raise ApiProblem(slug, f"lease {lease.get('leaseId')} is {certainty}", runId=run_id)
    if who is not None and lease.get("holderPrincipal") not in (None, who.name):
        raise ApiProblem(
            "not-lease-holder", f"{who.name} does not hold lease {lease.get('leaseId')}", runId=run_id
        )
    return found
