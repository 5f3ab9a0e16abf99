"""A client for the services that submit runs: submit, get, list, wait for an outcome, cancel,
retry and answer an input request (issue 17), sync (RunsClient) and async (AsyncRunsClient).

Both shells share RunsCore (sans-IO, like protocol.ClientCore): it builds each request and reads
each answer by the same rules. A submission is idempotent by its Idempotency-Key (one is made
when none is given, and reused by `submit`'s own retries), so resending it after an unknown
outcome (TenureUnavailable: connection error, 5xx, or 202 accepted-not-yet-decided) never makes
a second run. 404 is RunNotFound; any other 4xx is RequestRejected with its problem type.
`wait_for_outcome` re-reads the run with the one full-jitter backoff until it is terminal.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

import httpx

from .backoff import Backoff
from .client import response_body
from .errors import RequestRejected, RunNotFound, TenureRunnerError, TenureUnavailable, UnexpectedResponse
from .protocol import NOT_JSON, default_headers

__all__ = [
    "TERMINAL_STATUSES",
    "AsyncRunsClient",
    "RunCall",
    "RunWaitTimeout",
    "RunsClient",
    "RunsCore",
]

TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
_Method = Literal["GET", "POST"]


class RunWaitTimeout(TenureRunnerError):
    def __init__(self, run_id: str, last_status: str | None, timeout_s: float) -> None:
        super().__init__(f"run {run_id} did not end within {timeout_s:g}s (last status {last_status})")
        self.run_id = run_id
        self.last_status = last_status


@dataclass(frozen=True)
class RunCall:
    method: _Method
    operation: str
    path: str
    body: Mapping[str, Any] | None = None
    params: Mapping[str, str | int] | None = None
    headers: Mapping[str, str] | None = None


class RunsCore:
    """The requests of the submitting side and the meaning of their answers; no I/O."""

    def submit(
        self,
        tenant: str,
        execution_spec: Mapping[str, Any],
        timeout_seconds: int,
        *,
        idempotency_key: str,
        retry_safe: bool = False,
        max_attempts: int = 3,
        agent_revision_id: str | None = None,
    ) -> RunCall:
        body: dict[str, Any] = {
            "tenant": tenant,
            "executionSpec": dict(execution_spec),
            "timeoutSeconds": timeout_seconds,
            "retrySafe": retry_safe,
            "maxAttempts": max_attempts,
        }
        if agent_revision_id is not None:
            body["agentRevisionId"] = agent_revision_id
        return RunCall("POST", "submit", "/runs", body, headers={"Idempotency-Key": idempotency_key})

    def get(self, run_id: str) -> RunCall:
        return RunCall("GET", "get run", f"/runs/{_segment(run_id)}")

    def list(self, status: str | None, limit: int, cursor: str | None) -> RunCall:
        params: dict[str, str | int] = {"limit": limit}
        if status is not None:
            params["status"] = status
        if cursor is not None:
            params["cursor"] = cursor
        return RunCall("GET", "list runs", "/runs", params=params)

    def cancel(self, run_id: str, reason: str) -> RunCall:
        return RunCall("POST", "cancel", f"/runs/{_segment(run_id)}/cancel", {"reason": reason})

    def retry(self, run_id: str, acknowledge_repeated_effects: bool, reason: str, key: str) -> RunCall:
        body = {"acknowledgeRepeatedEffects": acknowledge_repeated_effects, "reason": reason}
        return RunCall(
            "POST", "retry", f"/runs/{_segment(run_id)}/retry", body, headers={"Idempotency-Key": key}
        )

    def answer_input(self, run_id: str, response_id: str, answer: Any) -> RunCall:
        body = {"responseId": response_id, "answer": answer}
        return RunCall("POST", "answer input", f"/runs/{_segment(run_id)}/input", body)

    def interpret(self, call: RunCall, status: int, body: Any, reason: str = "") -> dict[str, Any]:
        if status == 202:
            raise TenureUnavailable(call.operation, "HTTP 202: accepted, outcome still pending", 202)
        problem = body if isinstance(body, dict) else {}
        raw_type = problem.get("type")
        slug = raw_type.rstrip("/").rsplit("/", 1)[-1] if isinstance(raw_type, str) and raw_type else ""
        detail = str(problem.get("detail") or problem.get("title") or reason)
        if 200 <= status < 300:
            if not isinstance(body, dict):
                raise UnexpectedResponse(f"{call.operation}: HTTP {status} body is not a JSON object")
            return body
        if status >= 500:
            raise TenureUnavailable(
                call.operation, f"HTTP {status} {slug or 'server error'}: {detail}", status, slug
            )
        if status == 404 and slug in ("", "run-not-found"):
            raise RunNotFound(status, slug or "run-not-found", detail, problem)
        raise RequestRejected(status, slug or "http-error", detail, problem)

    def settled(self, view: Mapping[str, Any], until: Collection[str]) -> bool:
        return str(view.get("status")) in until

    # --- the waiting rules both clients follow (one implementation, the shells only sleep) ---

    def resend_backoff(self) -> Backoff:
        """Between resends of a submission whose outcome is unknown (the same Idempotency-Key)."""
        return Backoff(0.2, 5.0)

    def resend_delay(self, backoff: Backoff, retries: int, unknown: TenureUnavailable) -> float:
        """The wait before the next resend; `unknown` itself once `retries` resends were made."""
        if backoff.attempt >= retries:
            raise unknown
        return backoff.next_delay()

    def poll_backoff(self, poll_s: float, max_poll_s: float) -> Backoff:
        return Backoff(poll_s, max(poll_s, max_poll_s), random.random)

    def next_poll(
        self, backoff: Backoff, left_s: float, run_id: str, status: str | None, timeout_s: float
    ) -> float:
        """The wait before the next look at a run; RunWaitTimeout once the wait's time is up."""
        if left_s <= 0:
            raise RunWaitTimeout(run_id, status, timeout_s)
        return min(left_s, backoff.next_delay())


