"""Who is calling: API keys mapped to principals and roles, for every Tenure process.

`TENURE_API_KEYS="key=principal:role,..."`. Callers send `Authorization: Bearer <key>`. Roles:

* `submitter`: submits runs and acts on the leases it claimed (the default role);
* `runner`: a runner host's identity; like a submitter, it acts on the leases it claimed;
* `operator`: takeovers, the block policy, incident resolution;
* `service`: Tenure's own processes (the saga orchestrator acting for a trajectory); the key a
  process presents is `TENURE_SERVICE_KEY`.

With no keys configured a process runs in development mode: every caller is `anonymous` with the
`submitter` role. That is unsafe anywhere but a laptop, so every process says so loudly at
start-up (`warn_if_development_mode`) and in its `/healthz`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "ANONYMOUS",
    "DEVELOPMENT_MODE_WARNING",
    "AuthError",
    "Principal",
    "Role",
    "authenticate",
    "bearer",
    "parse_api_keys",
    "require_role",
    "warn_if_development_mode",
]


class Role(StrEnum):
    SUBMITTER = "submitter"
    RUNNER = "runner"
    OPERATOR = "operator"
    SERVICE = "service"
    VERIFIER = "verifier"


@dataclass(frozen=True)
class Principal:
    name: str
    role: str

    @property
    def is_service(self) -> bool:
        return self.role == Role.SERVICE


ANONYMOUS = Principal("anonymous", Role.SUBMITTER)

DEVELOPMENT_MODE_WARNING = (
    "DEVELOPMENT MODE: TENURE_API_KEYS is empty, so every caller is 'anonymous' and nothing is "
    "authenticated. Never expose this process beyond localhost; set TENURE_API_KEYS."
)


class AuthError(Exception):
    """`slug` is the problem type: unauthenticated (401) or forbidden (403)."""

    def __init__(self, slug: str, detail: str) -> None:
        super().__init__(detail)
        self.slug = slug
        self.detail = detail


def parse_api_keys(spec: str) -> dict[str, Principal]:
    keys: dict[str, Principal] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, _, who = item.partition("=")
        name, _, role = who.partition(":")
        if not key or not name:
            raise ValueError(f"TENURE_API_KEYS entry {item!r} is not key=principal:role")
        role = role or Role.SUBMITTER
        if role not in {r.value for r in Role}:
            raise ValueError(f"TENURE_API_KEYS entry {item!r}: unknown role {role!r}")
        keys[key] = Principal(name, role)
    return keys


def authenticate(authorization: str | None, keys: dict[str, Principal]) -> Principal:
    """The caller of a request with this Authorization header; development mode: anonymous."""
    if not keys:
        return ANONYMOUS
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or token.strip() not in keys:
        raise AuthError("unauthenticated", "send Authorization: Bearer <api key> with a known key")
    return keys[token.strip()]


def require_role(principal: Principal, action: str, *roles: str) -> None:
    if principal.role not in roles:
        raise AuthError(
            "forbidden",
            f"{principal.name} has role {principal.role!r}; {action} needs the {' or '.join(roles)} role",
        )


def bearer(key: str | None) -> dict[str, str]:
    """The header a client sends for `key` (nothing in development mode)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def warn_if_development_mode(keys: dict[str, Principal], service: str) -> bool:
    """Log the development-mode warning once at start-up; True when in development mode."""
    if keys:
        return False
    logging.getLogger("tenure.auth").warning(
        DEVELOPMENT_MODE_WARNING, extra={"fields": {"service": service, "developmentMode": True}}
    )
    return True
