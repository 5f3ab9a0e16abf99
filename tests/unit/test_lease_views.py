"""The lease record in the Run view (LEASE-2) and the effect gateway's fencing fold (LEASE-3).

The events come from the pure aggregate (`decide`/`decide_timers`), so every log folded here is
one the coordinator can really write. Proves LEASE-2 (lease id, work id, holder, issue time, every
renewal, expiry rule, certainty, takeover reason and evidence, epoch, effects with their status),
LEASE-6/LEASE-7 (ended leases and the takeover evidence are kept) and LEASE-3 on the gateway side
(`fold_fencing` follows the current epoch and effect statuses, and ignores redeliveries).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, example, given, reject, settings

from services.common.contracts import AttemptClaimed, LeaseTakenOver, RunEvent
from services.effect_gateway.fencing import FencingView, fold_fencing
from services.lease_coordinator.domain import LeaseCertainty, RunState, evolve
from services.projections.views import apply_event
from tests.support.lease_run import (
    T0,
    Run,
    intent_cmd,
    outcome_cmd,
    renew_cmd,
    report_cmd,
)
from tests.support.lease_simulation import (
    SCENARIO,
    STALE_RUNNERS,
    UNCONFIRMED_CANCEL,
    Step,
    UnfoldableDecision,
    simulate,
)

from .strategies import cancel_command

LEASE_2_FIELDS = {
    "leaseId",
    "workId",
    "attemptId",
    "holder",
    "holderKind",
    "epoch",
    "issuedAt",
    "expiresAt",
    "expiryRule",
    "certainty",
    "certaintyChangedAt",
    "renewals",
    "takeoverReason",
    "takeoverEvidence",
    "endedAt",
    "effects",
}


def fold_views(events: list[RunEvent]) -> list[dict[str, Any]]:
    """The view after each event."""
    views: list[dict[str, Any]] = []
    view: dict[str, Any] | None = None
    for event in events:
        view = apply_event(view, event)
        assert view is not None, f"{event.event_id} was taken for a duplicate"
        views.append(view)
    return views


def assert_lease_2_record(lease: dict[str, Any], run_id: str) -> None:
    assert set(lease) >= LEASE_2_FIELDS, f"missing {LEASE_2_FIELDS - set(lease)}"
    assert lease["workId"] == run_id
    assert set(lease["expiryRule"]) == {"leaseSeconds", "heartbeatSeconds", "atRiskAfterMs", "clock"}
    assert lease["expiryRule"]["clock"] == "coordinator", "LEASE-5: the server's clock decides"
    for renewal in lease["renewals"]:
        assert set(renewal) == {"sequence", "at", "expiresAt"}
    for effect in lease["effects"]:
        assert effect["epoch"] == lease["epoch"] and effect["status"] in (
            "intended",
            "committed",
            "failed",
            "unknown",
        )


def assert_view_agrees_with_state(view: dict[str, Any], state: RunState) -> None:
    """The read side tells the same story as the write side, field by field."""
    assert (view["status"], view["version"]) == (state.status.value, state.version)
    lease = view["lease"]
    if state.lease is None:
        assert lease is None
    else:
        assert_lease_2_record(lease, state.run_id)
        own = state.lease
        assert (lease["leaseId"], lease["attemptId"], lease["epoch"]) == (
            own.lease_id,
            own.attempt_id,
            own.epoch,
        )
        assert (lease["holder"], lease["holderKind"]) == (own.holder, own.holder_kind)
        assert (lease["issuedAt"], lease["expiresAt"]) == (own.issued_at, own.expires_at)
        assert lease["certainty"] == own.certainty.value
        assert lease["expiryRule"]["leaseSeconds"] * 1000 == own.lease_ms
        assert lease["expiryRule"]["atRiskAfterMs"] == own.at_risk_after_ms
        renewals = lease["renewals"]
        assert (renewals[-1]["at"] if renewals else lease["issuedAt"]) == own.last_renewal_at
        if own.certainty is not LeaseCertainty.RELEASED:  # a report moves the sequence, not renewals
            assert (renewals[-1]["sequence"] if renewals else 0) == own.last_sequence
        assert (lease["endedAt"] is None) == own.held
    leases = [*view["leaseHistory"], *([lease] if lease else [])]
    assert [old["epoch"] for old in leases] == sorted({old["epoch"] for old in leases}), (
        "one record per epoch"
    )
    assert all(old["endedAt"] is not None for old in view["leaseHistory"]), "history keeps ended leases"
    effects = {e["effectId"]: e["status"] for old in leases for e in old["effects"]}
    assert effects == {e.effect_id: e.outcome for e in state.effects}


class Story:
    """A retry-safe run through every lease event: claim, renewals, at-risk, expiry, requeue,
    claim again, takeover by an operator, effects across epochs, the operator's report."""

    def __init__(self) -> None:
        run = Run(retry_safe=True, max_attempts=3)
        self.run = run
        self.marks: dict[str, int] = {}
        run.at(T0 + 1_000)
        self.first = run.claim("runner-a")
        self._mark("claimed")
        for sequence, at in ((1, T0 + 11_000), (2, T0 + 21_000)):
            run.at(at).renew(sequence)
        self._mark("renewed")
        run.accept(intent_cmd(run.run_id, self.first.attempt_id, 1, "e1"))
        run.at(T0 + 21_000 + 45_000).tick()
        self._mark("at_risk")
        run.expire()
        self._mark("requeued")
        run.at(T0 + 200_000)
        self.second = run.claim("runner-b")
        run.at(T0 + 205_000).renew(1)
        run.accept(intent_cmd(run.run_id, self.second.attempt_id, 2, "e2"))
        self._mark("second")
        run.at(T0 + 230_000)
        self.takeover = run.take_over(reason="runner-b stuck on a refund", new_holder="operator:olga")
        self._mark("taken_over")
        run.accept(outcome_cmd(run.run_id, self.second.attempt_id, 2, "e2", "committed"))
        run.accept(outcome_cmd(run.run_id, self.first.attempt_id, 1, "e1", "failed"))
        run.accept(renew_cmd(run.run_id, self.takeover.attempt_id, 3, 1))
        run.at(T0 + 240_000)
        run.accept(report_cmd(run.run_id, self.takeover.attempt_id, 3, 2, "succeeded"))
        self._mark("reported")
        self.views = fold_views(run.events)

    def _mark(self, name: str) -> None:
        self.marks[name] = len(self.run.events) - 1

    def view(self, mark: str) -> dict[str, Any]:
        return self.views[self.marks[mark]]


