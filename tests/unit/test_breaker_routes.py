"""What operators see of the circuit breakers over HTTP (issue 13 part 3, BRK-1, BRK-2, BRK-4).

The API runs over tests/support/api_harness.py: the real app and routes, the breaker's real pure
core deciding, its events folded into the API's board (a BreakerHistoryFold, the one fold of the
breaker's own evolve), no broker. A gateway's reports open a breaker; GET /breakers shows its
window, cooldown and canary; GET /breakers/{endpoint} the transitions with their evidence; an
operator forces it open, disables and resets it with a reason (and only an operator may).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.breakers.view import BreakerBoard
from services.command_api.breaker_board import ApiBreakerBoard, BreakerHistoryFold
from services.command_api.problems import BREAKER_REJECTION_PROBLEMS, CATALOG
from services.common.contracts import (
    SUCCESS,
    TRANSPORT_FAILURE,
    BreakerRejectionCode,
    DisableBreaker,
    ForceOpenBreaker,
    RequestCanary,
    ResetBreaker,
)
from services.common.contracts.breakers import MAX_REASON_CHARS
from services.common.routing import breaker_command_record
from tests.support.api_harness import InMemoryTenure, api_client

pytestmark = pytest.mark.timeout(60)

KEYS = "rita-key=rita:submitter,olga-key=olga:operator,rob-key=rob:runner"
RITA = {"Authorization": "Bearer rita-key"}
OLGA = {"Authorization": "Bearer olga-key"}
ROB = {"Authorization": "Bearer rob-key"}
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
ENDPOINT = "ledger/transfer"  # endpoint ids may hold a slash: the route takes the rest of the path


@pytest.fixture()
def api(tmp_path: Path) -> Any:
    with api_client(tmp_path, api_keys=KEYS, decision_timeout_s=5.0) as pair:
        yield pair


def _problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["type"] == f"/problems/{slug}", body
    return body


def _open(tenure: InMemoryTenure, endpoint: str = ENDPOINT) -> None:
    """The default policy's ten calls, eight of them transport failures: 0.8 > 0.5 -> Open (BRK-1)."""
    tenure.report_outcomes(endpoint, [SUCCESS] * 2 + [TRANSPORT_FAILURE] * 8)


def _get(client: httpx.Client, endpoint: str = ENDPOINT) -> dict[str, Any]:
    answer = client.get(f"/breakers/{endpoint}", headers=RITA)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _override(
    client: httpx.Client, action: str, reason: Any = "maintenance window", headers: dict[str, str] = OLGA
) -> httpx.Response:
    return client.post(f"/breakers/{ENDPOINT}/{action}", headers=headers, json={"reason": reason})


# --- reading (BRK-1, BRK-2) -----------------------------------------------------------------------


def test_no_breaker_yet_is_an_empty_list_and_reading_needs_a_key(api: Any) -> None:
    client, _ = api
    listed = client.get("/breakers", headers=RITA)
    assert listed.status_code == 200 and listed.json()["breakers"] == [] and listed.json()["count"] == 0
    _problem(client.get("/breakers"), 401, "unauthenticated")
    _problem(client.get("/breakers/ledger", headers=RITA), 404, "breaker-not-found")


def test_a_breaker_opened_by_transport_failures_is_listed_with_its_window_and_cooldown_brk_1_brk_2(
    api: Any,
) -> None:
    client, tenure = api
    tenure.report_outcomes("env", [SUCCESS] * 3)
    _open(tenure)
    body = client.get("/breakers", headers=RITA).json()
    assert [b["endpoint"] for b in body["breakers"]] == ["env", ENDPOINT] and body["count"] == 2
    assert RFC3339.match(body["serverTime"])
    calm, tripped = body["breakers"]
    assert calm["status"] == "closed" and calm["failsFast"] is False and calm["errorRate"] == 0
    assert calm["window"] == {"size": 20, "calls": 3, "failures": 0, "errorRate": 0}
    assert tripped["status"] == "open" and tripped["failsFast"] is True
    # The window is frozen as the evidence: 8 failures in 10 calls.
    assert tripped["window"] == {"size": 20, "calls": 10, "failures": 8, "errorRate": 0.8}
    assert tripped["errorRate"] == 0.8 and tripped["timesOpened"] == 1
    assert tripped["cooldownMs"] == 30_000
    assert 0 < tripped["cooldownRemainingMs"] <= 30_000
    assert 0 < tripped["retryAfterMs"] <= 30_000  # what ERR_CIRCUIT_OPEN tells a caller
    for field in ("halfOpenAt", "openSince", "openedAt", "updatedAt"):
        assert RFC3339.match(tripped[field]), (field, tripped[field])
    assert tripped["canary"] is None and tripped["canaryHolder"] is None
    assert tripped["lastTransition"]["type"] == "BreakerOpened"
    assert "transitions" not in tripped  # the list is the summary; the detail route has them
    only_open = client.get("/breakers", params={"status": "open"}, headers=RITA).json()
    assert [b["endpoint"] for b in only_open["breakers"]] == [ENDPOINT]
    _problem(client.get("/breakers", params={"status": "ajar"}, headers=RITA), 422, "validation-failed")


