"""Request and response bodies (pydantic), the API's published contract in OpenAPI."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from services.lease_coordinator.domain.lifecycle import RunStatus
from services.lease_coordinator.domain.run import MAX_ATTEMPTS_LIMIT, MAX_TIMEOUT_SECONDS

__all__ = ["CancelRequest", "PendingCommand", "RunPage", "SubmitRunRequest"]


class SubmitRunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(min_length=1, max_length=200, description="Organisation the run belongs to.")
    executionSpec: dict[str, Any] = Field(
        description="The immutable ExecutionSpec handed to the harness (EXE-9)."
    )
    retrySafe: bool = Field(False, description="May Tenure retry automatically after lease loss?")
    timeoutSeconds: int = Field(ge=1, le=MAX_TIMEOUT_SECONDS, description="Bounds the whole run (EXE-10).")
    maxAttempts: int = Field(3, ge=1, le=MAX_ATTEMPTS_LIMIT)


class CancelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field("", max_length=2000)


class PendingCommand(BaseModel):
    runId: str
    commandId: str
    status: str = "pending"
    detail: str


class RunPage(BaseModel):
    items: list[dict[str, Any]]
    nextCursor: str | None


STATUS_VALUES = [s.value for s in RunStatus]
