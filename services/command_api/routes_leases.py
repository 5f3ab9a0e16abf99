"""Routes of the lease protocol: claim, heartbeat, batch renewal, terminal report, lease record,
takeover (the batch renewal, POST /leases:renew, is in lease_batch.py).

Answers to claims and heartbeats come from the decision event itself (the coordinator's clock
and expiry), not from the projection, so a renewal is acknowledged as soon as it is committed.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse

from services.command_api.context import (
    ApiContext,
    Outcome,
    check_holder,
    pending_response,
    rejection_problem,
)
from services.command_api.idempotency import PRINCIPAL_FIELD, KeyedRequest, conflict_problem, differing_fields
from services.command_api.lease_batch import add_batch_renewal, replayed_fields, stop_fields
from services.command_api.models import (
    ClaimRequest,
    HeartbeatRequest,
    PendingCommand,
    ReportRequest,
    TakeoverRequest,
)
from services.command_api.problems import ApiProblem
from services.command_api.routes_work import verify_manifest
from services.command_api.watchdog_delivery import pending_for_runner
from services.common.auth import Role, require_role
from services.common.contracts import (
    ArtifactEntry,
    AttemptClaimed,
    ClaimRun,
    LeaseTakenOver,
    RenewLease,
    ReportAttempt,
    TakeOverLease,
)
from services.common.contracts.ids import run_id_of_attempt
from services.common.decisions import Rejected
from services.common.ids import command_id_for

__all__ = ["leases_router"]

# A heartbeat for an attempt whose run does not exist is, to the runner, an unknown attempt.
_ATTEMPT_OVERRIDES = {"RUN_NOT_FOUND": "unknown-attempt"}


def _grant(event: AttemptClaimed | LeaseTakenOver, view: dict[str, Any]) -> dict[str, Any]:
    return _grant_body(
        {
            "attemptId": event.attempt_id,
            "attemptNumber": event.attempt_number if isinstance(event, AttemptClaimed) else None,
            "leaseId": event.lease_id,
            "epoch": event.epoch,
            "holder": event.holder,
            "holderKind": event.holder_kind,
            "expiresAt": event.expires_at,
            "leaseSeconds": event.lease_seconds,
            "heartbeatSeconds": event.heartbeat_seconds,
        },
        event.run_id,
        event.occurred_at,
        view,
        _attempt_context(view),
    )


def _grant_body(
    granted: dict[str, Any], run_id: str, at: int, view: dict[str, Any], context: dict[str, Any] | None
) -> dict[str, Any]:
    """The answer to a claim or a takeover, from its event (or its entry in the Run view)."""
    return {
        "runId": run_id,
        "attemptId": granted["attemptId"],
        "attemptNumber": granted.get("attemptNumber"),
        "leaseId": granted["leaseId"],
        "epoch": granted["epoch"],
        "holder": granted["holder"],
        "holderKind": granted["holderKind"],
        "expiresAt": granted["expiresAt"],
        "leaseSeconds": granted["leaseSeconds"],
        "heartbeatIntervalSeconds": granted["heartbeatSeconds"],
        "serverTime": at,
        "assignment": {"executionSpec": view["executionSpec"], "specDigest": view["specDigest"]},
        "attemptContext": context,
    }


def _replayed_grant(entry: dict[str, Any], view: dict[str, Any]) -> dict[str, Any]:
    """The grant a claim or takeover made, rebuilt from its entry in the Run view's history."""
    at = int(entry["occurredAt"])
    return _grant_body(entry["details"], view["runId"], at, view, _attempt_context_at(view, at))


def _attempt_context(view: dict[str, Any]) -> dict[str, Any] | None:
    """EXE-9: checkpoint and the user's answer travel separately in the AttemptContext."""
    wait = view.get("input")
    if not wait or wait.get("response") is None or view["status"] not in ("queued", "preparing"):
        return None
    return _context_of(wait)


def _attempt_context_at(view: dict[str, Any], granted_at: int) -> dict[str, Any] | None:
    """The AttemptContext a grant made at `granted_at` carried: the answer it continued from."""
    wait = view.get("input")
    if not wait or wait.get("response") is None or int(wait["response"]["at"]) > granted_at:
        return None
    return _context_of(wait)


def _context_of(wait: dict[str, Any]) -> dict[str, Any]:
    return {
        "checkpointDigest": wait["checkpointDigest"],
        "inputRequestId": wait["requestId"],
        "inputResponse": wait["response"],
    }


