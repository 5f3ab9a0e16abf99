"""The runner- and operator-facing routes of the semantic watchdog (issue 12, WD-1, WD-5).

The API runs over tests/support/api_harness.py: the real app, routes and views, the real pure
cores (lease coordinator, saga orchestrator, watchdog) deciding, no broker. A runner reports a
2-state loop as its own observations; the ladder must reach it on its next answers (level 1 on
the refused proposal, the accepted one and the heartbeat), tombstone the action (level 2) and
end in a semantic deadlock (level 3); the operator sees every rung with its evidence.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.command_api.problems import CATALOG, WATCHDOG_REJECTION_PROBLEMS
from services.command_api.routes_watchdog import THRESHOLD_BOUNDS
from services.common.contracts import (
    AcknowledgeRollback,
    ConfigureWatchdog,
    ObserveStep,
    WatchdogRejectionCode,
)
from services.common.ids import action_hash
from services.common.topics import PROGRESS_OBSERVATIONS
from services.watchdog.domain import BOUNDS
from tests.support.api_harness import InMemoryTenure, api_client

pytestmark = pytest.mark.timeout(60)

KEYS = "rita-key=rita:submitter,sam-key=sam:submitter,olga-key=olga:operator"
RITA = {"Authorization": "Bearer rita-key"}
SAM = {"Authorization": "Bearer sam-key"}
OLGA = {"Authorization": "Bearer olga-key"}
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
# The loop: provision "a" leaves the environment in state A, provision "b" in state B, and back.
A, B = {"name": "a"}, {"name": "b"}
STATE = {"a": "a" * 64, "b": "b" * 64}


@pytest.fixture()
def api(tmp_path: Path) -> Any:
    # A generous deadline: the harness decides at once, but a loaded CI machine may be slow.
    with api_client(tmp_path, api_keys=KEYS, decision_timeout_s=5.0) as pair:
        yield pair


class Runner:
    """A claimed run with an open trajectory, driven over HTTP by its holder (rita)."""

    def __init__(self, client: httpx.Client, key: str = "run-1") -> None:
        self.client = client
        created = client.post(
            "/runs",
            headers={**RITA, "Idempotency-Key": key},
            json={"tenant": "acme", "executionSpec": {"k": key}, "timeoutSeconds": 600},
        )
        assert created.status_code == 201, created.text
        self.run_id = str(created.json()["runId"])
        grant = client.post(f"/runs/{self.run_id}/attempts", headers=RITA, json={"runnerId": "r-1"})
        assert grant.status_code == 201, grant.text
        self.lease = {"attemptId": grant.json()["attemptId"], "leaseEpoch": grant.json()["epoch"]}
        self.sequence = 0
        self.step = 0

    def start_trajectory(self) -> None:
        started = self.client.post(f"/runs/{self.run_id}/trajectory", headers=RITA, json=self.lease)
        assert started.status_code == 201, started.text

    def observe(self, params: dict[str, Any], headers: dict[str, str] = RITA, **extra: Any) -> httpx.Response:
        self.step += 1
        body = {
            **self.lease,
            "stepSeq": self.step,
            "tool": "vm.provision",
            "arguments": params,
            "stateHash": STATE[params["name"]],
            "summary": f"provisioned {params['name']}",
            **extra,
        }
        return self.client.post(f"/runs/{self.run_id}/observations", headers=headers, json=body)

    def propose(self, params: dict[str, Any]) -> httpx.Response:
        body = {**self.lease, "tool": "vm.provision", "params": params}
        return self.client.post(f"/runs/{self.run_id}/trajectory/steps", headers=RITA, json=body)

    def heartbeat(self) -> dict[str, Any]:
        self.sequence += 1
        body = {"leaseEpoch": self.lease["leaseEpoch"], "sequence": self.sequence}
        answer = self.client.post(f"/attempts/{self.lease['attemptId']}/heartbeat", headers=RITA, json=body)
        assert answer.status_code == 200, answer.text
        result: dict[str, Any] = answer.json()
        return result

    def watchdog(self) -> dict[str, Any]:
        view = self.client.get(f"/runs/{self.run_id}/watchdog", headers=RITA)
        assert view.status_code == 200, view.text
        result: dict[str, Any] = view.json()
        return result


def _problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["type"] == f"/problems/{slug}", body
    return body


# --- observations (WD-1) -----------------------------------------------------------------------


def test_an_observation_of_the_lease_holder_is_published_on_the_runs_partition_wd_1(api: Any) -> None:
    client, tenure = api
    runner = Runner(client)
    answer = runner.observe(A, metrics=[3, 0.5])
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert body["status"] == "accepted" and body["watchdog"] is None and body["stepSeq"] == 1
    assert answer.headers["location"] == f"/runs/{runner.run_id}/watchdog"
    [sent] = tenure.commands_of(ObserveStep)
    assert sent.command_id == body["commandId"] and sent.source == "runner" and sent.actor == "rita"
    assert sent.action_hash == action_hash("vm.provision", A) == body["actionHash"]
    assert sent.state_hash == STATE["a"] and sent.metrics == (3.0, 0.5) and sent.mutating
    view = runner.watchdog()
    assert view["status"] == "watching" and view["turn"] == 1 and view["version"] == 2
    [seen] = view["observations"]
    assert seen["commandId"] == body["commandId"] and seen["stateHash"] == STATE["a"]
    assert RFC3339.fullmatch(seen["at"]) and RFC3339.fullmatch(view["updatedAt"])
    assert view["configurations"][0]["origin"] == "deployment"


def test_an_observation_by_anyone_but_the_holder_records_nothing_wd_1(api: Any) -> None:
    client, tenure = api
    runner = Runner(client)
    _problem(runner.observe(A, headers=SAM), 403, "not-lease-holder")
    _problem(runner.observe(A, headers=OLGA), 403, "not-lease-holder")
    stale = {**runner.lease, "leaseEpoch": 2, "stepSeq": 1, "tool": "t", "arguments": {}}
    _problem(
        client.post(f"/runs/{runner.run_id}/observations", headers=RITA, json=stale), 409, "unknown-attempt"
    )
    assert tenure.commands_of(ObserveStep) == []


@pytest.mark.parametrize(
    "changes",
    [
        {"arguments": None},  # neither arguments nor an actionHash
        {"actionHash": "0" * 16},  # not the hash of tool and arguments
        {"arguments": None, "actionHash": "XYZ"},
        {"stateHash": "abc"},
        {"metrics": ["3"]},
        {"metrics": [True]},
        {"metrics": [1.0] * 33},
        {"metrics": [1e300]},
        {"errorKind": "fatal"},
        {"summary": "x" * 2049},
        {"stepSeq": -1},
        {"polling": 1},
        {"unknown": 1},
    ],
)
def test_a_malformed_observation_is_422_and_nothing_is_published_wd_1(api: Any, changes: Any) -> None:
    client, tenure = api
    runner = Runner(client)
    body = {**runner.lease, "stepSeq": 1, "tool": "vm.provision", "arguments": A, **changes}
    body = {k: v for k, v in body.items() if v is not None}
    _problem(
        client.post(f"/runs/{runner.run_id}/observations", headers=RITA, json=body), 422, "validation-failed"
    )
    assert tenure.commands_of(ObserveStep) == []


def test_an_action_hash_may_stand_for_the_arguments_wd_4(api: Any) -> None:
    client, tenure = api
    runner = Runner(client)
    digest = action_hash("vm.provision", A)
    answer = runner.observe(A, arguments=None, actionHash=digest)
    assert answer.status_code == 202, answer.text
    assert tenure.commands_of(ObserveStep)[0].action_hash == digest


def test_an_observation_repeated_under_its_key_is_answered_again_and_a_changed_one_is_409(api: Any) -> None:
    client, tenure = api
    runner = Runner(client)
    body = {**runner.lease, "stepSeq": 1, "tool": "vm.provision", "arguments": A, "stateHash": STATE["a"]}
    url = f"/runs/{runner.run_id}/observations"
    first = client.post(url, headers={**RITA, "Idempotency-Key": "obs-1"}, json=body)
    again = client.post(url, headers={**RITA, "Idempotency-Key": "obs-1"}, json=body)
    assert first.status_code == again.status_code == 202
    assert again.json()["commandId"] == first.json()["commandId"] and again.json()["replayed"] is True
    assert len(tenure.commands_of(ObserveStep)) == 1
    changed = client.post(
        url, headers={**RITA, "Idempotency-Key": "obs-1"}, json={**body, "stateHash": "c" * 64}
    )
    assert _problem(changed, 409, "idempotency-key-conflict")["fields"] == ["stateHash"]
    assert len(tenure.commands_of(ObserveStep)) == 1


def test_the_watchdog_view_of_a_run_without_one_is_404(api: Any) -> None:
    client, _ = api
    runner = Runner(client)
    _problem(client.get(f"/runs/{runner.run_id}/watchdog", headers=RITA), 404, "watchdog-not-found")
    _problem(client.get("/runs/run_nope/watchdog", headers=RITA), 404, "run-not-found")


# --- the ladder, delivered (WD-5) ---------------------------------------------------------------


def test_wd_5_level_1_reaches_the_runner_on_its_refused_proposal_its_next_and_its_heartbeat(api: Any) -> None:
    client, _ = api
    runner = Runner(client)
    runner.start_trajectory()
    assert runner.heartbeat()["watchdog"] is None
    for params in (A, B):
        assert runner.observe(params).json()["watchdog"] is None
    looped = runner.observe(A)  # back in state A: a period-2 orbit
    assert looped.status_code == 202
    view = runner.watchdog()
    assert view["status"] == "interrupted"
    [rung] = view["interventions"]
    assert rung["level"] == 1 and rung["code"] == "STATE_OSCILLATION_DETECTED"
    assert rung["period"] == 2 and rung["returnedToStep"] == 1
    assert rung["actionHash"] == action_hash("vm.provision", A) and RFC3339.fullmatch(rung["issuedAt"])
    evidence = rung["evidence"]
    assert evidence["detector"] == "cycle" and STATE["a"] in evidence["repeatedHashes"]
    assert [w["stepSeq"] for w in evidence["window"]] == [1, 2]  # the ring before step 3
    # Its next proposal of the looping action is refused, with the intervention in the problem.
    refused = _problem(runner.propose(A), 409, "state-oscillation-detected")
    assert refused["code"] == "STATE_OSCILLATION_DETECTED"
    delivered = refused["watchdog"]
    assert delivered["interventionId"] == rung["interventionId"] and delivered["period"] == 2
    assert delivered["returnedToStep"] == 1 and delivered["actionHash"] == rung["actionHash"]
    assert "SEMANTIC_WATCHDOG_INTERRUPT" in delivered["message"] and "evidence" not in delivered
    # A different action is accepted, and its answer still carries the interrupt in force.
    accepted = runner.propose(B)
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["watchdog"]["interventionId"] == rung["interventionId"]
    beat = runner.heartbeat()
    assert beat["watchdog"]["code"] == "STATE_OSCILLATION_DETECTED" and beat["watchdog"]["level"] == 1


def test_wd_5_level_2_tombstones_the_action_and_waits_for_the_rollback(api: Any) -> None:
    client, tenure = api
    runner = Runner(client)
    runner.start_trajectory()
    for params in (A, B, A, B):  # a second violation within the ladder epoch
        assert runner.observe(params).status_code == 202
    view = runner.watchdog()
    assert view["status"] == "rollback-requested" and [r["level"] for r in view["interventions"]] == [1, 2]
    rollback = view["interventions"][-1]
    assert rollback["code"] == "ROLLBACK_REQUESTED" and rollback["truncatedSteps"] == [1, 2, 3, 4]
    assert rollback["checkpointStep"] == -1 and view["pendingRollback"] == rollback["interventionId"]
    tombstoned = action_hash("vm.provision", B)
    assert view["tombstones"] == [tombstoned] and view["rollbacks"] == {"used": 1, "budget": 1}
    refused = _problem(runner.propose(B), 409, "action-tombstoned")
    assert refused["code"] == "ACTION_TOMBSTONED" and refused["watchdog"]["actionHash"] == tombstoned
    assert refused["watchdog"]["truncatedSteps"] == [1, 2, 3, 4]
    assert runner.heartbeat()["watchdog"]["code"] == "ROLLBACK_REQUESTED"
    # The wrong intervention is not the rollback awaited; the right one is acknowledged once.
    ack = {**runner.lease, "interventionId": view["interventions"][0]["interventionId"], "checkpointStep": -1}
    url = f"/runs/{runner.run_id}/watchdog/rollback"
    _problem(client.post(url, headers=RITA, json=ack), 409, "no-rollback-pending")
    _problem(client.post(url, headers=SAM, json=ack), 403, "not-lease-holder")
    ack["interventionId"] = rollback["interventionId"]
    done = client.post(url, headers=RITA, json={**ack, "restoredStateHash": "0" * 64})
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "rolled-back" and done.json()["pendingRollback"] is None
    acknowledged = done.json()["interventions"][-1]
    assert RFC3339.fullmatch(acknowledged["acknowledgedAt"]) and acknowledged["acknowledgedBy"] == "rita"
    again = client.post(url, headers=RITA, json={**ack, "restoredStateHash": "0" * 64})
    assert again.status_code == 200 and len(tenure.commands_of(AcknowledgeRollback)) == 2  # one refused
    assert runner.heartbeat()["watchdog"] is None, "nothing is pending once the rollback is acknowledged"


def test_wd_5_level_3_is_a_semantic_deadlock_that_unwinds_the_trajectory(api: Any) -> None:
    client, _ = api
    runner = Runner(client)
    runner.start_trajectory()
    for params in (A, B, A, B, A, B, A):
        assert runner.observe(params).status_code == 202
    view = runner.watchdog()
    assert view["status"] == "deadlocked" and view["terminal"] is True
    assert [r["code"] for r in view["interventions"]] == [
        "STATE_OSCILLATION_DETECTED",
        "ROLLBACK_REQUESTED",
        "ERR_SEMANTIC_DEADLOCK",
    ]
    assert runner.heartbeat()["watchdog"]["code"] == "ERR_SEMANTIC_DEADLOCK"
    trajectory = client.get(f"/runs/{runner.run_id}/trajectory", headers=RITA).json()
    assert trajectory["watchdog"]["semanticDeadlock"] is True
    assert trajectory["watchdog"]["intervention"]["code"] == "ERR_SEMANTIC_DEADLOCK"
    assert trajectory["status"] == "rolled-back", "nothing committed: the unwind is immediate"
    assert trajectory["decisions"][-1]["gate"] == "semantic-watchdog"
    # Observations after the deadlock are refused by the watchdog; nothing changes the view.
    assert runner.observe(B).status_code == 202
    assert runner.watchdog()["version"] == view["version"]


def test_the_trajectory_view_renders_the_interrupt_and_the_tombstones_wd_5(api: Any) -> None:
    client, _ = api
    runner = Runner(client)
    runner.start_trajectory()
    quiet = client.get(f"/runs/{runner.run_id}/trajectory", headers=RITA).json()["watchdog"]
    assert quiet == {
        "interruptAction": None,
        "tombstones": [],
        "semanticDeadlock": False,
        "intervention": None,
    }
    for params in (A, B, A):
        runner.observe(params)
    shown = client.get(f"/runs/{runner.run_id}/trajectory", headers=RITA).json()["watchdog"]
    assert shown["interruptAction"] == action_hash("vm.provision", A)
    assert shown["intervention"]["code"] == "STATE_OSCILLATION_DETECTED"


def test_the_watchdog_view_long_polls_past_a_version(api: Any) -> None:
    client, _ = api
    runner = Runner(client)
    runner.observe(A)
    url = f"/runs/{runner.run_id}/watchdog"
    current = client.get(url, params={"afterVersion": 0}, headers=RITA).json()
    assert current["version"] == 2
    unchanged = client.get(url, params={"afterVersion": 2, "waitMs": 50}, headers=RITA)
    assert unchanged.status_code == 200 and unchanged.json()["version"] == 2


# --- per-run thresholds (WD-2..WD-5) ------------------------------------------------------------


def test_the_api_bounds_are_the_watchdogs_own() -> None:
    snake = {
        "".join("_" + c.lower() if c.isupper() else c for c in k): v for k, v in THRESHOLD_BOUNDS.items()
    }
    assert snake == dict(BOUNDS)


def test_the_submitter_or_an_operator_sets_a_runs_thresholds(api: Any) -> None:
    client, tenure = api
    runner = Runner(client)
    url = f"/runs/{runner.run_id}/watchdog"
    _problem(client.put(url, headers=SAM, json={"maxPeriod": 2}), 403, "forbidden")
    set_by_rita = client.put(url, headers=RITA, json={"maxPeriod": 2, "ladderEpoch": 5})
    assert set_by_rita.status_code == 200, set_by_rita.text
    assert set_by_rita.json()["thresholds"]["maxPeriod"] == 2
    assert set_by_rita.json()["configurations"][-1]["origin"] == "run"
    by_olga = client.put(url, headers=OLGA, json={"rollbackBudget": 0})
    assert by_olga.status_code == 200 and by_olga.json()["thresholds"] == {
        "maxPeriod": 2,
        "window": 32,
        "epochSteps": 6,
        "repeatCount": 1,
        "rollbackBudget": 0,
        "ladderEpoch": 5,
        "pollPatience": 5,
    }
    sent = len(tenure.commands_of(ConfigureWatchdog))
    for bad in ({"maxPeriod": 0}, {"window": 257}, {"rollbackBudget": True}, {"epochSteps": "3"}, {"k": 1}):
        _problem(client.put(url, headers=RITA, json=bad), 422, "validation-failed")
    assert len(tenure.commands_of(ConfigureWatchdog)) == sent, "refused before anything was published"
    # How the values combine is the watchdog's to judge: the window must exceed the period.
    combined = client.put(url, headers=RITA, json={"maxPeriod": 10, "window": 10})
    assert _problem(combined, 422, "watchdog-threshold-out-of-bounds")["code"] == "THRESHOLD_OUT_OF_BOUNDS"
    _problem(client.put(f"/runs/run_{'0' * 32}/watchdog", headers=RITA, json={}), 404, "run-not-found")


def test_thresholds_repeated_under_their_key_are_answered_from_the_view(api: Any) -> None:
    client, tenure = api
    runner = Runner(client)
    url = f"/runs/{runner.run_id}/watchdog"
    first = client.put(url, headers={**RITA, "Idempotency-Key": "cfg-1"}, json={"maxPeriod": 3})
    again = client.put(url, headers={**RITA, "Idempotency-Key": "cfg-1"}, json={"maxPeriod": 3})
    assert first.status_code == again.status_code == 200
    assert len(tenure.commands_of(ConfigureWatchdog)) == 1
    other = client.put(url, headers={**RITA, "Idempotency-Key": "cfg-1"}, json={"maxPeriod": 4})
    _problem(other, 409, "idempotency-key-conflict")


def test_per_run_thresholds_change_what_is_a_loop(api: Any) -> None:
    client, _ = api
    runner = Runner(client)
    assert (
        client.put(f"/runs/{runner.run_id}/watchdog", headers=RITA, json={"maxPeriod": 1}).status_code == 200
    )
    for params in (A, B, A):  # period 2: longer than the run's K = 1
        runner.observe(params)
    assert runner.watchdog()["interventions"] == []


# --- problems -----------------------------------------------------------------------------------


def test_every_watchdog_code_maps_to_a_problem_type_that_documents_itself(api: Any) -> None:
    client, _ = api
    missing = [code for code in WatchdogRejectionCode if code not in WATCHDOG_REJECTION_PROBLEMS]
    assert not missing
    slugs = {*WATCHDOG_REJECTION_PROBLEMS.values(), "state-oscillation-detected", "action-tombstoned"}
    for slug in sorted(slugs):
        assert slug in CATALOG
        described = client.get(f"/problems/{slug}")
        assert described.status_code == 200 and described.json()["meaning"], slug


def test_observations_travel_on_progress_observations(tmp_path: Path) -> None:
    tenure = InMemoryTenure()
    published: list[str] = []
    take = tenure._take

    def spy(record: Any, future: Any) -> None:
        published.append(record.topic)
        take(record, future)

    tenure._take = spy  # type: ignore[method-assign]
    with api_client(tmp_path, api_keys=KEYS, tenure=tenure) as (client, _):
        Runner(client).observe(A)
    assert published[-1] == PROGRESS_OBSERVATIONS.name
