"""The recovery policy D (REC-1..REC-5): what to do about one failed step, and why.

`decide_recovery` is a pure function of the failure context, the measured repair success rate and
the policy. It walks the gates of the seed in order and stops at the first one that decides:

1. Gate 1, taxonomy (REC-2): transient errors retry (with full-jitter backoff) until the retry
   allowance is spent; fatal errors stop forward progress at once. A deferral by the gateway's
   tool protection (`circuit-open`, ERR_CIRCUIT_OPEN; `bulkhead-full`, ERR_BULKHEAD_FULL) is
   transient too, but nothing was sent, so it is always retried, after at least the cooldown
   remaining: it never spends the retry allowance or K_repair (the counters do not move, see
   evolve) and never leads to a rollback or an escalation by itself (BRK-2, BRK-4).
2. Anti-spin (REC-5): a repeated error signature in this step's history, or K_repair consecutive
   repairs already spent, means the model is circling; stop repairing.
3. Gate 2, budget (REC-3): no repair unless the remaining tokens, money and steps cover one repair
   plus a reserve (a repair that truncates its own context is worse than a rollback).
4. Gate 3, economics (REC-4): repair when Cost(repair) + (1 - p) * (U + R) < U + R in every cost
   dimension (time, money) that is not zero; otherwise roll back.

The pivot boundary (SAGA-6) overrides the result: after the pivot there is nothing to roll back
to, so a would-be rollback becomes OPERATOR_ESCALATE and a semantic error that passed gates 1-2 is
repaired without the economics comparison (gate PIVOT).

Every decision carries the inputs that produced it, as strings, so an operator can read why.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from services.common.backoff import full_jitter_ms as full_jitter_backoff_ms
from services.saga_orchestrator.domain.tools import Cost, ToolSpec

__all__ = [
    "BULKHEAD_FULL_KIND",
    "CIRCUIT_OPEN_KIND",
    "DEFERRAL_KINDS",
    "Budget",
    "ErrorClass",
    "FailureContext",
    "Gate",
    "RecoveryAction",
    "RecoveryDecision",
    "RecoveryPolicy",
    "StepError",
    "break_even",
    "classify",
    "decide_recovery",
    "deferral_message",
    "error_signature",
    "expected_forward_cost",
    "full_jitter_backoff_ms",
    "is_deferral",
    "normalise_error_text",
    "normalise_kind",
    "retry_after_ms",
]


class ErrorClass(StrEnum):
    TRANSIENT = "transient"
    SEMANTIC = "semantic"
    FATAL = "fatal"


class RecoveryAction(StrEnum):
    TRANSIENT_RETRY = "TRANSIENT_RETRY"
    FORWARD_REPAIR = "FORWARD_REPAIR"
    BACKWARD_ROLLBACK = "BACKWARD_ROLLBACK"
    OPERATOR_ESCALATE = "OPERATOR_ESCALATE"


class Gate(StrEnum):
    TAXONOMY = "gate-1-taxonomy"
    ANTI_SPIN = "anti-spin"
    BUDGET = "gate-2-budget"
    ECONOMICS = "gate-3-economics"
    PIVOT = "pivot-boundary"


@dataclass(frozen=True)
class StepError:
    """One failure as the orchestrator saw it.

    `kind` is the problem slug of the tool's answer ("conflict", "timeout", "compile-error"; a
    "/problems/<kind>" type is accepted too) or an exception type name ("ImportError").
    `source` says where it came from (the tool, the gateway, a test file...).
    """

    kind: str
    source: str
    message: str
    status: int | None = None


# --- Gate 1: taxonomy ----------------------------------------------------------------------------

# The gateway's tool protection refused the call before anything was recorded or sent: the
# tool's circuit breaker is open (BRK-2) or its bulkhead is full (BRK-4). Transient, and a
# deferral: see `is_deferral`.
CIRCUIT_OPEN_KIND = "circuit-open"
BULKHEAD_FULL_KIND = "bulkhead-full"
DEFERRAL_KINDS = frozenset({CIRCUIT_OPEN_KIND, BULKHEAD_FULL_KIND})

_TRANSIENT_KINDS = frozenset(
    {
        *DEFERRAL_KINDS,
        "timeout",
        "rate-limited",
        "unavailable",
        "lock-contention",
        "outcome-unknown",
        # exception names of the same failures
        "timeouterror",
        "connectionerror",
        "connectionreseterror",
        "connectionrefusederror",
        "connectionabortederror",
        "brokenpipeerror",
        "readtimeout",
        "connecttimeout",
        "writetimeout",
        "pooltimeout",
        "connecterror",
    }
)

# Deterministic errors whose trace tells the model what to fix: repair candidates. The Python names
# are the ones a failing build or test run reports (the seed's spin trace: ImportError,
# AttributeError, TypeError).
_SEMANTIC_KINDS = frozenset(
    {
        "schema-invalid",
        "missing-parameter",
        "compile-error",
        "not-found",
        "invalid-parameter",
        "validation-error",
        "importerror",
        "modulenotfounderror",
        "attributeerror",
        "typeerror",
        "valueerror",
        "keyerror",
        "indexerror",
        "nameerror",
        "syntaxerror",
        "indentationerror",
        "filenotfounderror",
        "assertionerror",
        "jsondecodeerror",
        "unicodedecodeerror",
        "zerodivisionerror",
    }
)

# Invariant violations no repair can fix. "conflict" is an ownership conflict (the seed's DNS 409),
# not a lost race: races surface as lock-contention. stale-epoch / fenced-by-recipient mean this
# run no longer holds its lease, so nothing it does may continue.
_FATAL_KINDS = frozenset(
    {
        "auth-revoked",
        "exhausted",
        "corrupted",
        "sandbox-breach",
        "conflict",
        "stale-epoch",
        "fenced-by-recipient",
        "permissionerror",
        "memoryerror",
    }
)

_TRANSIENT_STATUSES = frozenset({408, 423, 429, 503, 504})
_SEMANTIC_STATUSES = frozenset({400, 404, 422})


def normalise_kind(kind: str) -> str:
    """The comparable form of a kind.

    "/problems/Rate-Limited" -> "rate-limited", "httpx.ReadTimeout" -> "readtimeout"."""
    slug = kind.strip().rsplit("/", 1)[-1]
    return slug.rsplit(".", 1)[-1].lower()


# How the executor passes a deferral's wait on: RecordStepOutcome has no field for it, so the
# error message starts with it ("retry after 1234 ms: <the gateway's detail>"). The message is
# recorded in StepFailed, so re-deciding from the log reads the same wait.
_RETRY_AFTER = re.compile(r"^retry after (\d{1,10}) ms: ")
_MAX_RETRY_AFTER_MS = 24 * 3600 * 1000


def is_deferral(kind: str) -> bool:
    """Refused by the gateway's tool protection (circuit open, bulkhead full): nothing was sent."""
    return normalise_kind(kind) in DEFERRAL_KINDS


