"""Idempotency-Key semantics (Stripe's): a key names one request, and only that request.

The canonical request is everything that decides what the command does: the calling principal,
the path's ids and every body field after defaults are applied. Its fingerprint is part of the
command id (`<command_id_for(run, type, key)>.<fingerprint>`), and every event records the id of
the command that caused it (`causationId` in the Run view's history, `commandId` in the
trajectory view), so a repeat is recognised exactly from the views, even after the API restarts:

* the same key and the same canonical request is the same command: the first answer again;
* the same key and a different request is 409 `idempotency-key-conflict`, with `fields` naming
  what differs (compared with the values the first request left in the view; a field the view
  does not record is named as a candidate when nothing recorded differs).

Without a key every request is a new command.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from services.command_api.problems import ApiProblem
from services.common.ids import canonical_json, command_id_for, sha256_digest

__all__ = ["PRINCIPAL_FIELD", "KeyedRequest", "conflict_problem", "differing_fields"]

# The pseudo-field of the canonical request that names the caller.
PRINCIPAL_FIELD = "principal"
_FINGERPRINT_HEX = 16


@dataclass(frozen=True)
class KeyedRequest:
    """One request's command id and canonical fields, and how to recognise its repeats."""

    run_id: str
    key: str | None
    base: str
    fields: Mapping[str, Any]
    command_id: str

    @classmethod
    def of(
        cls, run_id: str, command_type: str, key: str | None, principal: str, fields: Mapping[str, Any]
    ) -> KeyedRequest:
        canonical = {PRINCIPAL_FIELD: principal, **fields}
        if not key:
            fresh = command_id_for(run_id, command_type, uuid.uuid4().hex)
            return cls(run_id, None, fresh, canonical, fresh)
        base = command_id_for(run_id, command_type, key)
        fingerprint = sha256_digest(_text(canonical)).removeprefix("sha256:")[:_FINGERPRINT_HEX]
        return cls(run_id, key, base, canonical, f"{base}.{fingerprint}")

    def under_key(self, command_id: str | None) -> bool:
        """Did `command_id` come from a request under this key (this one or another)?"""
        if self.key is None or not command_id:
            return False
        # A bare base is a command sent before fingerprints were part of the id.
        return command_id == self.base or command_id.startswith(self.base + ".")

    def is_this(self, command_id: str) -> bool:
        return command_id == self.command_id

    def find(self, entries: Iterable[Mapping[str, Any]], id_field: str) -> Mapping[str, Any] | None:
        """The first entry caused by a request under this key."""
        return next((e for e in entries if self.under_key(e.get(id_field))), None)

    def check(self, recorded_id: str, recorded: Mapping[str, Any], what: str) -> None:
        """Raise the conflict when the request under this key that caused `recorded_id` differs.

        `recorded` holds the first request's fields as the view shows them; a field the view does
        not record is simply absent."""
        if self.is_this(recorded_id):
            return
        fields = differing_fields(self.fields, recorded)
        legacy = recorded_id == self.base
        if not fields and legacy:
            return  # no fingerprint to compare and nothing recorded differs: the same request
        raise conflict_problem(
            f"Idempotency-Key {self.key!r}",
            self.run_id,
            what,
            fields or [f for f in self.fields if f not in recorded],
            candidates=not fields,
            idempotencyKey=self.key,
        )


def differing_fields(request: Mapping[str, Any], recorded: Mapping[str, Any]) -> list[str]:
    """The request's fields whose recorded first value differs (unrecorded fields are skipped)."""
    return [
        name for name, value in request.items() if name in recorded and _text(recorded[name]) != _text(value)
    ]


def _text(value: Any) -> str:
    """Canonical JSON in which 5 and 5.0 are the same number (a view may hold either)."""
    return canonical_json(_numbers(value))


def _numbers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_numbers(v) for v in value]
    return value


def conflict_problem(
    subject: str, run_id: str, what: str, fields: list[str], *, candidates: bool = False, **extensions: Any
) -> ApiProblem:
    """409 idempotency-key-conflict: `subject` (e.g. "Idempotency-Key 'k'") named another request."""
    named = ", ".join(fields) if fields else "the request"
    if candidates:
        detail = (
            f"{subject} was first used for {what} with a different request; it differs in one "
            f"of: {named} (the views do not record their first values)"
        )
    else:
        detail = f"{subject} was first used for {what} with a different {named}"
    return ApiProblem(
        "idempotency-key-conflict",
        f"{detail}. It names one request: send the original request again for its answer, or "
        "use a new key for a new request; nothing was recorded.",
        fields=fields,
        runId=run_id,
        **extensions,
    )
