"""A synchronous HTTP client for the runner's side of the Tenure contract (EXE-4, LEASE-3).

Four calls: claim an attempt, renew its lease, report its outcome (command API) and ask the
effect gateway to perform an effect under the lease's epoch. Every answer is parsed into a
frozen value; every problem+json answer becomes a specific exception (see errors.py). A
connection error, a timeout, a 5xx or a 202 (accepted, not yet decided) becomes
`TenureUnavailable`: the request may have taken effect, so it is reported as an unknown outcome,
never as a refusal.

Circuit breakers (BRK-2): an answer `circuit-open` / ERR_CIRCUIT_OPEN (the dependency's
fleet-wide breaker is open; nothing was dispatched) raises `CircuitOpen` with the dependency and
the cooldown remaining, and the client refuses the same call itself, without sending it, until
that cooldown has passed: a runner's retry loop cannot hammer an open breaker. `breaker(endpoint)`
reads a breaker (GET /breakers/{endpoint}).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx

from services.runner_sdk.errors import (
    ERR_CIRCUIT_OPEN,
    ActionTombstoned,
    CircuitOpen,
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
from services.runner_sdk.renewals import BATCH_RENEWAL_MAX, BatchRenewalResult, batch_results, renewal_item

__all__ = [
    "REPORT_OUTCOMES",
    "BreakerView",
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
_Operation = Literal["claim", "heartbeat", "report", "effect", "breaker"]
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


@dataclass(frozen=True)
class BreakerView:
    """A tool endpoint's circuit breaker as GET /breakers/{endpoint} shows it (BRK-1, BRK-2).

    `fails_fast`: calls to it fail with ERR_CIRCUIT_OPEN now; `retry_after_s`: what such a call
    is told to wait; `cooldown_remaining_s`: an open breaker's time left before it half-opens.
    `view` is the whole answer (window, canary, transitions with their evidence)."""

    endpoint: str
    status: str
    fails_fast: bool
    cooldown_remaining_s: float
    retry_after_s: float
    error_rate: float
    canary_holder: str | None
    reason: str | None
    view: Mapping[str, Any]


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
        clock: Callable[[], float] | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self._api_url = api_url.rstrip("/")
        self._gateway_url = gateway_url.rstrip("/")
        self.timeout_s = timeout_s
        self._http = api_http_client(api_key, timeout_s, transport)
        self.interventions = as_inbox(on_intervention)
        # BRK-2: calls answered circuit-open, refused here until (monotonic s) their cooldown ends.
        self._clock = clock or time.monotonic
        self._circuits: dict[str, tuple[float, CircuitOpen]] = {}
        self._circuits_lock = threading.Lock()

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
        return self.renewal_answer(answer)

    def renew_leases(
        self, renewals: Sequence[tuple[Lease, int]], *, timeout_s: float | None = None
    ) -> list[BatchRenewalResult]:
        """POST /leases:renew: many leases (lease, sequence) renewed in one request each
        BATCH_RENEWAL_MAX; one result per lease, in order (renewals.py). Raises TenureUnavailable
        only when a whole request failed (Kafka took none of it, the API is unreachable)."""
        results: list[BatchRenewalResult] = []
        for start in range(0, len(renewals), BATCH_RENEWAL_MAX):
            chunk = renewals[start : start + BATCH_RENEWAL_MAX]
            body = {"renewals": [renewal_item(lease, sequence) for lease, sequence in chunk]}
            answer = self._post("heartbeat", f"{self._api_url}/leases:renew", body, timeout_s=timeout_s)
            results.extend(batch_results(answer, chunk, self.renewal_answer))
        return results

    def renewal_answer(self, answer: Mapping[str, Any]) -> RenewalAnswer:
        """A heartbeat's answer (or an accepted item of a batch renewal) as a RenewalAnswer."""
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
        url, circuit = f"{self._gateway_url}/effects", f"effect {tool}/{operation}"
        answer = self._post("effect", url, body, timeout_s=timeout_s, circuit=circuit)
        return EffectResult(
            effect_id=_field(answer, "effectId", str),
            outcome=_field(answer, "outcome", str),
            tool_status=_int(answer, "toolStatus"),
            tool_response=_field(answer, "toolResponse", dict),
            reconciled=_field(answer, "reconciled", bool),
        )

    # --- circuit breakers (BRK-2) ----------------------------------------------------------------

    def breaker(self, endpoint: str, *, timeout_s: float | None = None) -> BreakerView:
        """GET /breakers/{endpoint}. RequestRejected (404 breaker-not-found) for an endpoint no
        call has reached yet; TenureUnavailable when the API cannot answer."""
        url = f"{self._api_url}/breakers/{quote(endpoint, safe='/:@')}"
        answer = self._call("GET", "breaker", url, None, timeout_s=timeout_s)
        canary = answer.get("canaryHolder")
        reason = answer.get("reason")
        return BreakerView(
            endpoint=_field(answer, "endpoint", str),
            status=_field(answer, "status", str),
            fails_fast=_field(answer, "failsFast", bool),
            cooldown_remaining_s=_int(answer, "cooldownRemainingMs") / 1000,
            retry_after_s=_int(answer, "retryAfterMs") / 1000,
            error_rate=float(_number(answer, "errorRate")),
            canary_holder=canary if isinstance(canary, str) else None,
            reason=reason if isinstance(reason, str) else None,
            view=answer,
        )

    def open_circuits(self) -> dict[str, float]:
        """The calls this client refuses itself now, with the seconds left before it will send them."""
        now = self._clock()
        with self._circuits_lock:
            return {key: until - now for key, (until, _) in self._circuits.items() if until > now}

    def _refuse_if_open(self, key: str) -> None:
        """Raise CircuitOpen (local) while `key`'s last circuit-open answer's cooldown runs."""
        now = self._clock()
        with self._circuits_lock:
            found = self._circuits.get(key)
            if found is not None and found[0] <= now:
                del self._circuits[key]
                found = None
        if found is None:
            return
        until, seen = found
        left = until - now
        raise CircuitOpen(
            seen.status,
            seen.problem_type,
            f"not sent: the circuit breaker of {seen.dependency or key} is open for {left:.1f}s more "
            f"({seen.detail})",
            seen.body,
            dependency=seen.dependency,
            cooldown_remaining_s=left,
            local=True,
            pending_intent=seen.pending_intent,
        )

    def _remember(self, key: str, error: Exception) -> Exception:
        if isinstance(error, CircuitOpen):
            with self._circuits_lock:
                self._circuits[key] = (self._clock() + error.cooldown_remaining_s, error)
        return error

    # --- plumbing ----------------------------------------------------------------------------

    def _post(
        self,
        operation: _Operation,
        url: str,
        body: Mapping[str, Any],
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        circuit: str | None = None,
    ) -> dict[str, Any]:
        return self._call("POST", operation, url, body, headers=headers, timeout_s=timeout_s, circuit=circuit)

    def _call(
        self,
        method: Literal["GET", "POST"],
        operation: _Operation,
        url: str,
        body: Mapping[str, Any] | None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        circuit: str | None = None,
    ) -> dict[str, Any]:
        key = circuit or f"{operation} {url}"
        self._refuse_if_open(key)  # never retried before the cooldown (BRK-2)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            response = self._http.request(method, url, json=body, headers=headers, timeout=timeout)
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
            opened = _circuit_open(response.status_code, "", answer, response.headers)
            if opened is not None:  # a synthetic observation in a 2xx: the call failed fast
                raise self._remember(key, opened)
            return answer
        raise self._remember(key, _problem(operation, response))


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
    opened = _circuit_open(status, slug, body, response.headers)
    if opened is not None:  # before the 5xx rule: nothing was dispatched, the outcome is known
        return opened
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


