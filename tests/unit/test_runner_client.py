"""The runner SDK's HTTP client and lease keeper against a fake coordinator and gateway.

The fake (`FakeTenure`, tests/unit/runner_fakes.py) speaks the Issue 3 HTTP contract through
httpx.MockTransport: claim, heartbeat, report and effects, with problem+json errors, on a fake
clock offset from the coordinator's (LEASE-5). Stop requests, retries with full jitter and the
gateway's authentication are in test_runner_stop_and_retry.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from services.runner_sdk import (
    Certainty,
    EffectResult,
    FencedByRecipient,
    JournalKind,
    Lease,
    LeaseConflict,
    LeaseInJeopardy,
    LeaseKeeper,
    LeaseLost,
    LeaseReleased,
    OutcomeUnknown,
    RequestRejected,
    RunNotClaimable,
    RunNotFound,
    TenureClient,
    TenureUnavailable,
    ToolFailed,
    UnexpectedResponse,
)
from tests.unit.runner_fakes import API, ATTEMPT_ID, EPOCH, GATEWAY, RUN_ID, FakeClock, FakeTenure, problem


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def tenure(clock: FakeClock) -> FakeTenure:
    return FakeTenure(clock, clock.advance)


@pytest.fixture
def client(tenure: FakeTenure) -> Iterator[TenureClient]:
    with TenureClient(API, GATEWAY, api_key="runner-key", transport=tenure.transport()) as c:
        yield c


@pytest.fixture
def keeper(client: TenureClient, clock: FakeClock) -> LeaseKeeper:
    """A claimed lease (90 s, heartbeat 20 s, margin 30 s), renewed by hand: no thread."""
    return LeaseKeeper.claim(client, RUN_ID, "runner-7", ["checkpoint-v1"], clock=clock)


# --- client ------------------------------------------------------------------------------------


def test_claim_sends_the_contract_body_and_parses_the_lease(tenure: FakeTenure) -> None:
    seen: list[httpx.Request] = []

    def capture(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return tenure.handle(request)

    with TenureClient(API + "/", GATEWAY, api_key="k1", transport=httpx.MockTransport(capture)) as c:
        lease = c.claim(RUN_ID, "runner-7", ["checkpoint-v1"], 60, 15, idempotency_key="claim-1")
    request = seen[0]
    assert request.url.raw_path == b"/runs/run_01%2Fx%20y/attempts"
    assert request.headers["Authorization"] == "Bearer k1"
    assert request.headers["Idempotency-Key"] == "claim-1"
    assert json.loads(request.content) == {
        "runnerId": "runner-7",
        "holderKind": "runner",
        "capabilities": ["checkpoint-v1"],
        "leaseSeconds": 60,
        "heartbeatSeconds": 15,
    }
    assert lease == Lease(
        run_id=RUN_ID,
        attempt_id=ATTEMPT_ID,
        attempt_number=1,
        lease_id="lease_run_01-3",
        epoch=EPOCH,
        expires_at=tenure.expires_at,
        lease_seconds=90,
        heartbeat_interval_seconds=20,
        server_time=tenure.expires_at - 90_000,
        assignment={"executionSpec": {"image": "agent@sha256:aa"}, "specDigest": "sha256:5p"},
    )


def test_claim_without_api_key_or_idempotency_key_sends_neither(tenure: FakeTenure) -> None:
    seen: list[httpx.Request] = []

    def capture(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return tenure.handle(request)

    with TenureClient(API, GATEWAY, transport=httpx.MockTransport(capture)) as c:
        c.claim("r1", "runner-7", [])
    assert "Authorization" not in seen[0].headers
    assert "Idempotency-Key" not in seen[0].headers
    assert json.loads(seen[0].content)["leaseSeconds"] is None


def _answering(response: httpx.Response) -> TenureClient:
    return TenureClient(API, GATEWAY, transport=httpx.MockTransport(lambda request: response))


def _lease() -> Lease:
    return Lease(RUN_ID, ATTEMPT_ID, 1, "lease-1", EPOCH, 0, 90, 20, 0, {})


@pytest.mark.parametrize(
    ("response", "error", "slug"),
    [
        (problem(404, "run-not-found"), RunNotFound, "run-not-found"),
        (problem(409, "run-not-claimable"), RunNotClaimable, "run-not-claimable"),
        (problem(409, "attempts-exhausted"), RunNotClaimable, "attempts-exhausted"),
        (problem(422, "validation-failed"), RequestRejected, "validation-failed"),
        (problem(401, "unauthenticated"), RequestRejected, "unauthenticated"),
        (problem(503, "unavailable"), TenureUnavailable, "unavailable"),
    ],
)
def test_claim_problems_map_to_specific_errors(
    response: httpx.Response, error: type[Exception], slug: str
) -> None:
    with _answering(response) as c, pytest.raises(error) as caught:
        c.claim(RUN_ID, "runner-7", [])
    assert getattr(caught.value, "problem_type", None) == slug


@pytest.mark.parametrize(
    "slug", ["stale-epoch", "unknown-attempt", "sequence-not-increasing", "lease-expired", "lease-revoked"]
)
def test_heartbeat_and_report_409s_are_lease_conflicts_with_their_type(slug: str) -> None:
    """EXE-4: a stale epoch (and every other fencing refusal) is a 409 the runner must obey."""
    with _answering(problem(409, slug, "no")) as c:
        with pytest.raises(LeaseConflict) as hb:
            c.heartbeat(_lease(), 4)
        with pytest.raises(LeaseConflict) as rep:
            c.report(_lease(), 5, "succeeded")
    assert (hb.value.problem_type, rep.value.problem_type, hb.value.status) == (slug, slug, 409)
    assert not isinstance(hb.value, FencedByRecipient)


@pytest.mark.parametrize(
    ("response", "error", "slug"),
    [
        (problem(409, "stale-epoch"), LeaseConflict, "stale-epoch"),
        (problem(409, "fenced-by-recipient"), FencedByRecipient, "fenced-by-recipient"),
        (problem(502, "tool-failed"), ToolFailed, "tool-failed"),
        (problem(504, "outcome-unknown"), OutcomeUnknown, "outcome-unknown"),
        (httpx.Response(503, json={"status": "catching-up"}), TenureUnavailable, ""),
    ],
)
def test_effect_problems_map_to_specific_errors(
    response: httpx.Response, error: type[Exception], slug: str
) -> None:
    with _answering(response) as c, pytest.raises(error) as caught:
        c.effect(_lease(), "k-1", "ledger", "transfer", {"amount": 5})
    assert getattr(caught.value, "problem_type", None) == slug


def test_fenced_by_recipient_is_a_lease_conflict() -> None:
    """LEASE-3: the recipient refusing the epoch means the same as the coordinator refusing it."""
    assert issubclass(FencedByRecipient, LeaseConflict)


def test_effect_carries_run_attempt_epoch_and_idempotency_key(
    client: TenureClient, tenure: FakeTenure
) -> None:
    """LEASE-3/EXE-6: every effect carries the epoch and an idempotency key to the gateway."""
    result = client.effect(_lease(), "step-3", "ledger", "transfer", {"amount": 5})
    assert result == EffectResult("eff-step-3", "committed", 200, {"ok": True}, False)
    host, path, body = tenure.requests[-1]
    assert (host, path) == ("gateway.tenure.test", "/effects")
    assert body == {
        "runId": RUN_ID,
        "attemptId": ATTEMPT_ID,
        "epoch": EPOCH,
        "idempotencyKey": "step-3",
        "tool": "ledger",
        "operation": "transfer",
        "payload": {"amount": 5},
    }
    with pytest.raises(ValueError, match="idempotency key"):
        client.effect(_lease(), "", "ledger", "transfer", {})


@pytest.mark.parametrize(
    "failure", [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), httpx.RemoteProtocolError("cut")]
)
def test_transport_failures_are_unknown_outcomes_never_refusals(failure: httpx.TransportError) -> None:
    """LEASE-4: no answer means the outcome is unknown, not that the coordinator said no."""

    def fail(request: httpx.Request) -> httpx.Response:
        raise failure

    with TenureClient(API, GATEWAY, transport=httpx.MockTransport(fail)) as c:
        for call in (
            lambda: c.heartbeat(_lease(), 1),
            lambda: c.report(_lease(), 2, "failed", "E", "d"),
            lambda: c.effect(_lease(), "k", "t", "o", {}),
            lambda: c.claim("r", "w", []),
        ):
            with pytest.raises(TenureUnavailable) as caught:
                call()
            assert not isinstance(caught.value, LeaseConflict)
            assert type(failure).__name__ in str(caught.value)


def test_accepted_but_undecided_202_is_an_unknown_outcome() -> None:
    with _answering(httpx.Response(202, json={"commandId": "c1", "runId": RUN_ID})) as c:
        with pytest.raises(TenureUnavailable, match="202"):
            c.report(_lease(), 2, "succeeded")
        with pytest.raises(TenureUnavailable, match="202"):
            c.heartbeat(_lease(), 2)


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(200, text="<html>proxy</html>"),
        httpx.Response(200, json=[1, 2]),
        httpx.Response(200, json={"attemptId": ATTEMPT_ID, "epoch": True, "sequence": 1}),
    ],
)
def test_a_2xx_that_breaks_the_contract_is_unexpected(response: httpx.Response) -> None:
    with _answering(response) as c, pytest.raises(UnexpectedResponse):
        c.heartbeat(_lease(), 1)


def test_per_call_timeout_reaches_the_transport(tenure: FakeTenure) -> None:
    seen: list[dict[str, float]] = []

    def capture(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"])
        return tenure.handle(request)

    with TenureClient(API, GATEWAY, timeout_s=9, transport=httpx.MockTransport(capture)) as c:
        lease = c.claim(RUN_ID, "w", [])
        c.heartbeat(lease, 1, timeout_s=2.5)
    assert (seen[0]["read"], seen[1]["read"]) == (9, 2.5)


# --- keeper: renewals and certainty ----------------------------------------------------------


def test_confirmed_renewals_keep_the_lease_valid_with_increasing_sequences(
    keeper: LeaseKeeper, tenure: FakeTenure, clock: FakeClock
) -> None:
    """EXE-4/LEASE-5: heartbeats carry epoch and a strictly increasing sequence from 1."""
    assert keeper.state is Certainty.VALID
    for _ in range(6):  # 120 s, longer than the 90 s lease
        clock.advance(20)
        assert keeper.renew_once() is Certainty.VALID
    bodies = tenure.paths("/heartbeat")
    assert [b["sequence"] for b in bodies] == [1, 2, 3, 4, 5, 6]
    assert {b["leaseEpoch"] for b in bodies} == {EPOCH}
    assert keeper.last_renewal is not None and keeper.last_renewal.run_status == "running"
    assert keeper.valid_until is not None and keeper.valid_until <= tenure.true_expiry_local()
    assert keeper.send_effect("step-1", "ledger", "transfer", {"amount": 1}).outcome == "committed"


def test_renewal_timeouts_put_the_lease_in_jeopardy_before_expiry_and_effects_are_refused(
    keeper: LeaseKeeper, tenure: FakeTenure, clock: FakeClock
) -> None:
    """LEASE-4: an unknown renewal outcome is a state; no effects, checkpoints still allowed."""
    clock.advance(20)
    assert keeper.renew_once() is Certainty.VALID
    tenure.heartbeat_mode = "timeout"
    clock.advance(20)
    assert keeper.renew_once() is Certainty.JEOPARDY
    # Jeopardy is declared while the coordinator still holds the lease for us.
    assert clock() < tenure.true_expiry_local()
    effects_before = len(tenure.paths("/effects"))
    with pytest.raises(LeaseInJeopardy) as refused:
        keeper.send_effect("step-2", "ledger", "transfer", {"amount": 2})
    assert refused.value.idempotency_key == "step-2"
    assert len(tenure.paths("/effects")) == effects_before, "nothing may reach the gateway in jeopardy"
    refusal = keeper.journal[-1]
    assert refusal.kind is JournalKind.EFFECT_REFUSED
    assert "effect refused in jeopardy" in refusal.reason and "step-2" in refusal.reason
    assert refusal.attributes["idempotencyKey"] == "step-2"

    checkpoint = keeper.checkpoint("sha256:c1", "after step 1")
    assert (checkpoint.kind, checkpoint.state) == (JournalKind.CHECKPOINT, Certainty.JEOPARDY)
    assert checkpoint.attributes["digest"] == "sha256:c1" and checkpoint in keeper.journal

    with pytest.raises(LeaseInJeopardy):
        keeper.finish("succeeded")  # LEASE-4: no claim of success in jeopardy
    assert tenure.paths("/report") == []

    tenure.heartbeat_mode = "ok"  # the coordinator answers again
    clock.advance(20)
    assert keeper.renew_once() is Certainty.VALID
    assert keeper.send_effect("step-2", "ledger", "transfer", {"amount": 2}).effect_id == "eff-step-2"
    assert [b["sequence"] for b in tenure.paths("/heartbeat")] == [1, 2, 3]
    moves = [(e.previous, e.state) for e in keeper.journal if e.kind is JournalKind.TRANSITION]
    assert moves[-2:] == [(Certainty.VALID, Certainty.JEOPARDY), (Certainty.JEOPARDY, Certainty.VALID)]


def test_heartbeat_timeout_is_well_under_the_safety_margin(
    keeper: LeaseKeeper, tenure: FakeTenure, clock: FakeClock
) -> None:
    tenure.heartbeat_mode = "timeout"
    start = clock()
    keeper.renew_once()
    assert keeper.renewal_timeout_s == 7.5  # margin 30 s / 4
    assert clock() - start == keeper.renewal_timeout_s


def test_a_503_from_the_coordinator_is_jeopardy_not_loss(
    keeper: LeaseKeeper, tenure: FakeTenure, clock: FakeClock
) -> None:
    """LEASE-4: an unavailable coordinator is an unknown outcome, never a refusal."""
    tenure.heartbeat_mode = "unavailable"
    clock.advance(20)
    assert keeper.renew_once() is Certainty.JEOPARDY
    assert "503" in keeper.journal[-1].reason


def test_a_stale_epoch_answer_loses_the_lease_and_nothing_more_is_sent(
    keeper: LeaseKeeper, tenure: FakeTenure, clock: FakeClock
) -> None:
    """EXE-4: 409 stale-epoch -> LOST at once; a terminal report after LOST is not sent."""
    tenure.heartbeat_mode = "timeout"
    clock.advance(20)
    assert keeper.renew_once() is Certainty.JEOPARDY
    tenure.heartbeat_mode = "stale-epoch"
    clock.advance(20)
    assert keeper.renew_once() is Certainty.LOST
    assert "stale-epoch" in keeper.journal[-1].reason
    sent = len(tenure.requests)
    clock.advance(20)
    assert keeper.renew_once() is Certainty.LOST
    with pytest.raises(LeaseLost, match="stale-epoch"):
        keeper.finish("succeeded")
    with pytest.raises(LeaseLost):
        keeper.send_effect("step-9", "ledger", "transfer", {})
    with pytest.raises(LeaseLost):
        keeper.checkpoint("sha256:late")
    assert len(tenure.requests) == sent, "nothing may be sent after the lease is lost"


def test_renewals_that_never_answer_lose_the_lease_at_the_proven_bound(
    keeper: LeaseKeeper, tenure: FakeTenure, clock: FakeClock
) -> None:
    tenure.heartbeat_mode = "timeout"
    bound = keeper.valid_until
    assert bound is not None
    while keeper.renew_once() is Certainty.JEOPARDY:
        clock.advance(20)
    assert keeper.state is Certainty.LOST and clock() >= bound
    assert "no confirmed renewal covers" in keeper.journal[-1].reason
    with pytest.raises(LeaseLost):
        keeper.finish("failed", "RUNNER_GAVE_UP")
    assert tenure.paths("/report") == []


def test_finish_reports_with_the_next_sequence_and_releases(
    keeper: LeaseKeeper, tenure: FakeTenure, clock: FakeClock
) -> None:
    """EXE-4: the terminal report carries attemptId, leaseEpoch and the next sequence."""
    for _ in range(2):
        clock.advance(20)
        keeper.renew_once()
    view = keeper.finish("succeeded")
    assert view == {"runId": RUN_ID, "status": "succeeded"}
    assert tenure.paths("/report") == [
        {"leaseEpoch": EPOCH, "sequence": 3, "outcome": "succeeded", "errorCode": "", "detail": ""}
    ]
    assert keeper.state is Certainty.RELEASED
    sent = len(tenure.requests)
    assert keeper.renew_once() is Certainty.RELEASED
    with pytest.raises(LeaseReleased):
        keeper.send_effect("after", "ledger", "transfer", {})
    with pytest.raises(LeaseReleased):
        keeper.checkpoint("sha256:after")
    with pytest.raises(LeaseReleased):
        keeper.finish("succeeded")
    assert len(tenure.requests) == sent


def test_a_report_with_unknown_outcome_is_retried_with_the_same_sequence(
    keeper: LeaseKeeper, tenure: FakeTenure, clock: FakeClock
) -> None:
    """A heartbeat after an unanswered report would make the report's retry stale: none is sent."""
    clock.advance(20)
    keeper.renew_once()
    tenure.report_mode = "timeout"
    with pytest.raises(TenureUnavailable):
        keeper.finish("failed", "TOOL_BROKEN", "ledger down")
    assert keeper.state is Certainty.JEOPARDY
    clock.advance(20)
    keeper.renew_once()
    assert len(tenure.paths("/heartbeat")) == 1, "no heartbeat while a report is pending"
    with pytest.raises(ValueError, match="different terminal report"):
        keeper.finish("succeeded")
    tenure.report_mode = "ok"
    keeper.finish("failed", "TOOL_BROKEN", "ledger down")
    assert [b["sequence"] for b in tenure.paths("/report")] == [2, 2]
    assert keeper.journal[-1].state is Certainty.RELEASED


