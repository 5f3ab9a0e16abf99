"""Forwarding an effect to its tool, and probing the tool after an ambiguous answer.

Every request carries the idempotency key and the fencing epoch, so the recipient can refuse a
stale holder itself (LEASE-3) and never apply the same effect twice (EXE-6).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["ToolAnswer", "ToolRegistry", "ToolUnreachable"]


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


class ToolRegistry:
    """Tools by name (TENURE_TOOLS="ledger=http://127.0.0.1:9100,...")."""

    def __init__(self, tools: dict[str, str], timeout_s: float = 5.0) -> None:
        self._tools = tools
        self._client = httpx.AsyncClient(timeout=timeout_s)

    @classmethod
    def from_env(cls) -> ToolRegistry:
        spec = os.environ.get("TENURE_TOOLS", "ledger=http://127.0.0.1:9100")
        tools = {}
        for item in filter(None, (p.strip() for p in spec.split(","))):
            name, _, url = item.partition("=")
            tools[name] = url.rstrip("/")
        timeout = float(os.environ.get("TENURE_TOOL_TIMEOUT_S", "5"))
        return cls(tools, timeout)

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
            response = await self._client.post(
                f"{self._tools[tool]}/effects",
                headers=headers,
                json={"operation": operation, "payload": payload},
            )
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
            response = await self._client.get(f"{self._tools[tool]}/effects/{idempotency_key}")
        except httpx.HTTPError as exc:
            raise ToolUnreachable(f"{tool} probe: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise ToolUnreachable(f"{tool} probe answered {response.status_code}")
        return ToolAnswer(response.status_code, _json(response))

    async def verify(self, tool: str, verifier: str, work_id: str, payload: dict[str, Any]) -> ToolAnswer:
        try:
            response = await self._client.post(
                f"{self._tools[tool]}/verifiers/{verifier}", json={"payload": payload, "workId": work_id}
            )
        except httpx.HTTPError as exc:
            raise ToolUnreachable(f"{tool} verifier: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise ToolUnreachable(f"{tool} verifier answered {response.status_code}")
        return ToolAnswer(response.status_code, _json(response))

    async def close(self) -> None:
        await self._client.aclose()


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {"raw": response.text[:2000]}
    return body if isinstance(body, dict) else {"value": body}