def _circuit_open(
    status: int, slug: str, body: Mapping[str, Any], headers: Mapping[str, str]
) -> CircuitOpen | None:
    """The CircuitOpen an answer means, if it is `circuit-open` / ERR_CIRCUIT_OPEN (BRK-2).

    The code may sit in the body or in its `observation` (the synthetic observation the gateway
    hands an agent). The cooldown remaining is the longest the answer names in `cooldownRemainingMs`,
    `retryAfterMs`, `cooldownRemainingS` or `retryAfterSeconds`; only without any of them the
    Retry-After header's whole seconds. The dependency is `dependency` (or `endpoint`)."""
    nested = body.get("observation")
    observation: Mapping[str, Any] = nested if isinstance(nested, dict) else {}
    codes = {body.get("code"), body.get("errorCode"), observation.get("code")}
    if slug != "circuit-open" and ERR_CIRCUIT_OPEN not in codes:
        return None
    waits: list[float] = []
    scales = (("cooldownRemainingMs", 1000), ("retryAfterMs", 1000), ("cooldownRemainingS", 1))
    for source in (body, observation):
        for name, scale in (*scales, ("retryAfterSeconds", 1)):
            value = source.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
                waits.append(float(value) / scale)
    retry_after = headers.get("retry-after", "").strip()
    if not waits and retry_after.isdigit():
        waits.append(float(retry_after))
    dependency = next(
        (
            str(v)
            for source in (body, observation)
            for v in (source.get("dependency"), source.get("endpoint"))
            if isinstance(v, str) and v
        ),
        "",
    )
    detail = str(body.get("detail") or observation.get("message") or f"the breaker of {dependency} is open")
    return CircuitOpen(
        status,
        slug or "circuit-open",
        detail,
        body,
        dependency=dependency,
        cooldown_remaining_s=max(waits or [0.0]),
        pending_intent=body.get("pendingIntent") is True,
    )


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


def _number(answer: Mapping[str, Any], name: str) -> float:
    value = answer.get(name)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise UnexpectedResponse(f"answer field {name!r} should be a number, got {value!r}")
    return float(value)


def _optional_int(answer: Mapping[str, Any], name: str) -> int | None:
    return None if answer.get(name) is None else _int(answer, name)


def _int(answer: Mapping[str, Any], name: str) -> int:
    value = answer.get(name)
    # bool is an int subclass; a true/false where a number belongs is a contract violation.
    if not isinstance(value, int) or isinstance(value, bool):
        raise UnexpectedResponse(f"answer field {name!r} should be an integer, got {value!r}")
    return value
