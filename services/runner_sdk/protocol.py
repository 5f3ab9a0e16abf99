"""The sans-IO core of the runner SDK's clients: what to send and what an answer means.

TenureClient (sync, httpx.Client) and AsyncTenureClient (async, httpx.AsyncClient) are thin
shells over this module: `ClientCore` builds each request as a `Call` (method, URL, body,
headers, timeout, the circuit it belongs to) and `ClientCore.interpret` turns the status, headers
and body that came back into a parsed answer or the specific exception (errors.py). The rules
live here once, for both shells:

* a connection error, a timeout, a 5xx or a 202 (accepted, not yet decided) is
  `TenureUnavailable`: the request may have taken effect, so it is an unknown outcome, never a
  refusal (the keeper retries it with the one full-jitter backoff, backoff.py);
* idempotency: a claim carries its Idempotency-Key, an effect its idempotency key (EXE-6), a
  heartbeat its sequence; a retry sends the same Call again;
* circuit breakers (BRK-2): an answer `circuit-open` / ERR_CIRCUIT_OPEN raises `CircuitOpen`
  and `CircuitMemory` refuses the same call locally, unsent, until its cooldown has passed;
* claim-next (POST /queues/{queue}/claim) answers 204 when nothing is claimable: `None`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import quote

from .errors import (
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
from .interventions import Intervention, InterventionInbox
from .renewals import BATCH_RENEWAL_MAX, BatchRenewalResult, batch_results, renewal_item

__all__ = [
    "ACCEPT",
    "REPORT_OUTCOMES",
    "BreakerView",
    "Call",
    "CircuitMemory",
    "ClientCore",
    "EffectResult",
    "Lease",
    "Operation",
    "RenewalAnswer",
    "ReportOutcome",
    "check_outcome",
    "default_headers",
]

# The terminal outcomes the command API accepts (ReportRequest.outcome): `cancelled` confirms a
# requested stop (EXE-7); `preparation_failed` says no external effect happened yet (EXE-11).
ReportOutcome = Literal["succeeded", "failed", "cancelled", "preparation_failed"]
REPORT_OUTCOMES: tuple[ReportOutcome, ...] = ("succeeded", "failed", "cancelled", "preparation_failed")
Operation = Literal["claim", "heartbeat", "report", "effect", "breaker"]
_Operation = Operation
_T = TypeVar("_T")
ACCEPT = "application/json, application/problem+json"


def default_headers(api_key: str | None) -> dict[str, str]:
    """Every SDK client's headers: problem+json accepted, the bearer key when there is one."""
    headers = {"Accept": ACCEPT}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


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
    # claim-next only: how long the API waited (long-poll) before sending the granted claim.
    waited_ms: int = 0
    # EXE-9: the checkpoint and the user's answer a continuation starts from (None: a fresh start).
    attempt_context: Mapping[str, Any] | None = None


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


@dataclass(frozen=True)
class Call:
    """One request to send, as either shell sends it; `circuit` keys its breaker memory."""

    method: Literal["GET", "POST"]
    operation: Operation
    url: str
    body: Mapping[str, Any] | None
    headers: Mapping[str, str] | None = None
    timeout_s: float | None = None
    circuit: str = ""
    # A 204 (claim-next: nothing claimable) is an answer of its own, not a body to parse.
    empty_ok: bool = False
    chunk: Sequence[tuple[Lease, int]] = field(default=())


