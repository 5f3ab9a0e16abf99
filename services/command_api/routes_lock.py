"""A run's lock (EXE-16): what local mode downloads to run a Run on a local runner.

* GET /runs/{runId}/lock: the pinned, self-verifying document (services.common.contracts.locks):
  the run id, tenant, agentRevisionId, the executionSpec as submitted with its `specDigest`, the
  artifacts its `inputs` name (digest, size, media type, where to download them) and a
  `lockDigest` over the whole. A read like GET /runs/{runId}: any authenticated caller; an input
  must be an artifact of the run's own tenant, and a TAINTED one is refused (QUA-2), so a lock
  never pins what the mediation gateway would not serve. Nothing is recorded.
* GET /runs/{runId}/lock/artifacts/{artifactId}: the bytes of one input of that lock, to the
  run's submitter (who runs it locally) or an operator, verifier or service. The read goes
  through the same provenance graph as GET /artifacts/{id}: a TAINTED artifact is refused, and
  the read is recorded as an edge (this run reads that artifact) before a byte is sent, so a
  later taint of the input still reaches the run. The run itself is untouched: no claim, no
  attempt, no event on runs.events.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from services.command_api.context import ApiContext
from services.command_api.problems import ApiProblem
from services.command_api.routes_artifacts import board_artifact, serve_recorded_read
from services.common.auth import Principal, Role
from services.common.contracts.locks import BadInputs, input_artifact_ids, seal_lock
from services.common.contracts.quarantine import graph_id
from services.quarantine.domain import servable

__all__ = ["LockedArtifact", "RunLock", "lock_router"]

_READERS = (Role.OPERATOR, Role.VERIFIER, Role.SERVICE)


class LockedArtifact(BaseModel):
    artifactId: str = Field(description="An input the spec names (art_ + 32 hex).")
    digest: str = Field(description="sha256:<64 hex> of its bytes; check it before use.")
    sizeBytes: int
    mediaType: str
    download: str = Field(description="Where its bytes are served: GET this path.")


class RunLock(BaseModel):
    """The pinned, self-verifying document local mode runs a Run from (EXE-16)."""

    lockVersion: int
    runId: str
    tenant: str
    agentRevisionId: str | None
    executionSpec: dict[str, Any] = Field(description="The ExecutionSpec as submitted.")
    specDigest: str = Field(description="sha256 over the canonical JSON of executionSpec.")
    artifacts: list[LockedArtifact] = Field(description="The inputs executionSpec.inputs names, in order.")
    lockDigest: str = Field(description="sha256 over the canonical JSON of every other member.")


def _download_path(run_id: str, artifact_id: str) -> str:
    return f"/runs/{run_id}/lock/artifacts/{artifact_id}"


def lock_router(ctx: ApiContext) -> APIRouter:
    router = ctx.guarded(tags=["local mode"])

    async def run_of(run_id: str) -> dict[str, Any]:
        view = await ctx.view(run_id)
        if view is None:
            raise ApiProblem("run-not-found", f"run {run_id} does not exist", runId=run_id)
        return view

    def inputs_of(view: dict[str, Any]) -> tuple[str, ...]:
        try:
            return input_artifact_ids(view["executionSpec"])
        except BadInputs as exc:
            raise ApiProblem("validation-failed", f"run {view['runId']}: {exc}", runId=view["runId"]) from exc

    async def envelope(view: dict[str, Any], artifact_id: str) -> Any:
        """The input's envelope, in the run's own tenant's graph, and servable."""
        hit = await board_artifact(ctx, artifact_id)
        if hit is None or hit[0].graph_id != graph_id(str(view["tenant"])):
            # Another tenant's artifact is "not found" to this run: its existence is not told.
            raise ApiProblem(
                "artifact-not-found",
                f"run {view['runId']} names input {artifact_id}, which is no artifact of tenant "
                f"{view['tenant']}",
                artifactId=artifact_id,
            )
        artifact = hit[1]
        if not servable(artifact):
            raise ApiProblem(
                "artifact-quarantined",
                f"input {artifact_id} is TAINTED (quarantine of run {artifact.taint_origin}); "
                "no lock pins it until an operator or an independent verifier clears it",
                code="ARTIFACT_QUARANTINED",
                artifactId=artifact_id,
            )
        return hit

    @router.get(
        "/runs/{run_id}/lock",
        response_model=RunLock,
        summary="The run's lock: pinned spec and verified inputs (EXE-16)",
    )
    async def run_lock(run_id: str) -> Any:
        view = await run_of(run_id)
        artifacts = []
        for artifact_id in inputs_of(view):
            _, artifact = await envelope(view, artifact_id)
            artifacts.append(
                {
                    "artifactId": artifact_id,
                    "digest": artifact.content_hash,
                    "sizeBytes": artifact.size_bytes,
                    "mediaType": artifact.media_type,
                    "download": _download_path(run_id, artifact_id),
                }
            )
        return seal_lock(
            run_id, str(view["tenant"]), view.get("agentRevisionId"), view["executionSpec"], artifacts
        )

    def may_read(who: Principal, view: dict[str, Any]) -> None:
        if who.role in _READERS or who.name == view.get("submittedBy") or ctx.development_mode:
            return
        raise ApiProblem(
            "forbidden",
            f"{who.name} did not submit run {view['runId']}; its inputs are read by its submitter "
            "(who runs it locally) or an operator, verifier or service",
            runId=view["runId"],
        )

    @router.get(
        "/runs/{run_id}/lock/artifacts/{artifact_id}",
        response_class=Response,
        responses={200: {"content": {"application/octet-stream": {}}, "description": "The bytes."}},
        summary="The bytes of an input the run's lock pins (EXE-16; read through QUA-2)",
    )
    async def lock_artifact(run_id: str, artifact_id: str, request: Request) -> Any:
        who = ctx.principal(request)
        view = await run_of(run_id)
        may_read(who, view)
        if artifact_id not in inputs_of(view):
            raise ApiProblem(
                "artifact-not-found", f"run {run_id}'s lock pins no input {artifact_id[:80]}", runId=run_id
            )
        graph, artifact = await envelope(view, artifact_id)
        return await serve_recorded_read(
            ctx,
            request,
            graph,
            artifact,
            who,
            reader_run_id=run_id,
            correlation_id=run_id,
            key=(run_id, who.name),
        )

    return router
