"""The runner SDK: a stop request reaches runner code and is confirmed through the SDK (EXE-7),
every retry waits a full-jitter backoff (BRK-3), and effects carry the runner's API key to the
gateway.

Against the fake coordinator and gateway of runner_fakes.py; the jitter draw and the sleeps are
injected, so each wait is pinned to `full_jitter_s` of the draw.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.common.backoff import full_jitter_s
from services.runner_sdk import (
    Certainty,
    JournalKind,
    Lease,
    LeaseKeeper,
    LeaseLost,
    RenewalAnswer,
    RequestRejected,
    StopRequest,
    TenureClient,
    TenureUnavailable,
    TrajectoryClient,
    UnexpectedResponse,
)
from tests.unit.runner_fakes import (
    API,
    ATTEMPT_ID,
    EPOCH,
    GATEWAY,
    RUN_ID,
    SERVER_OFFSET_MS,
    FakeClock,
    FakeTenure,
    problem,
)

BASE_S = 0.1  # the keeper's default retry base (BRK-3: T_0 = 100 ms)
INTERVAL_S = 20  # the fake's heartbeat interval: the cap of a renewal's retry wait


class Draws:
    """A pinned jitter source: returns the given draws in order and counts how many were taken."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)
        self.taken: list[float] = []

    def __call__(self) -> float:
        value = self.values[len(self.taken) % len(self.values)]
        self.taken.append(value)
        return value


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


def _keeper(client: TenureClient, clock: FakeClock, **kwargs: Any) -> LeaseKeeper:
    """A claimed lease (90 s, heartbeat 20 s, margin 30 s), renewed by hand: no thread."""
    return LeaseKeeper.claim(client, RUN_ID, "runner-7", ["checkpoint-v1"], clock=clock, **kwargs)


def _lease() -> Lease:
    return Lease(RUN_ID, ATTEMPT_ID, 1, "lease-1", EPOCH, 0, 90, 20, 0, {})


def _answering(response: httpx.Response) -> TenureClient:
    return TenureClient(API, GATEWAY, transport=httpx.MockTransport(lambda request: response))


def _renewal(**extra: Any) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "attemptId": ATTEMPT_ID,
            "epoch": EPOCH,
            "sequence": 4,
            "expiresAt": 91_000,
            "serverTime": 1_000,
            "certainty": "active",
            "runStatus": "cancelling",
            **extra,
        },
    )


# --- EXE-7: the stop request reaches the runner ------------------------------------------------


def test_a_renewal_answer_carries_the_stop_request_EXE_7() -> None:
    with _answering(_renewal(stopRequested=True, stopKind="cancel", stopGraceUntil=31_000)) as c:
        answer = c.heartbeat(_lease(), 4)
    assert (answer.stop_requested, answer.stop_kind, answer.stop_grace_until) == (True, "cancel", 31_000)
    assert answer.run_status == "cancelling" and answer.replayed is False


def test_a_renewal_answer_without_stop_fields_means_no_stop_and_bad_ones_break_the_contract() -> None:
    with _answering(_renewal(replayed=True)) as c:
        answer = c.heartbeat(_lease(), 4)
    assert answer == RenewalAnswer(ATTEMPT_ID, EPOCH, 4, 91_000, 1_000, "active", "cancelling", replayed=True)
    assert (answer.stop_requested, answer.stop_kind, answer.stop_grace_until) == (False, None, None)
    for bad in ({"stopRequested": "yes"}, {"stopKind": 7}, {"stopGraceUntil": True}):
        with _answering(_renewal(**bad)) as c, pytest.raises(UnexpectedResponse):
            c.heartbeat(_lease(), 4)