def test_the_lease_record_after_a_claim_holds_every_lease_2_field() -> None:
    story = Story()
    view, first = story.view("claimed"), story.first
    lease = view["lease"]
    assert_lease_2_record(lease, story.run.run_id)
    assert (lease["leaseId"], lease["attemptId"], lease["epoch"]) == (first.lease_id, first.attempt_id, 1)
    assert (lease["holder"], lease["holderKind"], lease["issuedAt"]) == ("runner-a", "runner", T0 + 1_000)
    assert lease["expiresAt"] == T0 + 1_000 + 90_000
    assert lease["expiryRule"] == {
        "leaseSeconds": 90,
        "heartbeatSeconds": 20,
        "atRiskAfterMs": 45_000,
        "clock": "coordinator",
    }
    assert (lease["certainty"], lease["renewals"], lease["effects"]) == ("active", [], [])
    assert (lease["takeoverReason"], lease["takeoverEvidence"], lease["endedAt"]) == (None, None, None)
    assert view["status"] == "preparing" and view["leaseHistory"] == []
    assert view["attempts"] == [
        {
            "attemptId": first.attempt_id,
            "attemptNumber": 1,
            "epoch": 1,
            "holder": "runner-a",
            "claimedAt": T0 + 1_000,
            "outcome": None,
        }
    ]


