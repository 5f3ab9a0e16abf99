"""Routes of the lease protocol: claim, heartbeat, terminal report, lease record, takeover.

Answers to claims and heartbeats come from the decision event itself (the coordinator's clock
and expiry), not from the projection, so a renewal is acknowledged as soon as it is committed.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fastapi import APIRouter, Header, Request

from services.command_api.context import (
    ApiContext,
    Outcome,
    check_holder,
    pending_response,
    rejection_problem,
)
from services.command_api.models import (
    ClaimRequest,
    HeartbeatRequest,
    PendingCommand,
    ReportRequest,
    TakeoverRequest,
)
from services.command_api.problems import ApiProblem
from services.command_api.routes_runs import caused_by
from services.command_api.routes_work import verify_manifest
from services.common.contracts import (
    ArtifactEntry,
    AttemptClaimed,
    ClaimRun,
    LeaseTakenOver,
    RenewLease,
    ReportAttempt,
    TakeOverLease,
)
from services.common.decisions import Rejected
from services.common.ids import command_id_for
from services.lease_coordinator.domain import run_id_of_attempt

__all__ = ["leases_router"]

OPERATOR_ROLE = "operator"
# A heartbeat for an attempt whose run does not exist is, to the runner, an unknown attempt.
_ATTEMPT_OVERRIDES = {"RUN_NOT_FOUND": "unknown-attempt"}


def _grant(event: AttemptClaimed | LeaseTakenOver, view: dict[str, Any]) -> dict[str, Any]:
    return {
        "runId": event.run_id,
        "attemptId": event.attempt_id,
        "attemptNumber": event.attempt_number if isinstance(event, AttemptClaimed) else None,
        "leaseId": event.lease_id,
        "epoch": event.epoch,
        "holder": event.holder,
        "holderKind": event.holder_kind,
        "expiresAt": event.expires_at,
        "leaseSeconds": event.lease_seconds,
        "heartbeatIntervalSeconds": event.heartbeat_seconds,
        "serverTime": event.occurred_at,
        "assignment": {"executionSpec": view["executionSpec"], "specDigest": view["specDigest"]},
        "attemptContext": _attempt_context(view),
    }


def _attempt_context(view: dict[str, Any]) -> dict[str, Any] | None:
    """EXE-9: checkpoint and the user's answer travel separately in the AttemptContext."""
    wait = view.get("input")
    if not wait or wait.get("response") is None or view["status"] not in ("queued", "preparing"):
        return None
    return {
        "checkpointDigest": wait["checkpointDigest"],
        "inputRequestId": wait["requestId"],
        "inputResponse": wait["response"],
    }


def _run_of(attempt_id: str) -> str:
    run_id = run_id_of_attempt(attempt_id)
    if run_id is None:
        raise ApiProblem("unknown-attempt", f"{attempt_id!r} is not an attempt id this coordinator issued")
    return run_id


