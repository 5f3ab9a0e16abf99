"""The state of one tool endpoint's breaker: the fold of its events (services/breakers/domain/evolve.py)."""

from __future__ import annotations

from dataclasses import dataclass

from services.breakers.domain.lifecycle import BreakerStatus

__all__ = ["MAX_INSTANCES", "MAX_RECENT", "BreakerState", "Canary", "Verdict", "verdict"]

# The instances whose last outcome seq is kept, most recent last: a gateway fleet is small, and an
# instance that has not reported for this many others' reports is forgotten (its next outcome is
# taken whatever its seq).
MAX_INSTANCES = 64
# Ids of the accepted commands other than outcomes (canary requests and reports, operators), so a
# redelivery of one is answered with nothing (the runtime remembers refused ids itself).
MAX_RECENT = 32


@dataclass(frozen=True)
class Canary:
    """The one canary slot of a half-open breaker, held like a lease until `expires_at`."""

    canary_id: str
    instance_id: str
    request_id: str
    granted_at: int
    expires_at: int


@dataclass(frozen=True)
class BreakerState:
    """`window`: the last W counted outcomes, oldest first, True = failure (Closed only; frozen
    as evidence while open). `cooldown_ms`: the T in force since the breaker last opened (0 while
    closed: the next opening uses the policy's base). `open_since`: when this episode of not
    being closed began (re-openings keep it). `instances`: (instance id, last outcome seq)."""

    endpoint: str
    version: int
    status: BreakerStatus
    window: tuple[bool, ...] = ()
    cooldown_ms: int = 0
    open_since: int = 0
    opened_at: int = 0
    half_open_at: int = 0
    canary: Canary | None = None
    instances: tuple[tuple[str, int], ...] = ()
    recent: tuple[str, ...] = ()
    times_opened: int = 0
    reason: str = ""
    updated_at: int = 0

    @property
    def run_id(self) -> str:
        """The aggregate id under the runtime's conventional name."""
        return self.endpoint

    def last_seq(self, instance_id: str) -> int:
        return next((seq for known, seq in self.instances if known == instance_id), -1)

    @property
    def failures(self) -> int:
        return sum(self.window)

    @property
    def error_rate(self) -> float:
        return self.failures / len(self.window) if self.window else 0.0


@dataclass(frozen=True)
class Verdict:
    """What a caller of the endpoint does now (BRK-2). `open`: fail fast with ERR_CIRCUIT_OPEN
    (unless this caller holds the canary). `cooldown_remaining_ms`: when it is worth asking
    again: the cooldown left (Open), the canary's lease left (Half-open, slot held), or a fixed
    retry hint (Forced open). `canary_free`: a canary may be requested now."""

    endpoint: str
    status: str
    open: bool
    cooldown_remaining_ms: int
    canary_free: bool
    canary_holder: str = ""


def verdict(state: BreakerState | None, now_ms: int, forced_open_retry_ms: int) -> Verdict:
    """The breaker's answer to a call at `now_ms` (pure; the reader brings its own clock)."""
    if state is None:
        return Verdict("", BreakerStatus.CLOSED.value, False, 0, False)
    status = state.status
    if status is BreakerStatus.OPEN:
        left = max(0, state.half_open_at - now_ms)
        return Verdict(state.endpoint, status.value, True, left, left == 0)
    if status is BreakerStatus.HALF_OPEN:
        canary = state.canary
        if canary is not None and now_ms < canary.expires_at:
            return Verdict(
                state.endpoint, status.value, True, canary.expires_at - now_ms, False, canary.instance_id
            )
        return Verdict(state.endpoint, status.value, True, 0, True)
    if status is BreakerStatus.FORCED_OPEN:
        return Verdict(state.endpoint, status.value, True, forced_open_retry_ms, False)
    return Verdict(state.endpoint, status.value, False, 0, False)