def test_every_renewal_is_kept_and_at_risk_then_expiry_are_recorded_lease_2_lease_4() -> None:
    story = Story()
    renewed = story.view("renewed")
    assert renewed["status"] == "running"
    assert renewed["lease"]["renewals"] == [
        {"sequence": 1, "at": T0 + 11_000, "expiresAt": T0 + 11_000 + 90_000},
        {"sequence": 2, "at": T0 + 21_000, "expiresAt": T0 + 21_000 + 90_000},
    ]
    assert renewed["lease"]["expiresAt"] == T0 + 21_000 + 90_000
    at_risk = story.view("at_risk")["lease"]
    assert (at_risk["certainty"], at_risk["certaintyChangedAt"]) == ("at_risk", T0 + 66_000)
    assert at_risk["endedAt"] is None, "jeopardy is not the end of the lease"
    assert at_risk["effects"] == [
        {
            "effectId": "e1",
            "idempotencyKey": "idem-e1",
            "tool": "payments",
            "operation": "refund",
            "epoch": 1,
            "status": "intended",
            "recordedAt": T0 + 21_000,
        }
    ]
    expired_view = story.views[story.marks["requeued"] - 1]
    expired = expired_view["lease"]
    assert (expired["certainty"], expired["endedAt"]) == ("expired", T0 + 111_000)
    assert expired_view["status"] == "interrupted" and "LEASE_EXPIRED" in expired_view["statusReason"]
    requeued = story.view("requeued")
    assert requeued["status"] == "queued" and "1 attempt(s) used, 2 left" in requeued["statusReason"]
    assert requeued["lease"]["certainty"] == "expired", "the ended lease stays visible until the next one"


def test_leases_of_later_attempts_push_the_ended_ones_into_the_history_lease_6() -> None:
    story = Story()
    second = story.view("second")
    assert second["lease"]["epoch"] == 2 and second["lease"]["holder"] == "runner-b"
    (old,) = second["leaseHistory"]
    assert (old["epoch"], old["certainty"], len(old["renewals"])) == (1, "expired", 2), "kept whole"
    assert [a["attemptNumber"] for a in second["attempts"]] == [1, 2]


def test_a_takeover_records_the_reason_and_the_evidence_and_revokes_the_old_lease_lease_6_lease_7() -> None:
    story = Story()
    view = story.view("taken_over")
    new = view["lease"]
    assert (new["epoch"], new["holder"], new["holderKind"]) == (3, "operator:olga", "human")
    assert new["takeoverReason"] == "runner-b stuck on a refund"
    assert new["takeoverEvidence"] == {
        "previousHolder": "runner-b",
        "previousEpoch": 2,
        "previousLeaseId": story.second.lease_id,
        "lastRenewalAt": T0 + 205_000,
        "lastSequence": 1,
        "effectsAttempted": ["e2"],
        "by": "user:olga",
    }
    revoked = view["leaseHistory"][-1]
    assert (revoked["epoch"], revoked["certainty"], revoked["endedAt"]) == (2, "revoked", T0 + 230_000)
    assert view["status"] == "running"
    assert view["attempts"][-1]["takeover"] is True and view["attempts"][-1]["epoch"] == 3


def test_outcomes_land_on_the_lease_the_effect_was_attempted_under_and_the_report_releases_lease_2() -> None:
    story = Story()
    view = story.view("reported")
    first, second = view["leaseHistory"]
    assert [(e["effectId"], e["status"]) for e in first["effects"]] == [("e1", "failed")]
    assert [(e["effectId"], e["status"]) for e in second["effects"]] == [("e2", "committed")]
    assert second["effects"][0]["decidedAt"] == T0 + 230_000
    final = view["lease"]
    assert (final["certainty"], final["endedAt"], final["effects"]) == ("released", T0 + 240_000, [])
    assert view["status"] == "succeeded"
    assert view["attempts"][-1]["outcome"] == "succeeded"


def test_the_view_agrees_with_the_aggregate_after_every_event_of_the_story() -> None:
    story = Story()
    state: RunState | None = None
    for event, view in zip(story.run.events, story.views, strict=True):
        state = evolve(state, event)
        assert_view_agrees_with_state(view, state)


