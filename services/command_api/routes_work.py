"""Routes for work in progress: waiting for input (EXE-8/9) and artifacts (EXE-1/15).

The API validates what the pure core cannot (a JSON answer against its JSON Schema, uploaded
bytes against their grant, a ResultManifest against the object store) and hands the core only
the verdict, so decisions stay free of I/O.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import uuid
from typing import Annotated, Any, BinaryIO, cast

from fastapi import APIRouter, Query, Request
from pydantic import Field

from services.command_api.context import ApiContext, check_holder, pending_response, rejection_problem
from services.command_api.idempotency import PRINCIPAL_FIELD, conflict_problem, differing_fields
from services.command_api.input_schemas import answer_problem, schema_problem
from services.command_api.models import (
    ApiBody,
    Identifier,
    NonNegativeLong,
    PendingCommand,
    PositiveLong,
    Text,
)
from services.command_api.problems import ApiProblem
from services.command_api.routes_artifacts import refuse_quarantined, register_upload
from services.common.auth import Role
from services.common.contracts import ProvideInput, RequestInput, RequestUploadGrant, UploadGrantIssued
from services.common.contracts.ids import run_id_of_attempt, run_id_of_grant
from services.common.decisions import Rejected
from services.common.ids import canonical_json, command_id_for
from services.common.objectstore import KeyExists, ManifestEntry, ObjectTooLarge

__all__ = ["verify_manifest", "work_router"]


class InputRequestBody(ApiBody):
    leaseEpoch: PositiveLong
    sequence: PositiveLong
    checkpointDigest: Identifier = Field(min_length=1, max_length=200)
    inputSchema: dict[str, Any] = Field(description="JSON Schema the answer must satisfy.")
    prompt: Text = Field(min_length=1, max_length=10_000)
    expiresAt: NonNegativeLong = Field(description="Epoch millis on the coordinator's clock.")


class InputAnswerBody(ApiBody):
    responseId: Identifier = Field(
        min_length=1, max_length=200, description="Repeats are answered, never re-applied."
    )
    answer: Any


class UploadGrantBody(ApiBody):
    leaseEpoch: PositiveLong
    destination: Identifier = Field(min_length=1, max_length=256)
    maxBytes: PositiveLong
    mediaType: Identifier = Field(default="application/octet-stream", max_length=200)


def _run_of_attempt(attempt_id: str) -> str:
    run_id = run_id_of_attempt(attempt_id)
    if run_id is None:
        raise ApiProblem("unknown-attempt", f"{attempt_id!r} is not an attempt id this coordinator issued")
    return run_id


def verify_manifest(ctx: ApiContext, view: dict[str, Any], manifest: list[dict[str, Any]] | None) -> str:
    """'' when every artifact is stored under a grant of this run with the declared digest and size."""
    if manifest is None:
        return "the success report carried no ResultManifest"
    grants = {g["destination"]: g for g in view.get("uploadGrants", [])}
    entries: list[ManifestEntry] = []
    problems: list[str] = []
    for item in manifest:
        grant = grants.get(item["artifactId"])
        if grant is None:
            problems.append(f"artifact {item['artifactId']}: no upload grant of this run names it")
            continue
        entries.append(
            ManifestEntry(
                item["artifactId"],
                grant["keyPrefix"] + grant["destination"],
                item["digest"],
                int(item["sizeBytes"]),
                item["mediaType"],
            )
        )
    problems.extend(ctx.deps.objects.verify(entries))
    return "; ".join(problems)


def _input_request_fields(entry: dict[str, Any]) -> dict[str, Any]:
    """A recorded InputRequested in the request's field names."""
    details = entry.get("details", {})
    schema = details.get("inputSchema")
    return {
        PRINCIPAL_FIELD: entry.get("actor"),
        "leaseEpoch": details.get("epoch"),
        "checkpointDigest": details.get("checkpointDigest"),
        "inputSchema": json.loads(schema) if isinstance(schema, str) else schema,
        "prompt": details.get("prompt"),
        "expiresAt": details.get("expiresAt"),
    }