def _segment(value: str) -> str:
    return quote(value, safe="")


class RunsClient:
    """The submitting side of the command API, synchronous (httpx.Client)."""

    def __init__(
        self,
        api_url: str,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        *,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.core = RunsCore()
        self._http = httpx.Client(
            base_url=api_url.rstrip("/"),
            headers=default_headers(api_key),
            timeout=timeout_s,
            transport=transport,
        )
        self._sleep = sleep

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RunsClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def submit(
        self,
        tenant: str,
        execution_spec: Mapping[str, Any],
        timeout_seconds: int,
        *,
        idempotency_key: str | None = None,
        retries: int = 3,
        **options: Any,
    ) -> dict[str, Any]:
        """POST /runs; the Run view. An unknown outcome is resent under the same key (`retries`)."""
        call = self.core.submit(
            tenant,
            execution_spec,
            timeout_seconds,
            idempotency_key=idempotency_key or uuid.uuid4().hex,
            **options,
        )
        backoff = self.core.resend_backoff()
        while True:
            try:
                return self._send(call)
            except TenureUnavailable as unknown:
                self._sleep(self.core.resend_delay(backoff, retries, unknown))

    def get(self, run_id: str) -> dict[str, Any]:
        return self._send(self.core.get(run_id))

    def list(
        self, status: str | None = None, *, limit: int = 50, cursor: str | None = None
    ) -> dict[str, Any]:
        """One page: {"items": [...], "nextCursor": ...} (oldest submissions first)."""
        return self._send(self.core.list(status, limit, cursor))

    def cancel(self, run_id: str, reason: str = "") -> dict[str, Any]:
        return self._send(self.core.cancel(run_id, reason))

    def retry(
        self,
        run_id: str,
        *,
        acknowledge_repeated_effects: bool = False,
        reason: str = "",
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        key = idempotency_key or uuid.uuid4().hex
        return self._send(self.core.retry(run_id, acknowledge_repeated_effects, reason, key))

    def answer_input(self, run_id: str, response_id: str, answer: Any) -> dict[str, Any]:
        """POST /runs/{id}/input (EXE-8); a repeat of `response_id` is answered, never re-applied."""
        return self._send(self.core.answer_input(run_id, response_id, answer))

    def wait_for_outcome(
        self,
        run_id: str,
        *,
        timeout_s: float = 300.0,
        until: Collection[str] = TERMINAL_STATUSES,
        poll_s: float = 0.2,
        max_poll_s: float = 2.0,
    ) -> dict[str, Any]:
        """The Run view once its status is in `until` (terminal by default); RunWaitTimeout else."""
        deadline = time.monotonic() + timeout_s
        backoff = self.core.poll_backoff(poll_s, max_poll_s)
        status: str | None = None
        while True:
            try:
                view = self.get(run_id)
                status = str(view.get("status"))
                if self.core.settled(view, until):
                    return view
            except TenureUnavailable:
                pass  # an outage while waiting is waited out, like a run that has not ended
            left = deadline - time.monotonic()
            self._sleep(self.core.next_poll(backoff, left, run_id, status, timeout_s))

    def _send(self, call: RunCall) -> dict[str, Any]:
        try:
            response = self._http.request(
                call.method, call.path, json=call.body, params=call.params, headers=call.headers
            )
        except httpx.TransportError as exc:
            raise TenureUnavailable(call.operation, f"{type(exc).__name__}: {exc}") from exc
        body = response_body(response) if response.content else NOT_JSON
        return self.core.interpret(call, response.status_code, body, response.reason_phrase)


class AsyncRunsClient:
    """RunsClient's calls as coroutines (httpx.AsyncClient), by the same RunsCore rules."""

    def __init__(
        self,
        api_url: str,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.core = RunsCore()
        self._http = httpx.AsyncClient(
            base_url=api_url.rstrip("/"),
            headers=default_headers(api_key),
            timeout=timeout_s,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncRunsClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def submit(
        self,
        tenant: str,
        execution_spec: Mapping[str, Any],
        timeout_seconds: int,
        *,
        idempotency_key: str | None = None,
        retries: int = 3,
        **options: Any,
    ) -> dict[str, Any]:
        call = self.core.submit(
            tenant,
            execution_spec,
            timeout_seconds,
            idempotency_key=idempotency_key or uuid.uuid4().hex,
            **options,
        )
        backoff = self.core.resend_backoff()
        while True:
            try:
                return await self._send(call)
            except TenureUnavailable as unknown:
                await asyncio.sleep(self.core.resend_delay(backoff, retries, unknown))

    async def get(self, run_id: str) -> dict[str, Any]:
        return await self._send(self.core.get(run_id))

    async def list(
        self, status: str | None = None, *, limit: int = 50, cursor: str | None = None
    ) -> dict[str, Any]:
        return await self._send(self.core.list(status, limit, cursor))

    async def cancel(self, run_id: str, reason: str = "") -> dict[str, Any]:
        return await self._send(self.core.cancel(run_id, reason))

    async def retry(
        self,
        run_id: str,
        *,
        acknowledge_repeated_effects: bool = False,
        reason: str = "",
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        key = idempotency_key or uuid.uuid4().hex
        return await self._send(self.core.retry(run_id, acknowledge_repeated_effects, reason, key))

    async def answer_input(self, run_id: str, response_id: str, answer: Any) -> dict[str, Any]:
        return await self._send(self.core.answer_input(run_id, response_id, answer))

    async def wait_for_outcome(
        self,
        run_id: str,
        *,
        timeout_s: float = 300.0,
        until: Collection[str] = TERMINAL_STATUSES,
        poll_s: float = 0.2,
        max_poll_s: float = 2.0,
    ) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        backoff = self.core.poll_backoff(poll_s, max_poll_s)
        status: str | None = None
        while True:
            try:
                view = await self.get(run_id)
                status = str(view.get("status"))
                if self.core.settled(view, until):
                    return view
            except TenureUnavailable:
                pass
            await asyncio.sleep(
                self.core.next_poll(backoff, deadline - loop.time(), run_id, status, timeout_s)
            )

    async def _send(self, call: RunCall) -> dict[str, Any]:
        try:
            response = await self._http.request(
                call.method, call.path, json=call.body, params=call.params, headers=call.headers
            )
        except httpx.TransportError as exc:
            raise TenureUnavailable(call.operation, f"{type(exc).__name__}: {exc}") from exc
        body = response_body(response) if response.content else NOT_JSON
        return self.core.interpret(call, response.status_code, body, response.reason_phrase)