@pytest.mark.parametrize("outcome", ["cancelled", "preparation_failed"])
def test_the_client_reports_every_outcome_the_api_accepts_EXE_7_EXE_11(outcome: str) -> None:
    seen: list[dict[str, Any]] = []

    def capture(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"runId": RUN_ID, "status": outcome})

    with TenureClient(API, GATEWAY, transport=httpx.MockTransport(capture)) as c:
        view = c.report(_lease(), 5, outcome, "E", "d")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="outcome must be one of"):
            c.report(_lease(), 6, "cancel")  # type: ignore[arg-type]
    assert view["status"] == outcome and len(seen) == 1
    assert seen[0] == {
        "leaseEpoch": EPOCH,
        "sequence": 5,
        "outcome": outcome,
        "errorCode": "E",
        "detail": "d",
    }


def test_the_keeper_surfaces_a_stop_request_once_and_the_runner_confirms_it_EXE_7(
    client: TenureClient, tenure: FakeTenure, clock: FakeClock
) -> None:
    told: list[StopRequest] = []
    keeper = _keeper(client, clock, on_stop_requested=told.append)
    clock.advance(20)
    keeper.renew_once()
    assert not keeper.stop_requested and keeper.stop_request is None
    assert keeper.wait_for_stop_request(0) is None

    clock.advance(20)
    sent_at = clock()
    grace_until = tenure.server_now() + 30_000
    tenure.stop = {"stopRequested": True, "stopKind": "cancel", "stopGraceUntil": grace_until}
    assert keeper.renew_once() is Certainty.VALID, "a stop request is not a lost lease"
    stop = keeper.stop_request
    assert stop is not None and keeper.stop_requested
    assert (stop.kind, stop.grace_until, stop.sequence, stop.run_status) == (
        "cancel",
        grace_until,
        2,
        "cancelling",
    )
    # The grace period on the coordinator's clock, as a local bound that never overestimates it.
    assert stop.confirm_by == pytest.approx(sent_at + 30)
    assert stop.confirm_by <= (grace_until - SERVER_OFFSET_MS) / 1000
    assert keeper.wait_for_stop_request(0) == stop
    entry = next(e for e in keeper.journal if e.kind is JournalKind.STOP_REQUESTED)
    assert entry.attributes["stopKind"] == "cancel" and "cancel" in entry.reason

    clock.advance(20)
    keeper.renew_once()  # asked again: the runner is told once
    assert told == [stop]

    view = keeper.finish("cancelled", detail="stopped on request")
    assert view == {"runId": RUN_ID, "status": "cancelled"}
    assert tenure.paths("/report")[-1]["outcome"] == "cancelled"
    assert keeper.state is Certainty.RELEASED


def test_a_cancelled_report_without_a_stop_is_refused_and_the_lease_stays_valid_EXE_7(
    client: TenureClient, tenure: FakeTenure, clock: FakeClock
) -> None:
    keeper = _keeper(client, clock)
    with pytest.raises(RequestRejected):
        keeper.finish("cancelled")
    assert keeper.state is Certainty.VALID, "a definite 4xx applied nothing"
    clock.advance(20)
    assert keeper.renew_once() is Certainty.VALID
    with pytest.raises(ValueError, match="outcome must be one of"):
        keeper.finish("done")  # type: ignore[arg-type]


def test_preparation_failed_is_reported_through_the_keeper_EXE_11(
    client: TenureClient, tenure: FakeTenure, clock: FakeClock
) -> None:
    keeper = _keeper(client, clock)
    view = keeper.finish("preparation_failed", "IMAGE_PULL", "no such image")
    assert view["status"] == "preparation_failed"
    assert tenure.paths("/report") == [
        {
            "leaseEpoch": EPOCH,
            "sequence": 1,
            "outcome": "preparation_failed",
            "errorCode": "IMAGE_PULL",
            "detail": "no such image",
        }
    ]
    assert keeper.state is Certainty.RELEASED


