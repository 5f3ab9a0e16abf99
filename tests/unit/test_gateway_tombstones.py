"""The effect gateway refuses a tombstoned action (WD-5 level 2, ACTION_TOMBSTONED).

The semantic watchdog tombstones the action a run kept looping through; the orchestrator then
refuses its proposals, and the gateway refuses any effect named by it, so that a runner calling
POST /effects directly cannot go round the orchestrator. The real `Gateway.perform` and HTTP
front run here with Kafka cut off (tests/support/gateway.py): "nothing recorded or dispatched"
is checked on what the gateway would publish and on what the tool was sent. The end-to-end proof
is tests/e2e/test_watchdog_ladder.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.common.auth import Principal
from services.common.contracts import InterventionIssued, RecordEffectIntent
from services.common.ids import action_hash, run_id_for
from services.effect_gateway.fencing import effect_action_hashes, fold_tombstones, tombstoned_action
from tests.support.gateway import OfflineGateway, effect_body, gateway_app
from tests.support.lease_run import Run

pytestmark = pytest.mark.timeout(30)

RUNNER = Principal("runner:runner-a", "submitter")
SAGA = Principal("tenure-saga", "service")
KEYS = {"runkey": RUNNER, "sagakey": SAGA, "otherkey": Principal("svc-b", "submitter")}
PAYLOAD = {"account": "a", "amount": 1}


def intervention(run_id: str, level: int, action: str, n: int = 1) -> InterventionIssued:
    return InterventionIssued(
        event_id=f"wde-{n}",
        run_id=run_id,
        version=10 + n,
        occurred_at=1_767_225_600_000,
        causation_id=f"obs-{n}",
        correlation_id=run_id,
        actor="runner:runner-a",
        intervention_id=f"itv-{n}",
        detection_id=f"det-{n}",
        turn=n,
        level=level,
        code={1: "STATE_OSCILLATION_DETECTED", 2: "ROLLBACK_REQUESTED", 3: "ERR_SEMANTIC_DEADLOCK"}[level],
        detector="cycle",
        action_hash=action,
        period=2,
        returned_to_step=1,
        checkpoint_step=-1,
        checkpoint_turn=0,
        checkpoint_state_hash="",
        truncated_steps=(1, 2),
        rollbacks_used=1 if level >= 2 else 0,
        rollback_budget=1,
        message="loop",
    )


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
    return effect_body(run, key, **{"payload": PAYLOAD, **overrides})


def assert_tombstoned(response: Any, gateway: OfflineGateway, hit: str) -> None:
    assert response.status_code == 409, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["type"] == "/problems/action-tombstoned" and body["code"] == "ACTION_TOMBSTONED"
    assert body["actionHash"] == hit
    assert not [c for c in gateway.sent if isinstance(c, RecordEffectIntent)], "no intent was recorded"
    assert not [r for r in gateway.tool.requests if r.method == "POST"], "nothing was dispatched"


# --- the rule -----------------------------------------------------------------------------------


def test_levels_2_and_3_tombstone_their_action_level_1_does_not_wd_5() -> None:
    run_id = run_id_for("acme", "tombstones")
    masked = fold_tombstones(frozenset(), intervention(run_id, 1, "a" * 16))
    assert masked == frozenset()
    masked = fold_tombstones(masked, intervention(run_id, 2, "b" * 16))
    masked = fold_tombstones(masked, intervention(run_id, 3, "c" * 16))
    assert masked == {"b" * 16, "c" * 16}
    assert fold_tombstones(masked, intervention(run_id, 2, "")) == masked


def test_an_effect_goes_by_the_sagas_name_and_the_gateways_own_wd_4() -> None:
    names = effect_action_hashes("env", "vm.provision", {"name": "web"})
    # The saga names a catalog step by its tool name, which is the gateway operation.
    assert action_hash("vm.provision", {"name": "web"}) in names
    assert action_hash("env/vm.provision", {"name": "web"}) in names
    assert "f" * 16 in effect_action_hashes("env", "x", {}, "f" * 16)
    assert tombstoned_action(frozenset({"f" * 16}), names) is None


# --- over HTTP ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tombstone", "extra"),
    [
        (action_hash("credit", PAYLOAD), {}),  # the action as a saga step of that name
        (action_hash("ledger/credit", PAYLOAD), {}),  # the gateway's own name for it
        ("0123456789abcdef", {"actionHash": "0123456789abcdef"}),  # the hash the caller gives
    ],
)
def test_wd_5_a_tombstoned_action_is_refused_and_nothing_is_recorded_or_dispatched(
    http: TestClient, gateway: OfflineGateway, run: Run, tombstone: str, extra: dict[str, Any]
) -> None:
    gateway.fold_watchdog(intervention(run.run_id, 2, tombstone))
    for key in ("runkey", "sagakey"):  # the service role is refused too: a tombstone is no fence
        response = http.post(
            "/effects", json=effect(run, **extra), headers={"Authorization": f"Bearer {key}"}
        )
        assert_tombstoned(response, gateway, tombstone)


def test_other_actions_and_other_runs_are_not_refused(
    http: TestClient, gateway: OfflineGateway, run: Run
) -> None:
    gateway.fold_watchdog(intervention(run.run_id, 2, action_hash("credit", {"account": "b", "amount": 1})))
    gateway.fold_watchdog(intervention(run_id_for("acme", "another run"), 2, action_hash("credit", PAYLOAD)))
    answer = http.post("/effects", json=effect(run), headers={"Authorization": "Bearer runkey"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "committed"


def test_the_auth_rules_come_before_the_tombstone(
    http: TestClient, gateway: OfflineGateway, run: Run
) -> None:
    gateway.fold_watchdog(intervention(run.run_id, 2, action_hash("credit", PAYLOAD)))
    assert http.post("/effects", json=effect(run)).status_code == 401
    other = http.post("/effects", json=effect(run), headers={"Authorization": "Bearer otherkey"})
    assert other.status_code == 403 and other.json()["type"] == "/problems/not-lease-holder"
    assert gateway.sent == []


def test_an_effect_settled_before_the_tombstone_is_answered_as_before(
    http: TestClient, gateway: OfflineGateway, run: Run
) -> None:
    auth = {"Authorization": "Bearer runkey"}
    first = http.post("/effects", json=effect(run), headers=auth)
    assert first.status_code == 200
    # The log records the effect as committed (as the coordinator's events would fold it).
    intent = next(c for c in gateway.sent if isinstance(c, RecordEffectIntent))
    view = gateway.view(run.run_id)
    assert view is not None
    gateway._views[run.run_id] = replace(view, effects={**view.effects, intent.effect_id: "committed"})
    gateway.fold_watchdog(intervention(run.run_id, 2, action_hash("credit", PAYLOAD)))
    posts = len([r for r in gateway.tool.requests if r.method == "POST"])
    replay = http.post("/effects", json=effect(run), headers=auth)
    assert replay.status_code == 200 and replay.json()["replayed"] is True
    assert len([r for r in gateway.tool.requests if r.method == "POST"]) == posts, "nothing dispatched"
    fresh = http.post("/effects", json=effect(run, key="k-2"), headers=auth)
    assert fresh.status_code == 409 and fresh.json()["code"] == "ACTION_TOMBSTONED"


def test_a_malformed_action_hash_is_422(http: TestClient, gateway: OfflineGateway, run: Run) -> None:
    for bad in ("XYZ", "0" * 17, 7):
        response = http.post(
            "/effects", json=effect(run, actionHash=bad), headers={"Authorization": "Bearer runkey"}
        )
        assert response.status_code == 422, response.text
    assert gateway.sent == []
