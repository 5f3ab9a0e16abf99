"""Building breaker commands and driving the breaker's pure core, for the breakers' tests."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from services.breakers.domain import (
    DEFAULT_POLICY,
    BreakerPolicy,
    BreakerState,
    Rejection,
    decide,
    decide_timers,
    evolve,
)
from services.common.contracts import (
    SUCCESS,
    TRANSPORT_FAILURE,
    BreakerEvent,
    DisableBreaker,
    ForceOpenBreaker,
    RecordCallOutcome,
    ReportCanary,
    RequestCanary,
    ResetBreaker,
)

ENDPOINT = "env/vm.provision"
T0 = 1_767_225_600_000
# The smallest policy the bounds allow, so tests open a breaker with few outcomes.
POLICY = BreakerPolicy(window=20, min_calls=10, failure_rate=0.5, cooldown_ms=30_000, cooldown_max_ms=120_000)
_ids = itertools.count(1)


def _header(endpoint: str, command_id: str | None, actor: str = "service:gateway") -> dict[str, Any]:
    return {
        "command_id": command_id or f"cmd-{next(_ids)}",
        "run_id": endpoint,
        "issued_at": 0,
        "correlation_id": endpoint,
        "actor": actor,
    }


def outcome(
    seq: int,
    kind: str = TRANSPORT_FAILURE,
    *,
    instance: str = "gw-a",
    duration_ms: int = 10,
    endpoint: str = ENDPOINT,
    command_id: str | None = None,
    detail: str = "",
) -> RecordCallOutcome:
    return RecordCallOutcome(
        **_header(endpoint, command_id),
        instance_id=instance,
        seq=seq,
        outcome=kind,
        duration_ms=duration_ms,
        detail=detail,
    )


def request(
    instance: str = "gw-a", *, endpoint: str = ENDPOINT, command_id: str | None = None
) -> RequestCanary:
    return RequestCanary(**_header(endpoint, command_id), instance_id=instance)


def report(
    canary_id: str,
    kind: str = SUCCESS,
    *,
    instance: str = "gw-a",
    endpoint: str = ENDPOINT,
    command_id: str | None = None,
    duration_ms: int = 12,
) -> ReportCanary:
    return ReportCanary(
        **_header(endpoint, command_id),
        instance_id=instance,
        canary_id=canary_id,
        outcome=kind,
        duration_ms=duration_ms,
    )


def force_open(reason: str = "vendor incident", *, endpoint: str = ENDPOINT) -> ForceOpenBreaker:
    return ForceOpenBreaker(**_header(endpoint, None, "user:ops"), reason=reason)


def disable(reason: str = "breaker misbehaves", *, endpoint: str = ENDPOINT) -> DisableBreaker:
    return DisableBreaker(**_header(endpoint, None, "user:ops"), reason=reason)


def reset(reason: str = "vendor recovered", *, endpoint: str = ENDPOINT) -> ResetBreaker:
    return ResetBreaker(**_header(endpoint, None, "user:ops"), reason=reason)


@dataclass
class Breaker:
    """One endpoint's breaker driven through decide/evolve/decide_timers on a manual clock."""

    policy: BreakerPolicy = DEFAULT_POLICY
    now: int = T0
    state: BreakerState | None = None
    events: list[BreakerEvent] = field(default_factory=list)
    seq: int = 0

    def send(self, command: Any) -> tuple[BreakerEvent, ...] | Rejection:
        decision = decide(self.state, command, self.now, self.policy)
        if not isinstance(decision, Rejection):
            self._apply(decision)
        return decision

    def tick(self, advance_ms: int = 0) -> tuple[BreakerEvent, ...]:
        self.now += advance_ms
        if self.state is None:
            return ()
        events = decide_timers(self.state, self.now)
        self._apply(events)
        return events

    def _apply(self, events: Iterable[BreakerEvent]) -> None:
        for event in events:
            self.state = evolve(self.state, event)
            self.events.append(event)

    def outcomes(self, kinds: Iterable[str], instance: str = "gw-a") -> list[Any]:
        answers = []
        for kind in kinds:
            self.seq += 1
            answers.append(self.send(outcome(self.seq, kind, instance=instance)))
        return answers

    def open(self) -> None:
        """Closed -> Open with the smallest failing window the policy allows."""
        self.outcomes([TRANSPORT_FAILURE] * self.policy.min_calls)
        assert self.state is not None and self.state.status.value == "open", self.state

    def half_open(self) -> None:
        self.open()
        assert self.state is not None
        self.tick(self.state.half_open_at - self.now)
        assert self.state.status.value == "half-open", self.state


# --- the aggregate contract suite's command stream --------------------------------------------

BREAKER_ENDPOINTS = ("env", "ledger/transfer", "search")
BREAKER_INSTANCES = ("gw-a", "gw-b")
# Opens after 3 outcomes, so the streams reach Open, Half-open, canaries and their timers.
CONTRACT_POLICY = replace(POLICY, min_calls=3, canary_lease_ms=30_000)


def contract_commands(rng: random.Random, load: Callable[[str], Any], step: int) -> list[Any]:
    """Commands for tests/contract/test_aggregate_contract.py, generated against the current states."""
    commands: list[Any] = []
    for i in range(rng.randint(1, 6)):
        endpoint, instance = rng.choice(BREAKER_ENDPOINTS), rng.choice(BREAKER_INSTANCES)
        state, tag = load(endpoint), f"{endpoint}-{step}-{i}"
        roll = rng.random()
        canary = state.canary if state is not None else None
        if roll < 0.5 or (0.9 <= roll < 0.96):  # an outcome; now and then one again (a retried publish)
            seq = state.last_seq(instance) + 1 if state is not None else 1
            if state is not None and seq > 1 and rng.random() < 0.15:
                seq -= 1
            kind = "transport-failure" if rng.random() < 0.7 else "success"
            command_id = f"o-{endpoint}-{instance}-{seq}"
            commands.append(outcome(seq, kind, instance=instance, endpoint=endpoint, command_id=command_id))
        elif roll < 0.75:  # refused while closed (BREAKER_CLOSED), open (BREAKER_OPEN) or held
            commands.append(request(instance, endpoint=endpoint, command_id=f"q-{tag}"))
        elif roll < 0.9 and canary is not None:
            holder = canary.instance_id if rng.random() < 0.8 else instance  # or a stranger: refused
            kind = "success" if rng.random() < 0.5 else "transport-failure"
            commands.append(
                report(canary.canary_id, kind, instance=holder, endpoint=endpoint, command_id=f"p-{tag}")
            )
        elif roll >= 0.96:
            make = rng.choice((force_open, disable, reset, reset))
            commands.append(replace(make(endpoint=endpoint), command_id=f"x-{tag}"))
    return commands
