"""The effect gateway's lock (LEASE-1, LEASE-3): who may send an effect, and that a refusal
records nothing.

The real `Gateway.perform` and HTTP front run here with Kafka cut off (tests/support/gateway.py):
every command the gateway would publish is kept, so "nothing recorded" is checked directly. The
end-to-end proof on real processes is tests/e2e/test_gateway_auth.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.common.auth import DEVELOPMENT_MODE_WARNING, Principal
from services.common.contracts import AttemptClaimed, LeaseTakenOver, RecordEffectIntent
from services.effect_gateway import service as gateway_service
from services.effect_gateway.fencing import FencingView, authorize_effect, authorize_verify, fold_fencing
from services.lease_coordinator.domain import attempt_id_for
from services.projections.views import apply_event
from tests.support.gateway import OfflineGateway, effect_body, gateway_app
from tests.support.lease_run import Run

from .test_lease_views import Story

pytestmark = pytest.mark.timeout(30)

RUNNER = Principal("runner:runner-a", "submitter")
OTHER = Principal("svc-b", "submitter")
SAGA = Principal("tenure-saga", "service")
OLGA = Principal("operator:olga", "operator")
KEYS = {"runkey": RUNNER, "otherkey": OTHER, "sagakey": SAGA, "opkey": OLGA}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def run() -> Run:
    r = Run()
    r.claim("runner-a")
    return r


@pytest.fixture
def gateway(run: Run) -> OfflineGateway:
    return OfflineGateway().fold(*run.events)


@pytest.fixture
def http(gateway: OfflineGateway) -> Iterator[TestClient]:
    with TestClient(gateway_app(gateway, KEYS)) as client:
        yield client


def effect(run: Run, key: str = "k-1", **overrides: Any) -> dict[str, Any]:
    return effect_body(run, key, **overrides)


def assert_problem(response: Any, status: int, slug: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["type"] == f"/problems/{slug}"


# --- the rule ------------------------------------------------------------------------------


def test_the_gateway_and_the_projection_agree_on_every_leases_holder_principal_lease_1() -> None:
    """One rule for 'who speaks for this lease' (services.common.contracts.holder_principal)."""
    story = Story()
    fencing: FencingView | None = None
    view: dict[str, Any] | None = None
    issued = 0
    for event in story.run.events:
        fencing = fold_fencing(fencing, event)
        view = apply_event(view, event)
        if isinstance(event, (AttemptClaimed, LeaseTakenOver)):
            issued += 1
            assert fencing.holders[event.attempt_id] == view["lease"]["holderPrincipal"]
    assert fencing is not None and issued == 3
    assert fencing.holders[story.takeover.attempt_id] == "operator:olga"
    assert fencing.holders[story.first.attempt_id] == "runner:runner-a"


def test_authorize_effect_the_holder_and_the_service_role_only_lease_1(run: Run) -> None:
    view = OfflineGateway().fold(*run.events).view(run.run_id)
    assert view is not None and view.attempt_id is not None
    assert authorize_effect(RUNNER, view, view.attempt_id, 1) is None
    assert authorize_effect(SAGA, view, view.attempt_id, 1) is None
    assert authorize_effect(None, view, view.attempt_id, 1) is None  # development mode
    refused = authorize_effect(OTHER, view, view.attempt_id, 1)
    assert refused is not None and refused.slug == "not-lease-holder"
    assert authorize_effect(OLGA, view, view.attempt_id, 1) is not None, "an operator is not the holder"
    unknown = authorize_effect(RUNNER, view, attempt_id_for(run.run_id, 7), 7)
    assert unknown is not None and unknown.slug == "unknown-attempt"
    assert authorize_verify(RUNNER, view) is None and authorize_verify(SAGA, view) is None
    assert authorize_verify(OTHER, view) is not None


# --- over HTTP -----------------------------------------------------------------------------


def test_an_effect_without_a_key_is_401_and_nothing_is_recorded_lease_3(
    http: TestClient, gateway: OfflineGateway, run: Run
) -> None:
    for headers in ({}, bearer("no-such-key"), {"Authorization": "Basic cnVua2V5Og=="}):
        response = http.post("/effects", json=effect(run), headers=headers)
        assert_problem(response, 401, "unauthenticated")
        assert response.headers["www-authenticate"] == "Bearer"
    assert gateway.sent == [], "no intent may be published for an unauthenticated caller"
    assert gateway.tool.requests == [], "nothing may be dispatched"


def test_another_principals_key_is_403_not_lease_holder_and_nothing_is_recorded_lease_1(
    http: TestClient, gateway: OfflineGateway, run: Run
) -> None:
    for key in ("otherkey", "opkey"):
        response = http.post("/effects", json=effect(run), headers=bearer(key))
        assert_problem(response, 403, "not-lease-holder")
        assert response.json()["runId"] == run.run_id
    assert gateway.sent == [] and gateway.tool.requests == []


def test_the_holder_and_the_service_role_may_send_effects_lease_3(
    http: TestClient, gateway: OfflineGateway, run: Run
) -> None:
    mine = http.post("/effects", json=effect(run, "k-holder"), headers=bearer("runkey"))
    assert mine.status_code == 200, mine.text
    assert mine.json()["outcome"] == "committed"
    saga = http.post("/effects", json=effect(run, "k-saga"), headers=bearer("sagakey"))
    assert saga.status_code == 200, saga.text
    intents = [c for c in gateway.sent if isinstance(c, RecordEffectIntent)]
    assert [c.idempotency_key for c in intents] == ["k-holder", "k-saga"]
    assert set(gateway.tool.applied) == {"k-holder", "k-saga"}


def test_after_a_takeover_the_named_holder_acts_and_the_old_holder_is_refused_lease_1(run: Run) -> None:
    old = run.state.lease
    assert old is not None
    run.take_over(new_holder="operator:olga")
    gateway = OfflineGateway().fold(*run.events)
    with TestClient(gateway_app(gateway, KEYS)) as http:
        response = http.post("/effects", json=effect(run, "k-olga"), headers=bearer("opkey"))
        assert response.status_code == 200, response.text
        # The old holder, under the lease it held: its principal does not hold the new one, and
        # its own lease is stale.
        stale = http.post(
            "/effects",
            json=effect(run, "k-old", attemptId=old.attempt_id, epoch=old.epoch),
            headers=bearer("runkey"),
        )
        assert_problem(stale, 409, "stale-epoch")
        usurp = http.post("/effects", json=effect(run, "k-usurp"), headers=bearer("runkey"))
        assert_problem(usurp, 403, "not-lease-holder")
    assert {c.idempotency_key for c in gateway.sent if isinstance(c, RecordEffectIntent)} == {"k-olga"}


def test_an_attempt_the_gateway_never_saw_is_refused_without_recording_lease_3(
    http: TestClient, gateway: OfflineGateway, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gateway_service, "CATCH_UP_WAIT_S", 0.05)
    forged = attempt_id_for(run.run_id, 9)
    response = http.post("/effects", json=effect(run, attemptId=forged, epoch=9), headers=bearer("runkey"))
    assert_problem(response, 409, "unknown-attempt")
    assert gateway.sent == []


def test_verify_needs_a_key_and_the_service_role_or_the_runs_holder_saga_6(
    http: TestClient, gateway: OfflineGateway, run: Run
) -> None:
    body = {"runId": run.run_id, "tool": "ledger", "verifier": "balance", "payload": {}}
    assert_problem(http.post("/verify", json=body), 401, "unauthenticated")
    assert_problem(http.post("/verify", json=body, headers=bearer("otherkey")), 403, "not-lease-holder")
    assert gateway.tool.requests == []
    for key in ("sagakey", "runkey"):
        answer = http.post("/verify", json=body, headers=bearer(key))
        assert answer.status_code == 200, answer.text
        assert answer.json()["result"]["ok"] is True


def test_reads_authenticate_when_keys_are_set_but_health_does_not(http: TestClient, run: Run) -> None:
    assert_problem(http.get(f"/runs/{run.run_id}/fencing"), 401, "unauthenticated")
    read = http.get(f"/runs/{run.run_id}/fencing", headers=bearer("otherkey"))
    assert read.status_code == 200 and read.json()["epoch"] == 1
    health = http.get("/healthz")
    assert health.status_code == 200 and health.json()["developmentMode"] is False
    assert http.get("/readyz").status_code == 200


def test_development_mode_says_so_at_start_up_and_in_healthz(
    gateway: OfflineGateway, run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tenure.auth")
    with TestClient(gateway_app(gateway, {})) as http:
        assert http.get("/healthz").json()["developmentMode"] is True
        # Nothing is authenticated, so nothing is authorized either: anyone may act (localhost only).
        assert http.post("/effects", json=effect(run)).status_code == 200
    assert [r.getMessage() for r in caplog.records if r.name == "tenure.auth"] == [DEVELOPMENT_MODE_WARNING]


def test_healthz_is_liveness_and_readyz_is_503_with_retry_after_while_catching_up(run: Run) -> None:
    gateway = OfflineGateway(caught_up=False).fold(*run.events)
    with TestClient(gateway_app(gateway, KEYS)) as http:
        health = http.get("/healthz")
        assert health.status_code == 200 and health.json()["caughtUp"] is False
        ready = http.get("/readyz")
        assert_problem(ready, 503, "not-ready")
        assert ready.headers["retry-after"] == "1"
        assert ready.json()["checks"]["caughtUp"]["ok"] is False
        assert ready.json()["notReady"] == ["caughtUp"]
        refused = http.post("/effects", json=effect(run), headers=bearer("runkey"))
        assert_problem(refused, 503, "unavailable")
        assert refused.headers["retry-after"] == "1"
        gateway.catch_up()
        assert http.get("/readyz").status_code == 200
    assert gateway.sent == []


def test_authentication_comes_before_validation(http: TestClient, gateway: OfflineGateway, run: Run) -> None:
    """A caller without a key learns nothing, not even which of its fields are wrong."""
    response = http.post("/effects", json=effect(run, epoch=2**63, runId="nope"))
    assert_problem(response, 401, "unauthenticated")
    assert gateway.sent == []
