"""Forwarding an effect to its tool, and probing the tool after an ambiguous answer.

Every request carries the idempotency key and the fencing epoch, so the recipient can refuse a
stale holder itself (LEASE-3) and never apply the same effect twice (EXE-6).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from services.common.bulkhead import Bulkheads
from services.common.settings import TenureSettings
from services.common.tracing import SpanKind, inject_into_http, span

__all__ = ["KEEPALIVE_EXPIRY_S", "ToolAnswer", "ToolRegistry", "ToolUnreachable", "parse_tools"]


def parse_tools(spec: str) -> dict[str, str]:
    """`name=url,...` (TENURE_TOOLS) as {name: url without a trailing slash}."""
    tools: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        name, _, url = item.partition("=")
        if not name.strip() or not url.strip():
            raise ValueError(f"TENURE_TOOLS entry {item!r} is not name=url")
        tools[name.strip()] = url.strip().rstrip("/")
    return tools


class ToolUnreachable(Exception):
    """No usable answer: the effect may or may not have happened.

    `answer` is the tool's own 5xx answer when there was one: once a probe shows the effect did
    not happen, that answer is a definite failure with the tool's problem type."""

    def __init__(self, message: str, answer: ToolAnswer | None = None) -> None:
        super().__init__(message)
        self.answer = answer


@dataclass(frozen=True)
class ToolAnswer:
    status: int
    body: dict[str, Any]

    @property
    def problem_type(self) -> str | None:
        value = self.body.get("type")
        return str(value) if value is not None else None


# How long an idle connection to a tool is kept for reuse. httpx's default (5 s) equals the
# keep-alive of uvicorn and Node servers (5 s): a connection reused just as the tool closes it
# fails with a ReadError, and for an effect that is "outcome unknown", never retried blindly. A
# CI run's canary most likely met exactly that (2026-12-07: a ReadError on the gateway's first
# call to the tool in seconds). Well under the common servers' keep-alive, the gateway drops an
# idle connection before the tool does.
KEEPALIVE_EXPIRY_S = 2.0


class ToolRegistry:
    """Tools by name (TENURE_TOOLS="ledger=http://127.0.0.1:9100,...").

    `max_connections`: the HTTP connections open at once, across the tools. The gateway sizes it
    from its bulkheads (`Bulkheads.connection_limit()`, BRK-4): every pool's slots can each hold
    a connection, and no more can be in flight, where httpx's default would cap every domain
    together at 100. `transport` exists for tests (httpx.MockTransport)."""

    def __init__(
        self,
        tools: dict[str, str],
        timeout_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        max_connections: int = 100,
    ) -> None:
        self._tools = tools
        self.max_connections = max_connections
        limits = httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        )
        self._client = httpx.AsyncClient(timeout=timeout_s, transport=transport, limits=limits)

    @classmethod
    def from_settings(
        cls, settings: TenureSettings | None = None, bulkheads: Bulkheads | None = None
    ) -> ToolRegistry:
        settings = settings or TenureSettings()
        bulkheads = bulkheads or Bulkheads.from_settings(settings)
        return cls(
            parse_tools(settings.tools), settings.tool_timeout_s, max_connections=bulkheads.connection_limit()
        )

    def knows(self, tool: str) -> bool:
        return tool in self._tools

    def names(self) -> list[str]:
        return sorted(self._tools)

    async def dispatch(
        self,
        tool: str,
        work_id: str,
        epoch: int,
        idempotency_key: str,
        operation: str,
        payload: dict[str, Any],
    ) -> ToolAnswer:
        headers = {"Idempotency-Key": idempotency_key, "X-Fencing-Epoch": str(epoch), "X-Work-Id": work_id}
        try:
            with span(f"tool {tool}", _attributes(tool, operation, epoch), kind=SpanKind.CLIENT) as call:
                response = await self._client.post(
                    f"{self._tools[tool]}/effects",
                    headers=inject_into_http(headers),  # the tool continues the effect's trace
                    json={"operation": operation, "payload": payload},
                )
                call.set_attribute("http.response.status_code", response.status_code)
        except httpx.HTTPError as exc:
            raise ToolUnreachable(f"{tool}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise ToolUnreachable(
                f"{tool} answered {response.status_code}", ToolAnswer(response.status_code, _json(response))
            )
        return ToolAnswer(response.status_code, _json(response))

    async def probe(self, tool: str, idempotency_key: str) -> ToolAnswer:
        """REC-6: ask the recipient whether the effect with this key happened."""
        try:
            # The key is the caller's text: "/", "?", "#" or a space in it must not change the URL.
            url = f"{self._tools[tool]}/effects/{quote(idempotency_key, safe='')}"
            with span(f"probe {tool}", {"tenure.tool": tool}, kind=SpanKind.CLIENT):
                response = await self._client.get(url, headers=inject_into_http())
        except httpx.HTTPError as exc:
            raise ToolUnreachable(f"{tool} probe: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise ToolUnreachable(f"{tool} probe answered {response.status_code}")
        return ToolAnswer(response.status_code, _json(response))

    async def verify(self, tool: str, verifier: str, work_id: str, payload: dict[str, Any]) -> ToolAnswer:
        try:
            with span(
                f"verify {tool}", {"tenure.tool": tool, "tenure.verifier": verifier}, kind=SpanKind.CLIENT
            ):
                response = await self._client.post(
                    f"{self._tools[tool]}/verifiers/{quote(verifier, safe='')}",
                    headers=inject_into_http(),
                    json={"payload": payload, "workId": work_id},
                )
        except httpx.HTTPError as exc:
            raise ToolUnreachable(f"{tool} verifier: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise ToolUnreachable(f"{tool} verifier answered {response.status_code}")
        return ToolAnswer(response.status_code, _json(response))

    async def close(self) -> None:
        await self._client.aclose()


def _attributes(tool: str, operation: str, epoch: int) -> dict[str, Any]:
    return {"tenure.tool": tool, "tenure.operation": operation, "tenure.epoch": epoch}


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {"raw": response.text[:2000]}
    return body if isinstance(body, dict) else {"value": body}