class CircuitMemory:
    """BRK-2: the calls answered circuit-open, refused locally until (clock s) their cooldown ends.
    Thread-safe, so one memory serves a sync client's threads; an async client shares the rule."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock or time.monotonic
        self._circuits: dict[str, tuple[float, CircuitOpen]] = {}
        self._lock = threading.Lock()

    def open_circuits(self) -> dict[str, float]:
        now = self._clock()
        with self._lock:
            return {key: until - now for key, (until, _) in self._circuits.items() if until > now}

    def refuse_if_open(self, key: str) -> None:
        """Raise CircuitOpen (local) while `key`'s last circuit-open answer's cooldown runs."""
        now = self._clock()
        with self._lock:
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

    def remember(self, key: str, error: Exception) -> Exception:
        if isinstance(error, CircuitOpen):
            with self._lock:
                self._circuits[key] = (self._clock() + error.cooldown_remaining_s, error)
        return error


class ClientCore:
    """Requests and their interpretation for the command API (`api_url`) and the effect gateway
    (`gateway_url`); no I/O. `interventions` hears the watchdog rungs renewal answers carry."""

    def __init__(
        self,
        api_url: str,
        gateway_url: str,
        timeout_s: float,
        interventions: InterventionInbox,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.api_url = api_url.rstrip("/")
        self.gateway_url = gateway_url.rstrip("/")
        self.timeout_s = timeout_s
        self.interventions = interventions
        self.circuits = CircuitMemory(clock)

    # --- requests -----------------------------------------------------------------------------

    def claim(
        self,
        run_id: str,
        runner_id: str,
        capabilities: Sequence[str],
        lease_seconds: int | None,
        heartbeat_seconds: int | None,
        idempotency_key: str | None,
    ) -> Call:
        body = _claim_body(runner_id, capabilities, lease_seconds, heartbeat_seconds)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        url = f"{self.api_url}/runs/{_segment(run_id)}/attempts"
        return Call("POST", "claim", url, body, headers)

    def claim_next(
        self,
        queue: str,
        runner_id: str,
        capabilities: Sequence[str],
        lease_seconds: int | None,
        heartbeat_seconds: int | None,
        wait_s: int,
        idempotency_key: str | None = None,
    ) -> Call:
        """POST /queues/{queue}/claim; the HTTP timeout covers the server's long-poll. Resend the
        same Idempotency-Key after an unknown outcome: the API answers the grant it made."""
        body = _claim_body(runner_id, capabilities, lease_seconds, heartbeat_seconds)
        body["waitSeconds"] = wait_s
        url = f"{self.api_url}/queues/{_segment(queue)}/claim"
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return Call("POST", "claim", url, body, headers, timeout_s=self.timeout_s + wait_s, empty_ok=True)

    def heartbeat(self, lease: Lease, sequence: int, timeout_s: float | None) -> Call:
        url = f"{self.api_url}/attempts/{_segment(lease.attempt_id)}/heartbeat"
        body = {"leaseEpoch": lease.epoch, "sequence": sequence}
        return Call("POST", "heartbeat", url, body, None, timeout_s)

    def renewals(self, renewals: Sequence[tuple[Lease, int]], timeout_s: float | None) -> list[Call]:
        """POST /leases:renew, one Call each BATCH_RENEWAL_MAX leases (results: `renewal_results`)."""
        calls = []
        for start in range(0, len(renewals), BATCH_RENEWAL_MAX):
            chunk = renewals[start : start + BATCH_RENEWAL_MAX]
            body = {"renewals": [renewal_item(lease, sequence) for lease, sequence in chunk]}
            url = f"{self.api_url}/leases:renew"
            calls.append(Call("POST", "heartbeat", url, body, None, timeout_s, chunk=chunk))
        return calls

    def report(
        self,
        lease: Lease,
        sequence: int,
        outcome: ReportOutcome,
        error_code: str,
        detail: str,
        manifest: Sequence[Mapping[str, Any]] | None,
        timeout_s: float | None,
    ) -> Call:
        check_outcome(outcome)
        url = f"{self.api_url}/attempts/{_segment(lease.attempt_id)}/report"
        body: dict[str, Any] = {
            "leaseEpoch": lease.epoch,
            "sequence": sequence,
            "outcome": outcome,
            "errorCode": error_code,
            "detail": detail,
        }
        if manifest is not None:
            body["manifest"] = [dict(entry) for entry in manifest]
        return Call("POST", "report", url, body, None, timeout_s)

    def effect(
        self,
        lease: Lease,
        idempotency_key: str,
        tool: str,
        operation: str,
        payload: Mapping[str, Any],
        timeout_s: float | None,
        action_hash: str | None,
    ) -> Call:
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
        url = f"{self.gateway_url}/effects"
        return Call("POST", "effect", url, body, None, timeout_s, circuit=f"effect {tool}/{operation}")

    def breaker(self, endpoint: str, timeout_s: float | None) -> Call:
        url = f"{self.api_url}/breakers/{quote(endpoint, safe='/:@')}"
        return Call("GET", "breaker", url, None, None, timeout_s)

    # --- sending and answers ------------------------------------------------------------------

    def key(self, call: Call) -> str:
        return call.circuit or f"{call.operation} {call.url}"

    def before(self, call: Call) -> float:
        """Check the call may be sent (never before an open circuit's cooldown, BRK-2); its timeout."""
        self.circuits.refuse_if_open(self.key(call))
        return self.timeout_s if call.timeout_s is None else call.timeout_s

    def transport_failed(self, call: Call, exc: Exception) -> TenureUnavailable:
        # The request may have reached the service and taken effect: unknown, not refused.
        return TenureUnavailable(call.operation, f"{type(exc).__name__}: {exc}")

    def interpret(
        self, call: Call, status: int, headers: Mapping[str, str], body: Any, reason: str = ""
    ) -> dict[str, Any] | None:
        """The answer's JSON object, None for an allowed 204, else raise what it means.
        `body` is the parsed JSON (or _NOT_JSON when it was not JSON)."""
        key = self.key(call)
        if status == 204 and call.empty_ok:
            return None
        if status == 202:
            # The command was accepted but not yet decided: it may still take effect, or not.
            raise TenureUnavailable(call.operation, "HTTP 202: accepted, outcome still pending", 202)
        if 200 <= status < 300:
            if body is NOT_JSON:
                raise UnexpectedResponse(f"{call.operation}: HTTP {status} body is not JSON")
            if not isinstance(body, dict):
                raise UnexpectedResponse(f"{call.operation}: HTTP {status} body is not a JSON object")
            opened = _circuit_open(status, "", body, headers)
            if opened is not None:  # a synthetic observation in a 2xx: the call failed fast
                raise self.circuits.remember(key, opened)
            return body
        parsed = body if isinstance(body, dict) else {}
        raise self.circuits.remember(key, _problem(call.operation, status, parsed, headers, reason))

    # --- parsed answers -----------------------------------------------------------------------

    def lease(self, answer: Mapping[str, Any]) -> Lease:
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
            assignment=_field(answer, "assignment", dict),
            waited_ms=max(0, _optional_int(answer, "waitedMs") or 0),
            attempt_context=_optional(answer, "attemptContext", dict),
        )

    def renewal(self, answer: Mapping[str, Any]) -> RenewalAnswer:
        return RenewalAnswer(
            attempt_id=_field(answer, "attemptId", str),
            epoch=_int(answer, "epoch"),
            sequence=_int(answer, "sequence"),
            expires_at=_int(answer, "expiresAt"),
            server_time=_int(answer, "serverTime"),
            certainty=_field(answer, "certainty", str),
            run_status=_field(answer, "runStatus", str),
            # Tolerated as absent: an older API carries no stop flags (nor, on a replay, before
            # issue 17's repeat answers); this API always sends them, replay or not.
            stop_requested=_optional(answer, "stopRequested", bool) or False,
            stop_kind=_optional(answer, "stopKind", str),
            stop_grace_until=_optional_int(answer, "stopGraceUntil"),
            replayed=_optional(answer, "replayed", bool) or False,
            watchdog=self.interventions.notice(answer),
        )

    def renewal_results(self, call: Call, answer: Mapping[str, Any]) -> list[BatchRenewalResult]:
        return batch_results(answer, call.chunk, self.renewal, self.interventions.notice)

    def effect_result(self, answer: Mapping[str, Any]) -> EffectResult:
        return EffectResult(
            effect_id=_field(answer, "effectId", str),
            outcome=_field(answer, "outcome", str),
            tool_status=_int(answer, "toolStatus"),
            tool_response=_field(answer, "toolResponse", dict),
            reconciled=_field(answer, "reconciled", bool),
        )

    def breaker_view(self, answer: Mapping[str, Any]) -> BreakerView:
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


