"""A committed saga step's output as an artifact of the tenant's provenance graph (QUA-2); pure.

The issue's artifacts are the uploads (EXE-15) and the outputs of saga steps. The saga knows the
run's tenant from StartTrajectory v2 (the API copies it from the Run); a trajectory started by
an older writer has none, and registers nothing (there is no graph to put it in).

The envelope is fixed by the event alone: the artifact id by (run, step index, attempt), the
command id by the artifact and the content hash, so a commit decided again after a crash (the
same StepCommitted, or a re-decided one) registers the same envelope, which the graph answers
with nothing new. The bytes are the step's output text, UTF-8; the API serves them from the
trajectory (`location` names the run and the step, see `step_location`).
"""

from __future__ import annotations

import hashlib
import json

from services.common.contracts import StepCommitted
from services.common.contracts.quarantine import RegisterArtifact, graph_id
from services.common.ids import derived_id
from services.saga_orchestrator.domain import TrajectoryState

__all__ = [
    "MEDIA_TYPE",
    "SOURCE",
    "STEP_LOCATION_PREFIX",
    "TEXT_MEDIA_TYPE",
    "parse_step_location",
    "step_artifact",
    "step_artifact_id",
    "step_location",
]

SOURCE = "saga-step"
MEDIA_TYPE = "application/json"
TEXT_MEDIA_TYPE = "text/plain; charset=utf-8"
STEP_LOCATION_PREFIX = "trajectory:"


def step_artifact_id(run_id: str, step_index: int, attempt_id: str) -> str:
    """The same shape as an upload's id (art_ + 32 hex), from a namespace no upload can reach."""
    key = f"saga-step/{run_id}/{step_index}/{attempt_id}"
    return "art_" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


def step_location(run_id: str, step_index: int) -> str:
    return f"{STEP_LOCATION_PREFIX}{run_id}/steps/{step_index}"


def parse_step_location(location: str) -> tuple[str, int] | None:
    """(run id, step index) of a step output's location, else None (an object store key)."""
    if not location.startswith(STEP_LOCATION_PREFIX):
        return None
    run_id, sep, index = location[len(STEP_LOCATION_PREFIX) :].partition("/steps/")
    if not sep or not index.isdigit():
        return None
    return run_id, int(index)


def _media_type(output: str) -> str:
    try:
        json.loads(output)
    except ValueError:
        return TEXT_MEDIA_TYPE
    return MEDIA_TYPE


def step_artifact(event: StepCommitted, state: TrajectoryState | None, actor: str) -> RegisterArtifact | None:
    """The RegisterArtifact of `event`'s output, or None when the trajectory has no tenant."""
    if state is None or not state.tenant:
        return None
    data = event.output.encode("utf-8")
    content_hash = "sha256:" + hashlib.sha256(data).hexdigest()
    artifact_id = step_artifact_id(event.run_id, event.step_index, state.attempt_id)
    return RegisterArtifact(
        command_id=derived_id("cmd", artifact_id, "register", content_hash),
        run_id=graph_id(state.tenant),
        issued_at=event.occurred_at,
        correlation_id=event.correlation_id,
        actor=actor,
        artifact_id=artifact_id,
        producer_run_id=event.run_id,
        attempt_id=state.attempt_id,
        step=event.step_index,
        content_hash=content_hash,
        size_bytes=len(data),
        media_type=_media_type(event.output),
        source=SOURCE,
        location=step_location(event.run_id, event.step_index),
        derived_from=(),
    )
