"""Random walks of one Run through the pure aggregate: every event on the walk is one the
coordinator can really write (decided by `decide`/`decide_timers`, applied by `evolve`).

A walk is driven by a list of steps (action, variant, clock advance) so that hypothesis can draw
and shrink it and a benchmark can draw it from a seeded `random.Random`. The actions cover every
Run event: claims (with and without checkpoint-v1), heartbeats by the newest and by stale
holders, reports of every outcome (verified or not, with a manifest), takeovers, effect intents
and outcomes across epochs, input requests and answers (new and repeated), upload grants,
cancels, retries and the coordinator's timers (at-risk, expiry, requeue, grace, deadline).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from services.common.contracts import (
    ArtifactEntry,
    AttemptClaimed,
    CancelRun,
    ClaimRun,
    EffectIntentRecorded,
    LeaseTakenOver,
    ProvideInput,
    RecordEffectIntent,
    RecordEffectOutcome,
    RenewLease,
    ReportAttempt,
    RequestInput,
    RequestUploadGrant,
    RetryRun,
    RunCommand,
    RunEvent,
    TakeOverLease,
)
from services.lease_coordinator.domain import (
    CHECKPOINT_CAPABILITY,
    LeasePolicy,
    Rejection,
    RunState,
    decide,
    decide_timers,
    evolve,
)

from .strategies import SPEC_TEXTS, submit_command

__all__ = ["ACTIONS", "RunWalk", "Step", "steps", "walk"]

T0 = 1_767_225_600_000
RUNNERS = ("runner-a", "runner-b", "runner-c")
# Weighted by repetition: heartbeats are the common case, a cancel ends most walks it meets.
ACTIONS = (
    *("claim",) * 3,
    *("renew",) * 6,
    *("report",) * 2,
    "takeover",
    *("intent",) * 2,
    *("outcome",) * 2,
    *("input",) * 2,
    *("answer",) * 2,
    "grant",
    "cancel",
    "retry",
    *("tick",) * 3,
)
# Mostly heartbeat-sized steps, sometimes long enough for at-risk, expiry or a deadline.
ADVANCES = (0, 0, 1_000, 2_000, 5_000, 10_000, 20_000, 46_000, 100_000)
Step = tuple[str, int, int]  # action, variant, ms the clock moves first


def steps(min_size: int = 1, max_size: int = 40) -> st.SearchStrategy[list[Step]]:
    return st.lists(
        st.tuples(st.sampled_from(ACTIONS), st.integers(0, 11), st.sampled_from(ADVANCES)),
        min_size=min_size,
        max_size=max_size,
    )


class RunWalk:
    """One run, several runners and an operator, one coordinator clock."""

    def __init__(
        self,
        key: str = "walk-1",
        *,
        retry_safe: bool = True,
        max_attempts: int = 3,
        timeout_seconds: int = 600,
        now: int = T0,
        policy: LeasePolicy | None = None,
    ) -> None:
        self.now = now
        self.policy = policy or LeasePolicy(stop_grace_ms=10_000)
        self.events: list[RunEvent] = []
        self._state: RunState | None = None
        self.grants: list[tuple[str, str, int]] = []  # (holder, attempt id, epoch)
        self.sequences: dict[str, int] = {}
        self.effects: list[tuple[str, str, int]] = []  # (effect id, attempt id, epoch)
        self._ids = 0
        self.key = key
        submit = submit_command(
            idempotency_key=key,
            spec=SPEC_TEXTS[len(key) % len(SPEC_TEXTS)],
            command_id=f"{key}-submit",
            retry_safe=retry_safe,
            max_attempts=max_attempts,
            timeout_seconds=timeout_seconds,
        )
        self._accept(submit)

    @property
    def state(self) -> RunState:
        assert self._state is not None
        return self._state

    @property
    def run_id(self) -> str:
        return self.state.run_id

    def _head(self, kind: str, actor: str) -> dict[str, Any]:
        self._ids += 1
        return {
            "command_id": f"{self.key}-{kind}-{self._ids}",
            "run_id": self.run_id,
            "issued_at": self.now,
            "correlation_id": f"corr-{kind}",
            "actor": actor,
        }

    def _apply(self, events: tuple[RunEvent, ...]) -> None:
        for event in events:
            self._state = evolve(self._state, event)
            self.events.append(event)

    def _accept(self, command: RunCommand) -> None:
        decision = decide(self._state, command, self.now, self.policy)
        if isinstance(decision, Rejection):
            return
        self._apply(decision)
        for event in decision:
            if isinstance(event, (AttemptClaimed, LeaseTakenOver)):
                self.grants.append((event.holder, event.attempt_id, event.epoch))
            elif isinstance(event, EffectIntentRecorded):
                self.effects.append((event.effect_id, event.attempt_id, event.epoch))

    def _grant(self, variant: int) -> tuple[str, str, int]:
        # Mostly the newest holder; now and then a stale one that still believes it holds the run.
        return self.grants[-1] if variant < 9 else self.grants[variant % len(self.grants)]

    def _sequence(self, attempt_id: str) -> int:
        self.sequences[attempt_id] = self.sequences.get(attempt_id, 0) + 1
        return self.sequences[attempt_id]

    def step(self, action: str, variant: int, advance: int) -> None:
        self.now += advance
        if action == "tick":
            for _ in range(8):
                events = decide_timers(self.state, self.now, self.policy)
                if not events:
                    break
                self._apply(events)
            return
        command = self._command(action, variant)
        if command is not None:
            self._accept(command)

    def _command(self, action: str, variant: int) -> RunCommand | None:
        if action == "claim":
            runner = RUNNERS[variant % len(RUNNERS)]
            return ClaimRun(
                **self._head("claim", f"runner:{runner}"),
                runner_id=runner,
                capabilities=(CHECKPOINT_CAPABILITY,) if variant % 2 == 0 else (),
                lease_seconds=(0, 5, 30)[variant % 3],
            )
        if action == "takeover":
            human = variant % 2 == 0
            holder = "operator:olga" if human else RUNNERS[variant % len(RUNNERS)]
            return TakeOverLease(
                **self._head("takeover", "user:olga"),
                reason=f"wedged ({variant})",
                new_holder=holder,
                holder_kind="human" if human else "runner",
                lease_seconds=(0, 10)[variant % 2],
            )
        if action == "cancel":
            return CancelRun(**self._head("cancel", "user:alice"), reason=("", "not needed")[variant % 2])
        if action == "retry":
            return RetryRun(
                **self._head("retry", "user:alice"),
                acknowledge_repeated_effects=variant % 3 != 0,
                reason="again",
            )
        if action == "answer":
            return ProvideInput(
                **self._head("answer", "user:alice"),
                response_id=f"resp-{variant % 2}",
                answer='{"branch":"main"}',
            )
        if action == "outcome":
            if not self.effects:
                return None
            # Mostly the newest intent; now and then an older one, maybe of an ended lease.
            effect_id, attempt_id, epoch = self.effects[-1 if variant < 6 else variant % len(self.effects)]
            return RecordEffectOutcome(
                **self._head("outcome", "service:gateway"),
                attempt_id=attempt_id,
                lease_epoch=epoch,
                effect_id=effect_id,
                outcome=("committed", "failed", "unknown")[variant % 3],
                detail=f"outcome {variant}",
            )
        if not self.grants:
            return None
        return self._held_command(action, variant)

    def _held_command(self, action: str, variant: int) -> RunCommand:
        holder, attempt_id, epoch = self._grant(variant)
        fenced: dict[str, Any] = {"attempt_id": attempt_id, "lease_epoch": epoch}
        if action == "renew":
            return RenewLease(**self._head("renew", holder), **fenced, sequence=self._sequence(attempt_id))
        if action == "intent":
            effect_id = f"{self.key}-e{self._ids}"
            return RecordEffectIntent(
                **self._head("intent", holder),
                **fenced,
                effect_id=effect_id,
                idempotency_key=f"idem-{effect_id}",
                tool="payments",
                operation="refund",
            )
        if action == "input":
            return RequestInput(
                **self._head("input", holder),
                **fenced,
                sequence=self._sequence(attempt_id),
                checkpoint_digest="sha256:" + "c" * 64,
                input_schema='{"type":"object"}',
                prompt=f"which branch ({variant})?",
                expires_at=self.now + (5_000, 60_000, 600_000)[variant % 3],
            )
        if action == "grant":
            return RequestUploadGrant(
                **self._head("grant", holder),
                **fenced,
                destination=f"out/result-{variant}.json",
                max_bytes=1_000 + variant,
                media_type="application/json",
            )
        assert action == "report", action
        outcome = ("succeeded", "failed", "cancelled", "preparation_failed")[variant % 4]
        return ReportAttempt(
            **self._head("report", holder),
            **fenced,
            sequence=self._sequence(attempt_id),
            outcome=outcome,
            error_code="" if outcome == "succeeded" else "HARNESS_EXIT_1",
            detail=f"reported {outcome}",
            manifest=(
                ArtifactEntry(
                    artifact_id="out/result.json",
                    digest="sha256:" + "a" * 64,
                    size_bytes=12,
                    media_type="application/json",
                ),
            )
            if variant % 3
            else (),
            manifest_verified=variant % 5 != 0,
            manifest_problem="" if variant % 5 else "artifact out/result.json is missing",
        )


def walk(walk_steps: list[Step], key: str = "walk-1", **kwargs: Any) -> RunWalk:
    run = RunWalk(key, **kwargs)
    for action, variant, advance in walk_steps:
        run.step(action, variant, advance)
    return run