@pytest.mark.timeout(10)
def test_the_keeper_thread_calls_back_on_a_stop_request_EXE_7() -> None:
    tenure = FakeTenure(time.monotonic)
    told: list[tuple[StopRequest, str]] = []
    called = threading.Event()

    def on_stop(stop: StopRequest) -> None:
        told.append((stop, threading.current_thread().name))
        called.set()

    with TenureClient(API, GATEWAY, transport=tenure.transport()) as client:
        keeper = LeaseKeeper.claim(
            client, RUN_ID, "runner-7", [], heartbeat_interval_s=0.01, on_stop_requested=on_stop
        )
        with keeper:
            tenure.stop = {"stopRequested": True, "stopKind": "deadline", "stopGraceUntil": None}
            stop = keeper.wait_for_stop_request(5)
            assert stop is not None and stop.kind == "deadline" and stop.confirm_by is None
            assert called.wait(5)
            keeper.finish("failed", "DEADLINE_EXCEEDED")
        assert told[0][0] == stop and told[0][1].startswith("tenure-lease-keeper-")
        assert not keeper.running


# --- BRK-3: every retry waits a full-jitter backoff --------------------------------------------


def test_renewal_retries_wait_full_jitter_with_the_pinned_draw_BRK_3(
    client: TenureClient, tenure: FakeTenure, clock: FakeClock
) -> None:
    draws = Draws(0.5, 0.0, 0.9, 0.25)
    keeper = _keeper(client, clock, jitter=draws)
    clock.advance(20)
    keeper.renew_once()
    assert keeper.next_renewal_at == pytest.approx(clock() + INTERVAL_S), "confirmed: the regular cadence"
    assert draws.taken == []

    tenure.heartbeat_mode = "unavailable"  # answers at once, so the waits are the backoff alone
    clock.advance(20)
    waits = []
    for _ in range(8):
        assert keeper.renew_once() is Certainty.JEOPARDY
        waits.append(keeper.next_renewal_at - clock())
        clock.now = keeper.next_renewal_at
    expected = [full_jitter_s(k, BASE_S, INTERVAL_S, d) for k, d in enumerate(draws.taken)]
    assert len(draws.taken) == 8
    assert waits == pytest.approx(expected)
    assert max(waits) < INTERVAL_S, "a retry never waits longer than the regular cadence"
    assert len(set(waits)) > 1, "not a fixed retry interval"

    tenure.heartbeat_mode = "ok"
    assert keeper.renew_once() is Certainty.VALID
    assert keeper.next_renewal_at == pytest.approx(clock() + INTERVAL_S)
    tenure.heartbeat_mode = "unavailable"
    clock.advance(20)
    keeper.renew_once()
    # A confirmation resets the backoff: the next streak starts again at the base.
    assert keeper.next_renewal_at - clock() == pytest.approx(
        full_jitter_s(0, BASE_S, INTERVAL_S, draws.taken[-1])
    )


def test_a_timed_out_renewal_is_retried_after_a_jittered_wait_not_the_next_interval_BRK_3(
    client: TenureClient, tenure: FakeTenure, clock: FakeClock
) -> None:
    keeper = _keeper(client, clock, jitter=Draws(0.5))
    tenure.heartbeat_mode = "timeout"
    clock.advance(20)
    keeper.renew_once()
    assert keeper.next_renewal_at - clock() == pytest.approx(0.05)  # 0.5 * 100 ms


def test_an_unknown_report_is_retried_with_full_jitter_and_the_same_sequence_BRK_3(
    client: TenureClient, tenure: FakeTenure, clock: FakeClock
) -> None:
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(seconds)
        if len(slept) == 3:
            tenure.report_mode = "ok"  # the coordinator answers again

    draws = Draws(0.5, 0.9, 0.1)
    keeper = _keeper(client, clock, jitter=draws, sleep=sleep)
    tenure.report_mode = "unavailable"
    view = keeper.finish("failed", "TOOL_BROKEN", "ledger down", retries=5)
    assert view == {"runId": RUN_ID, "status": "failed"}
    assert [b["sequence"] for b in tenure.paths("/report")] == [1, 1, 1, 1], "a retry keeps the sequence"
    assert slept == pytest.approx(
        [full_jitter_s(k, BASE_S, INTERVAL_S, d) for k, d in enumerate(draws.taken)]
    )
    assert slept == pytest.approx([0.05, 0.18, 0.04])
    assert keeper.state is Certainty.RELEASED