def _claim_fields(entry: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The first claim's fields; lease terms only when asked for (else the coordinator chose)."""
    details = entry["details"]
    recorded = {
        PRINCIPAL_FIELD: entry.get("actor"),
        "runnerId": details["holder"],
        "holderKind": details["holderKind"],
        "capabilities": details.get("capabilities", []),
    }
    for name in ("leaseSeconds", "heartbeatSeconds"):
        if request.get(name) is not None:
            recorded[name] = details[name]
    return recorded


def _takeover_fields(entry: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    details = entry["details"]
    recorded = {
        PRINCIPAL_FIELD: entry.get("actor"),
        "reason": details["reason"],
        "newHolder": details["holder"],
        "holderKind": details["holderKind"],
    }
    if request.get("leaseSeconds") is not None:
        recorded["leaseSeconds"] = details["leaseSeconds"]
    return recorded


def _report_fields(entry: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    details = entry.get("details", {})
    recorded: dict[str, Any] = {PRINCIPAL_FIELD: entry.get("actor"), "leaseEpoch": details.get("epoch")}
    if not (details.get("errorCode") == "MANIFEST_INVALID" and request["outcome"] == "succeeded"):
        # (a success whose manifest failed verification is recorded as that failure instead)
        recorded.update(outcome=details.get("outcome"), errorCode=details.get("errorCode"))
        recorded["detail"] = details.get("detail")
    if request.get("manifest") is not None:
        recorded["manifest"] = details.get("manifest", [])
    return recorded


def _run_of(attempt_id: str) -> str:
    run_id = run_id_of_attempt(attempt_id)
    if run_id is None:
        raise ApiProblem("unknown-attempt", f"{attempt_id!r} is not an attempt id this coordinator issued")
    return run_id


def leases_router(ctx: ApiContext) -> APIRouter:
    router = ctx.guarded()

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
        """A repeat under the same Idempotency-Key (and body) answers the grant it made, 201."""
        who = ctx.principal(request)
        require_role(who, "claiming a run", Role.SUBMITTER, Role.RUNNER, Role.OPERATOR)
        view = await existing_run(run_id)
        fields = body.model_dump(mode="json")
        keyed = KeyedRequest.of(run_id, "ClaimRun", idempotency_key, who.name, fields)
        first = keyed.find(view["history"], "causationId")
        if first is not None:
            keyed.check(first["causationId"], _claim_fields(dict(first), fields), f"a claim of run {run_id}")
            return JSONResponse(_replayed_grant(dict(first), view), status_code=201)
        command = ClaimRun(
            command_id=keyed.command_id,
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
        """A repeated sequence (a runner whose answer was lost) renews nothing and answers
        `replayed: true` with every field a first answer has, taken from the run as it stands."""
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
                **stop_fields(before),
                # WD-5: the semantic watchdog's intervention in force for the run, if any.
                "watchdog": await pending_for_runner(ctx, run_id),
            }
        if isinstance(outcome, Rejected) and outcome.rejection.code == "DUPLICATE_SEQUENCE":
            # The same fields as a first answer, from the view as it stands now: a runner whose
            # answer was lost repeats the sequence, and must still learn of a stop requested
            # since (EXE-7/EXE-10) and of the watchdog's intervention (WD-5).
            view = await existing_run(run_id)
            return {
                "attemptId": attempt_id,
                "epoch": body.leaseEpoch,
                "sequence": body.sequence,
                "serverTime": outcome.rejection.occurred_at,
                **replayed_fields(view, attempt_id),
                "watchdog": await pending_for_runner(ctx, run_id),
                "replayed": True,
            }
        if isinstance(outcome, Rejected):
            return rejection_problem(outcome, request.url.path, **_ATTEMPT_OVERRIDES)
        return pending_response(outcome)

    add_batch_renewal(router, ctx)  # POST /leases:renew, many heartbeats in one request

    @router.post(
        "/attempts/{attempt_id}/report", summary="Terminal report of an attempt, fenced like a heartbeat"
    )
    async def report(attempt_id: str, body: ReportRequest, request: Request) -> Any:
        """A repeat of the same sequence answers the view again; with another body it is 409."""
        who = ctx.principal(request)
        run_id = _run_of(attempt_id)
        await check_holder(ctx, who.name, run_id, attempt_id)
        view = await existing_run(run_id)
        command_id = command_id_for(run_id, "ReportAttempt", f"{attempt_id}/{body.sequence}")
        first = next((e for e in view["history"] if e.get("causationId") == command_id), None)
        if first is not None:
            request_fields = {PRINCIPAL_FIELD: who.name, **body.model_dump(mode="json")}
            fields = differing_fields(request_fields, _report_fields(dict(first), request_fields))
            if fields:
                raise conflict_problem(
                    f"sequence {body.sequence} of attempt {attempt_id}", run_id, "a report", fields
                )
            return view
        manifest = [m.model_dump() for m in body.manifest] if body.manifest is not None else None
        problem = ""
        if body.outcome == "succeeded":
            problem = await ctx.in_thread("the object store", verify_manifest, ctx, view, manifest)
        command = ReportAttempt(
            command_id=command_id,
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
        outcome = await ctx.publish_and_wait(command)
        if isinstance(outcome, Rejected):
            return rejection_problem(outcome, request.url.path, **_ATTEMPT_OVERRIDES)
        if isinstance(outcome, PendingCommand):
            return pending_response(outcome)
        return outcome.view

    @router.get("/runs/{run_id}/lease", summary="The lease record (LEASE-2)")
    async def lease_record(run_id: str) -> Any:
        """Every renewal: those on runs.events (the view's) and those kept on runs.renewals."""
        view = await ctx.with_every_renewal(run_id, await existing_run(run_id))
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
        """A repeat under the same Idempotency-Key (and body) answers the grant it made."""
        who = ctx.principal(request)
        require_role(who, "a takeover", Role.OPERATOR)
        view = await existing_run(run_id)
        fields = body.model_dump(mode="json")
        keyed = KeyedRequest.of(run_id, "TakeOverLease", idempotency_key, who.name, fields)
        first = keyed.find(view["history"], "causationId")
        if first is not None:
            keyed.check(
                first["causationId"], _takeover_fields(dict(first), fields), f"a takeover of run {run_id}"
            )
            return _replayed_grant(dict(first), view)
        command = TakeOverLease(
            command_id=keyed.command_id,
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
        # Best effort, within the deadline: once the view shows the new lease, a request of the
        # replaced holder that arrives after this answer is refused here as stale (the saga
        # orchestrator learns of the takeover only later).
        await ctx.deps.views.wait_for_version(run_id, event.version, ctx.remaining())
        return _grant(event, view)

    return router