def deferral_message(detail: str, retry_after: int) -> str:
    """The error message of a deferral: its wait in ms first, then the gateway's detail."""
    return f"retry after {min(max(0, int(retry_after)), _MAX_RETRY_AFTER_MS)} ms: {detail}"


def retry_after_ms(message: str) -> int:
    """The wait a deferral's error message asks for (0 when it names none)."""
    found = _RETRY_AFTER.match(message)
    return min(int(found.group(1)), _MAX_RETRY_AFTER_MS) if found else 0


def classify(error: StepError) -> ErrorClass:
    """REC-2: by the error's kind; an unknown kind falls back on its HTTP status, then on FATAL
    (an error nobody has described is not one a repair can be trusted with)."""
    kind = normalise_kind(error.kind)
    if kind in _TRANSIENT_KINDS:
        return ErrorClass.TRANSIENT
    if kind in _SEMANTIC_KINDS:
        return ErrorClass.SEMANTIC
    if kind in _FATAL_KINDS:
        return ErrorClass.FATAL
    if error.status in _TRANSIENT_STATUSES:
        return ErrorClass.TRANSIENT
    if error.status in _SEMANTIC_STATUSES:
        return ErrorClass.SEMANTIC
    return ErrorClass.FATAL


# --- REC-5: error signatures ---------------------------------------------------------------------

