"""Request and response bodies (pydantic), the API's published contract in OpenAPI."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from services.lease_coordinator.domain.lifecycle import RunStatus
from services.lease_coordinator.domain.run import MAX_ATTEMPTS_LIMIT, MAX_TIMEOUT_SECONDS

__all__ = [
    "CancelRequest",
    "ClaimRequest",
    "HeartbeatRequest",
    "PendingCommand",
    "ReportRequest",
    "RetryRequest",
    "RunPage",
    "SubmitRunRequest",
    "TakeoverRequest",
]


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


class ClaimRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    runnerId: str = Field(min_length=1, max_length=200, description="Who will hold the lease.")
    holderKind: Literal["runner", "human"] = "runner"
    capabilities: list[str] = Field(default_factory=list, max_length=50)
    leaseSeconds: int | None = Field(default=None, ge=1, le=3600)
    heartbeatSeconds: int | None = Field(default=None, ge=1, le=1800)


class HeartbeatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    leaseEpoch: int = Field(ge=1)
    sequence: int = Field(ge=1, description="Strictly increasing per attempt; a repeat is idempotent.")


class ArtifactEntryBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    artifactId: str = Field(min_length=1, max_length=256)
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    sizeBytes: int = Field(ge=0)
    mediaType: str = Field(min_length=1, max_length=200)


class ReportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    leaseEpoch: int = Field(ge=1)
    sequence: int = Field(ge=1)
    outcome: Literal["succeeded", "failed", "cancelled", "preparation_failed"] = Field(
        description="cancelled confirms a requested stop; "
        "preparation_failed means no external effect happened yet (EXE-11)"
    )
    errorCode: str = Field("", max_length=200)
    detail: str = Field("", max_length=4000)
    manifest: list[ArtifactEntryBody] | None = Field(
        default=None,
        description="The ResultManifest (EXE-1/EXE-15): required for a success; [] if nothing was produced.",
        max_length=1000,
    )


class TakeoverRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=2000, description="Why the lease is taken (LEASE-6).")
    newHolder: str = Field(min_length=1, max_length=200)
    holderKind: Literal["runner", "human"] = "human"
    leaseSeconds: int | None = Field(default=None, ge=1, le=3600)


class RetryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    acknowledgeRepeatedEffects: bool = Field(
        False, description="I understand that external actions of the earlier attempt may repeat (EXE-5)."
    )
    reason: str = Field("", max_length=2000)
