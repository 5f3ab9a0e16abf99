"""The runner's side of a trajectory (the saga of its run, SAGA-1..7), over the command API.

client = TrajectoryClient(api_url, api_key="...")
client.start_trajectory(lease, budget={"tokens": 50_000, "steps": 20, "money": 2.0})
ticket = client.propose_step(lease, "vm.provision", {"name": "web-1"})
step = client.wait_for_step(lease.run_id, ticket.step_index, ticket.dispatch)
if step.status == "committed": ...  # step.output holds the tool's output
client.finish(lease)                # or client.abort(lease, "why"): compensates what committed

The orchestrator, not the runner, dispatches each step through the effect gateway, assigns its
idempotency key and decides what happens on failure (retry, repair, rollback, escalation). The
runner only proposes and watches. Every call sends an Idempotency-Key (a fresh one unless given):
after a TenureUnavailable, repeat the call with the same key and the API answers the decision
already made instead of deciding twice. Errors are the SDK's usual classes (errors.py):
LeaseConflict (the lease is no longer this attempt's), TrajectoryRejected (the orchestrator or
the API refused the request; `code` says why), TenureUnavailable (outcome unknown).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from .backoff import Backoff
from .client import api_http_client
from .errors import (
    LeaseConflict,
    RequestRejected,
    TenureProblem,
    TenureRunnerError,
    TenureUnavailable,
    UnexpectedResponse,
)
from .interventions import Intervention, as_inbox

__all__ = [
    "IN_FLIGHT_STATUSES",
    "LeaseLike",
    "StepOutcome",
    "StepTicket",
    "StepWaitTimeout",
    "TrajectoryClient",
    "TrajectoryRejected",
]

# The orchestrator still owes a step in one of these statuses an outcome.
IN_FLIGHT_STATUSES = frozenset({"pending", "dispatched", "preparing", "awaiting-gate"})
# Trajectory statuses in which no step moves until an operator acts (or ever again).
_STILL = frozenset({"frozen", "completed", "rolled-back", "abandoned"})
# How long one long-poll of wait_for_step may wait on the server: under the HTTP client's
# timeout, and the API bounds it by its request deadline anyway.
LONG_POLL_MS = 4_000
_LEASE_PROBLEMS = frozenset(
    {"stale-epoch", "unknown-attempt", "lease-expired", "lease-revoked", "lease-released"}
)


class LeaseLike(Protocol):
    """What the trajectory calls need of a lease: services.runner_sdk.Lease has it."""

    @property
    def run_id(self) -> str: ...

    @property
    def attempt_id(self) -> str: ...

    @property
    def epoch(self) -> int: ...


class TrajectoryRejected(RequestRejected):
    """A 4xx refusal that is not about the lease: `code` is the orchestrator's reason, e.g.
    UNKNOWN_TOOL, INVALID_PARAMETERS, TWO_PIVOTS, STEP_IN_FLIGHT, TRAJECTORY_NOT_FOUND."""

    @property
    def code(self) -> str:
        return str(self.body.get("code") or self.problem_type)

    @property
    def watchdog(self) -> Intervention | None:
        """The semantic watchdog's intervention behind a STATE_OSCILLATION_DETECTED,
        ACTION_TOMBSTONED or ERR_SEMANTIC_DEADLOCK refusal (WD-5)."""
        return Intervention.from_json(self.body.get("watchdog"))


class StepWaitTimeout(TenureRunnerError):
    """The step was still in flight when wait_for_step gave up (nothing is known to have failed)."""

    def __init__(self, run_id: str, index: int, last_status: str | None, timeout_s: float):
        self.run_id = run_id
        self.index = index
        self.last_status = last_status
        super().__init__(f"step {index} of {run_id} still {last_status or 'not visible'} after {timeout_s}s")


@dataclass(frozen=True)
class StepTicket:
    """The orchestrator recorded the step's intent; the gateway dispatches it next."""

    run_id: str
    step_index: int
    dispatch: int
    idempotency_key: str
    tool: str
    status: str
    command_id: str
    replayed: bool
    # WD-5: the semantic watchdog's intervention in force when the step was accepted, if any.
    watchdog: Intervention | None = None