def work_router(ctx: ApiContext) -> APIRouter:
    router = ctx.guarded()

    async def view_of(run_id: str) -> dict[str, Any]:
        view = await ctx.view(run_id)
        if view is None:
            raise ApiProblem("run-not-found", f"run {run_id} does not exist", runId=run_id)
        return view

    @router.post(
        "/attempts/{attempt_id}/input-request", summary="Save a checkpoint and wait for input (EXE-8)"
    )
    async def request_input(attempt_id: str, body: InputRequestBody, request: Request) -> Any:
        """A repeat of the same sequence answers the acknowledgement again; another body is 409."""
        who = ctx.principal(request)
        run_id = _run_of_attempt(attempt_id)
        await check_holder(ctx, who.name, run_id, attempt_id)
        command_id = command_id_for(run_id, "RequestInput", f"{attempt_id}/{body.sequence}")
        view = await view_of(run_id)
        first = next((e for e in view["history"] if e.get("causationId") == command_id), None)
        if first is not None:
            request_fields = {PRINCIPAL_FIELD: who.name, **body.model_dump(mode="json")}
            fields = differing_fields(request_fields, _input_request_fields(dict(first)))
            if fields:
                raise conflict_problem(
                    f"sequence {body.sequence} of attempt {attempt_id}", run_id, "an input request", fields
                )
            return {
                "acknowledged": True,
                "requestId": first["details"]["requestId"],
                "runStatus": view["status"],
                "leaseReleased": True,
            }
        schema_refused = schema_problem(body.inputSchema)
        if schema_refused:
            raise ApiProblem("validation-failed", schema_refused)
        command = RequestInput(
            command_id=command_id,
            run_id=run_id,
            issued_at=ctx.deps.clock.now_ms(),
            correlation_id=attempt_id,
            actor=who.name,
            attempt_id=attempt_id,
            lease_epoch=body.leaseEpoch,
            sequence=body.sequence,
            checkpoint_digest=body.checkpointDigest,
            input_schema=canonical_json(body.inputSchema),
            prompt=body.prompt,
            expires_at=body.expiresAt,
        )
        outcome = await ctx.publish_and_wait(command)
        if isinstance(outcome, Rejected):
            return rejection_problem(outcome, request.url.path)
        if isinstance(outcome, PendingCommand):
            return pending_response(outcome)
        assert outcome.view is not None
        # The acknowledgement the runner waits for before it releases its process (EXE-8).
        return {
            "acknowledged": True,
            "requestId": outcome.view["input"]["requestId"],
            "runStatus": outcome.view["status"],
            "leaseReleased": True,
        }

    @router.post("/runs/{run_id}/input", summary="Answer a run that waits for input (EXE-8)")
    async def provide_input(run_id: str, body: InputAnswerBody, request: Request) -> Any:
        """A repeat of the same responseId answers the view again; with another answer it is 409."""
        who = ctx.principal(request)
        view = await view_of(run_id)
        if who.name != view["submittedBy"] and who.role != Role.OPERATOR:
            raise ApiProblem("forbidden", f"{who.name} may not answer run {run_id}", runId=run_id)
        wait = view.get("input")
        if wait is None:
            raise ApiProblem("invalid-transition", f"run {run_id} never asked for input", runId=run_id)
        answered = wait.get("response")
        if answered is not None and answered["responseId"] == body.responseId:
            fields = differing_fields(
                {PRINCIPAL_FIELD: who.name, "answer": body.answer},
                {PRINCIPAL_FIELD: answered.get("by"), "answer": answered.get("answer")},
            )
            if fields:
                raise conflict_problem(f"responseId {body.responseId!r}", run_id, "an answer", fields)
            return view  # the same answer again: no further attempt
        answer_refused = answer_problem(body.answer, wait["inputSchema"])
        if answer_refused:
            raise ApiProblem("input-invalid", answer_refused[0], path=answer_refused[1], runId=run_id)
        command = ProvideInput(
            command_id=command_id_for(run_id, "ProvideInput", body.responseId),
            run_id=run_id,
            issued_at=ctx.deps.clock.now_ms(),
            correlation_id=request.headers.get("x-correlation-id") or run_id,
            actor=who.name,
            response_id=body.responseId,
            answer=canonical_json(body.answer),
        )
        outcome = await ctx.publish_and_wait(command)
        if isinstance(outcome, Rejected):
            return rejection_problem(outcome, request.url.path)
        if isinstance(outcome, PendingCommand):
            return pending_response(outcome)
        return outcome.view

    @router.post("/attempts/{attempt_id}/uploads", status_code=201, summary="An upload grant (EXE-15)")
    async def upload_grant(attempt_id: str, body: UploadGrantBody, request: Request) -> Any:
        who = ctx.principal(request)
        run_id = _run_of_attempt(attempt_id)
        await check_holder(ctx, who.name, run_id, attempt_id)
        refuse_quarantined(ctx, run_id)  # QUA-1: a quarantined run's grants are revoked
        command = RequestUploadGrant(
            command_id=f"cmd_{uuid.uuid4().hex}",
            run_id=run_id,
            issued_at=ctx.deps.clock.now_ms(),
            correlation_id=attempt_id,
            actor=who.name,
            attempt_id=attempt_id,
            lease_epoch=body.leaseEpoch,
            destination=body.destination,
            max_bytes=body.maxBytes,
            media_type=body.mediaType,
        )
        outcome = await ctx.publish_and_wait(command, wait_for_view=False)
        if isinstance(outcome, Rejected):
            return rejection_problem(outcome, request.url.path)
        if isinstance(outcome, PendingCommand):
            return pending_response(outcome)
        event = outcome.decided.event
        assert isinstance(event, UploadGrantIssued)
        return {
            "grantId": event.grant_id,
            "uploadUrl": f"/uploads/{event.grant_id}",
            "key": event.key_prefix + event.destination,
            "artifactId": event.destination,
            "maxBytes": event.max_bytes,
            "mediaType": event.media_type,
            "expiresAt": event.expires_at,
        }

    @router.put("/uploads/{grant_id}", status_code=201, summary="Upload the bytes of a granted artifact")
    async def upload(
        grant_id: str,
        request: Request,
        derivedFrom: Annotated[list[str] | None, Query(max_length=1000)] = None,
        step: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    ) -> Any:
        """Only the holder of the attempt the grant was issued to may upload under it. QUA-2:
        `derivedFrom` (artifact ids, repeated) and `step` go into the artifact's envelope."""
        who = ctx.principal(request)
        run_id = run_id_of_grant(grant_id)
        if run_id is None:
            raise ApiProblem("grant-not-found", f"{grant_id!r} is not an upload grant")
        grant = None
        while True:  # the grant is committed; the view may trail it by a few ms
            view = await view_of(run_id)
            grant = next((g for g in view.get("uploadGrants", []) if g["grantId"] == grant_id), None)
            if grant is not None or ctx.remaining() <= 0.02:
                break
            await asyncio.sleep(0.02)
        if grant is None:
            raise ApiProblem("grant-not-found", f"no upload grant {grant_id} for run {run_id}")
        await check_holder(ctx, who.name, run_id, grant["attemptId"])
        refuse_quarantined(ctx, run_id)
        if ctx.deps.clock.now_ms() >= grant["expiresAt"]:
            raise ApiProblem("grant-expired", f"upload grant {grant_id} expired at {grant['expiresAt']}")
        limit = int(grant["maxBytes"])
        with tempfile.SpooledTemporaryFile(max_size=8 << 20) as spool:
            received = 0
            async for chunk in request.stream():
                received += len(chunk)
                if received > limit:
                    raise ApiProblem("upload-too-large", f"the grant allows {limit} bytes", maxBytes=limit)
                spool.write(chunk)
            spool.seek(0)
            key = grant["keyPrefix"] + grant["destination"]
            try:
                stored = await asyncio.to_thread(
                    ctx.deps.objects.put,
                    key,
                    cast(BinaryIO, spool),
                    max_bytes=limit,
                    media_type=grant["mediaType"],
                )
            except ObjectTooLarge as exc:
                raise ApiProblem("upload-too-large", str(exc), maxBytes=limit) from exc
            except KeyExists as exc:
                raise ApiProblem("artifact-exists", str(exc)) from exc
        known_step = -1 if step is None else step  # unknown: inside any taint of the run
        envelope = await register_upload(ctx, who, view, grant, stored, derivedFrom or [], known_step)
        if not isinstance(envelope, dict):
            return envelope  # the graph refused the envelope (an unknown derivedFrom, ...)
        return {
            "artifactId": grant["destination"],
            "key": key,
            "digest": stored.digest,
            "sizeBytes": stored.size_bytes,
            "mediaType": stored.media_type,
            **envelope,
        }

    return router
