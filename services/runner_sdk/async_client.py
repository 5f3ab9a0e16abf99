"""The asynchronous HTTP client for the runner's side of the Tenure contract (asyncio, httpx).

The same calls, answers and exceptions as TenureClient (client.py), and the same rules: both are
thin shells over protocol.ClientCore, which builds every request and interprets every answer
(unknown outcomes as TenureUnavailable, 202 as not yet decided, circuit-open answers remembered
and refused locally until their cooldown, BRK-2). Only the sending differs: httpx.AsyncClient.

    async with AsyncTenureClient(api_url, gateway_url, api_key="...") as client:
        lease = await client.claim_next("default", "runner-7", wait_s=5)
        if lease is not None:
            await client.heartbeat(lease, 1)
            await client.report(lease, 2, "succeeded", manifest=[])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from .client import response_body
from .interventions import Intervention, as_inbox
from .protocol import (
    NOT_JSON,
    BreakerView,
    Call,
    ClientCore,
    EffectResult,
    Lease,
    RenewalAnswer,
    ReportOutcome,
    default_headers,
)
from .renewals import BatchRenewalResult

__all__ = ["AsyncTenureClient"]


class AsyncTenureClient:
    """TenureClient's calls as coroutines (see client.py for each call's contract)."""

    def __init__(
        self,
        api_url: str,
        gateway_url: str,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        on_intervention: Callable[[Intervention], None] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.interventions = as_inbox(on_intervention)
        self.core = ClientCore(api_url, gateway_url, timeout_s, self.interventions, clock)
        self.timeout_s = timeout_s
        self._http = httpx.AsyncClient(
            headers=default_headers(api_key), timeout=timeout_s, transport=transport
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncTenureClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def claim(
        self,
        run_id: str,
        runner_id: str,
        capabilities: Sequence[str],
        lease_seconds: int | None = None,
        heartbeat_seconds: int | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Lease:
        call = self.core.claim(
            run_id, runner_id, capabilities, lease_seconds, heartbeat_seconds, idempotency_key
        )
        return self.core.lease(await self._answer(call))

    async def claim_next(
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
        call = self.core.claim_next(
            queue, runner_id, capabilities, lease_seconds, heartbeat_seconds, wait_s, idempotency_key
        )
        answer = await self._send(call)
        return None if answer is None else self.core.lease(answer)

    async def heartbeat(
        self, lease: Lease, sequence: int, *, timeout_s: float | None = None
    ) -> RenewalAnswer:
        return self.core.renewal(await self._answer(self.core.heartbeat(lease, sequence, timeout_s)))

    async def renew_leases(
        self, renewals: Sequence[tuple[Lease, int]], *, timeout_s: float | None = None
    ) -> list[BatchRenewalResult]:
        results: list[BatchRenewalResult] = []
        for call in self.core.renewals(renewals, timeout_s):
            results.extend(self.core.renewal_results(call, await self._answer(call)))
        return results

    async def report(
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
        call = self.core.report(lease, sequence, outcome, error_code, detail, manifest, timeout_s)
        return await self._answer(call)

    async def effect(
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
        call = self.core.effect(lease, idempotency_key, tool, operation, payload, timeout_s, action_hash)
        return self.core.effect_result(await self._answer(call))

    async def breaker(self, endpoint: str, *, timeout_s: float | None = None) -> BreakerView:
        return self.core.breaker_view(await self._answer(self.core.breaker(endpoint, timeout_s)))

    def open_circuits(self) -> dict[str, float]:
        return self.core.circuits.open_circuits()

    async def _answer(self, call: Call) -> dict[str, Any]:
        answer = await self._send(call)
        assert answer is not None  # only a claim-next Call may be answered 204
        return answer

    async def _send(self, call: Call) -> dict[str, Any] | None:
        timeout = self.core.before(call)
        try:
            response = await self._http.request(
                call.method, call.url, json=call.body, headers=call.headers, timeout=timeout
            )
        except httpx.TransportError as exc:
            raise self.core.transport_failed(call, exc) from exc
        body = response_body(response) if response.content else NOT_JSON
        return self.core.interpret(call, response.status_code, response.headers, body, response.reason_phrase)
