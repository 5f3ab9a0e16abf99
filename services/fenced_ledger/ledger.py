"""Pure core of the fenced ledger: what one effect request does, decided without any I/O.

The ledger is Tenure's reference *recipient* of external effects (SPEC LEASE-3, EXE-6, REC-6):
fencing only protects anything when the system that receives an effect checks the epoch, so
the check lives here, in a system that is not Tenure. The rules, in the order they apply:

1. Idempotency first. A key that already names a stored effect answers with that effect's
   stored result when the request is the same (work id, operation, payload), so a retry never
   applies twice, whatever epoch the retry carries (the effect happened; REC-6). A different
   request under a known key is a conflict.
2. Fencing. An epoch below the highest one this work id has presented is refused and changes
   nothing: that caller lost its authority (LEASE-3).
3. Apply. The epoch becomes the work id's new bar (if higher), then the operation runs. A debit
   that would take an account below zero is refused, but the bar is still raised: the request
   proved the newer holder exists, and the previous holder must be fenced out from then on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "INT64_MAX",
    "MAX_AMOUNT",
    "MAX_ID_LENGTH",
    "OPERATIONS",
    "Apply",
    "BalanceOverflow",
    "Decision",
    "EffectRequest",
    "InsufficientFunds",
    "InvalidEffectRequest",
    "KeyConflict",
    "LedgerError",
    "Replay",
    "StaleEpoch",
    "StoredEffect",
    "build_effect_request",
    "canonical_json",
    "decide",
    "parse_effect_body",
    "parse_fencing_epoch",
    "parse_idempotency_key",
    "parse_work_id",
    "record_effect",
]

# SQLite stores integers as signed 64-bit; anything larger would be silently turned into a REAL.
INT64_MAX = 2**63 - 1
MAX_AMOUNT = 10**12
MAX_ID_LENGTH = 255
OPERATIONS = ("credit", "debit", "note")
BALANCE_OPERATIONS = ("credit", "debit")

# Only plain decimal digits: int() would also accept "+5", " 5" and "5_0", which no sender means.
_EPOCH_PATTERN = re.compile(r"[0-9]{1,19}")


class LedgerError(Exception):
    """Base class of the ledger's own errors."""


class InvalidEffectRequest(LedgerError):
    """The request cannot be understood; ``problem`` names the specific problem type."""

    def __init__(self, problem: str, detail: str) -> None:
        super().__init__(detail)
        self.problem = problem
        self.detail = detail


def canonical_json(value: Any) -> str:
    """One spelling per JSON value, so "the same payload" is a string comparison.

    ASCII escapes keep lone surrogates (valid in JSON text, not in UTF-8) storable."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidEffectRequest("invalid-effect", f"payload is not plain JSON: {exc}") from exc


def _parse_identifier(value: str | None, *, header: str, problem: str) -> str:
    if value is None or not value.strip():
        raise InvalidEffectRequest(problem, f"the {header} header is required")
    if value != value.strip():
        raise InvalidEffectRequest(problem, f"the {header} header must not start or end with spaces")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidEffectRequest(problem, f"the {header} header is longer than {MAX_ID_LENGTH} characters")
    return value


def parse_idempotency_key(value: str | None) -> str:
    return _parse_identifier(value, header="Idempotency-Key", problem="idempotency-key-required")


def parse_work_id(value: str | None) -> str:
    return _parse_identifier(value, header="X-Work-Id", problem="work-id-required")


def parse_fencing_epoch(value: str | None) -> int:
    if value is None or value == "":
        raise InvalidEffectRequest("fencing-epoch-required", "the X-Fencing-Epoch header is required")
    if not _EPOCH_PATTERN.fullmatch(value) or int(value) > INT64_MAX:
        raise InvalidEffectRequest(
            "fencing-epoch-invalid",
            f"X-Fencing-Epoch must be a non-negative decimal integer below 2^63, got {value!r}",
        )
    return int(value)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_effect_body(body: Any) -> tuple[str, dict[str, Any]]:
    """Validate ``{"operation": ..., "payload": {...}}`` and return (operation, payload)."""
    if not isinstance(body, dict):
        raise InvalidEffectRequest(
            "invalid-effect", "the body must be a JSON object with operation and payload"
        )
    unknown = sorted(set(body) - {"operation", "payload"})
    if unknown:
        raise InvalidEffectRequest("invalid-effect", f"unknown body fields: {', '.join(unknown)}")
    operation = body.get("operation")
    if operation not in OPERATIONS:
        raise InvalidEffectRequest(
            "invalid-effect", f"operation must be one of {', '.join(OPERATIONS)}, got {operation!r}"
        )
    payload = body.get("payload")
    if not isinstance(payload, dict):
        raise InvalidEffectRequest("invalid-effect", "payload must be a JSON object")
    canonical_json(payload)  # rejects NaN/Infinity, which cannot be stored or answered as JSON
    if operation in BALANCE_OPERATIONS:
        extra = sorted(set(payload) - {"account", "amount"})
        if extra:
            raise InvalidEffectRequest(
                "invalid-effect", f"unknown {operation} payload fields: {', '.join(extra)}"
            )
        account = payload.get("account")
        if (
            not isinstance(account, str)
            or not account.strip()
            or len(account) > MAX_ID_LENGTH
            or not _is_utf8(account)
        ):
            raise InvalidEffectRequest(
                "invalid-effect",
                f"payload.account must be a non-empty string of at most {MAX_ID_LENGTH} characters",
            )
        amount = payload.get("amount")
        if not isinstance(amount, int) or isinstance(amount, bool) or not 0 < amount <= MAX_AMOUNT:
            raise InvalidEffectRequest(
                "invalid-effect", f"payload.amount must be an integer from 1 to {MAX_AMOUNT}, got {amount!r}"
            )
    return str(operation), payload


@dataclass(frozen=True)
class EffectRequest:
    """One validated ``POST /effects``; the payload is kept as canonical JSON text."""

    idempotency_key: str
    work_id: str
    epoch: int
    operation: str
    payload_json: str

    @property
    def payload(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.payload_json)
        return loaded

    @property
    def account(self) -> str | None:
        if self.operation not in BALANCE_OPERATIONS:
            return None
        return str(self.payload["account"])

    @property
    def balance_change(self) -> int:
        """Signed change to the account's balance; 0 for a note."""
        if self.operation not in BALANCE_OPERATIONS:
            return 0
        amount = int(self.payload["amount"])
        return amount if self.operation == "credit" else -amount


