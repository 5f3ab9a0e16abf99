"""API keys mapped to principals and roles (TENURE_API_KEYS="key=principal:role,...").

With no keys configured the API runs in development mode: every caller is `anonymous` with the
`submitter` role, which the startup log says loudly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fastapi import Request

from services.command_api.problems import ApiProblem

__all__ = ["Principal", "load_api_keys", "principal_of"]


@dataclass(frozen=True)
class Principal:
    name: str
    role: str


ANONYMOUS = Principal("anonymous", "submitter")


def load_api_keys(spec: str | None = None) -> dict[str, Principal]:
    spec = os.environ.get("TENURE_API_KEYS", "") if spec is None else spec
    keys: dict[str, Principal] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, _, who = item.partition("=")
        name, _, role = who.partition(":")
        if not key or not name:
            raise ValueError(f"TENURE_API_KEYS entry {item!r} is not key=principal:role")
        keys[key] = Principal(name, role or "submitter")
    return keys


def principal_of(request: Request, keys: dict[str, Principal]) -> Principal:
    if not keys:
        return ANONYMOUS
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or token not in keys:
        raise ApiProblem("unauthenticated", "send Authorization: Bearer <api key> with a known key")
    return keys[token]
