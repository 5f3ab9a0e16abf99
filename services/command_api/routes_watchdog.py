"""Routes of a run's semantic watchdog (WD-1..WD-6): observations, rollbacks, thresholds, the view.

* POST /runs/{runId}/observations: the lease holder reports a step of its own (WD-1: a model
  turn that only read, an edit outside the saga); the saga reports the steps it dispatches by
  itself. Published to progress.observations on the run's partition and answered 202 once
  Kafka has it: the watchdog judges it asynchronously (GET the view, or the next answer).
* POST /runs/{runId}/watchdog/rollback: the lease holder restored the checkpoint a level-2
  intervention asked for (WD-5, AcknowledgeRollback).
* PUT /runs/{runId}/watchdog: per-run thresholds within the deployment's bounds (the run's
  submitter or an operator; ConfigureWatchdog).
* GET /runs/{runId}/watchdog: thresholds, recent observations, detections with their evidence
  and the ladder of interventions (RFC 3339 times); `afterVersion`/`waitMs` long-poll.

Idempotency as on the other routes (services/command_api/idempotency.py): with an
`Idempotency-Key` the command id is derived from the key and the whole canonical request, a
repeat the view records is answered again, and the same key with another request is 409
idempotency-key-conflict. The watchdog itself drops a repeated observation by its step number.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from pydantic import Field, StrictFloat, StrictInt, model_validator

from services.command_api.context import ApiContext, Outcome, pending_response
from services.command_api.holder_commands import command_header, current_lease, rejection_response
from services.command_api.idempotency import PRINCIPAL_FIELD, KeyedRequest
from services.command_api.models import AVRO_LONG_MAX, ApiBody, Identifier, NonNegativeLong, Text
from services.command_api.problems import WATCHDOG_REJECTION_PROBLEMS, ApiProblem
from services.command_api.routes_runs import may_act_on_run
from services.command_api.routes_trajectories import LeaseFields
from services.command_api.watchdog_delivery import pending_for_runner, watchdog_after, watchdog_view
from services.common.contracts import (
    MAX_METRICS,
    MAX_SUMMARY_CHARS,
    AcknowledgeRollback,
    ConfigureWatchdog,
    ObserveStep,
)
from services.common.decisions import Rejected
from services.common.ids import ACTION_HASH_PATTERN, action_hash
from services.common.routing import observation_record

__all__ = [
    "THRESHOLD_BOUNDS",
    "ObservationBody",
    "RollbackAcknowledgementBody",
    "WatchdogThresholdsBody",
    "watchdog_router",
]

MAX_WAIT_MS = 30_000
DEFAULT_WAIT_MS = 10_000
# A verifier metric is a count or a score: finite, and far inside a double's exact range.
METRIC_MAX = 1e15
# The bounds of each per-run threshold: the watchdog's own (services/watchdog/domain/thresholds.py
# BOUNDS; tests/unit/test_watchdog_routes.py checks they agree), so a wrong value is refused here,
# before anything is published. How they combine (window > maxPeriod) the watchdog checks.
THRESHOLD_BOUNDS: dict[str, tuple[int, int]] = {
    "maxPeriod": (1, 32),
    "window": (2, 256),
    "epochSteps": (2, 100),
    "repeatCount": (1, 10),
    "rollbackBudget": (0, 5),
    "ladderEpoch": (1, 10),
    "pollPatience": (1, 100),
}
_COMMAND_FIELDS = {
    "maxPeriod": "max_period",
    "window": "window",
    "epochSteps": "epoch_steps",
    "repeatCount": "repeat_count",
    "rollbackBudget": "rollback_budget",
    "ladderEpoch": "ladder_epoch",
    "pollPatience": "poll_patience",
}

Metric = Annotated[StrictFloat, Field(ge=-METRIC_MAX, le=METRIC_MAX, allow_inf_nan=False)]
StateHash = Annotated[str, Field(pattern=r"^([0-9a-f]{64})?$", description="SHA-256 hex, or empty.")]
CheckpointStep = Annotated[StrictInt, Field(ge=-1, le=AVRO_LONG_MAX)]


def _threshold(name: str) -> Any:
    low, high = THRESHOLD_BOUNDS[name]
    return Field(default=None, ge=low, le=high, description=f"{low}..{high}; omitted: keep.")


# --- bodies -------------------------------------------------------------------------------------


class ObservationBody(LeaseFields):
    """One step of the runner's own, as the environment saw it (WD-1)."""

    stepSeq: NonNegativeLong = Field(description="The runner's own step counter, strictly increasing.")
    tool: Identifier = Field(min_length=1, max_length=200)
    arguments: dict[str, Any] | None = Field(
        default=None, description="The step's arguments; hashed with the tool (WD-4) by the API."
    )
    actionHash: str | None = Field(
        default=None,
        pattern=ACTION_HASH_PATTERN,
        description="Instead of `arguments`: services.common.ids.action_hash(tool, arguments).",
    )
    stateHash: StateHash = Field(
        default="", description="SHA-256 of the canonical state after the step (runner_sdk.canonical)."
    )
    summary: Text = Field(default="", max_length=MAX_SUMMARY_CHARS)
    metrics: list[Metric] = Field(
        default_factory=list,
        max_length=MAX_METRICS,
        description="The verifier metric vector, each component higher-is-better (WD-3).",
    )
    errorKind: Literal["none", "application", "transient"] = "none"
    polling: bool = Field(default=False, description="A declared poll: a changing observation is progress.")
    mutating: bool = Field(default=True, description="The step may change the environment.")

    @model_validator(mode="after")
    def _one_action(self) -> ObservationBody:
        if self.arguments is None and self.actionHash is None:
            raise ValueError("give the step's arguments or its actionHash")
        given = self.arguments is not None and self.actionHash is not None
        if given and action_hash(self.tool, self.arguments) != self.actionHash:
            raise ValueError("actionHash is not the hash of tool and arguments (WD-4)")
        return self

    def action(self) -> str:
        if self.actionHash is not None:
            return self.actionHash
        return action_hash(self.tool, self.arguments or {})


