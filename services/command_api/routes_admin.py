"""Operator routes for the block policy that the coordinator re-checks at assignment (EXE-2)."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from services.command_api.context import ApiContext
from services.command_api.models import ApiBody, Text
from services.common.auth import Role, require_role
from services.common.contracts import BlockChanged
from services.common.policy import subject_key
from services.common.topics import POLICY

__all__ = ["admin_router"]

SubjectKind = Literal["principal", "tenant"]


class BlockBody(ApiBody):
    reason: Text = Field(min_length=1, max_length=2000)


def _describe(change: BlockChanged) -> dict[str, Any]:
    return {
        "subjectKind": change.subject_kind,
        "subject": change.subject,
        "blocked": change.blocked,
        "reason": change.reason,
        "by": change.actor,
        "at": change.occurred_at,
    }


def admin_router(ctx: ApiContext) -> APIRouter:
    router = ctx.guarded(prefix="/admin")

    async def change(request: Request, kind: SubjectKind, subject: str, blocked: bool, reason: str) -> Any:
        who = ctx.principal(request)
        require_role(who, "the block policy", Role.OPERATOR)
        event = BlockChanged(
            event_id=f"blk_{uuid.uuid4().hex}",
            subject_kind=kind,
            subject=subject,
            blocked=blocked,
            reason=reason,
            occurred_at=ctx.deps.clock.now_ms(),
            actor=who.name,
        )
        key = subject_key(kind, subject)
        await ctx.publish_record(ctx.deps.codec.outbound(POLICY.name, key, event), f"the change of {key}")
        # Answer once this API sees it too, so a GET right after shows the change; within the
        # request's deadline, else 202: the change is durable and takes effect shortly.
        wait_for = ctx.deps.blocks.wait_for
        patience = max(0.0, ctx.remaining() - 0.05)  # leave time to answer 202 in time
        seen = await ctx.in_thread("the block policy", wait_for, key, blocked, patience)
        if not seen:
            return JSONResponse(_describe(event) | {"status": "pending"}, status_code=202)
        return _describe(event)

    @router.put("/blocks/{kind}/{subject}", summary="Block a principal or tenant from assignment (operator)")
    async def block(kind: SubjectKind, subject: str, body: BlockBody, request: Request) -> Any:
        return await change(request, kind, subject, True, body.reason)

    @router.delete("/blocks/{kind}/{subject}", summary="Lift a block (operator)")
    async def unblock(kind: SubjectKind, subject: str, request: Request) -> Any:
        return await change(request, kind, subject, False, "unblocked")

    @router.get("/blocks", summary="The block policy in force")
    async def blocks() -> Any:
        return {"blocks": [_describe(b) for b in ctx.deps.blocks.entries()]}

    return router
