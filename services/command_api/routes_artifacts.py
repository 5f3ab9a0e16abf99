"""Artifacts through Tenure's mediation gateway (QUA-2): envelopes, reads as edges, clearing.

* GET /artifacts/{artifactId}?runId=<reader run>: the bytes, if the artifact may be served. Every
  read is decided by the tenant's provenance graph (RecordArtifactRead): a read of a TAINTED
  artifact answers `artifact-quarantined` and serves nothing; any other is recorded as an edge
  (reader run -> artifact) before a byte is sent, so a later taint reaches the reader. The
  headers say the taint (X-Tenure-Taint: UNTAINTED, SUSPECT, CLEARED) and the content hash. A
  runner reads for its run (`runId`, as that run's lease holder); operators, verifiers and the
  service role may read without one (recorded as the principal's read).
* GET /artifacts/{artifactId}/envelope: the immutable envelope and the taint, tainted or not
  (audit: nothing of the content).
* GET /artifacts?tenant=&runId=&includeTombstoned=: a tenant's artifacts; TAINTED rows are
  tombstoned: hidden unless an operator or verifier asks for them.
* POST /artifacts/{artifactId}/clear (operator or verifier, never the producing run's principal)
  `{"reason", "evidence"}`: CLEARED, with who, what and the evidence recorded.

A committed saga step's output is an artifact too: the saga registers its envelope with the
commit (services/saga_orchestrator/step_artifacts.py); its bytes are the step's output text, read
from the trajectory, not the object store.

`register_upload` (called by PUT /uploads/{grantId}) registers an uploaded artifact's envelope,
with `derivedFrom` and `step` as the uploader declares them; `refuse_quarantined` is the upload
routes' check that a quarantined run's grants are revoked.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field

from services.command_api.context import ApiContext
from services.command_api.models import ApiBody, Text
from services.command_api.problems import QUARANTINE_REJECTION_PROBLEMS, ApiProblem, problem_response
from services.command_api.quarantine_deps import publish, quarantine_deps
from services.common.auth import Principal, Role
from services.common.contracts.quarantine import (
    MAX_REASON_CHARS,
    ClearArtifacts,
    QuarantineRejectionCode,
    RecordArtifactRead,
    RegisterArtifact,
    graph_id,
)
from services.common.decisions import Rejected
from services.common.ids import canonical_json, derived_id
from services.quarantine.domain import ArtifactStatus, servable
from services.quarantine.view import render_artifact
from services.saga_orchestrator.step_artifacts import parse_step_location

__all__ = [
    "ArtifactClearBody",
    "artifact_bytes",
    "artifact_id_for",
    "artifacts_router",
    "board_artifact",
    "refuse_quarantined",
    "register_upload",
    "serve_recorded_read",
]

ARTIFACT_ID = re.compile(r"art_[0-9a-f]{32}")
_AUDIT_ROLES = (Role.OPERATOR, Role.VERIFIER, Role.SERVICE)


def artifact_id_for(run_id: str, destination: str) -> str:
    """An artifact's id: fixed by its run and its grant's destination (one artifact per grant)."""
    return "art_" + hashlib.sha256(f"{run_id}/{destination}".encode()).hexdigest()[:32]


class ArtifactClearBody(ApiBody):
    reason: Text = Field(min_length=1, max_length=MAX_REASON_CHARS)
    evidence: dict[str, Any] | None = None


def refuse_quarantined(ctx: ApiContext, run_id: str) -> None:
    """QUA-1 stage 2: every upload grant of a quarantined run is revoked."""
    deps = ctx.deps.quarantine
    if deps is not None and deps.board.is_quarantined(run_id):
        raise ApiProblem(
            "run-quarantined",
            f"run {run_id} is quarantined: its upload grants are revoked; nothing was stored",
            runId=run_id,
        )


async def register_upload(
    ctx: ApiContext,
    who: Principal,
    run: dict[str, Any],
    grant: dict[str, Any],
    stored: Any,
    derived_from: list[str],
    step: int,
) -> dict[str, Any] | JSONResponse:
    """The uploaded artifact's envelope in the tenant's graph; its reference, or the refusal."""
    if ctx.deps.quarantine is None:
        return {}
    run_id = str(run["runId"])
    artifact_id = artifact_id_for(run_id, grant["destination"])
    command = RegisterArtifact(
        command_id=derived_id("cmd", artifact_id, "register", stored.digest),
        run_id=graph_id(str(run["tenant"])),
        issued_at=ctx.deps.clock.now_ms(),
        correlation_id=run_id,
        actor=who.name,
        artifact_id=artifact_id,
        producer_run_id=run_id,
        attempt_id=str(grant["attemptId"]),
        step=step,
        content_hash=stored.digest,
        size_bytes=int(stored.size_bytes),
        media_type=str(stored.media_type),
        source="upload",
        location=grant["keyPrefix"] + grant["destination"],
        derived_from=tuple(dict.fromkeys(derived_from)),
    )
    outcome = await publish(ctx, command)
    if isinstance(outcome, Rejected) and outcome.rejection.code == QuarantineRejectionCode.NOTHING_TO_DO:
        hit = quarantine_deps(ctx).board.artifact(artifact_id)  # the same upload again
        return {"artifactRef": artifact_id, "taint": hit[1].status.value if hit else None}
    if isinstance(outcome, Rejected):
        r = outcome.rejection
        return problem_response(
            QUARANTINE_REJECTION_PROBLEMS.get(r.code, "validation-failed"),
            r.detail,
            code=r.code,
            runId=run_id,
        )
    status = outcome.event.status if outcome is not None else None
    return {"artifactRef": artifact_id, "taint": status}


def r_code(outcome: Rejected) -> str:
    return str(outcome.rejection.code)


async def board_artifact(ctx: ApiContext, artifact_id: str) -> Any:
    """(graph, artifact) from the quarantine board, or None: waiting up to half a second (within
    the request's deadline), since a registration just answered may still be on its way to the
    board's fold."""
    board = quarantine_deps(ctx).board
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(0.5, ctx.remaining())
    while True:
        hit = board.artifact(artifact_id)
        if hit is not None or loop.time() >= deadline:
            return hit
        await asyncio.sleep(0.01)


async def artifact_bytes(ctx: ApiContext, artifact: Any) -> bytes:
    """An upload's bytes from the object store; a saga step's output from its trajectory."""
    step = parse_step_location(artifact.location)
    if step is not None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(0.5, ctx.remaining())
        while True:  # the commit is on the log; its projection may be a moment behind
            output = await ctx.in_thread("the trajectory views", ctx.deps.views.step_output, *step)
            if output is not None or loop.time() >= deadline:
                break
            await asyncio.sleep(0.01)
        if output is None:
            raise ApiProblem("artifact-not-found", f"the output of {artifact.artifact_id} is not shown yet")
        return output.encode("utf-8")
    try:
        handle = await ctx.in_thread("the object store", ctx.deps.objects.open, artifact.location)
    except LookupError as exc:
        raise ApiProblem(
            "artifact-not-found", f"the bytes of {artifact.artifact_id} are gone: {exc}"
        ) from exc
    with handle:
        data: bytes = await ctx.in_thread("the object store", handle.read)
    return data


async def serve_recorded_read(
    ctx: ApiContext,
    request: Request,
    graph: Any,
    artifact: Any,
    who: Principal,
    *,
    reader_run_id: str,
    correlation_id: str,
    key: tuple[str, ...],
) -> Response:
    """Serve an artifact's bytes once its read is recorded in the tenant's provenance graph
    (QUA-2: a later taint of the artifact reaches every run that read it); a refused or
    undecided read serves nothing. `key` makes the read command's id."""
    now = ctx.deps.clock.now_ms()
    command = RecordArtifactRead(
        command_id=derived_id("cmd", artifact.artifact_id, "read", *key, str(now)),
        run_id=graph.graph_id,
        issued_at=now,
        correlation_id=correlation_id,
        actor=who.name,
        artifact_id=artifact.artifact_id,
        reader_run_id=reader_run_id,
        reader=who.name,
    )
    outcome = await publish(ctx, command)
    if isinstance(outcome, Rejected):
        r = outcome.rejection
        slug = QUARANTINE_REJECTION_PROBLEMS.get(r.code, "artifact-quarantined")
        return problem_response(
            slug, r.detail, request.url.path, code=r.code, artifactId=artifact.artifact_id
        )
    if outcome is None:
        raise ctx.unavailable("the read was not decided in time; nothing was served")
    data = await artifact_bytes(ctx, artifact)
    return Response(
        content=data,
        media_type=artifact.media_type,
        headers={"X-Tenure-Taint": outcome.event.status, "X-Tenure-Content-Hash": artifact.content_hash},
    )


def artifacts_router(ctx: ApiContext) -> APIRouter:
    router = ctx.guarded(tags=["artifacts"])

    async def found(artifact_id: str) -> Any:
        if not ARTIFACT_ID.fullmatch(artifact_id):
            raise ApiProblem("artifact-not-found", f"{artifact_id[:80]!r} is not an artifact id")
        hit = await board_artifact(ctx, artifact_id)
        if hit is None:
            raise ApiProblem("artifact-not-found", f"no artifact {artifact_id}")
        return hit

    def quarantined(artifact: Any, path: str) -> JSONResponse:
        return problem_response(
            "artifact-quarantined",
            f"artifact {artifact.artifact_id} is TAINTED (quarantine of run {artifact.taint_origin}); "
            "nothing is served until an operator or an independent verifier clears it",
            path,
            code="ARTIFACT_QUARANTINED",
            artifactId=artifact.artifact_id,
            taintOrigin=artifact.taint_origin,
        )

    @router.get(
        "/artifacts/{artifact_id}",
        summary="Read an artifact through the mediation gateway (QUA-2)",
        name="read_artifact",
    )
    async def read(
        artifact_id: str,
        request: Request,
        runId: Annotated[str | None, Query(max_length=200)] = None,
    ) -> Any:
        who = ctx.principal(request)
        graph, artifact = await found(artifact_id)
        if not servable(artifact):  # the fold says TAINTED: refused without a round trip
            return quarantined(artifact, request.url.path)
        if runId is None and who.role not in _AUDIT_ROLES and not ctx.development_mode:
            raise ApiProblem("forbidden", "a runner reads for a run: give ?runId=<your run>")
        if runId is not None and who.role not in _AUDIT_ROLES and not ctx.development_mode:
            reader = await ctx.view(runId)
            lease = (reader or {}).get("lease") or {}
            if reader is None or lease.get("holderPrincipal") != who.name:
                raise ApiProblem("forbidden", f"{who.name} does not hold a lease of run {runId}")
        return await serve_recorded_read(
            ctx,
            request,
            graph,
            artifact,
            who,
            reader_run_id=runId or "",
            correlation_id=runId or artifact_id,
            key=(runId or who.name,),
        )

    @router.get("/artifacts/{artifact_id}/envelope", summary="An artifact's envelope and taint (audit)")
    async def envelope(artifact_id: str) -> Any:
        _, artifact = await found(artifact_id)
        return render_artifact(artifact)

    @router.get("/artifacts", summary="A tenant's artifacts; tainted rows are tombstoned (hidden)")
    async def listing(
        request: Request,
        tenant: Annotated[str, Query(min_length=1, max_length=200)],
        runId: Annotated[str | None, Query(max_length=200)] = None,
        includeTombstoned: bool = False,
    ) -> Any:
        who = ctx.principal(request)
        if includeTombstoned and who.role not in _AUDIT_ROLES and not ctx.development_mode:
            raise ApiProblem("forbidden", "tombstoned artifacts are shown to operators and verifiers only")
        graph = quarantine_deps(ctx).board.graph(tenant)
        artifacts = sorted((graph.artifacts.values() if graph else ()), key=lambda a: a.artifact_id)
        items = [
            render_artifact(a)
            for a in artifacts
            if (runId is None or a.producer_run_id == runId) and (includeTombstoned or not a.tombstoned)
        ]
        return {"items": items, "count": len(items), "tombstonedHidden": not includeTombstoned}

    @router.post(
        "/artifacts/{artifact_id}/clear",
        status_code=202,
        summary="Clear an artifact (QUA-2)",
        name="clear_artifact",
    )
    async def clear(artifact_id: str, body: ArtifactClearBody, request: Request) -> Any:
        who = ctx.principal(request)
        graph, artifact = await found(artifact_id)
        producer = await ctx.view(artifact.producer_run_id)
        holders = {
            str(lease.get("holderPrincipal"))
            for lease in [*(producer or {}).get("leaseHistory", []), (producer or {}).get("lease") or {}]
        }
        state = quarantine_deps(ctx).board.quarantine(artifact.producer_run_id)
        if who.name in holders or (state is not None and who.name == state.holder):
            raise ApiProblem(
                "clearing-forbidden",
                f"{who.name} is the producing run's own principal: it may not clear {artifact_id}",
                artifactId=artifact_id,
            )
        if who.role not in (Role.OPERATOR, Role.VERIFIER):
            raise ApiProblem("clearing-forbidden", "clearing needs the operator or the verifier role")
        if artifact.status not in (ArtifactStatus.TAINTED, ArtifactStatus.SUSPECT):
            return JSONResponse(render_artifact(artifact), status_code=202)
        command = ClearArtifacts(
            command_id=derived_id("cmd", artifact_id, "clear", str(artifact.status_version)),
            run_id=graph.graph_id,
            issued_at=ctx.deps.clock.now_ms(),
            correlation_id=artifact_id,
            actor=who.name,
            cleared_run_id="",
            artifact_ids=(artifact_id,),
            reason=body.reason,
            evidence=canonical_json(body.evidence) if body.evidence is not None else "",
            role=str(who.role),
        )
        outcome = await publish(ctx, command)
        if isinstance(outcome, Rejected) and r_code(outcome) != QuarantineRejectionCode.NOTHING_TO_DO:
            r = outcome.rejection
            slug = QUARANTINE_REJECTION_PROBLEMS.get(r.code, "validation-failed")
            return problem_response(slug, r.detail, request.url.path, code=r.code)
        board = quarantine_deps(ctx).board
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ctx.remaining()
        while outcome is not None and loop.time() < deadline:
            hit = board.artifact(artifact_id)
            if hit is not None and hit[1].status is ArtifactStatus.CLEARED:
                return JSONResponse(render_artifact(hit[1]), status_code=202)
            await asyncio.sleep(0.005)
        hit = board.artifact(artifact_id)
        return JSONResponse(render_artifact(hit[1] if hit else artifact), status_code=202)

    return router