# Order matters: timestamps and uuids contain numbers and hex runs the later patterns would split.
_VOLATILE = (
    (
        re.compile(r"\d{4}-\d{2}-\d{2}(?:[t ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:z|[+-]\d{2}:?\d{2})?)?"),
        "<ts>",
    ),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
    (re.compile(r"\b0x[0-9a-f]+\b"), "<hex>"),
    (re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b"), "<hex>"),
    (re.compile(r"\b\d+(?:\.\d+)?\b"), "<n>"),
)
_WHITESPACE = re.compile(r"\s+")


def normalise_error_text(text: str) -> str:
    """Lowercase, volatile parts (timestamps, uuids, hex ids, numbers) replaced, whitespace collapsed,
    so the same failure seen twice reads the same."""
    result = text.lower()
    for pattern, placeholder in _VOLATILE:
        result = pattern.sub(placeholder, result)
    return _WHITESPACE.sub(" ", result).strip()


def error_signature(error: StepError) -> str:
    """REC-5: SHA-256 (hex) of the normalised (type, source, signature) of an error."""
    parts = [
        normalise_kind(error.kind),
        normalise_error_text(error.source),
        normalise_error_text(error.message),
    ]
    return hashlib.sha256(json.dumps(parts).encode("utf-8")).hexdigest()


# --- the policy ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """What the run has left: model tokens, trajectory steps, money."""

    tokens: int
    steps: int
    money: float


@dataclass(frozen=True)
class RecoveryPolicy:
    """The knobs of D. Repair defaults are the seed's worked example: one repair call reads 2,390
    tokens and writes 180, takes 4.1 s and costs $0.010."""

    k_repair: int = 3
    max_transient_retries: int = 3
    repair_tokens: int = 2390 + 180
    repair_cost: Cost = field(default_factory=lambda: Cost(4100, 0.010))
    token_reserve: int = 4096
    money_reserve: float = 0.01
    min_samples: int = 10
    prior_success: float = 0.5
    backoff_base_ms: int = 200
    backoff_cap_ms: int = 20_000

    def __post_init__(self) -> None:
        if not 0 <= self.k_repair <= 3:
            raise ValueError(f"k_repair must be between 0 and 3 (REC-5: K_repair <= 3), got {self.k_repair}")
        for name in (
            "max_transient_retries",
            "repair_tokens",
            "token_reserve",
            "min_samples",
            "backoff_base_ms",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.repair_cost.duration_ms < 0 or not 0 <= self.repair_cost.money < math.inf:
            raise ValueError(f"repair_cost must be non-negative and finite, got {self.repair_cost}")
        if not 0 <= self.money_reserve < math.inf:
            raise ValueError(f"money_reserve must be non-negative and finite, got {self.money_reserve}")
        if not 0.0 <= self.prior_success <= 1.0:
            raise ValueError(f"prior_success is a probability, got {self.prior_success}")
        if self.backoff_cap_ms < self.backoff_base_ms:
            raise ValueError(
                f"backoff_cap_ms ({self.backoff_cap_ms}) must be at least "
                f"backoff_base_ms ({self.backoff_base_ms})"
            )


@dataclass(frozen=True)
class FailureContext:
    """Omega_t of the seed: the failed step, its error, the budget and the step's history.

    `earlier_signatures` is the FIFO of this step's earlier error signatures (not including this
    error); `compensation_cost` is U, the sum of the compensators on the stack; `rerun_cost` is R,
    what re-running the rolled-back work would cost.
    """

    step_index: int
    tool: ToolSpec
    error: StepError
    after_pivot: bool
    budget: Budget
    consecutive_repairs: int = 0
    transient_retries: int = 0
    earlier_signatures: tuple[str, ...] = ()
    compensation_cost: Cost = field(default_factory=Cost)
    rerun_cost: Cost = field(default_factory=Cost)

    def __post_init__(self) -> None:
        object.__setattr__(self, "earlier_signatures", tuple(self.earlier_signatures))
        if self.consecutive_repairs < 0 or self.transient_retries < 0:
            raise ValueError("repair and retry counters cannot be negative")


@dataclass(frozen=True)
class RecoveryDecision:
    """REC-1: the action, the gate that decided it, a readable reason and every deciding input."""

    action: RecoveryAction
    gate: Gate
    reason: str
    error_class: ErrorClass
    signature: str
    inputs: Mapping[str, str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", MappingProxyType(dict(self.inputs)))

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action.value,
            "gate": self.gate.value,
            "reason": self.reason,
            "errorClass": self.error_class.value,
            "signature": self.signature,
            "inputs": dict(self.inputs),
        }


def break_even(repair: Cost, U: Cost, R: Cost) -> tuple[float | None, float | None]:
    """REC-4: p* = c_r / (U + R), by time and by money; None where U + R is zero in that dimension."""
    total = U + R
    by_time = repair.duration_ms / total.duration_ms if total.duration_ms > 0 else None
    by_money = repair.money / total.money if total.money > 0 else None
    return by_time, by_money


def _expected_forward(repair: Cost, p: float, total: Cost) -> tuple[float, float]:
    return repair.duration_ms + (1.0 - p) * total.duration_ms, repair.money + (1.0 - p) * total.money


def expected_forward_cost(repair: Cost, p: float, U: Cost, R: Cost) -> Cost:
    """E[Cost(Forward)] = Cost(repair) + (1 - p) * (U + R); the duration is rounded to whole ms."""
    duration, money = _expected_forward(repair, p, U + R)
    return Cost(round(duration), money)


# --- D -------------------------------------------------------------------------------------------


def _fmt_money(money: float) -> str:
    return format(money, ".6g")


def _fmt_cost(cost: Cost) -> str:
    return f"{cost.duration_ms}ms ${_fmt_money(cost.money)}"


def _fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else format(value, ".6g")


def _inputs(
    ctx: FailureContext,
    error_class: ErrorClass,
    signature: str,
    p: float,
    p_source: str,
    policy: RecoveryPolicy,
) -> dict[str, str]:
    U, R = ctx.compensation_cost, ctx.rerun_cost
    p_time, p_money = break_even(policy.repair_cost, U, R)
    forward_time, forward_money = _expected_forward(policy.repair_cost, p, U + R)
    return {
        "stepIndex": str(ctx.step_index),
        "tool": ctx.tool.name,
        "reversibility": ctx.tool.reversibility.value,
        "afterPivot": str(ctx.after_pivot).lower(),
        "errorKind": ctx.error.kind,
        "errorSource": ctx.error.source,
        "errorStatus": "none" if ctx.error.status is None else str(ctx.error.status),
        "errorClass": error_class.value,
        "signature": signature,
        "signatureRepeated": str(signature in ctx.earlier_signatures).lower(),
        "earlierSignatures": str(len(ctx.earlier_signatures)),
        "transientRetries": str(ctx.transient_retries),
        "maxTransientRetries": str(policy.max_transient_retries),
        "consecutiveRepairs": str(ctx.consecutive_repairs),
        "kRepair": str(policy.k_repair),
        "budgetTokens": str(ctx.budget.tokens),
        "budgetSteps": str(ctx.budget.steps),
        "budgetMoney": _fmt_money(ctx.budget.money),
        "repairTokens": str(policy.repair_tokens),
        "tokenReserve": str(policy.token_reserve),
        "repairCost": _fmt_cost(policy.repair_cost),
        "moneyReserve": _fmt_money(policy.money_reserve),
        "U": _fmt_cost(U),
        "R": _fmt_cost(R),
        "rollbackCost": _fmt_cost(U + R),
        "p": format(p, ".6g"),
        "pSource": p_source,
        "pStarTime": _fmt_ratio(p_time),
        "pStarMoney": _fmt_ratio(p_money),
        "expectedForward": f"{format(forward_time, '.6g')}ms ${_fmt_money(forward_money)}",
    }


def decide_recovery(
    ctx: FailureContext, p_success: float, p_source: str, policy: RecoveryPolicy
) -> RecoveryDecision:
    """D(state, failed step, error, budget, history) (REC-1). `p_success` is P(success | error kind)
    of one repair, measured or the prior (`p_source` says which, e.g. "measured n=14")."""
    if not 0.0 <= p_success <= 1.0:
        raise ValueError(f"p_success is a probability, got {p_success}")
    error_class = classify(ctx.error)
    signature = error_signature(ctx.error)
    inputs = _inputs(ctx, error_class, signature, p_success, p_source, policy)
    kind = ctx.error.kind

    def decided(action: RecoveryAction, gate: Gate, reason: str) -> RecoveryDecision:
        return RecoveryDecision(action, gate, reason, error_class, signature, inputs)

    def stop(gate: Gate, why: str) -> RecoveryDecision:
        # The pivot boundary (SAGA-6): after the pivot the compensation stack is retired.
        if ctx.after_pivot:
            return decided(
                RecoveryAction.OPERATOR_ESCALATE,
                gate,
                f"{why}; after the pivot there is no rollback: escalate",
            )
        return decided(RecoveryAction.BACKWARD_ROLLBACK, gate, f"{why}: roll back")

    # Gate 1 (REC-2)
    if error_class is ErrorClass.TRANSIENT and is_deferral(kind):
        wait = retry_after_ms(ctx.error.message)
        return RecoveryDecision(
            RecoveryAction.TRANSIENT_RETRY,
            Gate.TAXONOMY,
            f"deferred by the gateway's tool protection ({kind!r}): nothing was sent, so retry after "
            f"at least {wait} ms (the cooldown remaining) plus full jitter; not counted against the "
            f"retry allowance or K_repair, and never a rollback by itself",
            error_class,
            signature,
            {**inputs, "deferral": "true", "retryAfterMs": str(wait)},
        )
    if error_class is ErrorClass.TRANSIENT:
        if ctx.transient_retries < policy.max_transient_retries:
            return decided(
                RecoveryAction.TRANSIENT_RETRY,
                Gate.TAXONOMY,
                f"transient error {kind!r}: retry {ctx.transient_retries + 1} of "
                f"{policy.max_transient_retries} with full-jitter backoff",
            )
        return stop(
            Gate.TAXONOMY,
            f"transient error {kind!r} persisted through {ctx.transient_retries} retries (allowance "
            f"{policy.max_transient_retries})",
        )
    if error_class is ErrorClass.FATAL:
        return stop(Gate.TAXONOMY, f"fatal error {kind!r}: no repair can fix an invariant violation")

    # Anti-spin (REC-5)
    if signature in ctx.earlier_signatures:
        position = ctx.earlier_signatures.index(signature) + 1
        return stop(
            Gate.ANTI_SPIN,
            f"error signature {signature[:12]} repeats error {position} of this step's repair history "
            "(a repair cycle)",
        )
    if ctx.consecutive_repairs >= policy.k_repair:
        return stop(
            Gate.ANTI_SPIN,
            f"{ctx.consecutive_repairs} consecutive repairs of this step reach K_repair={policy.k_repair}",
        )

    # Gate 2 (REC-3)
    shortfalls = []
    if ctx.budget.tokens < policy.repair_tokens + policy.token_reserve:
        shortfalls.append(
            f"tokens {ctx.budget.tokens} < repair {policy.repair_tokens} + reserve {policy.token_reserve}"
        )
    if ctx.budget.money < policy.repair_cost.money + policy.money_reserve:
        shortfalls.append(
            f"money {_fmt_money(ctx.budget.money)} < repair {_fmt_money(policy.repair_cost.money)} + reserve "
            f"{_fmt_money(policy.money_reserve)}"
        )
    if ctx.budget.steps < 1:
        shortfalls.append(f"steps {ctx.budget.steps} < 1")
    if shortfalls:
        return stop(Gate.BUDGET, "budget cannot cover a repair: " + "; ".join(shortfalls))

    if ctx.after_pivot:
        return decided(
            RecoveryAction.FORWARD_REPAIR,
            Gate.PIVOT,
            f"semantic error {kind!r} after the pivot: forward repair (nothing to roll back to, so no "
            "economics comparison)",
        )

    # Gate 3 (REC-4)
    total = ctx.compensation_cost + ctx.rerun_cost
    if total.is_zero:
        return decided(
            RecoveryAction.BACKWARD_ROLLBACK,
            Gate.ECONOMICS,
            "U + R is zero: rolling back loses nothing, so a repair cannot pay off",
        )
    forward_time, forward_money = _expected_forward(policy.repair_cost, p_success, total)
    verdicts = []
    if total.duration_ms > 0:
        verdicts.append(
            (
                "time",
                forward_time < total.duration_ms,
                f"{format(forward_time, '.6g')}ms vs {total.duration_ms}ms",
            )
        )
    if total.money > 0:
        verdicts.append(
            (
                "money",
                forward_money < total.money,
                f"${_fmt_money(forward_money)} vs ${_fmt_money(total.money)}",
            )
        )
    comparison = "; ".join(f"{dimension}: {detail}" for dimension, _, detail in verdicts)
    if all(cheaper for _, cheaper, _ in verdicts):
        return decided(
            RecoveryAction.FORWARD_REPAIR,
            Gate.ECONOMICS,
            f"expected forward cost beats U + R at p={format(p_success, '.3g')} ({p_source}): {comparison}",
        )
    losing = ", ".join(dimension for dimension, cheaper, _ in verdicts if not cheaper)
    return decided(
        RecoveryAction.BACKWARD_ROLLBACK,
        Gate.ECONOMICS,
        f"a repair at p={format(p_success, '.3g')} ({p_source}) does not beat U + R by {losing}: "
        f"{comparison}; roll back",
    )