class RollbackAcknowledgementBody(LeaseFields):
    interventionId: Identifier = Field(min_length=1, max_length=200)
    checkpointStep: CheckpointStep = Field(
        description="The step whose checkpoint was restored; -1: the run's start."
    )
    restoredStateHash: StateHash = ""


class WatchdogThresholdsBody(ApiBody):
    """Per-run thresholds (WD-2..WD-5); an omitted one keeps its current value."""

    maxPeriod: StrictInt | None = _threshold("maxPeriod")
    window: StrictInt | None = _threshold("window")
    epochSteps: StrictInt | None = _threshold("epochSteps")
    repeatCount: StrictInt | None = _threshold("repeatCount")
    rollbackBudget: StrictInt | None = _threshold("rollbackBudget")
    ladderEpoch: StrictInt | None = _threshold("ladderEpoch")
    pollPatience: StrictInt | None = _threshold("pollPatience")


# --- helpers ------------------------------------------------------------------------------------


def _location(run_id: str) -> dict[str, str]:
    return {"Location": f"/runs/{run_id}/watchdog"}


def _observation_fields(entry: dict[str, Any]) -> dict[str, Any]:
    """A recorded observation in the request's field names."""
    return {
        PRINCIPAL_FIELD: entry.get("actor"),
        "stepSeq": entry.get("stepSeq"),
        "tool": entry.get("tool"),
        "actionHash": entry.get("actionHash"),
        "stateHash": entry.get("stateHash") or "",
        "summary": entry.get("summary"),
        "metrics": entry.get("metrics"),
        "errorKind": entry.get("errorKind"),
        "polling": entry.get("polling"),
        "mutating": entry.get("mutating"),
    }


# --- routes -------------------------------------------------------------------------------------


