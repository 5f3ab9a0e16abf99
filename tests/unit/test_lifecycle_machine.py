"""The whole Run lifecycle of the pure core under random interleavings (a hypothesis state machine).

One Run at a time (a fresh one once it ended) is driven through `decide` / `evolve` /
`decide_timers` on a hand-moved coordinator clock: submit (retry-safe or not, 1-3 attempts,
short timeouts), claim by one of three runners (with or without checkpoint-v1), heartbeats,
reports and input requests fenced by each holder's own (possibly stale) epoch and sequence,
cancel, answers (new or repeated responseId), user retries (acknowledged or not), takeovers,
every command also at the "wrong" time, time passing, and the reconciler (`decide_timers` until
nothing is due). The clock may move without the reconciler running, so commands also meet
timers that are due but not yet decided. At the end every accepted command is redelivered.

Checked after every step (the requirement each proves):
- LEASE-3: one holder per epoch; epochs strictly increase by one per grant, none granted twice;
  a new claim only when no lease is held; a lease is held exactly while the run is preparing,
  running or cancelling; a holder with a stale epoch never gets an accepted event (STALE_EPOCH).
- EXE-4: every accepted holder command carried the current epoch of a live lease.
- Lifecycle table: a terminal status never changes and no event follows it.
- EXE-7: once a cancel is accepted the run never ends `succeeded` until the user's own explicit
  retry, and it is never automatically requeued again (no RunRequeued ever follows it).
- EXE-10: `deadline_at` never changes once set and equals first assignment + timeoutSeconds; a
  run past its deadline is never assigned again; after the reconciler ran no run is still live
  past its deadline (unless it is stopping).
- EXE-1: `succeeded` only from an AttemptReported "succeeded" whose report carried a verified
  ResultManifest.
- EXE-12: the reconciler decides deterministically, never acts before `next_timer_at`, and once
  drained leaves nothing due (no lease, grace, input wait or deadline past `now` left undecided).
- DUR-1: versions +1 each and fold(all events) == the incrementally evolved state; every event
  the core emits is applicable (evolve never raises on it) and deciding twice gives the same;
  event ids are unique; a redelivered accepted command decides nothing (EXE-2, EXE-3).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from services.common.contracts import (
    AttemptClaimed,
    AttemptReported,
    CancelRun,
    ClaimRun,
    InputProvided,
    InputRequested,
    LeaseRenewed,
    LeaseTakenOver,
    ProvideInput,
    RenewLease,
    ReportAttempt,
    RequestInput,
    RetryRun,
    RunCancelled,
    RunCancelRequested,
    RunCommand,
    RunEvent,
    RunRetried,
    TakeOverLease,
)
from services.lease_coordinator.domain import (
    CHECKPOINT_CAPABILITY,
    TERMINAL_STATUSES,
    Decision,
    LeasePolicy,
    Rejection,
    RejectionCode,
    RunState,
    RunStatus,
    StopKind,
    decide,
    decide_timers,
    evolve,
    next_timer_at,
)

from .lifecycle_checks import LifecycleChecks
from .strategies import SPEC_TEXTS, submit_command

T0 = 1_767_225_600_000
RUNNERS = ("runner-0", "runner-1", "runner-2")
OPERATOR = "operator:olga"
HOLDERS = (*RUNNERS, OPERATOR)
RESPONSE_IDS = ("resp-a", "resp-b", "resp-c")
# Short leases make expiry common; 0 asks for the deployment default (90 s).
LEASE_SECONDS = (2, 3, 5, 8, 0)
# The reconciler decides one kind of event per call; a run never needs more than a few in a row.
_MAX_TIMER_ROUNDS = 8

Grant = tuple[str, str, int]  # (holder, attempt id, epoch)

SUBMIT_ARGUMENTS: dict[str, Any] = {
    # Biased towards retries, so runs come back to the queue often.
    "retry_safe": st.sampled_from((True, True, False)),
    "max_attempts": st.integers(1, 3),
    "timeout_seconds": st.integers(3, 40),
    "grace_ms": st.sampled_from((1_000, 3_000, 10_000)),
    "auto_retry": st.sampled_from((True, True, False)),
}


def _running_its_course(machine: RunLifecycleMachine) -> bool:
    return machine.terminal is None


def _holder_may_speak(machine: RunLifecycleMachine) -> bool:
    # Holders (current or stale) keep talking until the run ended; after that,
    # `any_command_at_any_time` still sends them now and then.
    return machine.terminal is None and bool(machine.grants)


class RunLifecycleMachine(LifecycleChecks, RuleBasedStateMachine):
    """One Run, many actors, one coordinator clock; every invariant after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.policy = LeasePolicy()
        self._ids = itertools.count()
        self.runs_started = 0
        self.idempotency_key = ""
        self._start_tracking()

    def _start_tracking(self) -> None:
        self.state: RunState | None = None
        self.events: list[RunEvent] = []
        self.accepted_commands: list[RunCommand] = []
        # Every lease ever granted, in order, as (holder, attempt id, epoch).
        self.grants: list[Grant] = []
        # The last sequence each attempt's holder sent, accepted or not.
        self.sent_sequence: dict[str, int] = {}
        self.terminal: RunStatus | None = None
        self.cancel_ever = False
        self.cancel_in_force = False
        self.first_claim_at: int | None = None

    # --- plumbing -------------------------------------------------------------------------------

    def _cid(self, kind: str) -> str:
        return f"m-{kind}-{next(self._ids)}"

    def _head(self, kind: str, actor: str) -> dict[str, Any]:
        assert self.state is not None
        return {
            "command_id": self._cid(kind),
            "run_id": self.state.run_id,
            "issued_at": self.now,
            "correlation_id": f"corr-{kind}",
            "actor": actor,
        }

    @property
    def run(self) -> RunState:
        assert self.state is not None
        return self.state

    def _decide(self, command: RunCommand) -> Decision:
        before = self.state
        decision = decide(before, command, self.now, self.policy)
        # Determinism: the same command on the same state at the same `now` decides the same.
        assert decide(before, command, self.now, self.policy) == decision
        if isinstance(decision, Rejection):
            assert self.state == before, "a rejection changes nothing"
            return decision
        self._apply(decision, command)
        if decision:
            self.accepted_commands.append(command)
        return decision

    def _apply(self, events: tuple[RunEvent, ...], cause: RunCommand | None) -> None:
        for event in events:
            before = self.state
            try:
                after = evolve(before, event)
            except Exception as exc:  # pragma: no cover - the failure message is the point
                raise AssertionError(f"the core emitted an event it cannot apply: {event!r}") from exc
            self._check_step(before, event, after, cause)
            self.state = after
            self.events.append(event)

    def _is(self, *statuses: RunStatus) -> bool:
        return self.state is not None and self.state.status in statuses

    def _grant(self, newest: bool, index: int) -> Grant:
        return self.grants[-1] if newest else self.grants[index % len(self.grants)]

    def _sequence(self, attempt_id: str, mode: str) -> int:
        last = self.sent_sequence.get(attempt_id, 0)
        sequence = {"next": last + 1, "jump": last + 3, "same": last, "lower": max(0, last - 1)}[mode]
        self.sent_sequence[attempt_id] = max(last, sequence)
        return sequence

    # --- submit ---------------------------------------------------------------------------------

    @initialize(**SUBMIT_ARGUMENTS)
    def submit(
        self, retry_safe: bool, max_attempts: int, timeout_seconds: int, grace_ms: int, auto_retry: bool
    ) -> None:
        self._submit(retry_safe, max_attempts, timeout_seconds, grace_ms, auto_retry)

    @precondition(lambda self: self.terminal is not None)
    @rule(**SUBMIT_ARGUMENTS)
    def next_run(
        self, retry_safe: bool, max_attempts: int, timeout_seconds: int, grace_ms: int, auto_retry: bool
    ) -> None:
        """Once a run ended, the remaining steps drive a fresh one (a new idempotency key)."""
        self._start_tracking()
        self._submit(retry_safe, max_attempts, timeout_seconds, grace_ms, auto_retry)

    def _submit(
        self, retry_safe: bool, max_attempts: int, timeout_seconds: int, grace_ms: int, auto_retry: bool
    ) -> None:
        self.runs_started += 1
        self.idempotency_key = f"key-{self.runs_started}"
        self.policy = LeasePolicy(stop_grace_ms=grace_ms, auto_retry=auto_retry)
        command = submit_command(
            idempotency_key=self.idempotency_key,
            spec=SPEC_TEXTS[0],
            command_id=self._cid("submit"),
            retry_safe=retry_safe,
            max_attempts=max_attempts,
            timeout_seconds=timeout_seconds,
        )
        decision = self._decide(command)
        assert not isinstance(decision, Rejection) and len(decision) == 1
        assert self.run.status is RunStatus.QUEUED

    def resubmit(self, same_spec: bool) -> None:
        """EXE-2: dispatch is idempotent by runId; another spec under the same key is refused."""
        command = submit_command(
            idempotency_key=self.idempotency_key,
            spec=SPEC_TEXTS[1] if same_spec else SPEC_TEXTS[2],  # [1] is [0] in another key order
            command_id=self._cid("resubmit"),
            retry_safe=self.run.retry_safe,
            max_attempts=self.run.max_attempts,
            timeout_seconds=self.run.timeout_seconds,
        )
        decision = self._decide(command)
        if same_spec:
            assert decision == ()
        else:
            assert isinstance(decision, Rejection)
            assert decision.code is RejectionCode.IDEMPOTENCY_KEY_CONFLICT

    # --- the holder's side ----------------------------------------------------------------------

    @precondition(lambda self: self._is(RunStatus.QUEUED))
    @rule(
        runner=st.sampled_from(RUNNERS),
        checkpoint=st.sampled_from((True, True, False)),
        lease_seconds=st.sampled_from(LEASE_SECONDS),
    )
    def claim(self, runner: str, checkpoint: bool, lease_seconds: int) -> None:
        before = self.run
        command = ClaimRun(
            **self._head("claim", f"runner:{runner}"),
            runner_id=runner,
            capabilities=(CHECKPOINT_CAPABILITY,) if checkpoint else (),
            lease_seconds=lease_seconds,
        )
        decision = self._decide(command)
        past_deadline = before.deadline_at is not None and self.now >= before.deadline_at
        if before.status is not RunStatus.QUEUED or past_deadline:
            # EXE-10: the deadline bounds later queueing too; a run past it is never assigned.
            assert isinstance(decision, Rejection) and decision.code is RejectionCode.RUN_NOT_CLAIMABLE
        elif before.continuation_of is None and before.attempts_used >= before.max_attempts:
            assert isinstance(decision, Rejection) and decision.code is RejectionCode.ATTEMPTS_EXHAUSTED
        else:
            assert not isinstance(decision, Rejection), decision
            (event,) = decision
            assert isinstance(event, AttemptClaimed) and event.holder == runner
            assert self.run.status is RunStatus.PREPARING
            continuation = before.continuation_of is not None
            assert self.run.attempts_used == before.attempts_used + (0 if continuation else 1)

    @precondition(_holder_may_speak)
    @rule(
        newest=st.sampled_from((True, True, True, False)),
        index=st.integers(0, 9),
        mode=st.sampled_from(("next", "next", "next", "jump", "same", "lower")),
    )
    def heartbeat(self, newest: bool, index: int, mode: str) -> None:
        holder, attempt_id, epoch = self._grant(newest, index)
        before = self.run
        command = RenewLease(
            **self._head("renew", holder),
            attempt_id=attempt_id,
            lease_epoch=epoch,
            sequence=self._sequence(attempt_id, mode),
        )
        decision = self._decide(command)
        self._check_fenced(before, epoch, decision)
        if not isinstance(decision, Rejection):
            (event,) = decision
            assert isinstance(event, LeaseRenewed) and before.lease is not None
            assert event.sequence > before.lease.last_sequence
            lease = self.run.lease
            assert lease is not None and lease.expires_at == self.now + lease.lease_ms

    @precondition(_holder_may_speak)
    @rule(
        newest=st.sampled_from((True, True, True, False)),
        index=st.integers(0, 9),
        outcome=st.sampled_from(("succeeded", "succeeded", "failed", "cancelled", "preparation_failed")),
        verified=st.booleans(),
    )
    def report(self, newest: bool, index: int, outcome: str, verified: bool) -> None:
        holder, attempt_id, epoch = self._grant(newest, index)
        before = self.run
        command = ReportAttempt(
            **self._head("report", holder),
            attempt_id=attempt_id,
            lease_epoch=epoch,
            sequence=self._sequence(attempt_id, "next"),
            outcome=outcome,
            error_code="" if outcome == "succeeded" else "HARNESS_EXIT_1",
            detail=f"reported {outcome}",
            manifest_verified=verified,
            manifest_problem="" if verified else "artifact out/result.json is missing",
        )
        decision = self._decide(command)
        self._check_fenced(before, epoch, decision)
        if isinstance(decision, Rejection):
            return
        after = self.run
        if before.status is RunStatus.CANCELLING:
            # EXE-7/EXE-10: whatever the runner says, it confirms the stop it was asked for.
            assert before.stop is not None
            expected = RunStatus.FAILED if before.stop.kind is StopKind.DEADLINE else RunStatus.CANCELLED
            assert after.status is expected
        elif outcome == "preparation_failed":
            assert after.status in (RunStatus.QUEUED, RunStatus.FAILED)
        elif outcome == "succeeded" and verified:
            assert after.status is RunStatus.SUCCEEDED
        else:
            assert after.status is RunStatus.FAILED
            reported = decision[0]
            assert isinstance(reported, AttemptReported)
            if outcome == "succeeded":
                assert reported.error_code == "MANIFEST_INVALID", "EXE-1: exit 0 alone is no success"

    @precondition(lambda self: self._is(RunStatus.RUNNING, RunStatus.CANCELLING))
    @rule(
        newest=st.sampled_from((True, True, True, False)),
        index=st.integers(0, 9),
        expires_in_ms=st.one_of(st.integers(1, 20_000), st.just(0)),
    )
    def request_input(self, newest: bool, index: int, expires_in_ms: int) -> None:
        holder, attempt_id, epoch = self._grant(newest, index)
        before = self.run
        command = RequestInput(
            **self._head("input", holder),
            attempt_id=attempt_id,
            lease_epoch=epoch,
            sequence=self._sequence(attempt_id, "next"),
            checkpoint_digest="sha256:" + "c" * 64,
            input_schema='{"type":"string"}',
            prompt="which branch?",
            expires_at=self.now + expires_in_ms,
        )
        decision = self._decide(command)
        self._check_fenced(before, epoch, decision)
        if isinstance(decision, Rejection):
            return
        (event,) = decision
        assert isinstance(event, InputRequested)
        # EXE-8: only with checkpoint-v1, only while running, and the lease is released.
        assert before.status is RunStatus.RUNNING and before.lease is not None
        assert CHECKPOINT_CAPABILITY in before.lease.capabilities
        assert self.run.status is RunStatus.WAITING_INPUT
        assert self.run.lease is not None and not self.run.lease.held

    # --- the user's and the operator's side -----------------------------------------------------

    @precondition(lambda self: self._is(RunStatus.WAITING_INPUT) or bool(self.run.input_responses))
    @rule(response=st.sampled_from(RESPONSE_IDS))
    def provide_input(self, response: str) -> None:
        before = self.run
        command = ProvideInput(**self._head("answer", "user:alice"), response_id=response, answer='"main"')
        decision = self._decide(command)
        if response in before.input_responses:
            assert decision == (), "EXE-8: a repeated responseId creates no further attempt"
        elif before.status is not RunStatus.WAITING_INPUT:
            assert isinstance(decision, Rejection) and decision.code is RejectionCode.INVALID_TRANSITION
        elif before.input_wait is not None and self.now >= before.input_wait.expires_at:
            assert isinstance(decision, Rejection) and decision.code is RejectionCode.INPUT_EXPIRED
        else:
            assert not isinstance(decision, Rejection), decision
            (event,) = decision
            assert isinstance(event, InputProvided)
            assert self.run.status is RunStatus.QUEUED and self.run.continuation_of == response

    @precondition(_running_its_course)
    @rule(actor=st.sampled_from(("user:alice", "operator:olga")), reason=st.sampled_from(("not needed", "")))
    def cancel(self, actor: str = "user:alice", reason: str = "not needed") -> None:
        before = self.run
        decision = self._decide(CancelRun(**self._head("cancel", actor), reason=reason))
        if before.status in TERMINAL_STATUSES:
            assert isinstance(decision, Rejection) and decision.code is RejectionCode.RUN_ALREADY_TERMINAL
        elif before.status is RunStatus.CANCELLING:
            assert isinstance(decision, Rejection)
            assert decision.code is RejectionCode.CANCEL_ALREADY_REQUESTED
        else:
            assert not isinstance(decision, Rejection), decision
            (event,) = decision
            if before.status in (RunStatus.PREPARING, RunStatus.RUNNING):
                assert isinstance(event, RunCancelRequested), "EXE-7: a held run must confirm its cancel"
                assert self.run.status is RunStatus.CANCELLING
            else:
                assert isinstance(event, RunCancelled), "EXE-7: nobody holds it, so it ends at once"

    @precondition(lambda self: self._is(RunStatus.INTERRUPTED))
    @rule(acknowledged=st.sampled_from((True, True, False)))
    def retry(self, acknowledged: bool) -> None:
        before = self.run
        command = RetryRun(
            **self._head("retry", "user:alice"), acknowledge_repeated_effects=acknowledged, reason="again"
        )
        decision = self._decide(command)
        if before.status in TERMINAL_STATUSES:
            assert isinstance(decision, Rejection) and decision.code is RejectionCode.RUN_ALREADY_TERMINAL
        elif before.status is not RunStatus.INTERRUPTED:
            assert isinstance(decision, Rejection) and decision.code is RejectionCode.INVALID_TRANSITION
        elif isinstance(decision, Rejection) and decision.code is RejectionCode.INVALID_TRANSITION:
            # Refusing a retry past the deadline is one fix for the duplicate DeadlineReached id
            # (see event_ids_are_unique); a retry is never refused that way otherwise.
            assert before.deadline_at is not None and self.now >= before.deadline_at
        elif not acknowledged:
            assert isinstance(decision, Rejection)
            assert decision.code is RejectionCode.RETRY_NEEDS_ACKNOWLEDGEMENT, "EXE-5: warn first"
        elif before.attempts_used >= before.max_attempts:
            assert isinstance(decision, Rejection) and decision.code is RejectionCode.ATTEMPTS_EXHAUSTED
        else:
            assert not isinstance(decision, Rejection), decision
            (event,) = decision
            assert isinstance(event, RunRetried) and self.run.status is RunStatus.QUEUED

    @precondition(lambda self: self._is(RunStatus.PREPARING, RunStatus.RUNNING))
    @rule(new_holder=st.sampled_from(HOLDERS), lease_seconds=st.sampled_from(LEASE_SECONDS))
    def takeover(self, new_holder: str, lease_seconds: int) -> None:
        before = self.run
        command = TakeOverLease(
            **self._head("takeover", "user:olga"),
            reason="runner wedged",
            new_holder=new_holder,
            holder_kind="human" if new_holder == OPERATOR else "runner",
            lease_seconds=lease_seconds,
        )
        decision = self._decide(command)
        if before.status not in (RunStatus.PREPARING, RunStatus.RUNNING):
            assert isinstance(decision, Rejection)
            assert decision.code is RejectionCode.TAKEOVER_NOT_POSSIBLE
            return
        assert not isinstance(decision, Rejection), decision
        (event,) = decision
        assert isinstance(event, LeaseTakenOver) and before.lease is not None
        # LEASE-6/LEASE-7: the previous lease is the evidence, the reason is recorded.
        assert (event.previous_epoch, event.previous_holder) == (before.lease.epoch, before.lease.holder)
        assert event.reason == "runner wedged" and self.run.status is before.status

    @rule(
        kind=st.sampled_from(
            ("cancel", "retry", "claim", "heartbeat", "report", "input", "answer", "takeover", "submit")
        ),
        same_spec=st.booleans(),
    )
    def any_command_at_any_time(self, kind: str, same_spec: bool) -> None:
        """Commands whose rule waits for the right status, sent regardless; the called rule
        asserts the specific refusal (and an ended run must stay exactly as it was)."""
        before = self.run
        if kind in ("heartbeat", "report", "input") and not self.grants:
            kind = "claim"
        actions: dict[str, Callable[[], None]] = {
            "cancel": self.cancel,
            "retry": lambda: self.retry(acknowledged=True),
            "claim": lambda: self.claim(RUNNERS[0], checkpoint=True, lease_seconds=5),
            "heartbeat": lambda: self.heartbeat(newest=True, index=0, mode="next"),
            "report": lambda: self.report(newest=True, index=0, outcome="succeeded", verified=True),
            "input": lambda: self.request_input(newest=True, index=0, expires_in_ms=5_000),
            "answer": lambda: self.provide_input(RESPONSE_IDS[0]),
            "takeover": lambda: self.takeover(OPERATOR, lease_seconds=0),
            "submit": lambda: self.resubmit(same_spec),
        }
        actions[kind]()
        if before.status in TERMINAL_STATUSES:
            assert self.run == before

    # --- the coordinator's clock and the reconciler ---------------------------------------------

    @rule(
        how=st.sampled_from(("by", "by", "to_timer", "stand_still")),
        ms=st.one_of(st.sampled_from((1, 999, 1_000, 2_000, 5_000, 30_000)), st.integers(1, 60_000)),
        offset=st.sampled_from((-1, 0, 0, 1)),
        reconcile=st.sampled_from((False, True)),
    )
    def clock(self, how: str, ms: int, offset: int, reconcile: bool) -> None:
        """Time passes (`to_timer` lands on or next to a timer's boundary, where races are
        decided), then the reconciler runs, or not yet: commands also meet due timers."""
        due = next_timer_at(self.state)
        if how == "to_timer" and due is not None:
            self.now = max(self.now, due + offset)
        elif how != "stand_still":
            self.now += ms
        if reconcile:
            self._reconcile()

    def _reconcile(self) -> None:
        """EXE-12: the reconciler on the coordinator's clock, until nothing is due."""
        for _ in range(_MAX_TIMER_ROUNDS):
            events = decide_timers(self.run, self.now, self.policy)
            assert decide_timers(self.run, self.now, self.policy) == events, "timers are deterministic"
            if not events:
                break
            assert all(e.causation_id.startswith("timer/") for e in events)
            self._apply(events, None)
        else:
            raise AssertionError(f"the reconciler never settled: {self.events[-_MAX_TIMER_ROUNDS:]}")
        state = self.run
        due = next_timer_at(state)
        assert due is None or due > self.now, f"a timer due at {due} is left undecided at {self.now}"
        lease = state.lease
        if lease is not None and lease.held:
            assert self.now < lease.expires_at, "LEASE-5: an expired lease is still held"
        if state.status is RunStatus.CANCELLING:
            assert state.stop is not None and self.now < state.stop.grace_until
        if state.status is RunStatus.WAITING_INPUT:
            assert state.input_wait is not None and self.now < state.input_wait.expires_at
        if state.deadline_at is not None and self.now >= state.deadline_at:
            stopped_at_deadline = state.stop is not None and state.stop.kind is StopKind.DEADLINE
            assert (
                state.status in TERMINAL_STATUSES
                or state.status is RunStatus.CANCELLING
                or (state.status is RunStatus.INTERRUPTED and stopped_at_deadline)
            ), f"EXE-10: {state.status.value} past the deadline"

    def teardown(self) -> None:
        """Kafka redelivers after a crash: no accepted command ever decides anything again."""
        if self.state is None:
            return
        for command in self.accepted_commands:
            decision = decide(self.state, command, self.now, self.policy)
            assert decision == () or isinstance(decision, Rejection), (command, decision)


TestRunLifecycleMachine = RunLifecycleMachine.TestCase
TestRunLifecycleMachine.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
