"""A synchronous HTTP client for the runner's side of the Tenure contract (EXE-4, LEASE-3).

Four calls: claim an attempt, renew its lease, report its outcome (command API) and ask the
effect gateway to perform an effect under the lease's epoch. Every answer is parsed into a
frozen value; every problem+json answer becomes a specific exception (see errors.py). A
connection error, a timeout, a 5xx or a 202 (accepted, not yet decided) becomes
`TenureUnavailable`: the request may have taken effect, so it is reported as an unknown outcome,
never as a refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx

from services.runner_sdk.errors import (
    ActionTombstoned,
    FencedByRecipient,
    LeaseConflict,
    OutcomeUnknown,
    RequestRejected,
    RunNotClaimable,
    RunNotFound,
    TenureProblem,
    TenureUnavailable,
    ToolFailed,
    UnexpectedResponse,
)
from services.runner_sdk.interventions import Intervention, as_inbox

__all__ = [
    "REPORT_OUTCOMES",
    "EffectResult",
    "Lease",
    "RenewalAnswer",
    "ReportOutcome",
    "TenureClient",
    "api_http_client",
    "check_outcome",
]

# The terminal outcomes the command API accepts (ReportRequest.outcome): `cancelled` confirms a
# requested stop (EXE-7); `preparation_failed` says no external effect happened yet (EXE-11).
ReportOutcome = Literal["succeeded", "failed", "cancelled", "preparation_failed"]
REPORT_OUTCOMES: tuple[ReportOutcome, ...] = ("succeeded", "failed", "cancelled", "preparation_failed")
_Operation = Literal["claim", "heartbeat", "report", "effect"]
_T = TypeVar("_T")


@dataclass(frozen=True)
class Lease:
    """A claimed attempt and its lease. Times are epoch ms on the coordinator's clock."""

    run_id: str
    attempt_id: str
    attempt_number: int
    lease_id: str
    epoch: int
    expires_at: int
    lease_seconds: int
    heartbeat_interval_seconds: int
    server_time: int
    assignment: Mapping[str, Any]


@dataclass(frozen=True)
class RenewalAnswer:
    """A confirmed renewal. `certainty` is the coordinator's own view ("active" or "at_risk").

    `stop_requested` says the run was asked to stop (EXE-7 cancel, EXE-10 deadline; `stop_kind`
    says which): the runner stops its work and confirms with a terminal report before
    `stop_grace_until` (coordinator clock, epoch ms), or the run ends `interrupted`. `replayed`
    marks the answer to a repeated sequence, given from the lease as it stands.
    """

    attempt_id: str
    epoch: int
    sequence: int
    expires_at: int
    server_time: int
    certainty: str
    run_status: str
    stop_requested: bool = False
    stop_kind: str | None = None
    stop_grace_until: int | None = None
    replayed: bool = False
    # WD-5: the semantic watchdog's intervention in force for the run (also handed to the
    # client's on_intervention, once per intervention).
    watchdog: Intervention | None = None


@dataclass(frozen=True)
class EffectResult:
    effect_id: str
    outcome: str
    tool_status: int
    tool_response: Mapping[str, Any]
    reconciled: bool