def test_the_detail_shows_the_transitions_with_their_evidence_brk_1(api: Any) -> None:
    client, tenure = api
    _open(tenure)
    body = _get(client)
    assert body["endpoint"] == ENDPOINT and body["status"] == "open"
    assert body["recentOutcomes"] == [False, False] + [True] * 8
    (opened,) = body["transitions"]
    assert opened["type"] == "BreakerOpened" and opened["status"] == "open"
    assert opened["calls"] == 10 and opened["failures"] == 8 and opened["threshold"] == 0.5
    assert opened["window"] == [False, False] + [True] * 8 and opened["minCalls"] == 10
    assert opened["cooldownMs"] == 30_000 and RFC3339.match(opened["halfOpenAt"])
    assert RFC3339.match(opened["at"]) and opened["version"] == 11 and opened["by"]


def test_the_one_canary_and_its_holder_are_shown_while_half_open_brk_2(api: Any) -> None:
    client, tenure = api
    _open(tenure)
    tenure.breaker_timers(tenure.clock.now_ms() + 31_000)  # the cooldown ran out
    half = _get(client)
    assert half["status"] == "half-open" and half["failsFast"] is True
    assert half["cooldownRemainingMs"] == 0 and half["halfOpenAt"] is None
    assert half["transitions"][-1]["type"] == "BreakerHalfOpened"
    ask = RequestCanary(
        command_id="cmd-canary-1",
        run_id=ENDPOINT,
        issued_at=tenure.clock.now_ms(),
        correlation_id=ENDPOINT,
        actor="tenure-gateway",
        instance_id="gw-2",
    )
    tenure.publish(breaker_command_record(tenure.codec, ask))
    held = _get(client)
    assert held["canaryHolder"] == "gw-2" and held["canary"]["held"] is True
    assert RFC3339.match(held["canary"]["expiresAt"]) and held["canary"]["canaryId"]
    assert 0 < held["retryAfterMs"] <= 15_000  # the others wait for the canary's lease
    granted = held["transitions"][-1]
    assert granted["type"] == "CanaryGranted" and granted["instanceId"] == "gw-2"
    assert RFC3339.match(granted["expiresAt"])


def test_a_malformed_endpoint_id_is_not_found(api: Any) -> None:
    """Refused at the edge, like any path id Tenure cannot have issued."""
    client, _ = api
    for bad in ("-leading-dash", "has space", "x" * 201):
        answer = client.get(f"/breakers/{bad}", headers=RITA)
        assert answer.status_code == 404 and answer.headers["content-type"].startswith("application/problem")


# --- operators ----------------------------------------------------------------------------------