def build_effect_request(
    idempotency_key: str | None, work_id: str | None, fencing_epoch: str | None, body: Any
) -> EffectRequest:
    """Headers and body of a ``POST /effects``, validated; raises :class:`InvalidEffectRequest`."""
    key = parse_idempotency_key(idempotency_key)
    work = parse_work_id(work_id)
    epoch = parse_fencing_epoch(fencing_epoch)
    operation, payload = parse_effect_body(body)
    return EffectRequest(key, work, epoch, operation, canonical_json(payload))


@dataclass(frozen=True)
class StoredEffect:
    """An applied effect as the ledger keeps it; ``result_json`` is the exact answer given."""

    effect_id: str
    idempotency_key: str
    work_id: str
    epoch: int
    operation: str
    payload_json: str
    result_json: str
    applied_at: str

    @property
    def payload(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.payload_json)
        return loaded

    @property
    def result(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.result_json)
        return loaded

    def to_json(self) -> dict[str, Any]:
        return {
            "effectId": self.effect_id,
            "idempotencyKey": self.idempotency_key,
            "workId": self.work_id,
            "epoch": self.epoch,
            "operation": self.operation,
            "payload": self.payload,
            "result": self.result,
            "appliedAt": self.applied_at,
        }


@dataclass(frozen=True)
class Replay:
    """The key names this very request already applied: answer its stored result again."""

    effect: StoredEffect


@dataclass(frozen=True)
class KeyConflict:
    """The key names a different request; ``differences`` lists the fields that differ."""

    existing: StoredEffect
    differences: tuple[str, ...]


@dataclass(frozen=True)
class StaleEpoch:
    """The caller's epoch is below the bar: it is a previous holder and is fenced out."""

    work_id: str
    presented_epoch: int
    highest_epoch: int


@dataclass(frozen=True)
class InsufficientFunds:
    """A debit below zero. ``raise_epoch_to`` is still recorded (see the module docstring)."""

    account: str
    balance: int
    amount: int
    raise_epoch_to: int | None


@dataclass(frozen=True)
class BalanceOverflow:
    """A credit that would take the balance past what the ledger can store."""

    account: str
    balance: int
    amount: int
    raise_epoch_to: int | None


@dataclass(frozen=True)
class Apply:
    """Apply the effect: record the new bar (None: unchanged) and the account's new balance."""

    raise_epoch_to: int | None
    account: str | None
    new_balance: int | None


Decision = Replay | KeyConflict | StaleEpoch | InsufficientFunds | BalanceOverflow | Apply


def decide(
    request: EffectRequest,
    existing: StoredEffect | None,
    highest_epoch: int | None,
    balance: int = 0,
) -> Decision:
    """What ``request`` does, given the effect stored under its key (if any), the work id's
    highest epoch so far (None: never seen) and the current balance of its account (0 if new)."""
    if existing is not None:
        differences = tuple(
            name
            for name, mine, theirs in (
                ("workId", request.work_id, existing.work_id),
                ("operation", request.operation, existing.operation),
                ("payload", request.payload_json, existing.payload_json),
            )
            if mine != theirs
        )
        return KeyConflict(existing, differences) if differences else Replay(existing)
    if highest_epoch is not None and request.epoch < highest_epoch:
        return StaleEpoch(request.work_id, request.epoch, highest_epoch)
    raise_to = request.epoch if highest_epoch is None or request.epoch > highest_epoch else None
    account = request.account
    if account is None:
        return Apply(raise_to, None, None)
    change = request.balance_change
    new_balance = balance + change
    if new_balance < 0:
        return InsufficientFunds(account, balance, -change, raise_to)
    if new_balance > INT64_MAX:
        return BalanceOverflow(account, balance, change, raise_to)
    return Apply(raise_to, account, new_balance)


def record_effect(request: EffectRequest, decision: Apply, effect_id: str, applied_at: str) -> StoredEffect:
    """The stored form of an applied effect, including the result every replay will answer."""
    result = {
        "effectId": effect_id,
        "idempotencyKey": request.idempotency_key,
        "workId": request.work_id,
        "epoch": request.epoch,
        "operation": request.operation,
        "payload": request.payload,
        "account": decision.account,
        "balance": decision.new_balance,
        "appliedAt": applied_at,
    }
    return StoredEffect(
        effect_id=effect_id,
        idempotency_key=request.idempotency_key,
        work_id=request.work_id,
        epoch=request.epoch,
        operation=request.operation,
        payload_json=request.payload_json,
        result_json=canonical_json(result),
        applied_at=applied_at,
    )
