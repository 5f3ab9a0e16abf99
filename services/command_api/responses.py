"""Every operation's 2xx answers, typed, with an example: the success half of the OpenAPI document.

Keyed by operationId (the route function's name, pinned by tests/unit/test_openapi_document.py),
so the route files stay as they are: `install_responses` writes these into the document that
openapi_doc.py builds, and nothing else. The models are documentation only (see
responses_runs.py): no route answers through them, so an answer's shape and cost are unchanged.

Besides the route's own status, an operation lists what it really answers too: 200 for the
repeat of a creation (the same Idempotency-Key), 202 when the command is durable but its
decision did not arrive in time (`PendingAnswer`: poll, or repeat the request), 204 for an empty
queue. A test drives a client generated from this document through the README's walkthrough on
the real system and fails on any status or body the document does not declare.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from services.command_api.responses_examples import EXAMPLES
from services.command_api.responses_runs import (
    BatchRenewalAnswer,
    HeartbeatAnswer,
    InputAcknowledgement,
    LeaseGrant,
    LeaseRecordAnswer,
    PendingAnswer,
    QueueGrant,
    RunListPage,
    RunView,
    UploadAnswer,
    UploadGrantAnswer,
)
from services.command_api.responses_views import (
    ArtifactListing,
    ArtifactView,
    BlockChange,
    BlockList,
    BreakerList,
    BreakerOverrideAnswer,
    BreakerView,
    BulkheadConfig,
    Health,
    IncidentList,
    ObservationAnswer,
    ProblemDescription,
    QuarantineView,
    Readiness,
    ScheduleList,
    SchedulePending,
    ScheduleView,
    StepTicket,
    TrajectoryView,
    WatchdogView,
)
from services.command_api.routes_lock import RunLock

__all__ = ["ANSWERS", "Answer", "install_responses"]

JSON = "application/json"
ANY_MEDIA = "*/*"


@dataclass(frozen=True)
class Answer:
    """One documented 2xx answer: its models (any of them), description and example's name."""

    models: tuple[type[BaseModel], ...]
    description: str
    example: str | None = None
    media_type: str = JSON
    location: str | None = None  # what the Location header names, when the answer sends one


def _located(answer: Answer, what: str) -> Answer:
    return Answer(answer.models, answer.description, answer.example, answer.media_type, what)


def _one(model: type[BaseModel], description: str, example: str) -> Answer:
    return Answer((model,), description, example)


_PENDING = _one(PendingAnswer, "Durable but not decided in time: poll, or repeat (same key)", "pending")
_RUN = "The run (/runs/{runId})"
_NO_BODY = Answer((), "Nothing to claim right now")


def _command(status: int, model: type[BaseModel], what: str, example: str) -> dict[int, Answer]:
    """A command that waits for its decision: the decided answer, else 202 pending."""
    return {status: _one(model, what, example), 202: _PENDING}


_TRAJECTORY_COMMAND = _command(200, TrajectoryView, "The trajectory after the command", "trajectory")
_WATCHDOG_COMMAND = _command(200, WatchdogView, "The watchdog after the command", "watchdog")
_BREAKER_OVERRIDE = {
    200: _one(BreakerOverrideAnswer, "The breaker after the override", "breaker_override"),
    202: _one(PendingAnswer, "Durable, not yet seen decided here: GET the breaker", "breaker_pending"),
}
_SCHEDULE_COMMAND = {
    200: _one(ScheduleView, "The schedule after the command", "schedule"),
    202: _one(SchedulePending, "Durable, not yet decided: GET the schedule", "schedule_pending"),
}
_BLOCK = {
    200: _one(BlockChange, "The change, in force at this API", "block"),
    202: _one(BlockChange, "Durable; in force here shortly (status pending)", "block_pending"),
}
_QUARANTINE = {202: _one(QuarantineView, "The run's quarantine view", "quarantine")}