def test_an_operator_forces_a_breaker_open_with_a_reason_that_is_recorded_brk_2(api: Any) -> None:
    client, tenure = api
    tenure.report_outcomes(ENDPOINT, [SUCCESS])
    answer = _override(client, "force-open", "vendor maintenance until 14:00")
    assert answer.status_code == 200, answer.text
    assert answer.headers["location"] == f"/breakers/{ENDPOINT}"
    body = answer.json()
    assert body["status"] == "forced-open" and body["failsFast"] is True
    assert body["reason"] == "vendor maintenance until 14:00" and body["replayed"] is False
    forced = body["transitions"][-1]
    assert forced == forced | {
        "type": "BreakerForcedOpen",
        "status": "forced-open",
        "by": "olga",
        "reason": "vendor maintenance until 14:00",
        "previousStatus": "closed",
        "commandId": body["commandId"],
    }
    (command,) = tenure.commands_of(ForceOpenBreaker)
    assert command.actor == "olga" and command.reason == "vendor maintenance until 14:00"
    assert _get(client)["lastTransition"]["reason"] == "vendor maintenance until 14:00"
    again = _override(client, "force-open", "still maintenance")
    conflict = _problem(again, 409, "breaker-conflict")
    assert conflict["code"] == BreakerRejectionCode.BREAKER_FORCED_OPEN
    assert conflict["currentStatus"] == "forced-open"


def test_only_an_operator_may_override_a_breaker_and_a_refusal_records_nothing_brk_2(api: Any) -> None:
    client, tenure = api
    tenure.report_outcomes(ENDPOINT, [SUCCESS])
    before = len(tenure.commands)
    for action in ("force-open", "disable", "reset"):
        _problem(_override(client, action, headers=RITA), 403, "forbidden")
        _problem(_override(client, action, headers=ROB), 403, "forbidden")
        _problem(_override(client, action, headers={}), 401, "unauthenticated")
    assert len(tenure.commands) == before
    assert _get(client)["status"] == "closed" and _get(client)["transitions"] == []


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"reason": ""},
        {"reason": "   "},
        {"reason": "x" * (MAX_REASON_CHARS + 1)},
        {"reason": 7},
        {"reason": "ok", "force": True},
        {"reason": "nul \u0000"},
    ],
)
def test_a_reason_is_required_and_bounded(api: Any, body: dict[str, Any]) -> None:
    client, tenure = api
    tenure.report_outcomes(ENDPOINT, [SUCCESS])
    before = len(tenure.commands)
    answer = client.post(f"/breakers/{ENDPOINT}/force-open", headers=OLGA, json=body)
    _problem(answer, 422, "validation-failed")
    assert len(tenure.commands) == before


def test_an_unknown_endpoint_cannot_be_overridden(api: Any) -> None:
    client, tenure = api
    body = _problem(_override(client, "force-open"), 404, "breaker-not-found")
    assert body["endpoint"] == ENDPOINT
    assert tenure.commands_of(ForceOpenBreaker) == []


def test_disable_lets_calls_through_and_reset_closes_with_an_empty_window_brk_2(api: Any) -> None:
    client, tenure = api
    _open(tenure)
    disabled = _override(client, "disable", "the endpoint's own retries cope")
    assert disabled.status_code == 200, disabled.text
    assert disabled.json()["status"] == "disabled" and disabled.json()["failsFast"] is False
    reset = _override(client, "reset", "back to normal")
    assert reset.status_code == 200, reset.text
    body = reset.json()
    assert body["status"] == "closed" and body["failsFast"] is False and body["window"]["calls"] == 0
    assert body["reason"] == "back to normal"
    assert [t["type"] for t in body["transitions"]] == ["BreakerOpened", "BreakerDisabled", "BreakerReset"]
    assert [t["previousStatus"] for t in body["transitions"][1:]] == ["open", "disabled"]
    assert len(tenure.commands_of(DisableBreaker)) == len(tenure.commands_of(ResetBreaker)) == 1


def test_an_idempotency_key_names_one_override(api: Any) -> None:
    client, tenure = api
    tenure.report_outcomes(ENDPOINT, [SUCCESS])
    keyed = {**OLGA, "Idempotency-Key": "incident-42"}
    first = client.post(f"/breakers/{ENDPOINT}/force-open", headers=keyed, json={"reason": "incident 42"})
    assert first.status_code == 200, first.text
    again = client.post(f"/breakers/{ENDPOINT}/force-open", headers=keyed, json={"reason": "incident 42"})
    assert again.status_code == 200, again.text
    assert again.json()["replayed"] is True and again.json()["commandId"] == first.json()["commandId"]
    assert len(tenure.commands_of(ForceOpenBreaker)) == 1
    other = client.post(f"/breakers/{ENDPOINT}/force-open", headers=keyed, json={"reason": "another"})
    conflict = _problem(other, 409, "idempotency-key-conflict")
    assert conflict["fields"] == ["reason"]
    assert len(tenure.commands_of(ForceOpenBreaker)) == 1


