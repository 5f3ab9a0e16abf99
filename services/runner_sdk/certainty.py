"""What a lease holder may believe about its own lease: a pure state machine (LEASE-4, LEASE-5).

The tracker never reads a clock. Every method takes `now` (milliseconds of the holder's LOCAL
monotonic clock) from the caller, so the same inputs always give the same answers and tests can
replay any timeline.

Why the bound is safe whatever the clock offset between holder and coordinator: a renewal sent
at local time `sent_at` reaches the coordinator at or after `sent_at`. The answer carries the
new expiry and the coordinator's now (`serverTime`, read after the request arrived), both on
the SERVER clock, so their difference is a duration the offset cancels out of. The lease
therefore lives at least until local `sent_at + min(lease_ms, expiresAt - serverTime)`. That
bound never overestimates the true expiry (the property test in tests/unit proves it over
random delays and offsets); clock-rate drift over one lease is what the safety margin absorbs.

States:
  VALID     the bound is more than the safety margin away and no renewal outcome is unknown;
            the only state in which external effects may be produced.
  JEOPARDY  the holder cannot tell (a renewal's outcome is unknown, no renewal confirmed yet, or
            the bound is within the safety margin). Quiescence: checkpoint and wait, no effects.
  LOST      the bound passed, or the coordinator/a recipient refused the epoch. Terminal.
  RELEASED  the terminal report was accepted. Terminal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from .errors import InvalidCertaintyTransition

__all__ = [
    "TERMINAL_CERTAINTIES",
    "TRANSITIONS",
    "Certainty",
    "CertaintyTracker",
    "JournalEntry",
    "JournalKind",
    "check_transition",
    "is_allowed",
]


class Certainty(StrEnum):
    VALID = "valid"
    JEOPARDY = "jeopardy"
    LOST = "lost"
    RELEASED = "released"


# Written out edge by edge so a missing or extra edge is a visible diff, not a computed accident.
TRANSITIONS: Mapping[Certainty, frozenset[Certainty]] = {
    Certainty.VALID: frozenset({Certainty.JEOPARDY, Certainty.LOST, Certainty.RELEASED}),
    Certainty.JEOPARDY: frozenset({Certainty.VALID, Certainty.LOST, Certainty.RELEASED}),
    Certainty.LOST: frozenset(),
    Certainty.RELEASED: frozenset(),
}

TERMINAL_CERTAINTIES = frozenset({Certainty.LOST, Certainty.RELEASED})


def is_allowed(source: Certainty, target: Certainty) -> bool:
    return target in TRANSITIONS[source]


def check_transition(source: Certainty, target: Certainty) -> None:
    if not is_allowed(source, target):
        raise InvalidCertaintyTransition(source.value, target.value)


class JournalKind(StrEnum):
    """What a journal entry records; the journal is the holder's evidence (LEASE-2, LEASE-4)."""

    TRANSITION = "transition"
    IGNORED = "ignored"  # an answer that arrived after the lease was already LOST or RELEASED
    CHECKPOINT = "checkpoint"
    EFFECT_REFUSED = "effect-refused"  # refused locally, nothing was sent
    EFFECT_ATTEMPTED = "effect-attempted"
    EFFECT_COMMITTED = "effect-committed"
    EFFECT_FAILED = "effect-failed"
    EFFECT_UNCERTAIN = "effect-uncertain"
    REPORT_REFUSED = "report-refused"  # refused locally, nothing was sent
    REPORT_ATTEMPTED = "report-attempted"
    STOP_REQUESTED = "stop-requested"  # the coordinator asked the runner to stop (EXE-7, EXE-10)


@dataclass(frozen=True)
class JournalEntry:
    at_ms: float  # local monotonic milliseconds
    kind: JournalKind
    state: Certainty  # the state after this entry
    reason: str
    previous: Certainty | None = None  # set on transitions
    attributes: Mapping[str, str] = field(default_factory=dict)


