"""Reconciler races, continued: two defects the races found (a claim at the deadline, the deadline
decision's event id after a user retry; EXE-10, DUR-1) and determinism of both orders (EXE-12,
EXE-7, EXE-10). The scenes are tests/support/race_scene.py's."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from services.common.contracts import (
    LeaseExpired,
    RetryRun,
    RunCancelled,
    RunCancelRequested,
    RunCommand,
    RunEvent,
    RunRequeued,
)
from services.lease_coordinator.domain import (
    TERMINAL_STATUSES,
    Rejection,
    RejectionCode,
    RunStatus,
    StopKind,
    decide_timers,
)
from tests.support.lease_run import T0, claim_cmd
from tests.support.race_scene import (
    Scene,
    answer,
    at_deadline,
    cancel,
    cancel_confirmation,
    cancelling,
    command_then_timers,
    event_types,
    running,
    success_report,
    timers_then_command,
    waiting_for_input,
)

# --- two defects these races found (now fixed in domain/lease.py and domain/stops.py) ---------


def test_claim_at_the_deadline_is_refused_so_both_orders_end_failed_without_a_lease_exe_10() -> None:
    """EXE-10 bounds the run from first assignment 'including later queueing'; a continuation
    still queued when the deadline passes must not be assigned again. Timers first, the run
    fails at once and the claim is refused. Command first, the claim must be refused as well:
    granting a fresh 90 s lease (and an active slot) to a run already past its deadline only
    forces a stop that the new runner may never confirm (then `interrupted`, not `failed`)."""
    scene = waiting_for_input(expires_in_ms=60_000, timeout_seconds=20)
    scene = scene.at(T0 + 3_000).accept(answer(scene))
    assert scene.state.status is RunStatus.QUEUED and scene.state.continuation_of == "resp-1"
    deadline = scene.state.deadline_at
    assert deadline is not None
    scene = scene.at(deadline)
    claim = claim_cmd(scene.state.run_id, "runner-b", command_id="race-claim-late")

    second = timers_then_command(scene, claim)
    assert second.refused.code is RejectionCode.RUN_NOT_CLAIMABLE
    assert second.final.status is RunStatus.FAILED

    first = command_then_timers(scene, claim)
    assert isinstance(first.decision, Rejection), (
        f"a run past its deadline ({deadline}) was assigned at {scene.now}: {first.decision}"
    )
    assert first.final == second.final


def test_every_deadline_decision_has_its_own_event_id_after_a_user_retry_exe_10_dur_1() -> None:
    """Event ids are derived from their cause so that a redelivery repeats them exactly; two
    *different* events must never share one. Deadline stop, never confirmed -> interrupted;
    the user's retry (if accepted) re-arms the deadline, and the reconciler's second
    DeadlineReached must not reuse the first one's id (its cause was `timer/<run>/deadline`)."""
    scene = at_deadline()
    log: list[RunEvent] = []
    events, scene = scene.reconcile()
    log += events
    stop = scene.state.stop
    assert stop is not None and stop.kind is StopKind.DEADLINE
    events, scene = scene.at(stop.grace_until).reconcile()
    log += events
    assert scene.state.status is RunStatus.INTERRUPTED
    retry = RetryRun(
        command_id="race-retry",
        run_id=scene.state.run_id,
        issued_at=scene.now,
        correlation_id="corr-retry",
        actor="user:alice",
        acknowledge_repeated_effects=True,
        reason="try once more",
    )
    decision = scene.decide(retry)
    if not isinstance(decision, Rejection):
        log += decision
        scene = scene.applied(decision)
        events, scene = scene.reconcile()
        log += events
    ids = [e.event_id for e in log]
    assert len(ids) == len(set(ids)), f"one event id for two events: {event_types(tuple(log))} {ids}"


# --- determinism: the same state, command and `now` decide the same ---------------------------


def _scenes() -> list[tuple[str, Callable[[], tuple[Scene, RunCommand]]]]:
    def expiry() -> tuple[Scene, RunCommand]:
        scene = running(lease_seconds=60, retry_safe=True)
        assert scene.state.lease is not None
        scene = scene.at(scene.state.lease.expires_at)
        return scene, success_report(scene)

    def deadline() -> tuple[Scene, RunCommand]:
        scene = at_deadline()
        return scene, success_report(scene)

    def grace() -> tuple[Scene, RunCommand]:
        scene = cancelling()
        assert scene.state.stop is not None
        scene = scene.at(scene.state.stop.grace_until)
        return scene, cancel_confirmation(scene)

    def input_expiry() -> tuple[Scene, RunCommand]:
        scene = waiting_for_input()
        assert scene.state.input_wait is not None
        scene = scene.at(scene.state.input_wait.expires_at)
        return scene, answer(scene)

    def cancel_at_expiry() -> tuple[Scene, RunCommand]:
        scene = running(lease_seconds=60)
        assert scene.state.lease is not None
        scene = scene.at(scene.state.lease.expires_at)
        return scene, cancel(scene)

    return [
        ("lease-expiry", expiry),
        ("deadline", deadline),
        ("cancel-grace", grace),
        ("input-expiry", input_expiry),
        ("cancel-at-expiry", cancel_at_expiry),
    ]


@pytest.mark.parametrize("build", [b for _, b in _scenes()], ids=[name for name, _ in _scenes()])
def test_both_orders_are_deterministic_exe_12(build: Callable[[], tuple[Scene, RunCommand]]) -> None:
    """Deciding the same (state, command, now) twice gives identical events, and so does each
    whole order: a coordinator that crashes and re-decides after a restart decides the same."""
    scene, command = build()
    assert scene.decide(command) == scene.decide(command)
    assert decide_timers(scene.state, scene.now, scene.policy) == decide_timers(
        scene.state, scene.now, scene.policy
    )
    assert command_then_timers(scene, command) == command_then_timers(scene, command)
    assert timers_then_command(scene, command) == timers_then_command(scene, command)
    # A rebuilt scene (fresh objects, same inputs) decides the same too: nothing hidden leaks in.
    again, same_command = build()
    assert again.state == scene.state and same_command == command
    assert command_then_timers(again, same_command) == command_then_timers(scene, command)
    assert timers_then_command(again, same_command) == timers_then_command(scene, command)


@pytest.mark.parametrize("build", [b for _, b in _scenes()], ids=[name for name, _ in _scenes()])
def test_neither_order_ever_ends_succeeded_after_a_stop_or_with_a_refused_report_exe_7_exe_10(
    build: Callable[[], tuple[Scene, RunCommand]],
) -> None:
    scene, command = build()
    for outcome in (command_then_timers(scene, command), timers_then_command(scene, command)):
        if outcome.final.status is RunStatus.SUCCEEDED:
            assert not isinstance(outcome.decision, Rejection)
            assert outcome.timer_events == ()
        assert outcome.final.status in TERMINAL_STATUSES or outcome.final.status in (
            RunStatus.QUEUED,
            RunStatus.INTERRUPTED,
            RunStatus.CANCELLING,
        )
        cancelled = isinstance(outcome.decision, tuple) and any(
            isinstance(e, (RunCancelRequested, RunCancelled)) for e in outcome.decision
        )
        if cancelled:
            assert outcome.final.status is not RunStatus.SUCCEEDED
            assert not any(isinstance(e, RunRequeued) for e in outcome.timer_events)
        if any(isinstance(e, LeaseExpired) for e in outcome.timer_events):
            assert outcome.final.lease is not None and not outcome.final.lease.held