def test_report_retries_end_when_they_run_out_or_the_lease_is_lost_BRK_3(
    client: TenureClient, tenure: FakeTenure, clock: FakeClock
) -> None:
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(seconds)

    keeper = _keeper(client, clock, jitter=Draws(0.0), sleep=sleep)
    tenure.report_mode = "unavailable"
    with pytest.raises(TenureUnavailable):
        keeper.finish("failed", "E", retries=2)
    assert len(tenure.paths("/report")) == 3 and slept == [0.0, 0.0]

    # No heartbeat goes out while the report is pending, so the proven lease runs out; the
    # retries stop there instead of reporting under a lease that may belong to someone else.
    slow = _keeper(client, clock, jitter=Draws(0.999), sleep=sleep)
    bound = slow.valid_until
    assert bound is not None
    sent = len(tenure.paths("/report"))
    with pytest.raises(LeaseLost):
        slow.finish("failed", "E", retries=1_000)
    assert clock() >= bound and slow.state is Certainty.LOST
    assert max(slept) <= INTERVAL_S
    assert len(tenure.paths("/report")) - sent < 20, "the waits grew; the retries ended at the bound"


def _trajectory_view(status: str) -> dict[str, Any]:
    step = {"index": 0, "tool": "vm.provision", "status": status, "dispatch": 1, "idempotencyKey": "k0"}
    return {"runId": RUN_ID, "status": "running", "steps": [step]}


def test_waiting_for_a_step_polls_with_full_jitter_BRK_3() -> None:
    answers = iter(["pending", "dispatched", "dispatched", "dispatched", "committed"])
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=_trajectory_view(next(answers)))

    slept: list[float] = []
    draws = Draws(0.5, 0.999, 0.0, 0.3)
    with TrajectoryClient(
        API, api_key="runner-key", transport=httpx.MockTransport(handle), jitter=draws, sleep=slept.append
    ) as trajectories:
        outcome = trajectories.wait_for_step(RUN_ID, 0, 1, poll_s=0.2, max_poll_s=1.0)
    assert outcome.committed and len(seen) == 5
    assert seen[0].headers["Authorization"] == "Bearer runner-key"
    assert slept == pytest.approx([full_jitter_s(k, 0.2, 1.0, d) for k, d in enumerate(draws.taken)])
    assert slept == pytest.approx([0.1, 0.3996, 0.0, 0.3])


# --- the gateway sees the runner's API key ------------------------------------------------------


def test_effects_carry_the_runners_api_key_to_the_gateway(
    client: TenureClient, tenure: FakeTenure, clock: FakeClock
) -> None:
    """The gateway authenticates like the API (401 without a key, 403 for a non-holder)."""
    client.effect(_lease(), "step-1", "ledger", "credit", {"amount": 1})
    keeper = _keeper(client, clock)
    keeper.send_effect("step-2", "ledger", "credit", {"amount": 2})
    effects = [(host, h) for host, path, h in tenure.headers if path == "/effects"]
    assert [host for host, _ in effects] == ["gateway.tenure.test"] * 2
    assert all(h["authorization"] == "Bearer runner-key" for _, h in effects)


@pytest.mark.parametrize(("status", "slug"), [(401, "unauthenticated"), (403, "not-lease-holder")])
def test_a_gateway_auth_refusal_is_a_rejection_not_a_lost_lease(status: int, slug: str) -> None:
    seen: list[httpx.Request] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return problem(status, slug, "who are you")

    transport = httpx.MockTransport(refuse)
    with (
        TenureClient(API, GATEWAY, api_key="other-key", transport=transport) as c,
        pytest.raises(RequestRejected) as refused,
    ):
        c.effect(_lease(), "step-1", "ledger", "credit", {})
    assert refused.value.status == status and refused.value.problem_type == slug
    assert seen[0].headers["Authorization"] == "Bearer other-key"