class CertaintyTracker:
    """The holder's conservative view of its lease, advanced only by explicit inputs.

    `started_at` must be a local time at or after the moment the claim's answer arrived: until a
    renewal is confirmed the tracker is in JEOPARDY, and it declares the lease LOST at
    `started_at + lease_ms`, by which time the claimed lease has certainly run out.
    """

    def __init__(self, lease_ms: float, *, started_at: float, safety_margin_ms: float | None = None) -> None:
        if lease_ms <= 0:
            raise ValueError(f"lease_ms must be positive, got {lease_ms}")
        margin = lease_ms / 3 if safety_margin_ms is None else safety_margin_ms
        if not 0 <= margin < lease_ms:
            raise ValueError(f"safety margin must be in [0, lease_ms={lease_ms}), got {margin}")
        self._lease_ms = lease_ms
        self._margin_ms = margin
        self._unproven_deadline = started_at + lease_ms
        self._valid_until: float | None = None
        self._unknown: tuple[int, str] | None = None  # highest renewal with an unknown outcome
        self._last_sent_sequence: int | None = None
        self._state = Certainty.JEOPARDY
        self._journal: list[JournalEntry] = [
            JournalEntry(
                started_at, JournalKind.TRANSITION, Certainty.JEOPARDY, "started: no renewal confirmed yet"
            )
        ]

    # --- read side ---------------------------------------------------------------------------

    @property
    def state(self) -> Certainty:
        """The state as of the last input; call `evaluate(now)` for the state at `now`."""
        return self._state

    @property
    def lease_ms(self) -> float:
        return self._lease_ms

    @property
    def safety_margin_ms(self) -> float:
        return self._margin_ms

    @property
    def valid_until_local(self) -> float | None:
        """Local time until which the lease is proven to live; None before any confirmation."""
        return self._valid_until

    @property
    def lost_at_local(self) -> float:
        """Local time at which, without a further confirmation, the lease will be declared LOST."""
        return self._lost_deadline()

    @property
    def last_transition(self) -> JournalEntry:
        return next(e for e in reversed(self._journal) if e.kind is JournalKind.TRANSITION)

    @property
    def journal(self) -> tuple[JournalEntry, ...]:
        return tuple(self._journal)

    @property
    def transitions(self) -> tuple[JournalEntry, ...]:
        return tuple(e for e in self._journal if e.kind is JournalKind.TRANSITION)

    def can_send_effects(self, now: float) -> bool:
        """True only if the lease is VALID at `now` (LEASE-4: no effects in jeopardy)."""
        return self.evaluate(now) is Certainty.VALID

    # --- inputs ------------------------------------------------------------------------------

    def evaluate(self, now: float) -> Certainty:
        """The state at `now`. Time alone can only degrade it (VALID -> JEOPARDY -> LOST)."""
        self._settle(now, recovered_by="")
        return self._state

    def renewal_sent(self, sequence: int, now: float) -> Certainty:
        if self._last_sent_sequence is not None and sequence <= self._last_sent_sequence:
            raise ValueError(
                f"renewal sequence {sequence} is not above the last sent {self._last_sent_sequence}"
            )
        self._last_sent_sequence = sequence
        return self.evaluate(now)

    def renewal_confirmed(
        self, sequence: int, sent_at: float, server_expires_at: int, server_time: int, now: float
    ) -> Certainty:
        """A 2xx renewal answer (or the claim itself, as sequence 0) arrived at local `now`."""
        if self._ignored_in_terminal(now, f"confirmation of renewal {sequence}"):
            return self._state
        granted = min(self._lease_ms, server_expires_at - server_time)
        bound = sent_at + granted
        # Each bound is a lower bound of an expiry that only moves forward, so the max is too.
        self._valid_until = bound if self._valid_until is None else max(self._valid_until, bound)
        if self._unknown is not None and sequence >= self._unknown[0]:
            self._unknown = None
        self._settle(now, recovered_by=f"renewal {sequence} confirmed: valid until local {bound:.0f} ms")
        return self._state

    def renewal_unknown(self, sequence: int, now: float, reason: str = "no answer") -> Certainty:
        """Timeout, connection error or 5xx: the renewal may or may not have taken effect."""
        if self._ignored_in_terminal(now, f"unknown outcome of renewal {sequence}"):
            return self._state
        if self._unknown is None or sequence >= self._unknown[0]:
            self._unknown = (sequence, reason)
        self._settle(now, recovered_by="")
        return self._state

    def renewal_refused(self, reason: str, now: float) -> Certainty:
        """A 409 from the coordinator or a fenced recipient: the lease is gone, now."""
        if self._ignored_in_terminal(now, f"refusal ({reason})"):
            return self._state
        self._move(Certainty.LOST, now, f"refused: {reason}")
        return self._state

    def released(self, now: float, reason: str = "terminal report accepted") -> Certainty:
        if self._ignored_in_terminal(now, f"release ({reason})"):
            return self._state
        self._move(Certainty.RELEASED, now, reason)
        return self._state

    def record(
        self, now: float, kind: JournalKind, reason: str, attributes: Mapping[str, str] | None = None
    ) -> JournalEntry:
        """Append evidence that is not a transition (checkpoints, effects attempted or refused)."""
        if kind is JournalKind.TRANSITION:
            raise ValueError("transitions are journaled by the tracker itself")
        entry = JournalEntry(now, kind, self._state, reason, attributes=dict(attributes or {}))
        self._journal.append(entry)
        return entry

    # --- internals ---------------------------------------------------------------------------

    def _lost_deadline(self) -> float:
        return self._unproven_deadline if self._valid_until is None else self._valid_until

    def _jeopardy_reason(self, now: float) -> str | None:
        if self._unknown is not None:
            return f"renewal {self._unknown[0]} outcome unknown ({self._unknown[1]})"
        if self._valid_until is None:
            return "no renewal confirmed yet"
        if now >= self._valid_until - self._margin_ms:
            return (
                f"within the safety margin: {self._valid_until - now:.0f} ms left of the proven lease, "
                f"margin {self._margin_ms:.0f} ms"
            )
        return None

    def _settle(self, now: float, recovered_by: str) -> None:
        """Apply the rules at `now`; only a confirmation (`recovered_by`) may lift JEOPARDY."""
        if self._state in TERMINAL_CERTAINTIES:
            return
        deadline = self._lost_deadline()
        if now >= deadline:
            self._move(
                Certainty.LOST, now, f"no confirmed renewal covers local {now:.0f} ms (bound {deadline:.0f})"
            )
            return
        why = self._jeopardy_reason(now)
        if why is not None:
            if self._state is Certainty.VALID:
                self._move(Certainty.JEOPARDY, now, why)
        elif self._state is Certainty.JEOPARDY and recovered_by:
            self._move(Certainty.VALID, now, recovered_by)

    def _ignored_in_terminal(self, now: float, what: str) -> bool:
        if self._state not in TERMINAL_CERTAINTIES:
            return False
        self._journal.append(
            JournalEntry(
                now, JournalKind.IGNORED, self._state, f"{what} ignored: lease already {self._state.value}"
            )
        )
        return True

    def _move(self, target: Certainty, now: float, reason: str) -> None:
        check_transition(self._state, target)
        entry = JournalEntry(now, JournalKind.TRANSITION, target, reason, previous=self._state)
        self._state = target
        self._journal.append(entry)