ANSWERS: dict[str, dict[int, Answer]] = {
    "describe_problem": {200: _one(ProblemDescription, "What the problem type means", "problem")},
    "healthz": {200: _one(Health, "The process is alive", "health")},
    "readyz": {200: _one(Readiness, "Every dependency is ready", "ready")},
    # runs
    "submit_run": {
        201: _located(_one(RunView, "The run, created", "queued_run"), _RUN),
        200: _located(
            _one(RunView, "The same Idempotency-Key again: the same run, nothing new", "queued_run"), _RUN
        ),
        202: _located(_PENDING, _RUN),
    },
    "list_runs": {200: _one(RunListPage, "A page of runs, oldest submissions first", "run_page")},
    "get_run": {200: _one(RunView, "The run", "running_run")},
    "cancel_run": _command(200, RunView, "The run, cancelled or cancelling", "cancelled_run"),
    "retry_run": {
        200: _one(RunView, "The run, queued again (or this retry, answered again)", "queued_run"),
        201: _located(
            _one(RunView, "A finished run's retry: a new run with parentRunId", "queued_run"), _RUN
        ),
        202: _PENDING,
    },
    # leases and a runner's work
    "claim": {
        201: _one(LeaseGrant, "The grant: an Attempt, its lease and epoch", "grant"),
        202: _located(_PENDING, _RUN),
    },
    "claim_next": {
        201: _located(_one(QueueGrant, "The grant of the queue's next run", "queue_grant"), _RUN),
        202: _located(_PENDING, _RUN),
        204: _NO_BODY,
    },
    "heartbeat": _command(200, HeartbeatAnswer, "The lease, renewed", "heartbeat"),
    "renew_leases": {200: _one(BatchRenewalAnswer, "One result per renewal, in order", "renewals")},
    "report": _command(200, RunView, "The run after the report", "cancelled_run"),
    "lease_record": {200: _one(LeaseRecordAnswer, "The run's lease record (LEASE-2)", "lease_record")},
    "takeover": _command(200, LeaseGrant, "The new holder's grant", "grant"),
    "request_input": _command(
        200, InputAcknowledgement, "Checkpoint saved; the lease is released", "input_ack"
    ),
    "provide_input": _command(200, RunView, "The run, queued to resume with the answer", "queued_run"),
    "upload_grant": _command(201, UploadGrantAnswer, "Where and how much to upload", "upload_grant"),
    "upload": {201: _one(UploadAnswer, "The stored artifact", "upload")},
    # sagas
    "start_trajectory": _command(201, TrajectoryView, "The trajectory, started", "trajectory"),
    "get_trajectory": {200: _one(TrajectoryView, "The run's trajectory", "trajectory")},
    "propose_step": {
        202: Answer(
            (StepTicket, PendingAnswer),
            "The step's intent is recorded (a ticket), or not yet decided (pending): poll the trajectory",
            "step_ticket",
        )
    },
    "approve_pivot": _TRAJECTORY_COMMAND,
    "finish_trajectory": _TRAJECTORY_COMMAND,
    "adopt_lease": _TRAJECTORY_COMMAND,
    "abort_trajectory": _TRAJECTORY_COMMAND,
    "resolve_incident": _TRAJECTORY_COMMAND,
    "list_incidents": {200: _one(IncidentList, "Open incidents, oldest first", "incidents")},
    # the semantic watchdog
    "observe": {202: _one(ObservationAnswer, "The observation is durable", "observation")},
    "acknowledge_rollback": _WATCHDOG_COMMAND,
    "configure": _WATCHDOG_COMMAND,
    "get_watchdog": {200: _one(WatchdogView, "The run's watchdog", "watchdog")},
    # the block policy
    "block": _BLOCK,
    "unblock": _BLOCK,
    "blocks": {200: _one(BlockList, "The block policy in force", "blocks")},
    # circuit breakers and bulkheads
    "list_breakers": {200: _one(BreakerList, "Every breaker", "breakers")},
    "get_breaker": {200: _one(BreakerView, "The breaker with its transitions", "breaker")},
    "force_open_breaker": _BREAKER_OVERRIDE,
    "disable_breaker": _BREAKER_OVERRIDE,
    "reset_breaker": _BREAKER_OVERRIDE,
    "bulkheads": {200: _one(BulkheadConfig, "The configured bulkheads", "bulkheads")},
    # schedules
    "create_schedule": {
        201: _located(_one(ScheduleView, "The schedule, created", "schedule"), "The schedule"),
        200: _one(ScheduleView, "The same Idempotency-Key again: the same schedule", "schedule"),
        202: _one(SchedulePending, "Durable, not yet decided: GET the schedule", "schedule_pending"),
    },
    "list_schedules": {200: _one(ScheduleList, "The schedules", "schedules")},
    "get_schedule": {200: _one(ScheduleView, "The schedule", "schedule")},
    "patch_schedule": _SCHEDULE_COMMAND,
    "pause_schedule": _SCHEDULE_COMMAND,
    "resume_schedule": _SCHEDULE_COMMAND,
    "trigger_schedule": _SCHEDULE_COMMAND,
    # quarantine and artifacts
    "quarantine": _QUARANTINE,
    "suspicion": _QUARANTINE,
    "stage": _QUARANTINE,
    "clear_quarantine": _QUARANTINE,
    "read_quarantine": {200: _one(QuarantineView, "The run's quarantine view", "quarantine")},
    "read_artifact": {200: Answer((), "The artifact's bytes, in its own media type", "bytes", ANY_MEDIA)},
    "envelope": {200: _one(ArtifactView, "The artifact's envelope and taint", "artifact")},
    "listing": {200: _one(ArtifactListing, "The tenant's artifacts", "artifacts")},
    "clear_artifact": {202: _one(ArtifactView, "The artifact, cleared", "artifact")},
    # local mode (EXE-16)
    "run_lock": {200: _one(RunLock, "The run's lock: its spec and inputs, pinned by digest", "lock")},
    "lock_artifact": {200: Answer((), "A pinned input's bytes", "bytes", "application/octet-stream")},
}