def watchdog_router(ctx: ApiContext) -> APIRouter:
    router = ctx.guarded()

    async def decided(command: Any, path: str) -> Any:
        outcome = await ctx.publish_watchdog_and_wait(command)
        if isinstance(outcome, Rejected):
            return rejection_response(outcome, path, WATCHDOG_REJECTION_PROBLEMS, "command-rejected")
        if not isinstance(outcome, Outcome):
            response = pending_response(outcome)
            response.headers.update(_location(command.run_id))
            return response
        return JSONResponse(outcome.view, headers=_location(command.run_id))

    @router.post(
        "/runs/{run_id}/observations",
        status_code=202,
        summary="Report a step of the runner's own to the semantic watchdog (the lease holder, WD-1)",
    )
    async def observe(
        run_id: str,
        body: ObservationBody,
        request: Request,
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        """202 once the observation is durable; `watchdog` is the pending intervention (or null).

        Send it after the step, with the canonical state's hash (runner_sdk.canonical) and the
        verifier metrics; a repeated `stepSeq` is dropped by the watchdog."""
        who = ctx.principal(request)
        await current_lease(ctx, run_id, body.attemptId, body.leaseEpoch, who)
        digest = body.action()
        fields = body.model_dump(mode="json") | {"actionHash": digest}
        keyed = KeyedRequest.of(run_id, "ObserveStep", idempotency_key, who.name, fields)
        existing = await watchdog_view(ctx, run_id) if idempotency_key else None
        first = keyed.find((existing or {}).get("observations", []), "commandId")
        if first is not None:
            what = f"an observation of run {run_id}"
            keyed.check(first["commandId"], _observation_fields(dict(first)), what)
        else:
            command = ObserveStep(
                **command_header(ctx, request, who, run_id, keyed.command_id),
                source="runner",
                step_seq=body.stepSeq,
                tool=body.tool,
                action_hash=digest,
                state_hash=body.stateHash,
                summary=body.summary,
                metrics=tuple(float(m) for m in body.metrics),
                error_kind=body.errorKind,
                polling=body.polling,
                mutating=body.mutating,
            )
            # Durable is enough: the watchdog's verdict comes on the runner's next answer.
            await ctx.publish_record(observation_record(ctx.deps.codec, command), "the observation")
        return JSONResponse(
            {
                "runId": run_id,
                "commandId": first["commandId"] if first is not None else keyed.command_id,
                "stepSeq": body.stepSeq,
                "actionHash": digest,
                "status": "accepted",
                "replayed": first is not None,
                "watchdog": await pending_for_runner(ctx, run_id),
            },
            status_code=202,
            headers=_location(run_id),
        )

    @router.post(
        "/runs/{run_id}/watchdog/rollback",
        summary="Acknowledge a level-2 rollback: the checkpoint was restored (the lease holder, WD-5)",
    )
    async def acknowledge_rollback(
        run_id: str,
        body: RollbackAcknowledgementBody,
        request: Request,
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        """200 with the watchdog view once recorded; an acknowledged rollback answers the view."""
        who = ctx.principal(request)
        await current_lease(ctx, run_id, body.attemptId, body.leaseEpoch, who)
        existing = await watchdog_view(ctx, run_id)
        if existing is None:
            raise ApiProblem("watchdog-not-found", f"run {run_id} has no watchdog yet", runId=run_id)
        rung = next(
            (i for i in existing.get("interventions", []) if i["interventionId"] == body.interventionId),
            None,
        )
        if rung is not None and rung.get("acknowledgedAt") is not None:
            return JSONResponse(existing, headers=_location(run_id))  # acknowledged already
        fields = body.model_dump(mode="json")
        keyed = KeyedRequest.of(run_id, "AcknowledgeRollback", idempotency_key, who.name, fields)
        command = AcknowledgeRollback(
            **command_header(ctx, request, who, run_id, keyed.command_id),
            intervention_id=body.interventionId,
            checkpoint_step=body.checkpointStep,
            restored_state_hash=body.restoredStateHash,
        )
        return await decided(command, request.url.path)

    @router.put(
        "/runs/{run_id}/watchdog",
        summary="Set the run's watchdog thresholds within the deployment's bounds (submitter or operator)",
    )
    async def configure(
        run_id: str,
        body: WatchdogThresholdsBody,
        request: Request,
        idempotency_key: str | None = Header(default=None, alias="Idempotency-Key", max_length=200),
    ) -> Any:
        """200 with the watchdog view showing the thresholds in force from now on."""
        who = ctx.principal(request)
        run = await ctx.view(run_id)
        if run is None:
            raise ApiProblem("run-not-found", f"run {run_id} does not exist", runId=run_id)
        may_act_on_run(who, run, "configuring the watchdog of")
        given = {name: value for name, value in body.model_dump().items() if value is not None}
        keyed = KeyedRequest.of(run_id, "ConfigureWatchdog", idempotency_key, who.name, given)
        existing = await watchdog_view(ctx, run_id) if idempotency_key else None
        first = keyed.find((existing or {}).get("configurations", []), "commandId")
        if first is not None and existing is not None:
            recorded = {PRINCIPAL_FIELD: first.get("actor"), **first.get("thresholds", {})}
            keyed.check(first["commandId"], recorded, f"the watchdog of run {run_id}")
            return JSONResponse(existing, headers=_location(run_id))
        command = ConfigureWatchdog(
            **command_header(ctx, request, who, run_id, keyed.command_id),
            **{_COMMAND_FIELDS[name]: value for name, value in given.items()},
        )
        return await decided(command, request.url.path)

    @router.get(
        "/runs/{run_id}/watchdog",
        summary="The watchdog view: thresholds, observations, detections and the intervention ladder",
    )
    async def get_watchdog(
        run_id: str,
        after_version: Annotated[
            int | None,
            Query(alias="afterVersion", ge=0, le=AVRO_LONG_MAX, description="Long-poll past this version"),
        ] = None,
        wait_ms: Annotated[
            int,
            Query(alias="waitMs", ge=0, le=MAX_WAIT_MS, description="How long a long-poll may wait"),
        ] = DEFAULT_WAIT_MS,
    ) -> Any:
        if after_version is None:
            view = await watchdog_view(ctx, run_id)
        else:
            view = await watchdog_after(ctx, run_id, after_version, wait_ms / 1000)
        if view is None:
            raise ApiProblem("watchdog-not-found", f"run {run_id} has no watchdog yet", runId=run_id)
        return view

    return router
