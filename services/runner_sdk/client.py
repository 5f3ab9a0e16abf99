"""The synchronous HTTP client for the runner's side of the Tenure contract (EXE-4, LEASE-3).

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

The rules are protocol.py's (ClientCore), shared with AsyncTenureClient (async_client.py): this
module only sends each Call with httpx.Client.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from .interventions import Intervention, as_inbox
from .protocol import (
    NOT_JSON,
    REPORT_OUTCOMES,
    BreakerView,
    Call,
    ClientCore,
    EffectResult,
    Lease,
    RenewalAnswer,
    ReportOutcome,
    check_outcome,
    default_headers,
)
from .renewals import BatchRenewalResult

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
    "response_body",
]


def api_http_client(
    api_key: str | None, timeout_s: float, transport: httpx.BaseTransport | None = None
) -> httpx.Client:
    """The HTTP client every SDK client of the command API uses: problem+json accepted, bearer key."""
    return httpx.Client(headers=default_headers(api_key), timeout=timeout_s, transport=transport)


def response_body(response: httpx.Response) -> Any:
    """The parsed JSON of an answer, or protocol.NOT_JSON."""
    try:
        return response.json()
    except ValueError:
        return NOT_JSON


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
        self.interventions = as_inbox(on_intervention)
        self.core = ClientCore(api_url, gateway_url, timeout_s, self.interventions, clock)
        self.timeout_s = timeout_s
        self._http = api_http_client(api_key, timeout_s, transport)

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
        call = self.core.claim(
            run_id, runner_id, capabilities, lease_seconds, heartbeat_seconds, idempotency_key
        )
        return self.core.lease(self._answer(call))

    def claim_next(
        self,
        queue: str,
        runner_id: str,
        capabilities: Sequence[str] = (),
        lease_seconds: int | None = None,
        heartbeat_seconds: int | None = None,
        *,
        wait_s: int = 0,
        idempotency_key: str | None = None,
    ) -> Lease | None:
        """POST /queues/{queue}/claim: the next run of `queue` this runner can run (tenant-fair),
        or None when nothing is claimable after the server's long-poll of `wait_s` seconds."""
        call = self.core.claim_next(
            queue, runner_id, capabilities, lease_seconds, heartbeat_seconds, wait_s, idempotency_key
        )
        answer = self._send(call)
        return None if answer is None else self.core.lease(answer)

    def heartbeat(self, lease: Lease, sequence: int, *, timeout_s: float | None = None) -> RenewalAnswer:
        """POST /attempts/{attemptId}/heartbeat. Raises LeaseConflict (409) or TenureUnavailable."""
        return self.core.renewal(self._answer(self.core.heartbeat(lease, sequence, timeout_s)))

    def renew_leases(
        self, renewals: Sequence[tuple[Lease, int]], *, timeout_s: float | None = None
    ) -> list[BatchRenewalResult]:
        """POST /leases:renew: many leases (lease, sequence) renewed in one request each
        BATCH_RENEWAL_MAX; one result per lease, in order (renewals.py). Raises TenureUnavailable
        only when a whole request failed (Kafka took none of it, the API is unreachable)."""
        results: list[BatchRenewalResult] = []
        for call in self.core.renewals(renewals, timeout_s):
            results.extend(self.core.renewal_results(call, self._answer(call)))
        return results

    def renewal_answer(self, answer: Mapping[str, Any]) -> RenewalAnswer:
        """A heartbeat's answer (or an accepted item of a batch renewal) as a RenewalAnswer."""
        return self.core.renewal(answer)

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
        return self._answer(
            self.core.report(lease, sequence, outcome, error_code, detail, manifest, timeout_s)
        )

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
        than the gateway's own (effect_action_hash).
        """
        call = self.core.effect(lease, idempotency_key, tool, operation, payload, timeout_s, action_hash)
        return self.core.effect_result(self._answer(call))

    # --- circuit breakers (BRK-2) ----------------------------------------------------------------

    def breaker(self, endpoint: str, *, timeout_s: float | None = None) -> BreakerView:
        """GET /breakers/{endpoint}. RequestRejected (404 breaker-not-found) for an endpoint no
        call has reached yet; TenureUnavailable when the API cannot answer."""
        return self.core.breaker_view(self._answer(self.core.breaker(endpoint, timeout_s)))

    def open_circuits(self) -> dict[str, float]:
        """The calls this client refuses itself now, with the seconds left before it will send them."""
        return self.core.circuits.open_circuits()

    # --- plumbing ----------------------------------------------------------------------------

    def _answer(self, call: Call) -> dict[str, Any]:
        answer = self._send(call)
        assert answer is not None  # only a claim-next Call may be answered 204
        return answer

    def _send(self, call: Call) -> dict[str, Any] | None:
        timeout = self.core.before(call)
        try:
            response = self._http.request(
                call.method, call.url, json=call.body, headers=call.headers, timeout=timeout
            )
        except httpx.TransportError as exc:
            raise self.core.transport_failed(call, exc) from exc
        body = response_body(response) if response.content else NOT_JSON
        return self.core.interpret(call, response.status_code, response.headers, body, response.reason_phrase)