def leases_router(ctx: ApiContext) -> APIRouter:
    router = APIRouter()

    async def existing_run(run_id: str) -> dict[str, Any]:
        view = await ctx.view(run_id)
        if view is None:
            raise ApiProblem("run-not-found", f"run {run_id} does not exist", runId=run_id)
        return view

    @router.post(
        "/runs/{run_id}/attempts", status_code=201, summary="Claim a queued run: a new Attempt and its lease"
    )
    async def claim(
        run_id: str,
        body: ClaimRequest,
        request: Request,
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        who = ctx.principal(request)
        view = await existing_run(run_id)
        command = ClaimRun(
            command_id=command_id_for(run_id, "ClaimRun", idempotency_key or uuid.uuid4().hex),
            run_id=run_id,
            issued_at=ctx.deps.clock.now_ms(),
            correlation_id=request.headers.get("x-correlation-id") or run_id,
            actor=who.name,
            runner_id=body.runnerId,
            holder_kind=body.holderKind,
            capabilities=tuple(body.capabilities),
            lease_seconds=body.leaseSeconds or 0,
            heartbeat_seconds=body.heartbeatSeconds or 0,
        )
        if caused_by(view, command.command_id):
            raise ApiProblem(
                "run-not-claimable", "this claim was already granted; use the lease you were given"
            )
        outcome = await ctx.publish_and_wait(command, wait_for_view=False)
        if isinstance(outcome, Rejected):
            return rejection_problem(outcome, request.url.path)
        if isinstance(outcome, PendingCommand):
            return pending_response(outcome)
        event = outcome.decided.event
        assert isinstance(event, AttemptClaimed)
        return _grant(event, view)

    @router.post("/attempts/{attempt_id}/heartbeat", summary="Renew the lease (EXE-4, LEASE-5)")
    async def heartbeat(attempt_id: str, body: HeartbeatRequest, request: Request) -> Any:
        who = ctx.principal(request)
        run_id = _run_of(attempt_id)
        # One read of the view per heartbeat: the holder check and the stop flags both use it
        # (a stop requested a moment ago shows on the next heartbeat, as EXE-7 allows).
        before = await check_holder(ctx, who.name, run_id, attempt_id) or {}
        command = RenewLease(
            # Every HTTP request is its own command: a repeated sequence is answered from the
            # lease as it stands, never by replaying an old answer.
            command_id=f"cmd_{uuid.uuid4().hex}",
            run_id=run_id,
            issued_at=ctx.deps.clock.now_ms(),
            correlation_id=attempt_id,
            actor=who.name,
            attempt_id=attempt_id,
            lease_epoch=body.leaseEpoch,
            sequence=body.sequence,
        )
        outcome = await ctx.publish_and_wait(command, wait_for_view=False)
        if isinstance(outcome, Outcome):
            event = outcome.decided.event
            stop = before.get("stop") or {}
            status = "running" if getattr(event, "run_started", False) else before.get("status", "running")
            return {
                "attemptId": attempt_id,
                "epoch": body.leaseEpoch,
                "sequence": body.sequence,
                "expiresAt": getattr(event, "expires_at", None),
                "serverTime": event.occurred_at,
                "certainty": "active",
                "runStatus": status,
                # EXE-7/EXE-10: the runner learns of a requested stop on its next heartbeat.
                "stopRequested": before.get("status") == "cancelling",
                "stopKind": stop.get("kind"),
                "stopGraceUntil": stop.get("graceUntil"),
            }
        if isinstance(outcome, Rejected) and outcome.rejection.code == "DUPLICATE_SEQUENCE":
            view = await existing_run(run_id)
            lease = view.get("lease") or {}
            return {
                "attemptId": attempt_id,
                "epoch": body.leaseEpoch,
                "sequence": body.sequence,
                "expiresAt": lease.get("expiresAt"),
                "serverTime": outcome.rejection.occurred_at,
                "certainty": lease.get("certainty"),
                "runStatus": view["status"],
                "replayed": True,
            }
        if isinstance(outcome, Rejected):
            return rejection_problem(outcome, request.url.path, **_ATTEMPT_OVERRIDES)
        return pending_response(outcome)

    @router.post(
        "/attempts/{attempt_id}/report", summary="Terminal report of an attempt, fenced like a heartbeat"
    )
    async def report(attempt_id: str, body: ReportRequest, request: Request) -> Any:
        who = ctx.principal(request)
        run_id = _run_of(attempt_id)
        await check_holder(ctx, who.name, run_id, attempt_id)
        view = await existing_run(run_id)
        manifest = [m.model_dump() for m in body.manifest] if body.manifest is not None else None
        problem = ""
        if body.outcome == "succeeded":
            problem = await asyncio.to_thread(verify_manifest, ctx, view, manifest)
        command = ReportAttempt(
            command_id=command_id_for(run_id, "ReportAttempt", f"{attempt_id}/{body.sequence}"),
            run_id=run_id,
            issued_at=ctx.deps.clock.now_ms(),
            correlation_id=attempt_id,
            actor=who.name,
            attempt_id=attempt_id,
            lease_epoch=body.leaseEpoch,
            sequence=body.sequence,
            outcome=body.outcome,
            error_code=body.errorCode,
            detail=body.detail,
            manifest=tuple(
                ArtifactEntry(
                    artifact_id=m["artifactId"],
                    digest=m["digest"],
                    size_bytes=m["sizeBytes"],
                    media_type=m["mediaType"],
                )
                for m in manifest or ()
            ),
            manifest_verified=body.outcome == "succeeded" and not problem,
            manifest_problem=problem,
        )
        if caused_by(view, command.command_id):
            return view
        outcome = await ctx.publish_and_wait(command)
        if isinstance(outcome, Rejected):
            return rejection_problem(outcome, request.url.path, **_ATTEMPT_OVERRIDES)
        if isinstance(outcome, PendingCommand):
            return pending_response(outcome)
        return outcome.view

    @router.get("/runs/{run_id}/lease", summary="The lease record (LEASE-2)")
    async def lease_record(run_id: str, request: Request) -> Any:
        ctx.principal(request)
        view = await existing_run(run_id)
        return {
            "runId": run_id,
            "runStatus": view["status"],
            "lease": view.get("lease"),
            "previousLeases": view.get("leaseHistory", []),
        }

    @router.post(
        "/runs/{run_id}/lease/takeover", summary="Operator takeover: revoke and re-grant (LEASE-6/7)"
    )
    async def takeover(
        run_id: str,
        body: TakeoverRequest,
        request: Request,
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        who = ctx.principal(request)
        if who.role != OPERATOR_ROLE:
            raise ApiProblem(
                "forbidden",
                f"{who.name} has role {who.role!r}; a takeover needs the operator role",
                runId=run_id,
            )
        view = await existing_run(run_id)
        command = TakeOverLease(
            command_id=command_id_for(run_id, "TakeOverLease", idempotency_key or uuid.uuid4().hex),
            run_id=run_id,
            issued_at=ctx.deps.clock.now_ms(),
            correlation_id=request.headers.get("x-correlation-id") or run_id,
            actor=who.name,
            reason=body.reason,
            new_holder=body.newHolder,
            holder_kind=body.holderKind,
            lease_seconds=body.leaseSeconds or 0,
        )
        outcome = await ctx.publish_and_wait(command, wait_for_view=False)
        if isinstance(outcome, Rejected):
            return rejection_problem(outcome, request.url.path)
        if isinstance(outcome, PendingCommand):
            return pending_response(outcome)
        event = outcome.decided.event
        assert isinstance(event, LeaseTakenOver)
        return _grant(event, view)

    return router
