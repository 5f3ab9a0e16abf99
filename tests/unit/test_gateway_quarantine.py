"""The effect gateway's side of a quarantine (QUA-1): RUN_QUARANTINED and the egress allowlist.

The real `Gateway.perform` and HTTP front with Kafka cut off (tests/support/gateway.py): what
the gateway would publish is in `gateway.sent`, what the tool was sent in `gateway.tool`. The
end-to-end proof on real processes is tests/integration/test_quarantine_process.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from services.common.auth import Principal
from services.common.contracts import RecordEffectIntent, RecordEffectOutcome, RunSubmitted
from services.common.contracts.quarantine import IN_FLIGHT_NOTE, QuarantineStarted, StartQuarantine
from services.effect_gateway.egress import check_egress, effect_hosts, parse_tool_egress, run_allowlist
from services.effect_gateway.quarantine_guard import egress_trigger_id
from tests.support.gateway import OfflineGateway, gateway_app
from tests.support.lease_run import Run

from .test_gateway_tombstones import effect

pytestmark = pytest.mark.timeout(30)

RUNNER = Principal("runner:runner-a", "runner")
KEYS = {"runkey": RUNNER}
AUTH = {"Authorization": "Bearer runkey"}


def test_the_hosts_an_effect_is_aimed_at_and_the_allowlists_QUA_1() -> None:
    assert effect_hosts({"url": "https://Attacker.example:8443/leak?k=1"}) == ("attacker.example",)
    assert effect_hosts({"host": "db.internal", "urls": ["http://a.test/x"], "hosts": ["b.test"]}) == (
        "db.internal",
        "a.test",
        "b.test",
    )
    assert effect_hosts({"account": "a"}) == ()  # the tool's own endpoint: nothing to check
    assert effect_hosts({"url": ""}) == ("",)  # a host field naming nothing is aimed somewhere unknown
    assert parse_tool_egress("ledger=127.0.0.1|*.corp.test, env=sim.local") == {
        "ledger": ("127.0.0.1", "*.corp.test"),
        "env": ("sim.local",),
    }
    assert run_allowlist('{"agent":"x"}') is None and run_allowlist('{"egressAllowlist":["A.test"]}') == (
        "a.test",
    )
    assert run_allowlist('{"egressAllowlist":"a.test"}') == ()  # malformed: nothing is allowed
    assert check_egress({"url": "http://api.corp.test"}, ("*.corp.test",), None) is None
    tool = check_egress({"url": "http://evil.test"}, ("*.corp.test",), None)
    assert tool is not None and tool.declared_by == "tool" and tool.host == "evil.test"
    run = check_egress({"host": "api.corp.test"}, ("*.corp.test",), ("db.corp.test",))
    assert run is not None and run.declared_by == "run"


@pytest.fixture
def run() -> Run:
    r = Run()
    r.claim("runner-a")
    return r


@pytest.fixture
def gateway(run: Run) -> OfflineGateway:
    gateway = OfflineGateway(egress={"ledger": ("ledger.internal",)}).fold(*run.events)
    submitted = run.events[0]
    assert isinstance(submitted, RunSubmitted)
    gateway._quarantine.fold_run(replace(submitted, execution_spec='{"egressAllowlist":["ledger.internal"]}'))
    return gateway


@pytest.fixture
def http(gateway: OfflineGateway) -> Iterator[TestClient]:
    with TestClient(gateway_app(gateway, KEYS)) as client:
        yield client


def _quarantined(run: Run) -> QuarantineStarted:
    return QuarantineStarted(
        event_id="qev-1",
        run_id=run.run_id,
        version=1,
        occurred_at=1,
        causation_id="cmd-q",
        correlation_id="c",
        actor="olga",
        trigger="operator",
        reason="injection",
        evidence="",
        tenant="acme",
        holder="runner-a",
        lease_epoch=1,
        attempt_id="",
        taint_from_step=-1,
        taint_from_at=0,
    )


def _nothing_sent(gateway: OfflineGateway) -> None:
    assert not [c for c in gateway.sent if isinstance(c, RecordEffectIntent)], "no intent was recorded"
    assert not [r for r in gateway.tool.requests if r.method == "POST"], "nothing was dispatched"


def test_egress_to_a_host_off_the_allowlist_is_refused_before_dispatch_and_triggers_QUA_1(
    http: TestClient, gateway: OfflineGateway, run: Run
) -> None:
    body: dict[str, Any] = effect(run, "leak-1", payload={"url": "https://attacker.example/leak"})
    refused = http.post("/effects", json=body, headers=AUTH)
    assert refused.status_code == 403, refused.text
    problem = refused.json()
    assert problem["type"] == "/problems/egress-not-allowed" and problem["code"] == "EGRESS_NOT_ALLOWED"
    assert problem["host"] == "attacker.example" and problem["quarantineTriggered"] is True
    _nothing_sent(gateway)
    [trigger] = [c for c in gateway.sent if isinstance(c, StartQuarantine)]
    assert trigger.trigger == "egress-policy" and trigger.holder == "runner:runner-a"
    assert trigger.lease_epoch == 1
    assert trigger.command_id == egress_trigger_id(run.run_id, "leak-1")  # a retry is the same trigger
    assert '"host":"attacker.example"' in trigger.evidence
    allowed = http.post(
        "/effects", json=effect(run, "ok-1", payload={"host": "ledger.internal"}), headers=AUTH
    )
    assert allowed.status_code == 200, allowed.text


def test_every_effect_of_a_quarantined_run_is_refused_whatever_the_epoch_QUA_1(
    http: TestClient, gateway: OfflineGateway, run: Run
) -> None:
    gateway.quarantine_fold.apply(_quarantined(run))
    for epoch in (1, 2, 500):
        refused = http.post("/effects", json=effect(run, f"k-{epoch}", epoch=epoch), headers=AUTH)
        assert refused.status_code == 409, refused.text
        assert (
            refused.json()["type"] == "/problems/run-quarantined"
            and refused.json()["code"] == "RUN_QUARANTINED"
        )
    _nothing_sent(gateway)
    assert gateway._quarantine.in_flight_note(run.run_id, "").startswith("in flight")


def test_an_effect_in_flight_when_its_run_is_quarantined_is_recorded_as_such_QUA_1(
    http: TestClient, gateway: OfflineGateway, run: Run
) -> None:
    tool = gateway.tool
    answer = tool.__call__

    def quarantined_mid_flight(request: Any) -> Any:
        gateway.quarantine_fold.apply(_quarantined(run))  # the trigger lands while the tool works
        return answer(request)

    gateway._tools = type(gateway._tools)(
        {"ledger": "http://ledger.test"}, transport=httpx.MockTransport(quarantined_mid_flight)
    )
    done = http.post("/effects", json=effect(run, "in-flight-1"), headers=AUTH)
    assert done.status_code == 200, done.text  # it had been dispatched: its answer is the tool's
    [outcome] = [c for c in gateway.sent if isinstance(c, RecordEffectOutcome)]
    assert outcome.outcome == "committed" and IN_FLIGHT_NOTE in outcome.detail
    refused = http.post("/effects", json=effect(run, "after-1"), headers=AUTH)
    assert refused.status_code == 409 and refused.json()["code"] == "RUN_QUARANTINED"