@dataclass(frozen=True)
class StepOutcome:
    """A step no longer in flight (or the trajectory stopped moving: frozen or ended)."""

    run_id: str
    index: int
    tool: str
    status: str
    dispatch: int
    idempotency_key: str
    output: Any
    error: Mapping[str, Any] | None
    trajectory_status: str
    step: Mapping[str, Any]  # the step as the trajectory view shows it

    @property
    def committed(self) -> bool:
        return self.status == "committed"


class TrajectoryClient:
    """HTTP client for the trajectory routes of the command API (`api_url`).

    `jitter` (a draw in [0, 1)) and `sleep` are the polling backoff's, injectable for tests.
    `on_intervention` is called once per semantic watchdog intervention a proposal's answer (or
    refusal) carries (WD-5; pass the InterventionInbox of the run's other clients to share it).
    """

    def __init__(
        self,
        api_url: str,
        api_key: str | None = None,
        timeout_s: float = 15.0,
        *,
        transport: httpx.BaseTransport | None = None,
        jitter: Callable[[], float] = random.random,
        sleep: Callable[[float], None] = time.sleep,
        on_intervention: Callable[[Intervention], None] | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self._api_url = api_url.rstrip("/")
        self._http = api_http_client(api_key, timeout_s, transport)
        self._jitter = jitter
        self._sleep = sleep
        self.interventions = as_inbox(on_intervention)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TrajectoryClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- calls -------------------------------------------------------------------------------

    def start_trajectory(
        self,
        lease: LeaseLike,
        *,
        plan: Sequence[Mapping[str, Any]] | None = None,
        pivot_approval: str = "none",
        budget: Mapping[str, Any] | None = None,
        rerun_cost: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """POST /runs/{runId}/trajectory; returns the trajectory view.

        `plan` is a list of {stepId, tool, params, after}; budget {tokens, steps, money};
        rerun_cost {durationMs, money}."""
        body: dict[str, Any] = {**_lease_fields(lease), "pivotApproval": pivot_approval}
        if plan is not None:
            body["plan"] = [dict(step) for step in plan]
        if budget is not None:
            body["budget"] = dict(budget)
        if rerun_cost is not None:
            body["rerunCost"] = dict(rerun_cost)
        return self._post("start", self._path(lease.run_id), body, idempotency_key)

    def propose_step(
        self,
        lease: LeaseLike,
        tool: str,
        params: Mapping[str, Any],
        *,
        plan_step_id: str = "",
        repair_of: int | None = None,
        tokens_used: int = 0,
        money_used: float = 0.0,
        idempotency_key: str | None = None,
    ) -> StepTicket:
        """POST /runs/{runId}/trajectory/steps: the next step, or with `repair_of` a repair.

        A refusal by the semantic watchdog (TrajectoryRejected, `code` STATE_OSCILLATION_DETECTED,
        ACTION_TOMBSTONED or ERR_SEMANTIC_DEADLOCK) carries the intervention (`exc.watchdog`),
        handed to on_intervention before it is raised."""
        body: dict[str, Any] = {
            **_lease_fields(lease),
            "tool": tool,
            "params": dict(params),
            "planStepId": plan_step_id,
            "tokensUsed": tokens_used,
            "moneyUsed": money_used,
        }
        if repair_of is not None:
            body["repairOf"] = repair_of
        try:
            answer = self._post("propose", f"{self._path(lease.run_id)}/steps", body, idempotency_key)
        except TrajectoryRejected as exc:
            self.interventions.notice(exc.body)  # WD-5: the runner hears why before it acts again
            raise
        return StepTicket(
            run_id=_field(answer, "runId", str),
            step_index=_int(answer, "stepIndex"),
            dispatch=_int(answer, "dispatch"),
            idempotency_key=_field(answer, "idempotencyKey", str),
            tool=_field(answer, "tool", str),
            status=_field(answer, "status", str),
            command_id=_field(answer, "commandId", str),
            replayed=bool(answer.get("replayed")),
            watchdog=self.interventions.notice(answer),
        )

    def trajectory(
        self, run_id: str, *, after_version: int | None = None, wait_ms: int = 0
    ) -> dict[str, Any]:
        """GET /runs/{runId}/trajectory. Raises TrajectoryRejected (code trajectory-not-found).

        With `after_version`, a long-poll: the API answers once the view's version is above it,
        or with the view as it is after `wait_ms` (bounded by the API's request deadline)."""
        params = {} if after_version is None else {"afterVersion": after_version, "waitMs": wait_ms}
        try:
            response = self._http.get(self._path(run_id), params=params)
        except httpx.TransportError as exc:
            raise TenureUnavailable("trajectory", f"{type(exc).__name__}: {exc}") from exc
        return _answer("trajectory", response)

    def wait_for_step(
        self,
        run_id: str,
        index: int,
        dispatch: int | None = None,
        *,
        timeout_s: float = 60.0,
        poll_s: float = 0.2,
        max_poll_s: float = 2.0,
        long_poll_ms: int = LONG_POLL_MS,
    ) -> StepOutcome:
        """Wait until step `index` (at `dispatch` or a later one) has settled.

        Settled: no longer pending, dispatched, preparing or awaiting-gate; or the trajectory
        stopped moving (frozen, completed, rolled back, abandoned). A transient failure that the
        orchestrator retries is not settled: the retry is a later dispatch of the same step.

        Each fetch after the first is a long-poll past the version last seen, so the runner
        learns of the commit the moment it is visible, without polling. Only a fetch that could
        not long-poll (no trajectory yet, an API without versions) waits a full-jitter backoff
        from `poll_s` up to `max_poll_s` before the next (BRK-3), so many runners waiting on one
        slow tool do not poll the API in lockstep."""
        deadline = time.monotonic() + timeout_s
        backoff = Backoff(poll_s, max(poll_s, max_poll_s), self._jitter)
        last_status: str | None = None
        seen: int | None = None
        while True:
            asked = time.monotonic()
            left_ms = int(max(0.0, deadline - asked) * 1000)
            try:
                if seen is None:
                    view = self.trajectory(run_id)
                else:
                    view = self.trajectory(run_id, after_version=seen, wait_ms=min(long_poll_ms, left_ms))
            except TrajectoryRejected as exc:
                if exc.status != 404:
                    raise
                view = {}
            steps = view.get("steps") or []
            step = steps[index] if 0 <= index < len(steps) else None
            if step is not None:
                last_status = str(step.get("status"))
                fresh = dispatch is None or int(step.get("dispatch", 0)) >= dispatch
                still = view.get("status") in _STILL
                if (fresh and last_status not in IN_FLIGHT_STATUSES) or still:
                    return _outcome(run_id, view, step)
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                raise StepWaitTimeout(run_id, index, last_status, timeout_s)
            version = view.get("version")
            if isinstance(version, int) and not isinstance(version, bool) and long_poll_ms > 0:
                # The next fetch waits on the server for a newer version. An unchanged version
                # answered at once means the server did not wait (it is older than long-polls,
                # or its deadline is short): then back off as a poller would.
                unchanged_at_once = version == seen and time.monotonic() - asked < long_poll_ms / 2000
                seen = version
                if not unchanged_at_once:
                    continue
            else:
                seen = None
            self._sleep(min(backoff.next_delay(), left_s))

    def finish(self, lease: LeaseLike, *, idempotency_key: str | None = None) -> dict[str, Any]:
        """POST /runs/{runId}/trajectory/finish; returns the (completed) trajectory view."""
        return self._post(
            "finish", f"{self._path(lease.run_id)}/finish", _lease_fields(lease), idempotency_key
        )

    def adopt(self, lease: LeaseLike, *, idempotency_key: str | None = None) -> dict[str, Any]:
        """POST /runs/{runId}/trajectory/lease: after taking the run's lease over (a crashed
        runner), move the trajectory's owed work, even a step in flight, to this lease."""
        return self._post("adopt", f"{self._path(lease.run_id)}/lease", _lease_fields(lease), idempotency_key)

    def abort(
        self, lease: LeaseLike, reason: str = "", *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """POST /runs/{runId}/trajectory/abort: every committed step is compensated (SAGA-3).

        Returns the view as of the decision; the unwind continues asynchronously (status
        unwinding, then rolled-back)."""
        body = {**_lease_fields(lease), "reason": reason}
        return self._post("abort", f"{self._path(lease.run_id)}/abort", body, idempotency_key)

    # --- plumbing ----------------------------------------------------------------------------

    def _path(self, run_id: str) -> str:
        return f"{self._api_url}/runs/{quote(run_id, safe='')}/trajectory"

    def _post(
        self, operation: str, url: str, body: Mapping[str, Any], idempotency_key: str | None
    ) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key or uuid.uuid4().hex}
        try:
            response = self._http.post(url, json=dict(body), headers=headers)
        except httpx.TransportError as exc:
            # The request may have reached the API and been decided: unknown, not refused.
            raise TenureUnavailable(operation, f"{type(exc).__name__}: {exc}") from exc
        if response.status_code == 202:
            answer = _json(operation, response)
            if operation == "propose" and "stepIndex" in answer:
                return answer  # decided: the intent is recorded, the dispatch is asynchronous
            raise TenureUnavailable(operation, "HTTP 202: accepted, decision still pending", 202)
        return _answer(operation, response)


def _lease_fields(lease: LeaseLike) -> dict[str, Any]:
    return {"attemptId": lease.attempt_id, "leaseEpoch": lease.epoch}


def _outcome(run_id: str, view: Mapping[str, Any], step: Mapping[str, Any]) -> StepOutcome:
    error = step.get("error")
    return StepOutcome(
        run_id=run_id,
        index=int(step["index"]),
        tool=str(step["tool"]),
        status=str(step["status"]),
        dispatch=int(step["dispatch"]),
        idempotency_key=str(step["idempotencyKey"]),
        output=step.get("output"),
        error=error if isinstance(error, Mapping) else None,
        trajectory_status=str(view.get("status")),
        step=dict(step),
    )


def _json(operation: str, response: httpx.Response) -> dict[str, Any]:
    try:
        answer = response.json()
    except ValueError as exc:
        raise UnexpectedResponse(f"{operation}: HTTP {response.status_code} body is not JSON") from exc
    if not isinstance(answer, dict):
        raise UnexpectedResponse(f"{operation}: HTTP {response.status_code} body is not a JSON object")
    return answer


def _answer(operation: str, response: httpx.Response) -> dict[str, Any]:
    if response.is_success:
        return _json(operation, response)
    status = response.status_code
    body: dict[str, Any] = {}
    try:
        parsed = response.json()
        body = parsed if isinstance(parsed, dict) else {}
    except ValueError:
        pass
    raw_type = body.get("type")
    slug = raw_type.rstrip("/").rsplit("/", 1)[-1] if isinstance(raw_type, str) and raw_type else ""
    detail = str(body.get("detail") or body.get("title") or response.reason_phrase)
    if status >= 500:
        raise TenureUnavailable(operation, f"HTTP {status} {slug or 'server error'}: {detail}", status, slug)
    if status == 409 and slug in _LEASE_PROBLEMS:
        raise LeaseConflict(status, slug, detail, body)
    if 400 <= status < 500:
        raise TrajectoryRejected(status, slug or "http-error", detail, body)
    raise TenureProblem(status, slug or "unexpected-status", detail, body)


def _field(answer: Mapping[str, Any], name: str, kind: type[Any]) -> Any:
    value = answer.get(name)
    if not isinstance(value, kind):
        raise UnexpectedResponse(f"answer field {name!r} should be {kind.__name__}, got {value!r}")
    return value


def _int(answer: Mapping[str, Any], name: str) -> int:
    value = answer.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise UnexpectedResponse(f"answer field {name!r} should be an integer, got {value!r}")
    return value