def test_an_undecided_override_is_a_202_to_poll(tmp_path: Path) -> None:
    with api_client(tmp_path, api_keys=KEYS, decision_timeout_s=0.5) as (client, tenure):
        tenure.report_outcomes(ENDPOINT, [SUCCESS])
        tenure.breakers_seen = False  # decided, but this API's board has not folded it yet
        answer = _override(client, "force-open")
        assert answer.status_code == 202, answer.text
        assert answer.json()["status"] == "pending" and answer.json()["commandId"]
        assert answer.headers["location"] == f"/breakers/{ENDPOINT}"


def test_a_broker_that_never_acknowledges_is_a_503_with_retry_after(tmp_path: Path) -> None:
    with api_client(tmp_path, api_keys=KEYS, decision_timeout_s=0.5) as (client, tenure):
        tenure.report_outcomes(ENDPOINT, [SUCCESS])
        tenure.mode = "down"
        answer = _problem(_override(client, "force-open"), 503, "unavailable")
        assert int(answer["retryAfterSeconds"]) >= 1


def test_a_board_still_reading_the_log_is_a_503(api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    client, tenure = api
    monkeypatch.setattr(tenure.breakers, "wait_until_current", lambda timeout_s=0.0: False)
    answer = client.get("/breakers", headers=RITA)
    _problem(answer, 503, "unavailable")
    assert int(answer.headers["retry-after"]) >= 1


def test_the_apis_board_follows_kafka_and_keeps_the_history() -> None:
    """ApiBreakerBoard: BreakerBoard's readiness (folded up to the start-up end of the log), not
    the in-memory fold's always-current one; the history fold's `apply` over the breaker's fold."""
    assert ApiBreakerBoard.wait_until_current is BreakerBoard.wait_until_current
    assert ApiBreakerBoard.health is BreakerBoard.health and ApiBreakerBoard.close is BreakerBoard.close
    assert ApiBreakerBoard.apply is BreakerHistoryFold.apply


def test_every_breaker_rejection_code_has_a_problem_type() -> None:
    assert set(BREAKER_REJECTION_PROBLEMS) == set(BreakerRejectionCode)
    for slug in BREAKER_REJECTION_PROBLEMS.values():
        assert CATALOG.get(slug) is not None, slug


# --- bulkheads (BRK-4) ----------------------------------------------------------------------------


def test_bulkheads_show_the_configured_domains_and_limits_brk_4(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENURE_BULKHEAD_TOOLS", "env=internal,search=external:4/8/3000")
    monkeypatch.setenv("TENURE_BULKHEAD_EXTERNAL_CONCURRENCY", "12")
    with api_client(tmp_path, api_keys=KEYS) as (client, _):
        _problem(client.get("/bulkheads"), 401, "unauthenticated")
        body = client.get("/bulkheads", headers=RITA).json()
    pools = {p["pool"]: p for p in body["pools"]}
    assert pools["local"] == {
        "pool": "local",
        "domain": "local",
        "concurrency": 64,
        "queue": 64,
        "timeoutMs": 500,
    }
    assert pools["external"]["concurrency"] == 12 and pools["external"]["timeoutMs"] == 5_000
    assert pools["tool:search"] == {
        "pool": "tool:search",
        "domain": "external",
        "concurrency": 4,
        "queue": 8,
        "timeoutMs": 3000,
    }
    assert body["tools"] == [
        {"tool": "env", "domain": "internal", "pool": "internal"},
        {"tool": "search", "domain": "external", "pool": "tool:search"},
    ]
    assert body["defaultDomain"] == "external" and body["connectionLimit"] == 64 + 32 + 12 + 4
    assert "gateway" in body["occupancy"]


def test_bulkhead_settings_the_gateway_would_refuse_are_a_problem_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENURE_BULKHEAD_TOOLS", "env=nowhere")
    with api_client(tmp_path, api_keys=KEYS) as (client, _):
        body = _problem(client.get("/bulkheads", headers=RITA), 503, "unavailable")
        assert "local, internal or external" in body["detail"]
        assert client.get("/breakers", headers=RITA).status_code == 200  # the rest of the API serves