def test_a_report_refused_with_409_loses_the_lease(keeper: LeaseKeeper, tenure: FakeTenure) -> None:
    tenure.report_mode = "lease-revoked"
    with pytest.raises(LeaseLost) as lost:
        keeper.finish("succeeded")
    assert lost.value.problem_type == "lease-revoked"
    assert keeper.state is Certainty.LOST


@pytest.mark.parametrize("slug", ["stale-epoch", "fenced-by-recipient"])
def test_an_effect_refused_for_its_epoch_loses_the_lease(
    keeper: LeaseKeeper, tenure: FakeTenure, slug: str
) -> None:
    """LEASE-3: the gateway or the tool rejecting the epoch means another holder took over."""
    tenure.effect_mode = slug
    with pytest.raises(LeaseLost) as lost:
        keeper.send_effect("step-4", "ledger", "transfer", {"amount": 4})
    assert lost.value.problem_type == slug
    assert isinstance(lost.value.__cause__, LeaseConflict)
    assert keeper.state is Certainty.LOST
    kinds = [e.kind for e in keeper.journal]
    assert JournalKind.EFFECT_ATTEMPTED in kinds


@pytest.mark.parametrize(
    ("mode", "error", "kind"),
    [
        ("tool-failed", ToolFailed, JournalKind.EFFECT_FAILED),
        ("outcome-unknown", OutcomeUnknown, JournalKind.EFFECT_UNCERTAIN),
    ],
)
def test_effect_failures_are_journaled_and_leave_the_lease_valid(
    keeper: LeaseKeeper, tenure: FakeTenure, mode: str, error: type[Exception], kind: JournalKind
) -> None:
    tenure.effect_mode = mode
    with pytest.raises(error):
        keeper.send_effect("step-5", "ledger", "transfer", {})
    entry = keeper.journal[-1]
    assert (entry.kind, entry.attributes["idempotencyKey"]) == (kind, "step-5")
    assert keeper.state is Certainty.VALID


