"""Routes for schedules (EXE-14): create, list, describe, change, pause, resume, trigger.

Writes are the Schedule aggregate's commands on schedules.commands; the answer is read back from
the ScheduleBoard (a fold of schedules.events / schedules.rejections): 201/200 with the view once
the schedule shows the command, its refusal as a problem, or 202 when the deadline passed first.
Who may write: creating needs the submitter or operator role; changing a schedule needs its
owner (who created it) or an operator - the same rule as cancelling a run. A cron expression or
time zone that cannot be used is refused before anything is published: 422 invalid-schedule,
naming the `field` and why. GET /schedules/{id} shows the next firings in local time and UTC.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from services.command_api.context import ApiContext
from services.command_api.problems import SCHEDULE_REJECTION_PROBLEMS, ApiProblem
from services.common.auth import Principal, Role, require_role
from services.common.contracts.schedules import (
    SCHEDULE_ID_PATTERN,
    CreateSchedule,
    PauseSchedule,
    ResumeSchedule,
    ScheduleCommand,
    TriggerSchedule,
    UpdateSchedule,
)
from services.common.ids import canonical_json, derived_id
from services.common.messages import MessageCodec
from services.common.routing import schedule_command_record
from services.schedules.domain import CalendarError, ScheduleState, validate_cron, validate_zone
from services.schedules.view import ScheduleBoard, schedule_view

__all__ = ["SchedulePatch", "ScheduleRequest", "schedules_router"]

_IDEMPOTENCY_KEY = Header(default=None, alias="Idempotency-Key", max_length=200)
_NAME = r"^[^\x00-\x1f\x7f]*$"


class _Template(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    executionSpec: dict[str, Any]
    retrySafe: bool = False
    timeoutSeconds: int = Field(default=3600, ge=1, le=7 * 24 * 3600)
    maxAttempts: int = Field(default=1, ge=1, le=10)
    labels: dict[str, str] = Field(default_factory=dict, max_length=50)


class ScheduleRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    tenant: str = Field(min_length=1, max_length=100, pattern=_NAME)
    agentRevisionId: str = Field(min_length=1, max_length=200, pattern=_NAME)
    runTemplate: _Template
    timeZone: str = Field(min_length=1, max_length=100)
    cron: str = Field(min_length=1, max_length=200)
    overlapPolicy: Literal["skip", "queue"] = "skip"
    misfirePolicy: Literal["skip", "coalesce"] = "coalesce"
    nonexistentPolicy: Literal["skip", "shift"] = "skip"
    repeatedPolicy: Literal["first", "last", "both"] = "first"


class SchedulePatch(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    agentRevisionId: str | None = Field(default=None, min_length=1, max_length=200, pattern=_NAME)
    runTemplate: _Template | None = None
    timeZone: str | None = Field(default=None, min_length=1, max_length=100)
    cron: str | None = Field(default=None, min_length=1, max_length=200)
    overlapPolicy: Literal["skip", "queue"] | None = None
    misfirePolicy: Literal["skip", "coalesce"] | None = None
    nonexistentPolicy: Literal["skip", "shift"] | None = None
    repeatedPolicy: Literal["first", "last", "both"] | None = None


class _Reason(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    reason: str = Field(default="", max_length=1000)


def _check_calendar(cron: str, zone: str) -> None:
    try:
        validate_zone(zone)
        validate_cron(cron)
    except CalendarError as exc:
        raise ApiProblem("invalid-schedule", f"{exc.field}: {exc.detail}", field=exc.field) from None


def _definition(body: ScheduleRequest) -> dict[str, Any]:
    t = body.runTemplate
    return {
        "agent_revision_id": body.agentRevisionId,
        "execution_spec": canonical_json(t.executionSpec),
        "retry_safe": t.retrySafe,
        "timeout_seconds": t.timeoutSeconds,
        "max_attempts": t.maxAttempts,
        "labels": t.labels,
        "time_zone": body.timeZone,
        "cron": body.cron,
        "overlap_policy": body.overlapPolicy,
        "misfire_policy": body.misfirePolicy,
        "nonexistent_policy": body.nonexistentPolicy,
        "repeated_policy": body.repeatedPolicy,
    }


def _as_request(state: ScheduleState) -> dict[str, Any]:
    d = state.definition
    return {
        "tenant": state.tenant,
        "agentRevisionId": d.agent_revision_id,
        "runTemplate": {
            "executionSpec": json.loads(d.execution_spec),
            "retrySafe": d.retry_safe,
            "timeoutSeconds": d.timeout_seconds,
            "maxAttempts": d.max_attempts,
            "labels": dict(d.labels),
        },
        "timeZone": d.time_zone,
        "cron": d.cron,
        "overlapPolicy": d.overlap_policy,
        "misfirePolicy": d.misfire_policy,
        "nonexistentPolicy": d.nonexistent_policy,
        "repeatedPolicy": d.repeated_policy,
    }


def schedules_router(ctx: ApiContext) -> APIRouter:
    router = ctx.guarded()
    codec = MessageCodec()

    def board() -> ScheduleBoard:
        if ctx.deps.schedules is None:
            raise ctx.unavailable("the schedules view is not configured in this API")
        return ctx.deps.schedules

    async def current() -> ScheduleBoard:
        """The board once it holds every schedule on the log (else 503: it would answer 404)."""
        b = board()
        if not await ctx.in_thread("the schedules view", b.wait_current, max(ctx.remaining() - 0.5, 0.1)):
            raise ctx.unavailable(
                f"the schedules view is still reading schedules.events ({b.failure or 'catching up'})"
            )
        return b

    async def existing(schedule_id: str) -> ScheduleState:
        b = await current()
        state = b.get(schedule_id) if re.fullmatch(SCHEDULE_ID_PATTERN, schedule_id) else None
        if state is None:
            raise ApiProblem("schedule-not-found", f"schedule {schedule_id[:80]!r} does not exist")
        return state

    def may_change(who: Principal, state: ScheduleState, action: str) -> None:
        require_role(who, action, Role.SUBMITTER, Role.OPERATOR)
        if who.role != Role.OPERATOR and who.name != state.owner:
            raise ApiProblem(
                "forbidden",
                f"{who.name} did not create schedule {state.schedule_id}; {action} needs its owner or "
                "the operator role",
            )

    def header(
        request: Request, schedule_id: str, who: Principal, kind: str, key: str | None
    ) -> dict[str, Any]:
        return {
            "command_id": derived_id("cmd", schedule_id, kind, key or uuid.uuid4().hex),
            "run_id": schedule_id,
            "issued_at": ctx.deps.clock.now_ms(),
            "correlation_id": request.headers.get("x-correlation-id") or schedule_id,
            "actor": who.name,
        }

    async def send(command: ScheduleCommand, request: Request, status: int = 200) -> Any:
        await ctx.publish_record(schedule_command_record(codec, command), f"{type(command).__name__}")
        b, sid, cid = board(), command.run_id, command.command_id

        def answered() -> Any:
            rejected = b.rejection(cid)
            if rejected is not None:
                return ("rejected", rejected)
            state = b.get(sid)
            if state is not None and (cid in state.recent or _caused(state, cid)):
                return ("done", state)
            return None

        outcome = await ctx.in_thread(
            "the schedules processor", b.wait, answered, max(ctx.remaining() - 0.2, 0.1)
        )
        if outcome is None:
            return JSONResponse(
                {"scheduleId": sid, "commandId": cid, "status": "pending"},
                status_code=202,
                headers={"Location": f"/schedules/{sid}"},
            )
        if outcome[0] == "rejected":
            r = outcome[1]
            slug = SCHEDULE_REJECTION_PROBLEMS.get(r.code, "validation-failed")
            raise ApiProblem(slug, r.detail, code=r.code, scheduleId=sid, currentStatus=r.current_status)
        view = schedule_view(outcome[1], ctx.deps.clock.now_ms())
        return JSONResponse(view, status_code=status, headers={"Location": f"/schedules/{sid}"})

    @router.post("/schedules", status_code=201, summary="Create a schedule (idempotent by Idempotency-Key)")
    async def create_schedule(
        body: ScheduleRequest, request: Request, idempotency_key: str | None = _IDEMPOTENCY_KEY
    ) -> Any:
        who = ctx.principal(request)
        require_role(who, "creating a schedule", Role.SUBMITTER, Role.OPERATOR)
        _check_calendar(body.cron, body.timeZone)
        key = idempotency_key or uuid.uuid4().hex
        schedule_id = "sch_" + hashlib.sha256(f"{body.tenant}\x00{key}".encode()).hexdigest()[:24]
        known = (await current()).get(schedule_id)
        if known is not None:
            if known.owner != who.name or _as_request(known) != body.model_dump(mode="json"):
                raise ApiProblem(
                    "idempotency-key-conflict",
                    f"Idempotency-Key {key!r} already created schedule {schedule_id} with other values",
                    scheduleId=schedule_id,
                )
            return JSONResponse(schedule_view(known, ctx.deps.clock.now_ms()), status_code=200)
        command = CreateSchedule(
            **header(request, schedule_id, who, "CreateSchedule", key),
            tenant=body.tenant,
            **_definition(body),
        )
        return await send(command, request, status=201)

    @router.get("/schedules", summary="List schedules")
    async def list_schedules(tenant: str | None = Query(default=None, max_length=100)) -> Any:
        now = ctx.deps.clock.now_ms()
        states = sorted((await current()).states(), key=lambda s: s.schedule_id)
        items = [schedule_view(s, now, upcoming=1) for s in states if tenant is None or s.tenant == tenant]
        return {"items": items}

    @router.get(
        "/schedules/{schedule_id}", summary="A schedule, its next firings (local and UTC), its history"
    )
    async def get_schedule(schedule_id: str, next: int = Query(default=5, ge=0, le=100)) -> Any:
        return schedule_view(await existing(schedule_id), ctx.deps.clock.now_ms(), upcoming=next)

    @router.patch("/schedules/{schedule_id}", summary="Change a schedule (its owner or an operator)")
    async def patch_schedule(
        schedule_id: str,
        body: SchedulePatch,
        request: Request,
        idempotency_key: str | None = _IDEMPOTENCY_KEY,
    ) -> Any:
        who = ctx.principal(request)
        state = await existing(schedule_id)
        may_change(who, state, "changing a schedule")
        merged = {**_as_request(state), **body.model_dump(mode="json", exclude_none=True)}
        full = ScheduleRequest.model_validate(merged, strict=False)
        _check_calendar(full.cron, full.timeZone)
        command = UpdateSchedule(
            **header(request, schedule_id, who, "UpdateSchedule", idempotency_key), **_definition(full)
        )
        return await send(command, request)

    def _action(kind: type[Any], path: str, action: str) -> None:
        async def act(
            schedule_id: str,
            request: Request,
            body: _Reason | None = None,
            idempotency_key: str | None = _IDEMPOTENCY_KEY,
        ) -> Any:
            who = ctx.principal(request)
            state = await existing(schedule_id)
            may_change(who, state, action)
            reason = body.reason if body is not None else ""
            command = kind(**header(request, schedule_id, who, kind.__name__, idempotency_key), reason=reason)
            return await send(command, request)

        router.add_api_route(
            f"/schedules/{{schedule_id}}/{path}",
            act,
            methods=["POST"],
            summary=action,
            name=f"{path}_schedule",
        )

    _action(PauseSchedule, "pause", "pausing a schedule")
    _action(ResumeSchedule, "resume", "resuming a schedule")
    _action(TriggerSchedule, "trigger", "triggering a manual run of a schedule")
    return router


def _caused(state: ScheduleState, command_id: str) -> bool:
    return any(f.firing_key.endswith(f"/manual/{command_id}") for f in state.history)
