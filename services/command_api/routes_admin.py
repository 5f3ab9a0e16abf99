"""Operator routes for the block policy that the coordinator re-checks at assignment (EXE-2)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from services.command_api.context import ApiContext
from services.command_api.problems import ApiProblem
from services.common.contracts import BlockChanged
from services.common.policy import subject_key
from services.common.topics import POLICY

__all__ = ["admin_router"]

OPERATOR_ROLE = "operator"
SubjectKind = Literal["principal", "tenant"]


class BlockBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=2000)


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
    router = APIRouter(prefix="/admin")

    async def change(request: Request, kind: SubjectKind, subject: str, blocked: bool, reason: str) -> Any:
        who = ctx.principal(request)
        if who.role != OPERATOR_ROLE:
            raise ApiProblem(
                "forbidden", f"{who.name} has role {who.role!r}; the block policy needs the operator role"
            )
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
        await asyncio.wrap_future(
            ctx.deps.publisher.publish(ctx.deps.codec.outbound(POLICY.name, key, event))
        )
        # Answer once this API sees it too, so a GET right after shows the change.
        await asyncio.to_thread(ctx.deps.blocks.wait_for, key, blocked)
        return _describe(event)

    @router.put("/blocks/{kind}/{subject}", summary="Block a principal or tenant from assignment (operator)")
    async def block(kind: SubjectKind, subject: str, body: BlockBody, request: Request) -> Any:
        return await change(request, kind, subject, True, body.reason)

    @router.delete("/blocks/{kind}/{subject}", summary="Lift a block (operator)")
    async def unblock(kind: SubjectKind, subject: str, request: Request) -> Any:
        return await change(request, kind, subject, False, "unblocked")

    @router.get("/blocks", summary="The block policy in force")
    async def blocks(request: Request) -> Any:
        ctx.principal(request)
        return {"blocks": [_describe(b) for b in ctx.deps.blocks.entries()]}

    return router