NOT_JSON: Any = object()


def _claim_body(
    runner_id: str, capabilities: Sequence[str], lease_seconds: int | None, heartbeat_seconds: int | None
) -> dict[str, Any]:
    return {
        "runnerId": runner_id,
        "holderKind": "runner",
        "capabilities": list(capabilities),
        "leaseSeconds": lease_seconds,
        "heartbeatSeconds": heartbeat_seconds,
    }


def _problem(
    operation: _Operation, status: int, body: dict[str, Any], headers: Mapping[str, str], reason: str
) -> Exception:
    raw_type = body.get("type")
    slug = raw_type.rstrip("/").rsplit("/", 1)[-1] if isinstance(raw_type, str) and raw_type else ""
    detail_value = body.get("detail") or body.get("title") or reason
    detail = str(detail_value)
    opened = _circuit_open(status, slug, body, headers)
    if opened is not None:  # before the 5xx rule: nothing was dispatched, the outcome is known
        return opened
    if status >= 500:
        if operation == "effect" and status == 502 and slug == "tool-failed":
            return ToolFailed(status, slug, detail, body)
        if operation == "effect" and status == 504:
            return OutcomeUnknown(status, slug or "outcome-unknown", detail, body)
        return TenureUnavailable(
            operation,
            f"HTTP {status} {slug or 'server error'}: {detail}",
            status,
            slug,
            _retry_after_s(headers),
        )
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
    retry_after = _retry_after_s(headers)
    if not waits and retry_after is not None:
        waits.append(retry_after)
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


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    """The answer's Retry-After in seconds, when it has one in delta-seconds form."""
    retry_after = headers.get("retry-after", "").strip()
    return float(retry_after) if retry_after.isdigit() else None