_BINARY_SCHEMA = {"type": "string", "format": "binary"}
# PUT /uploads/{grantId} reads the raw body itself, so FastAPI cannot know it takes one.
_UPLOAD_BODY = {
    "required": True,
    "description": "The artifact's bytes (at most the grant's maxBytes); Content-Type is its media type.",
    "content": {"*/*": {"schema": _BINARY_SCHEMA}},
}


def _schemas() -> tuple[dict[type[BaseModel], dict[str, Any]], dict[str, Any]]:
    models = {m for answers in ANSWERS.values() for a in answers.values() for m in a.models}
    ordered = sorted(models, key=lambda m: m.__name__)
    refs, top = models_json_schema(
        [(m, "serialization") for m in ordered], ref_template="#/components/schemas/{model}"
    )
    return {m: refs[(m, "serialization")] for m in ordered}, top.get("$defs", {})


def _content(answer: Answer, refs: dict[type[BaseModel], dict[str, Any]]) -> dict[str, Any]:
    if not answer.models:
        schema: dict[str, Any] = _BINARY_SCHEMA
    elif len(answer.models) == 1:
        schema = refs[answer.models[0]]
    else:
        schema = {"anyOf": [refs[m] for m in answer.models]}
    media: dict[str, Any] = {"schema": schema}
    if answer.example is not None:
        media["example"] = EXAMPLES[answer.example]
    return {answer.media_type: media}


_REF = re.compile(r'"#/components/schemas/([^"]+)"')


def _referenced(document: dict[str, Any]) -> set[str]:
    """The component schemas the paths use, directly or through other schemas."""
    schemas = document.get("components", {}).get("schemas", {})
    seen: set[str] = set()
    todo = set(_REF.findall(json.dumps(document.get("paths", {}))))
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo |= set(_REF.findall(json.dumps(schemas.get(name, {}))))
    return seen


def install_responses(document: dict[str, Any]) -> None:
    """Write every operation's declared 2xx answers (and their schemas) into `document`; a schema
    only FastAPI's own 2xx answer used (a route's loose `response_model`) goes with it."""
    before = _referenced(document)
    refs, definitions = _schemas()
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in definitions.items():
        if schemas.get(name, definition) != definition:
            raise ValueError(f"response model {name} has the name of another schema: rename one")
        schemas[name] = definition
    for item in document.get("paths", {}).values():
        for operation in item.values():
            answers = ANSWERS.get(operation.get("operationId", ""))
            if answers is None:
                continue  # left as FastAPI wrote it: the unit test names it
            responses = operation.setdefault("responses", {})
            for status in [s for s in responses if s.startswith("2")]:
                del responses[status]
            for status, answer in sorted(answers.items()):
                declared: dict[str, Any] = {"description": answer.description}
                if answer.location is not None:
                    declared["headers"] = {
                        "Location": {"description": answer.location, "schema": {"type": "string"}}
                    }
                if answer.models or answer.media_type != JSON:
                    declared["content"] = _content(answer, refs)
                responses[str(status)] = declared
            if operation.get("operationId") == "upload":
                operation["requestBody"] = _UPLOAD_BODY
    for name in before - _referenced(document):
        schemas.pop(name, None)
