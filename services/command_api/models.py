"""Request and response bodies (pydantic), the API's published contract in OpenAPI.

What a body may carry is bounded here, once, by reusable types (the README's "What the API
refuses" lists the rules):

* every body model is strict (`ApiBody`): `"5"` is not an integer, `true` is not an integer,
  `1` is not a boolean, `7` is not a string;
* every integer fits the Avro type its field is published as (schemas/: `int` is 32-bit,
  `long` 64-bit signed), so encoding a command can never overflow: `PositiveLong`,
  `NonNegativeLong`; quantities the saga orchestrator adds up (tokens, durations) stay below
  2^53 (`Quantity`) so that no sum of them overflows a long; money is finite (`Money`);
* identifiers and names (`Identifier`) carry no control character (U+0000-U+001F, U+007F);
  free text (`Text`) may carry tab, line feed and carriage return but no other control
  character.

Byte-level rules (UTF-8, duplicate keys, lone surrogates, size) are the HTTP guard's
(services.common.http_guard): they hold before a body reaches these models.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr
from pydantic_core import PydanticCustomError

from services.common.contracts.status import MAX_ATTEMPTS_LIMIT, MAX_TIMEOUT_SECONDS, RunStatus
from services.common.ids import RUN_ID_PATTERN

__all__ = [
    "AVRO_INT_MAX",
    "AVRO_LONG_MAX",
    "AVRO_LONG_MIN",
    "QUANTITY_MAX",
    "ApiBody",
    "AvroInt",
    "AvroLong",
    "CancelRequest",
    "ClaimRequest",
    "HeartbeatRequest",
    "Identifier",
    "Money",
    "NonNegativeLong",
    "PendingCommand",
    "PositiveLong",
    "Quantity",
    "ReportRequest",
    "RetryRequest",
    "RunIdField",
    "RunPage",
    "StepIndexPath",
    "SubmitRunRequest",
    "TakeoverRequest",
    "Text",
]

AVRO_INT_MAX = 2**31 - 1
AVRO_LONG_MIN = -(2**63)
AVRO_LONG_MAX = 2**63 - 1
# The largest integer every JSON client (JavaScript's Number) can hold exactly; far below
# AVRO_LONG_MAX, so the orchestrator's sums of these stay within a long.
QUANTITY_MAX = 2**53 - 1
MONEY_MAX = 1e12

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_TEXT_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _no_control(value: str) -> str:
    if _CONTROL.search(value):
        raise PydanticCustomError(
            "control_character", "must not contain a control character (U+0000-U+001F, U+007F)"
        )
    return value


def _text_control(value: str) -> str:
    if _TEXT_CONTROL.search(value):
        raise PydanticCustomError(
            "control_character",
            "must not contain a control character other than tab, line feed or carriage return",
        )
    return value


# Bounded types. Add lengths (strings) in the field's own Field(); do not add ge/le to the
# integer types: pydantic keeps the type's own bound when both name the same constraint.
AvroInt = Annotated[StrictInt, Field(ge=-(2**31), le=AVRO_INT_MAX)]
AvroLong = Annotated[StrictInt, Field(ge=AVRO_LONG_MIN, le=AVRO_LONG_MAX)]
PositiveLong = Annotated[StrictInt, Field(ge=1, le=AVRO_LONG_MAX)]
NonNegativeLong = Annotated[StrictInt, Field(ge=0, le=AVRO_LONG_MAX)]
Quantity = Annotated[StrictInt, Field(ge=0, le=QUANTITY_MAX)]
Money = Annotated[StrictFloat, Field(ge=0, le=MONEY_MAX, allow_inf_nan=False)]
Identifier = Annotated[
    StrictStr, AfterValidator(_no_control), Field(json_schema_extra={"pattern": "^[^\\x00-\\x1f\\x7f]*$"})
]
Text = Annotated[
    StrictStr,
    AfterValidator(_text_control),
    Field(json_schema_extra={"pattern": "^[^\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f]*$"}),
]
RunIdField = Annotated[StrictStr, Field(pattern=RUN_ID_PATTERN, description="A run id (run_ + 32 hex).")]
# A path segment arrives as text, so this one is parsed (not strict); its Avro field is a long.
StepIndexPath = Annotated[int, Path(ge=0, le=AVRO_LONG_MAX, description="The step's index, from 0.")]


class ApiBody(BaseModel):
    """The base of every request body: unknown members and loosely typed values are refused."""

    model_config = ConfigDict(extra="forbid", strict=True)


class SubmitRunRequest(ApiBody):
    tenant: Identifier = Field(min_length=1, max_length=200, description="Organisation the run belongs to.")
    executionSpec: dict[str, Any] = Field(
        description="The immutable ExecutionSpec handed to the harness (EXE-9)."
    )
    retrySafe: bool = Field(False, description="May Tenure retry automatically after lease loss?")
    timeoutSeconds: int = Field(ge=1, le=MAX_TIMEOUT_SECONDS, description="Bounds the whole run (EXE-10).")
    maxAttempts: int = Field(3, ge=1, le=MAX_ATTEMPTS_LIMIT)
    agentRevisionId: Identifier | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="What the run runs (EXE-14): the agent revision, as a schedule names it; "
        "shown in the Run view, null when none is named.",
    )


class CancelRequest(ApiBody):
    reason: Text = Field("", max_length=2000)


class PendingCommand(BaseModel):
    runId: str
    commandId: str
    status: str = "pending"
    detail: str


class RunPage(BaseModel):
    items: list[dict[str, Any]]
    nextCursor: str | None


STATUS_VALUES = [s.value for s in RunStatus]


class ClaimRequest(ApiBody):
    runnerId: Identifier = Field(min_length=1, max_length=200, description="Who will hold the lease.")
    holderKind: Literal["runner", "human"] = "runner"
    capabilities: list[Annotated[Identifier, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=50
    )
    leaseSeconds: int | None = Field(default=None, ge=1, le=3600)
    heartbeatSeconds: int | None = Field(default=None, ge=1, le=1800)


class HeartbeatRequest(ApiBody):
    leaseEpoch: PositiveLong = Field(description="The lease's fencing epoch (LEASE-3).")
    sequence: PositiveLong = Field(description="Strictly increasing per attempt; a repeat is idempotent.")


class ArtifactEntryBody(ApiBody):
    artifactId: Identifier = Field(min_length=1, max_length=256)
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    sizeBytes: NonNegativeLong
    mediaType: Identifier = Field(min_length=1, max_length=200)


class ReportRequest(ApiBody):
    leaseEpoch: PositiveLong
    sequence: PositiveLong
    outcome: Literal["succeeded", "failed", "cancelled", "preparation_failed"] = Field(
        description="cancelled confirms a requested stop; "
        "preparation_failed means no external effect happened yet (EXE-11)"
    )
    errorCode: Identifier = Field("", max_length=200)
    detail: Text = Field("", max_length=4000)
    manifest: list[ArtifactEntryBody] | None = Field(
        default=None,
        description="The ResultManifest (EXE-1/EXE-15): required for a success; [] if nothing was produced.",
        max_length=1000,
    )


class TakeoverRequest(ApiBody):
    reason: Text = Field(min_length=1, max_length=2000, description="Why the lease is taken (LEASE-6).")
    newHolder: Identifier = Field(min_length=1, max_length=200)
    holderKind: Literal["runner", "human"] = "human"
    leaseSeconds: int | None = Field(default=None, ge=1, le=3600)


class RetryRequest(ApiBody):
    acknowledgeRepeatedEffects: bool = Field(
        False, description="I understand that external actions of the earlier attempt may repeat (EXE-5)."
    )
    reason: Text = Field("", max_length=2000)
