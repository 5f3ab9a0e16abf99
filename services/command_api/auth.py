"""The API's side of authentication: the shared principal model (services.common.auth) per request.

With no keys configured the API runs in development mode: every caller is `anonymous` with the
`submitter` role; `warn_if_development_mode` says so at start-up and `/healthz` reports it.
"""

from __future__ import annotations

from fastapi import Request

from services.common.auth import Principal, authenticate, parse_api_keys
from services.common.settings import TenureSettings

__all__ = ["Principal", "load_api_keys", "principal_of"]


def load_api_keys(spec: str | None = None) -> dict[str, Principal]:
    return parse_api_keys(TenureSettings().api_keys if spec is None else spec)


def principal_of(request: Request, keys: dict[str, Principal]) -> Principal:
    return authenticate(request.headers.get("authorization"), keys)