def test_attempt_numbers_in_the_view_are_unique_after_a_takeover_and_a_requeue_exe_5() -> None:
    """A takeover issues a new attempt id but does not use up one of the run's maxAttempts, so the
    next claim after a requeue is attempt number 2. The view must never show two different
    attempts under the same number (it once numbered takeovers len(attempts) + 1)."""
    run = Run(retry_safe=True, max_attempts=3)
    run.claim("runner-a")
    run.take_over()
    run.expire()
    claimed = run.claim("runner-b")
    view = fold_views(run.events)[-1]
    numbers = [a["attemptNumber"] for a in view["attempts"] if a["attemptNumber"] is not None]
    assert len(numbers) == len(set(numbers)), f"attempt numbers {numbers} for {view['attempts']}"
    assert view["attempts"][-1]["attemptNumber"] == claimed.attempt_number


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**SCENARIO)
@example(retry_safe=True, max_attempts=3, lease_seconds=0, steps=STALE_RUNNERS)
@example(retry_safe=True, max_attempts=3, lease_seconds=0, steps=UNCONFIRMED_CANCEL)
def test_the_lease_record_agrees_with_the_aggregate_over_competing_runners_lease_2(
    retry_safe: bool, max_attempts: int, lease_seconds: int, steps: list[Step]
) -> None:
    try:
        sim = simulate(retry_safe, max_attempts, lease_seconds, steps)
    except UnfoldableDecision:
        reject()  # never on the log: the processor fails such a batch before committing it
    state: RunState | None = None
    fencing: FencingView | None = None
    for event, view in zip(sim.run.events, fold_views(sim.run.events), strict=True):
        state = evolve(state, event)
        fencing = fold_fencing(fencing, event)
        assert_view_agrees_with_state(view, state)
        assert (fencing.epoch, fencing.version) == (state.epoch, state.version)
        assert fencing.lease_held == (state.lease is not None and state.lease.held)
        assert fencing.effects == {e.effect_id: e.outcome for e in state.effects}


# --- the effect gateway's fencing fold ---------------------------------------------------------


def test_fold_fencing_follows_the_current_epoch_and_the_effects_lease_3() -> None:
    story = Story()
    fencing: FencingView | None = None
    seen: list[tuple[int, bool]] = []
    for event in story.run.events:
        fencing = fold_fencing(fencing, event)
        if isinstance(event, (AttemptClaimed, LeaseTakenOver)):
            assert fencing.attempt_id == event.attempt_id
        seen.append((fencing.epoch, fencing.lease_held))
    assert fencing is not None
    assert seen[story.marks["claimed"]] == (1, True)
    assert seen[story.marks["requeued"]] == (1, False), "an expired lease authorises nothing"
    assert seen[story.marks["second"]] == (2, True)
    assert seen[story.marks["taken_over"]] == (3, True)
    assert seen[story.marks["reported"]] == (3, False)
    assert fencing.effects == {"e1": "failed", "e2": "committed"}
    assert (fencing.run_id, fencing.version) == (story.run.run_id, len(story.run.events))


def test_fold_fencing_ignores_redeliveries_lease_3() -> None:
    story = Story()
    events = story.run.events
    once: FencingView | None = None
    for event in events:
        once = fold_fencing(once, event)
    twice: FencingView | None = None
    for event in events:
        twice = fold_fencing(twice, event)
        again = fold_fencing(twice, event)
        assert again == twice, f"redelivered {type(event).__name__} changed the view"
        twice = again
    assert twice == once
    # An old grant redelivered late must not hand the fence back to epoch 1 or 2.
    assert once is not None
    for old in (e for e in events if isinstance(e, (AttemptClaimed, LeaseTakenOver))):
        assert fold_fencing(once, old) == once


def test_fold_fencing_stops_holding_a_lease_revoked_by_an_unconfirmed_stop_lease_3_exe_7() -> None:
    """The runner never confirmed a cancel: the coordinator revokes its lease in place (same epoch,
    no new holder). The gateway's fold must not keep believing that lease is held."""
    run = Run()
    run.claim()
    run.renew(1)
    run.accept(cancel_command(run.run_id, command_id="cancel-unconfirmed"))
    assert run.state.stop is not None
    run.at(run.state.stop.grace_until).tick()
    assert run.state.lease is not None and run.state.lease.certainty is LeaseCertainty.REVOKED
    fencing: FencingView | None = None
    for event in run.events:
        fencing = fold_fencing(fencing, event)
    assert fencing is not None and fencing.epoch == 1
    assert fencing.lease_held is False, f"after {type(run.events[-1]).__name__} the lease is revoked"
    assert fold_views(run.events)[-1]["lease"]["certainty"] == "revoked", "the Run view agrees"