def test_without_the_claim_send_time_the_keeper_starts_in_jeopardy(
    client: TenureClient, tenure: FakeTenure, clock: FakeClock
) -> None:
    """LEASE-4: nothing proves how long a lease of unknown age still runs; one renewal does."""
    lease = client.claim(RUN_ID, "runner-7", [])
    keeper = LeaseKeeper(client, lease, clock)
    assert keeper.state is Certainty.JEOPARDY
    with pytest.raises(LeaseInJeopardy):
        keeper.send_effect("k", "ledger", "transfer", {})
    assert keeper.renew_once() is Certainty.VALID


def test_keeper_refuses_settings_that_leave_no_valid_window(client: TenureClient, clock: FakeClock) -> None:
    lease = client.claim(RUN_ID, "runner-7", [])
    with pytest.raises(ValueError, match="no VALID window"):
        LeaseKeeper(client, lease, clock, safety_margin_s=75)
    with pytest.raises(ValueError, match="at most half the safety margin"):
        LeaseKeeper(client, lease, clock, heartbeat_timeout_s=20)


# --- keeper: the background thread -------------------------------------------------------------


@pytest.mark.timeout(10)
def test_the_thread_renews_in_order_and_stops_when_the_lease_is_lost() -> None:
    """EXE-4: real thread, real clock, tiny interval; a 409 stale-epoch ends the renewal loop."""
    tenure = FakeTenure(time.monotonic)
    tenure.heartbeats_wanted = 3
    with TenureClient(API, GATEWAY, transport=tenure.transport()) as client:
        keeper = LeaseKeeper.claim(client, RUN_ID, "runner-7", [], heartbeat_interval_s=0.01)
        with keeper:
            assert tenure.heartbeat_seen.wait(5), "the keeper did not renew"
            assert keeper.state is Certainty.VALID
            tenure.heartbeat_mode = "stale-epoch"
            deadline = time.monotonic() + 5
            while keeper.running and time.monotonic() < deadline:
                time.sleep(0.005)
            assert not keeper.running, "the keeper must stop once the lease is lost"
        assert keeper.journal[-1].state is Certainty.LOST
        sequences = [b["sequence"] for b in tenure.paths("/heartbeat")]
        assert sequences == list(range(1, len(sequences) + 1))
        with pytest.raises(LeaseLost):
            keeper.finish("succeeded")
        assert tenure.paths("/report") == []


@pytest.mark.timeout(10)
def test_the_thread_stops_after_finish() -> None:
    tenure = FakeTenure(time.monotonic)
    tenure.heartbeats_wanted = 2
    with TenureClient(API, GATEWAY, transport=tenure.transport()) as client:
        keeper = LeaseKeeper.claim(client, RUN_ID, "runner-7", [], heartbeat_interval_s=0.01)
        with keeper:
            assert tenure.heartbeat_seen.wait(5)
            keeper.finish("succeeded")
            assert not keeper.running
        report = tenure.paths("/report")[0]
        assert report["sequence"] > max(b["sequence"] for b in tenure.paths("/heartbeat"))