def api_http_client(
    api_key: str | None, timeout_s: float, transport: httpx.BaseTransport | None = None
) -> httpx.Client:
    """The HTTP client every SDK client of the command API uses: problem+json accepted, bearer key."""
    headers = {"Accept": "application/json, application/problem+json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return httpx.Client(headers=headers, timeout=timeout_s, transport=transport)


class TenureClient:
    """HTTP client for the command API (`api_url`) and the effect gateway (`gateway_url`).

    `api_key` goes to both as `Authorization: Bearer <key>`: the gateway authenticates like the
    API and lets only the lease's holder principal act under it. `transport` exists for tests
    (httpx.MockTransport) and custom networking. `on_intervention` is called once per semantic
    watchdog intervention a heartbeat answer carries (WD-5; an InterventionInbox shares that
    memory with the run's other clients).
    """

    def __init__(
        self,
        api_url: str,
        gateway_url: str,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        *,
        transport: httpx.BaseTransport | None = None,
        on_intervention: Callable[[Intervention], None] | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self._api_url = api_url.rstrip("/")
        self._gateway_url = gateway_url.rstrip("/")
        self.timeout_s = timeout_s
        self._http = api_http_client(api_key, timeout_s, transport)
        self.interventions = as_inbox(on_intervention)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TenureClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- command API -------------------------------------------------------------------------

    def claim(
        self,
        run_id: str,
        runner_id: str,
        capabilities: Sequence[str],
        lease_seconds: int | None = None,
        heartbeat_seconds: int | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Lease:
        """POST /runs/{runId}/attempts. Raises RunNotFound, RunNotClaimable, TenureUnavailable."""
        body = {
            "runnerId": runner_id,
            "holderKind": "runner",
            "capabilities": list(capabilities),
            "leaseSeconds": lease_seconds,
            "heartbeatSeconds": heartbeat_seconds,
        }
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        url = f"{self._api_url}/runs/{_segment(run_id)}/attempts"
        answer = self._post("claim", url, body, headers=headers)
        assignment = _field(answer, "assignment", dict)
        return Lease(
            run_id=_field(answer, "runId", str),
            attempt_id=_field(answer, "attemptId", str),
            attempt_number=_int(answer, "attemptNumber"),
            lease_id=_field(answer, "leaseId", str),
            epoch=_int(answer, "epoch"),
            expires_at=_int(answer, "expiresAt"),
            lease_seconds=_int(answer, "leaseSeconds"),
            heartbeat_interval_seconds=_int(answer, "heartbeatIntervalSeconds"),
            server_time=_int(answer, "serverTime"),
            assignment=assignment,
        )

    def heartbeat(self, lease: Lease, sequence: int, *, timeout_s: float | None = None) -> RenewalAnswer:
        """POST /attempts/{attemptId}/heartbeat. Raises LeaseConflict (409) or TenureUnavailable."""
        url = f"{self._api_url}/attempts/{_segment(lease.attempt_id)}/heartbeat"
        answer = self._post(
            "heartbeat", url, {"leaseEpoch": lease.epoch, "sequence": sequence}, timeout_s=timeout_s
        )
        return RenewalAnswer(
            attempt_id=_field(answer, "attemptId", str),
            epoch=_int(answer, "epoch"),
            sequence=_int(answer, "sequence"),
            expires_at=_int(answer, "expiresAt"),
            server_time=_int(answer, "serverTime"),
            certainty=_field(answer, "certainty", str),
            run_status=_field(answer, "runStatus", str),
            # Optional in the contract: an older API, or a replayed answer, carries no stop flags.
            stop_requested=_optional(answer, "stopRequested", bool) or False,
            stop_kind=_optional(answer, "stopKind", str),
            stop_grace_until=_optional_int(answer, "stopGraceUntil"),
            replayed=_optional(answer, "replayed", bool) or False,
            watchdog=self.interventions.notice(answer),
        )

    def report(
        self,
        lease: Lease,
        sequence: int,
        outcome: ReportOutcome,
        error_code: str = "",
        detail: str = "",
        *,
        manifest: Sequence[Mapping[str, Any]] | None = None,
        timeout_s: float | None = None,
    ) -> Mapping[str, Any]:
        """POST /attempts/{attemptId}/report; returns the Run view. Raises LeaseConflict (409).

        `outcome` is one of REPORT_OUTCOMES. A success needs its ResultManifest (artifactId,
        digest, sizeBytes, mediaType per entry; an empty list when the run produced no artifact):
        without it the coordinator records a failure (EXE-1). `cancelled` is accepted only for a
        run asked to stop (otherwise RequestRejected), `preparation_failed` only while preparing.
        """
        check_outcome(outcome)
        url = f"{self._api_url}/attempts/{_segment(lease.attempt_id)}/report"
        body: dict[str, Any] = {
            "leaseEpoch": lease.epoch,
            "sequence": sequence,
            "outcome": outcome,
            "errorCode": error_code,
            "detail": detail,
        }
        if manifest is not None:
            body["manifest"] = [dict(entry) for entry in manifest]
        return self._post("report", url, body, timeout_s=timeout_s)

    # --- effect gateway ----------------------------------------------------------------------

    def effect(
        self,
        lease: Lease,
        idempotency_key: str,
        tool: str,
        operation: str,
        payload: Mapping[str, Any],
        *,
        timeout_s: float | None = None,
        action_hash: str | None = None,
    ) -> EffectResult:
        """POST /effects under the lease's epoch (LEASE-3).

        Raises LeaseConflict / FencedByRecipient (409), ToolFailed (502), OutcomeUnknown (504) or
        TenureUnavailable; after the last two, retry with the same idempotency key (EXE-6).
        ActionTombstoned (409) when the semantic watchdog tombstoned the action (WD-5);
        `action_hash` names the action the effect is, if the runner reports it by another name
        than the gateway's own (services.runner_sdk.effect_action_hash).
        """
        if not idempotency_key:
            raise ValueError("an effect needs an idempotency key so a retry never repeats it (EXE-6)")
        body = {
            "runId": lease.run_id,
            "attemptId": lease.attempt_id,
            "epoch": lease.epoch,
            "idempotencyKey": idempotency_key,
            "tool": tool,
            "operation": operation,
            "payload": dict(payload),
        }
        if action_hash is not None:
            body["actionHash"] = action_hash
        answer = self._post("effect", f"{self._gateway_url}/effects", body, timeout_s=timeout_s)
        return EffectResult(
            effect_id=_field(answer, "effectId", str),
            outcome=_field(answer, "outcome", str),
            tool_status=_int(answer, "toolStatus"),
            tool_response=_field(answer, "toolResponse", dict),
            reconciled=_field(answer, "reconciled", bool),
        )

    # --- plumbing ----------------------------------------------------------------------------

    def _post(
        self,
        operation: _Operation,
        url: str,
        body: Mapping[str, Any],
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            response = self._http.post(url, json=body, headers=headers, timeout=timeout)
        except httpx.TransportError as exc:
            # The request may have reached the service and taken effect: unknown, not refused.
            raise TenureUnavailable(operation, f"{type(exc).__name__}: {exc}") from exc
        if response.status_code == 202:
            # The command was accepted but not yet decided: it may still take effect, or not.
            raise TenureUnavailable(operation, "HTTP 202: accepted, outcome still pending", 202)
        if response.is_success:
            try:
                answer = response.json()
            except ValueError as exc:
                raise UnexpectedResponse(
                    f"{operation}: HTTP {response.status_code} body is not JSON"
                ) from exc
            if not isinstance(answer, dict):
                raise UnexpectedResponse(
                    f"{operation}: HTTP {response.status_code} body is not a JSON object"
                )
            return answer
        raise _problem(operation, response)


def _problem(operation: _Operation, response: httpx.Response) -> Exception:
    status = response.status_code
    body: dict[str, Any] = {}
    try:
        parsed = response.json()
        if isinstance(parsed, dict):
            body = parsed
    except ValueError:
        pass
    raw_type = body.get("type")
    slug = raw_type.rstrip("/").rsplit("/", 1)[-1] if isinstance(raw_type, str) and raw_type else ""
    detail_value = body.get("detail") or body.get("title") or response.reason_phrase
    detail = str(detail_value)
    if status >= 500:
        if operation == "effect" and status == 502 and slug == "tool-failed":
            return ToolFailed(status, slug, detail, body)
        if operation == "effect" and status == 504:
            return OutcomeUnknown(status, slug or "outcome-unknown", detail, body)
        return TenureUnavailable(operation, f"HTTP {status} {slug or 'server error'}: {detail}", status, slug)
    if operation == "claim":
        if status == 404:
            return RunNotFound(status, slug or "run-not-found", detail, body)
        if status == 409:
            return RunNotClaimable(status, slug or "run-not-claimable", detail, body)
    elif status == 409:
        if slug == "action-tombstoned":
            return ActionTombstoned(status, slug, detail, body)  # the lease is still held
        if slug == "fenced-by-recipient":
            return FencedByRecipient(status, slug, detail, body)
        return LeaseConflict(status, slug or "conflict", detail, body)
    if 400 <= status < 500:
        return RequestRejected(status, slug or "http-error", detail, body)
    # 1xx/3xx: httpx does not follow redirects here; a redirect means a misconfigured URL.
    return TenureProblem(status, slug or "unexpected-status", detail, body)


def check_outcome(outcome: str) -> None:
    """Raise ValueError unless `outcome` is a terminal outcome the API accepts."""
    if outcome not in REPORT_OUTCOMES:
        raise ValueError(f"outcome must be one of {', '.join(REPORT_OUTCOMES)}; got {outcome!r}")


def _segment(value: str) -> str:
    return quote(value, safe="")


def _field(answer: Mapping[str, Any], name: str, kind: type[_T]) -> _T:
    value = answer.get(name)
    if not isinstance(value, kind):
        raise UnexpectedResponse(f"answer field {name!r} should be {kind.__name__}, got {value!r}")
    return value


def _optional(answer: Mapping[str, Any], name: str, kind: type[_T]) -> _T | None:
    value = answer.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise UnexpectedResponse(f"answer field {name!r} should be {kind.__name__} or null, got {value!r}")
    return value


def _optional_int(answer: Mapping[str, Any], name: str) -> int | None:
    return None if answer.get(name) is None else _int(answer, name)


def _int(answer: Mapping[str, Any], name: str) -> int:
    value = answer.get(name)
    # bool is an int subclass; a true/false where a number belongs is a contract violation.
    if not isinstance(value, int) or isinstance(value, bool):
        raise UnexpectedResponse(f"answer field {name!r} should be an integer, got {value!r}")
    return value
