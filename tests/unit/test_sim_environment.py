"""The simulated environment: the "external world" sagas act upon through the effect gateway.

Proves that the recipient, not Tenure, refuses a previous lease holder (LEASE-3: stale epochs),
that one idempotency key is applied at most once whatever the retries (EXE-6), that a lost
acknowledgement can be found by the probe (REC-6), that compensators are idempotent and semantic
so an unwind brings the world back to its start (SAGA-3, SAGA-4), that every armed fault does what
it says (timeouts before/after commit, errors, partial outputs), and that tools.json registers
the operations consistently with the world (SAGA-2, SAGA-5). Pure core first, then the HTTP app.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import jsonschema
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from services.common.settings import TenureSettings
from services.sim_environment import load_tool_registrations
from services.sim_environment.app import create_app
from services.sim_environment.verifiers import UnknownVerifier, verify
from services.sim_environment.world import OPERATIONS, Answer, Fault, World, is_back_to_start

pytestmark = pytest.mark.timeout(30)

PROBLEM_JSON = "application/problem+json"
WORK = "run-1"


def _do(
    world: World, key: str, operation: str, payload: dict[str, Any], epoch: int = 1, work: str = WORK
) -> Answer:
    return world.perform(work, epoch, key, operation, payload)


def _ok(answer: Answer) -> dict[str, Any]:
    assert answer.status == 200, answer.body
    output: dict[str, Any] = answer.body["output"]
    return output


def _deploy_until_dns(world: World) -> dict[str, str]:
    """The seed's deploy, steps T1..T4 (VM, IP, compile, firewall); returns the resource ids."""
    vm = _ok(_do(world, "t1", "vm.provision", {"name": "web"}))["vmId"]
    ip = _ok(_do(world, "t2", "ip.reserve", {"region": "eu-west"}))
    build = _ok(_do(world, "t3", "sandbox.compile", {"vmId": vm, "source": "int main() {}"}))["buildId"]
    rule = _ok(_do(world, "t4", "firewall.write", {"vmId": vm, "port": 443}))["ruleId"]
    return {"vm": vm, "ip": ip["ipId"], "address": ip["address"], "build": build, "rule": rule}


# --------------------------------------------------------------------------- idempotency, fencing


def test_same_key_twice_is_applied_once_and_answers_the_same_body_exe6() -> None:
    world = World()
    first = _do(world, "k1", "vm.provision", {"name": "web"})
    second = _do(world, "k1", "vm.provision", {"name": "web"})
    assert first.status == second.status == 200
    assert second.body == first.body and second.replay and not first.replay
    assert first.body["output"]["vmId"].startswith("vm-")
    audit = world.audit()
    assert len(audit["live"]) == 1
    assert audit["effects"] == [
        {
            "key": "k1",
            "workId": WORK,
            "operation": "vm.provision",
            "requests": 2,
            "applied": 1,
            "succeeded": True,
        }
    ]
    assert audit["duplicates"] == []


def test_a_different_request_under_a_known_key_is_a_conflict_and_changes_nothing() -> None:
    world = World()
    _ok(_do(world, "k1", "vm.provision", {"name": "web"}))
    for work, operation, payload, differs in (
        (WORK, "vm.provision", {"name": "db"}, ["payload"]),
        ("run-2", "vm.provision", {"name": "web"}, ["workId"]),
        (WORK, "ip.reserve", {"region": "eu"}, ["operation", "payload"]),
    ):
        answer = world.perform(work, 1, "k1", operation, payload)
        assert answer.status == 409
        assert answer.body["type"] == "/problems/idempotency-key-conflict"
        assert answer.body["differences"] == differs
    assert len(world.audit()["live"]) == 1


def test_stale_epoch_is_refused_by_the_recipient_and_changes_nothing_lease3() -> None:
    world = World()
    _ok(_do(world, "k1", "vm.provision", {"name": "web"}, epoch=2))
    stale = _do(world, "k2", "vm.provision", {"name": "db"}, epoch=1)
    assert stale.status == 409
    assert stale.body["type"] == "/problems/stale-epoch"
    assert (stale.body["presentedEpoch"], stale.body["highestEpoch"]) == (1, 2)
    assert [r["params"]["name"] for r in world.audit()["live"]] == ["web"]
    # Another work id has its own bar.
    _ok(_do(world, "k3", "vm.provision", {"name": "other"}, epoch=1, work="run-2"))
    assert world.highest_epoch(WORK) == 2 and world.highest_epoch("run-2") == 1


def test_a_replay_answers_the_stored_body_even_with_a_stale_epoch_rec6() -> None:
    world = World()
    first = _do(world, "k1", "vm.provision", {"name": "web"}, epoch=1)
    _ok(_do(world, "k2", "ip.reserve", {"region": "eu"}, epoch=3))
    replay = _do(world, "k1", "vm.provision", {"name": "web"}, epoch=1)
    assert replay.status == 200 and replay.body == first.body and replay.replay


def test_the_epoch_bar_rises_even_when_the_request_then_fails() -> None:
    world = World()
    assert _do(world, "k1", "vm.provision", {}, epoch=5).status == 422
    assert _do(world, "k2", "vm.provision", {"name": "web"}, epoch=4).body["type"] == "/problems/stale-epoch"


def test_ids_and_answers_are_deterministic() -> None:
    worlds = [World(), World()]
    for world in worlds:
        _deploy_until_dns(world)
        _do(world, "c1", "vm.terminate", {"vmId": world.audit()["live"][0]["id"]})
    assert worlds[0].audit() == worlds[1].audit()


# --------------------------------------------------------------------------- operations


def test_every_forward_operation_creates_what_it_says() -> None:
    world = World()
    ids = _deploy_until_dns(world)
    assert ids["address"].startswith("10.")
    dns = _ok(_do(world, "t5", "dns.publish", {"name": "web.example", "address": ids["address"]}))
    hold = _ok(_do(world, "p1", "payment.hold", {"account": "acct-1", "amount": 12.5}))
    message = _ok(_do(world, "n1", "notify.send", {"to": "ops@example", "text": "deployed"}))
    cache = _ok(_do(world, "w1", "cache.warm", {"name": "assets"}))
    audit = world.audit()
    live = {(r["kind"], r["id"]) for r in audit["live"]}
    assert live == {
        ("vm", ids["vm"]),
        ("ip", ids["ip"]),
        ("build", ids["build"]),
        ("firewall-rule", ids["rule"]),
        ("payment-hold", hold["holdId"]),
        ("cache", cache["cacheId"]),
    }
    assert {(r["kind"], r["id"]) for r in audit["permanent"]} == {
        ("dns-record", dns["recordId"]),
        ("message", message["messageId"]),
    }
    assert all(r["workId"] == WORK for r in audit["live"])
    assert next(r for r in audit["live"] if r["kind"] == "ip")["params"] == {
        "region": "eu-west",
        "address": ids["address"],
    }


def test_compile_needs_a_live_vm_and_fails_on_a_syntax_error() -> None:
    world = World()
    missing = _do(world, "k1", "sandbox.compile", {"vmId": "vm-nope", "source": "x"})
    assert (missing.status, missing.body["type"]) == (404, "/problems/not-found")
    vm = _ok(_do(world, "k2", "vm.provision", {"name": "web"}))["vmId"]
    broken = _do(world, "k3", "sandbox.compile", {"vmId": vm, "source": "ok\nsyntax-error here"})
    assert (broken.status, broken.body["type"], broken.body["line"]) == (422, "/problems/compile-error", 2)
    _ok(_do(world, "k4", "vm.terminate", {"vmId": vm}))
    after = _do(world, "k5", "firewall.write", {"vmId": vm, "port": 80})
    assert after.status == 404 and "no live vm" in after.body["detail"]
    assert world.audit()["live"] == []


@pytest.mark.parametrize(
    ("operation", "payload", "kind", "detail_part"),
    [
        ("vm.provision", {}, "missing-parameter", "vm.provision needs payload.name"),
        ("firewall.write", {"vmId": "vm-x"}, "missing-parameter", "needs payload.port"),
        ("firewall.write", {"vmId": "vm-x", "port": 70000}, "schema-invalid", "payload.port"),
        ("firewall.write", {"vmId": "vm-x", "port": "80"}, "schema-invalid", "payload.port"),
        ("vm.provision", {"name": "web", "size": "xl"}, "schema-invalid", "'size' was unexpected"),
        ("vm.provision", {"name": ""}, "schema-invalid", "payload.name"),
        ("payment.hold", {"account": "a", "amount": 0}, "schema-invalid", "payload.amount"),
        ("payment.hold", {"account": "a", "amount": True}, "schema-invalid", "payload.amount"),
        ("teleport", {}, "schema-invalid", "unknown operation 'teleport'"),
    ],
)
def test_bad_payloads_are_refused_with_a_specific_problem(
    operation: str, payload: dict[str, Any], kind: str, detail_part: str
) -> None:
    world = World()
    answer = _do(world, "k1", operation, payload)
    assert (answer.status, answer.body["type"]) == (422, f"/problems/{kind}")
    assert detail_part in answer.body["detail"]
    assert world.audit()["live"] == [] and world.probe("k1") is None


def test_compensators_are_idempotent_and_semantic_saga3() -> None:
    world = World()
    vm = _ok(_do(world, "k1", "vm.provision", {"name": "web"}))["vmId"]
    first = _ok(_do(world, "c1", "vm.terminate", {"vmId": vm}))
    assert first == {"vmId": vm, "terminated": True, "alreadyReleased": False}
    assert _do(world, "c1", "vm.terminate", {"vmId": vm}).replay  # same key: a replay
    second = _ok(_do(world, "c2", "vm.terminate", {"vmId": vm}))  # new key: succeeds, changes nothing
    assert second["alreadyReleased"] is True
    released = world.audit()["released"]
    assert [(r["id"], r["releasedByKey"], r["releaseKeys"]) for r in released] == [(vm, "c1", ["c1", "c2"])]
    unknown = _do(world, "c3", "ip.release", {"ipId": vm})  # a vm id is no ip
    assert (unknown.status, unknown.body["type"]) == (404, "/problems/not-found")
    effects = {e["key"]: e for e in world.audit()["effects"]}
    assert effects["c1"]["applied"] == effects["c2"]["applied"] == 1 and effects["c3"]["applied"] == 0


def test_the_seeds_deploy_failing_at_dns_unwinds_back_to_start_saga4() -> None:
    """T1..T4 commit, T5 (DNS, the pivot) fails 409; C4..C1 in reverse bring the world back."""
    world = World()
    ids = _deploy_until_dns(world)
    world.arm(Fault("dns.publish", "error", problem="conflict", detail="domain owned by someone else"))
    failed = _do(world, "t5", "dns.publish", {"name": "web.example", "address": ids["address"]})
    assert (failed.status, failed.body["type"]) == (409, "/problems/conflict")
    assert not is_back_to_start(world.audit())
    for key, operation, payload in (
        ("c4", "firewall.unbind", {"ruleId": ids["rule"]}),
        ("c3", "sandbox.clean", {"buildId": ids["build"]}),
        ("c2", "ip.release", {"ipId": ids["ip"]}),
        ("c1", "vm.terminate", {"vmId": ids["vm"]}),
    ):
        _ok(_do(world, key, operation, payload))
    audit = world.audit()
    assert is_back_to_start(audit) and audit["backToStart"]
    assert audit["permanent"] == [] and audit["duplicates"] == [] and audit["orphans"] == []
    assert [r["releaseKeys"] for r in audit["released"]] == [["c1"], ["c2"], ["c3"], ["c4"]]


def test_a_published_dns_record_is_permanent_not_an_orphan() -> None:
    world = World()
    _ok(_do(world, "t5", "dns.publish", {"name": "web.example", "address": "10.0.0.1"}))
    audit = world.audit()
    assert audit["live"] == [] and audit["orphans"] == [] and is_back_to_start(audit)
    assert [r["kind"] for r in audit["permanent"]] == ["dns-record"]


def test_dns_names_conflict_across_works_and_the_verifier_sees_it_saga7() -> None:
    world = World()
    payload = {"name": "web.example", "address": "10.0.0.1"}
    assert verify("dns.name-available", world, payload, "run-2")[0]
    record = _ok(_do(world, "k1", "dns.publish", payload))["recordId"]
    ok, detail = verify("dns.name-available", world, payload, "run-2")
    assert not ok and "run-1" in detail and record in detail
    assert verify("dns.name-available", world, payload, WORK)[0]
    assert not verify("dns.name-available", world, payload)[0]
    assert verify("dns.name-available", world, {}) == (False, "payload.name must be a non-empty string")
    taken = world.perform("run-2", 1, "k2", "dns.publish", payload)
    assert (taken.status, taken.body["type"], taken.body["recordId"]) == (409, "/problems/conflict", record)
    again = _ok(_do(world, "k3", "dns.publish", payload))  # the same work republishing: nothing new
    assert again["recordId"] == record and len(world.audit()["permanent"]) == 1
    with pytest.raises(UnknownVerifier, match=r"no verifier 'dns\.nope'"):
        verify("dns.nope", world, payload)


# --------------------------------------------------------------------------- faults


def test_an_error_fault_fires_times_times_then_the_operation_succeeds() -> None:
    world = World()
    world.arm(Fault("vm.provision", "error", times=2, problem="rate-limited", extensions={"retryAfter": 1}))
    for key in ("k1", "k2"):
        answer = _do(world, key, "vm.provision", {"name": "web"})
        assert (answer.status, answer.body["type"], answer.body["retryAfter"]) == (
            429,
            "/problems/rate-limited",
            1,
        )
    assert world.faults() == [] and world.audit()["live"] == []
    _ok(_do(world, "k1", "vm.provision", {"name": "web"}))  # the same key, now without a fault
    effect = world.effect("k1")
    assert effect is not None and (effect.requests, effect.applied) == (2, 1)


def test_error_faults_take_the_kinds_status_or_an_explicit_one() -> None:
    world = World()
    world.arm(Fault("vm.terminate", "error", problem="auth-revoked"))
    world.arm(Fault("vm.terminate", "error", problem="quota-gone", status=507, detail="no more VMs"))
    first = _do(world, "k1", "vm.terminate", {"vmId": "vm-x"})
    second = _do(world, "k2", "vm.terminate", {"vmId": "vm-x"})
    assert (first.status, first.body["type"], first.body["title"]) == (
        403,
        "/problems/auth-revoked",
        "Credentials revoked",
    )
    assert (second.status, second.body["type"], second.body["detail"]) == (
        507,
        "/problems/quota-gone",
        "no more VMs",
    )


def test_a_partial_output_leaves_the_resource_behind_and_a_retry_adopts_it() -> None:
    world = World()
    world.arm(Fault("vm.provision", "error", status=500, problem="unavailable", partial_output=True))
    failed = _do(world, "k1", "vm.provision", {"name": "web"})
    assert failed.status == 500
    vm = failed.body["partialOutput"]["vmId"]
    audit = world.audit()
    assert [r["id"] for r in audit["live"]] == [vm] == [r["id"] for r in audit["orphans"]]
    assert world.probe("k1") is None  # no success was ever answered
    retried = _ok(_do(world, "k1", "vm.provision", {"name": "web"}))
    assert retried == {"vmId": vm}
    audit = world.audit()
    assert len(audit["live"]) == 1 and audit["orphans"] == [] and audit["effects"][0]["applied"] == 1


def test_a_partial_output_can_be_compensated_first() -> None:
    """SAGA-3: a failed step with partial effects has its own compensator run first."""
    world = World()
    world.arm(Fault("ip.reserve", "error", problem="unavailable", partial_output=True))
    ip = _do(world, "k1", "ip.reserve", {"region": "eu"}).body["partialOutput"]["ipId"]
    _ok(_do(world, "c1", "ip.release", {"ipId": ip}))
    assert is_back_to_start(world.audit())


def test_a_timeout_after_commit_applies_the_effect_and_the_probe_finds_it_rec6() -> None:
    world = World()
    world.arm(Fault("ip.reserve", "timeout-after-commit", delay_s=7.5))
    answer = _do(world, "k1", "ip.reserve", {"region": "eu"})
    assert answer.status == 200 and answer.delay_s == 7.5
    assert world.probe("k1") == answer.body
    retry = _do(world, "k1", "ip.reserve", {"region": "eu"})
    assert retry.replay and retry.body == answer.body and retry.delay_s == 0.0
    assert world.audit()["effects"][0]["applied"] == 1


def test_a_timeout_before_commit_applies_nothing() -> None:
    world = World()
    world.arm(Fault("ip.reserve", "timeout-before-commit", delay_s=3.0))
    answer = _do(world, "k1", "ip.reserve", {"region": "eu"})
    assert (answer.status, answer.body["type"], answer.delay_s) == (503, "/problems/unavailable", 3.0)
    assert world.probe("k1") is None and world.audit()["live"] == []
    _ok(_do(world, "k1", "ip.reserve", {"region": "eu"}))
    assert world.audit()["effects"][0] == {
        "key": "k1",
        "workId": WORK,
        "operation": "ip.reserve",
        "requests": 2,
        "applied": 1,
        "succeeded": True,
    }


def test_faults_fire_per_operation_in_order_and_only_on_matching_payloads() -> None:
    world = World()
    world.arm(Fault("vm.provision", "error", problem="conflict", match={"name": "db"}))
    world.arm(Fault("vm.provision", "error", problem="rate-limited"))
    assert _do(world, "k0", "ip.reserve", {"region": "eu"}).status == 200  # another operation
    assert _do(world, "k1", "vm.provision", {"name": "web"}).status == 429  # the first does not match
    assert _do(world, "k2", "vm.provision", {"name": "db"}).status == 409
    assert _do(world, "k3", "vm.provision", {"name": "db"}).status == 200
    assert world.clear_faults() == 0


def test_replays_and_stale_requests_do_not_consume_faults() -> None:
    world = World()
    _ok(_do(world, "k1", "vm.provision", {"name": "web"}, epoch=2))
    armed = world.arm(Fault("vm.provision", "error", problem="unavailable"))
    assert _do(world, "k1", "vm.provision", {"name": "web"}, epoch=2).replay
    assert _do(world, "k2", "vm.provision", {"name": "db"}, epoch=1).status == 409
    assert world.faults() == [armed.to_json()] and armed.fired == 0


def test_nominal_durations_are_scaled_into_the_answers_delay() -> None:
    world = World(time_scale=0.5)
    assert _do(world, "k1", "vm.provision", {"name": "web"}).delay_s == pytest.approx(0.06)
    assert _do(world, "k1", "vm.provision", {"name": "web"}).delay_s == 0.0  # a replay is a lookup
    assert OPERATIONS["sandbox.compile"].nominal_ms == 4200
    assert World().perform(WORK, 1, "k", "vm.provision", {"name": "web"}).delay_s == 0.0
    with pytest.raises(ValueError, match="time_scale"):
        World(time_scale=-1.0)


_OPS = st.sampled_from(["provision", "terminate", "fault", "stale"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_OPS, st.integers(0, 3), st.integers(1, 3)), max_size=40))
def test_no_key_is_ever_applied_twice_whatever_the_retries_exe6(steps: list[tuple[str, int, int]]) -> None:
    world = World()
    answers: dict[str, dict[str, Any]] = {}
    for action, index, epoch in steps:
        if action == "fault":
            world.arm(Fault("vm.provision", "error", partial_output=epoch == 2))
            continue
        key = f"{action}-{index}"
        if action == "provision":
            answer = _do(world, key, "vm.provision", {"name": f"n{index}"}, epoch=3)
        elif action == "terminate":
            vm = world.audit()["live"][0]["id"] if world.audit()["live"] else "vm-none"
            key = f"{key}-{vm}"
            answer = world.perform("run-9", 1, key, "vm.terminate", {"vmId": vm})
        else:
            fenced = world.highest_epoch(WORK) == 3 and key not in answers
            answer = _do(world, key, "vm.provision", {"name": "stale"}, epoch=1)
            assert not fenced or answer.body["type"] == "/problems/stale-epoch"
        if answer.ok:
            assert answers.setdefault(key, answer.body) == answer.body  # a replay answers the same
            assert world.probe(key) == answer.body
    audit = world.audit()
    assert audit["duplicates"] == []
    assert all(effect["applied"] <= 1 for effect in audit["effects"])
    vms_created = {r["createdByKey"] for r in audit["live"] + audit["released"]}
    assert len(vms_created) == len(audit["live"]) + len(audit["released"])


# --------------------------------------------------------------------------- HTTP app


def _headers(key: str = "k1", epoch: str = "1", work: str = WORK) -> dict[str, str]:
    return {"Idempotency-Key": key, "X-Fencing-Epoch": epoch, "X-Work-Id": work}


@pytest.fixture
def client() -> TestClient:
    return TestClient(create_app())


def test_http_effect_replay_and_probe_rec6(client: TestClient) -> None:
    body = {"operation": "vm.provision", "payload": {"name": "web"}}
    first = client.post("/effects", json=body, headers=_headers())
    assert first.status_code == 200 and "Idempotent-Replay" not in first.headers
    second = client.post("/effects", json=body, headers=_headers())
    assert second.json() == first.json() and second.headers["Idempotent-Replay"] == "true"
    assert first.json()["operation"] == "vm.provision"
    probe = client.get("/effects/k1")
    assert probe.status_code == 200 and probe.json() == first.json()
    missing = client.get("/effects/never/sent")
    assert missing.status_code == 404 and missing.headers["content-type"] == PROBLEM_JSON
    assert missing.json()["type"] == "/problems/effect-not-found"
    assert missing.json()["idempotencyKey"] == "never/sent"


def test_http_stale_epoch_is_a_409_problem_lease3(client: TestClient) -> None:
    body = {"operation": "vm.provision", "payload": {"name": "web"}}
    assert client.post("/effects", json=body, headers=_headers("k1", "5")).status_code == 200
    stale = client.post("/effects", json=body, headers=_headers("k2", "4"))
    assert stale.status_code == 409 and stale.headers["content-type"] == PROBLEM_JSON
    assert stale.json()["type"].endswith("stale-epoch") and stale.json()["instance"] == "/effects"


@pytest.mark.parametrize(
    ("headers", "kind"),
    [
        ({"X-Fencing-Epoch": "1", "X-Work-Id": WORK}, "idempotency-key-required"),
        ({"Idempotency-Key": " k", "X-Fencing-Epoch": "1", "X-Work-Id": WORK}, "idempotency-key-required"),
        (
            {"Idempotency-Key": "k" * 256, "X-Fencing-Epoch": "1", "X-Work-Id": WORK},
            "idempotency-key-required",
        ),
        ({"Idempotency-Key": "k", "X-Fencing-Epoch": "1"}, "work-id-required"),
        ({"Idempotency-Key": "k", "X-Work-Id": WORK}, "fencing-epoch-required"),
        (_headers(epoch="-1"), "fencing-epoch-invalid"),
        (_headers(epoch="+5"), "fencing-epoch-invalid"),
        (_headers(epoch="9223372036854775808"), "fencing-epoch-invalid"),
    ],
)
def test_http_missing_or_malformed_headers_are_400_problems(
    client: TestClient, headers: dict[str, str], kind: str
) -> None:
    answer = client.post(
        "/effects", json={"operation": "vm.provision", "payload": {"name": "w"}}, headers=headers
    )
    assert answer.status_code == 400 and answer.headers["content-type"] == PROBLEM_JSON
    assert answer.json()["type"] == f"/problems/{kind}"
    assert client.get("/audit").json()["effects"] == []


@pytest.mark.parametrize(
    ("content", "detail_part"),
    [
        ("[1]", "must be a JSON object"),
        ('{"operation": "vm.provision", "payload": {}, "x": 1}', "unknown body fields: x"),
        ('{"operation": 3, "payload": {}}', "operation must be"),
        ('{"operation": "vm.provision", "payload": []}', "payload must be a JSON object"),
        ('{"operation": "vm.provision", "payload": {"name": NaN}}', "not plain JSON"),
        ("{not json", ""),
    ],
)
def test_http_bodies_of_the_wrong_shape_are_422_invalid_request(
    client: TestClient, content: str, detail_part: str
) -> None:
    headers = {**_headers(), "Content-Type": "application/json"}
    answer = client.post("/effects", content=content, headers=headers)
    assert answer.status_code == 422 and answer.json()["type"] == "/problems/invalid-request"
    assert detail_part in answer.json()["detail"]


def test_http_operation_errors_keep_their_problem_type(client: TestClient) -> None:
    answer = client.post("/effects", json={"operation": "vm.provision", "payload": {}}, headers=_headers())
    assert answer.status_code == 422 and answer.headers["content-type"] == PROBLEM_JSON
    assert answer.json()["type"] == "/problems/missing-parameter" and answer.json()["parameter"] == "name"


def test_http_faults_are_armed_listed_validated_and_cleared(client: TestClient) -> None:
    fault = {"operation": "dns.publish", "kind": "error", "problem": "conflict", "times": 2}
    armed = client.post("/faults", json=fault)
    assert armed.status_code == 201
    assert (
        armed.json()["faultId"] == "fault-1"
        and armed.json()["remaining"] == 2
        and armed.json()["status"] is None
    )
    assert [f["faultId"] for f in client.get("/faults").json()["faults"]] == ["fault-1"]
    payload = {"name": "web.example", "address": "10.0.0.1"}
    refused = client.post(
        "/effects", json={"operation": "dns.publish", "payload": payload}, headers=_headers()
    )
    assert refused.status_code == 409 and refused.json()["type"] == "/problems/conflict"
    assert client.delete("/faults").json() == {"cleared": 1}
    assert client.post(
        "/effects", json={"operation": "dns.publish", "payload": payload}, headers=_headers()
    ).is_success


@pytest.mark.parametrize(
    ("fault", "detail_part"),
    [
        ({"operation": "teleport", "kind": "error"}, "unknown operation"),
        ({"operation": "vm.provision", "kind": "explode"}, "kind"),
        (
            {"operation": "vm.provision", "kind": "timeout-after-commit", "status": 500},
            "only to kind 'error'",
        ),
        ({"operation": "vm.provision", "kind": "error", "problem": "weird"}, "give its status"),
        ({"operation": "vm.provision", "kind": "error", "times": 0}, "times"),
        ({"operation": "vm.provision", "kind": "error", "times": "2"}, "times"),
        ({"operation": "vm.provision", "kind": "error", "status": 200}, "status"),
        ({"operation": "vm.provision", "kind": "error", "colour": "red"}, "colour"),
        ({"operation": "vm.provision", "kind": "timeout-before-commit", "delayS": -1}, "delayS"),
    ],
)
def test_http_invalid_faults_are_422_invalid_fault(
    client: TestClient, fault: dict[str, Any], detail_part: str
) -> None:
    answer = client.post("/faults", json=fault)
    assert answer.status_code == 422 and answer.json()["type"] == "/problems/invalid-fault"
    assert detail_part in answer.json()["detail"]
    assert client.get("/faults").json() == {"faults": []}


def test_http_timeout_after_commit_the_probe_sees_the_effect_before_the_answer_rec6() -> None:
    """The delay is slept outside the lock: a probe during it already finds the committed effect."""
    app = create_app()

    async def scenario() -> tuple[httpx.Response, httpx.Response, float]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
            arm = {"operation": "vm.provision", "kind": "timeout-after-commit", "delayS": 0.5}
            assert (await client.post("/faults", json=arm)).status_code == 201
            body = {"operation": "vm.provision", "payload": {"name": "web"}}
            loop = asyncio.get_running_loop()
            started = loop.time()
            slow = asyncio.create_task(client.post("/effects", json=body, headers=_headers()))
            await asyncio.sleep(0.1)
            probe = await client.get("/effects/k1")
            assert not slow.done()
            answer = await slow
            return probe, answer, loop.time() - started

    probe, answer, elapsed = asyncio.run(scenario())
    assert probe.status_code == 200 and answer.status_code == 200 and probe.json() == answer.json()
    assert elapsed >= 0.45


def test_http_audit_reset_verifier_problems_and_health(client: TestClient) -> None:
    payload = {"name": "web.example", "address": "10.0.0.1"}
    client.post(
        "/effects", json={"operation": "vm.provision", "payload": {"name": "web"}}, headers=_headers("k1")
    )
    client.post("/effects", json={"operation": "dns.publish", "payload": payload}, headers=_headers("k2"))
    audit = client.get("/audit").json()
    assert len(audit["live"]) == 1 and len(audit["permanent"]) == 1 and audit["backToStart"] is False
    verdict = client.post(
        "/verifiers/dns.name-available", json={"payload": payload, "workId": "run-2"}
    ).json()
    assert verdict["ok"] is False and "already published" in verdict["detail"]
    unknown = client.post("/verifiers/nope", json={"payload": {}})
    assert unknown.status_code == 404 and unknown.json()["type"] == "/problems/verifier-not-found"
    assert client.post("/verifiers/dns.name-available", json={"payload": 3}).status_code == 422
    client.post("/faults", json={"operation": "vm.provision", "kind": "error"})
    assert client.post("/reset").json() == {"reset": True}
    audit = client.get("/audit").json()
    assert (
        audit["live"] == audit["permanent"] == audit["effects"] == audit["faults"] == []
        and audit["backToStart"]
    )
    assert client.get("/problems/stale-epoch").json() == {
        "type": "/problems/stale-epoch",
        "status": 409,
        "title": "Fencing epoch is stale",
    }
    assert client.get("/problems/nope").status_code == 404
    assert client.get("/healthz").json() == {"status": "ok", "timeScale": 0.0}
    assert client.get("/nowhere").json()["type"] == "/problems/not-found"
    assert client.put("/audit").status_code == 405


def test_http_app_uses_the_given_world_factory_and_time_scale() -> None:
    assert TestClient(create_app(time_scale=0.25)).get("/healthz").json()["timeScale"] == 0.25
    worlds: list[World] = []

    def factory() -> World:
        worlds.append(World())
        return worlds[-1]

    client = TestClient(create_app(factory))
    client.post("/effects", json={"operation": "cache.warm", "payload": {"name": "a"}}, headers=_headers())
    client.post("/reset")
    assert len(worlds) == 2 and len(worlds[0].audit()["live"]) == 1 and worlds[1].audit()["live"] == []


# --------------------------------------------------------------------------- registrations, config


def test_tools_json_registers_every_forward_operation_consistently_saga2_saga5() -> None:
    tools = load_tool_registrations()
    forward = [spec.name for spec in OPERATIONS.values() if spec.role == "create"]
    assert [tool["name"] for tool in tools] == forward
    for tool in tools:
        spec = OPERATIONS[tool["operation"]]
        assert tool["gatewayTool"] == "env" and tool["idempotent"] and tool["probe"]
        jsonschema.Draft202012Validator.check_schema(tool["parameters"])
        assert tool["parameters"] == spec.parameters and tool["parameters"]["additionalProperties"] is False
        assert tool["cost"]["durationMs"] == spec.nominal_ms
        assert tool["domain"] in ("local", "internal", "external")
        if tool["reversibility"] == "III":
            assert "compensator" not in tool and spec.permanent
            assert all(name in ("dns.name-available",) for name in tool["verifiers"])
            continue
        assert tool["reversibility"] in ("I", "II") and not tool["outbound"] and not spec.permanent
        compensator = OPERATIONS[tool["compensator"]["operation"]]
        assert compensator.role == "release" and compensator.resource_kind == spec.resource_kind
        assert tool["compensator"]["cost"]["durationMs"] == compensator.nominal_ms
        bind = tool["compensator"]["bind"]
        assert sorted(bind) == sorted(compensator.parameters["required"])
        assert all(source.removeprefix("output.") in spec.outputs for source in bind.values())
    by_name = {tool["name"]: tool for tool in tools}
    assert by_name["dns.publish"]["verifiers"] == ["dns.name-available"]
    assert by_name["notify.send"]["outbound"] is True and by_name["notify.send"]["reversibility"] == "III"
    assert {by_name[n]["reversibility"] for n in ("sandbox.compile", "cache.warm")} == {"I"}
    assert json.loads(json.dumps(tools)) == tools


def test_compensator_bindings_from_tools_json_drive_a_real_unwind() -> None:
    """Every registered compensator, bound from its forward output, releases what was created."""
    world = World()
    vm = _ok(_do(world, "setup", "vm.provision", {"name": "base"}))["vmId"]
    examples = {
        "vm.provision": {"name": "web"},
        "ip.reserve": {"region": "eu"},
        "sandbox.compile": {"vmId": vm, "source": "x"},
        "firewall.write": {"vmId": vm, "port": 22},
        "payment.hold": {"account": "a", "amount": 5},
        "cache.warm": {"name": "c"},
    }
    stack = []
    for tool in load_tool_registrations():
        if tool["reversibility"] == "III":
            continue
        output = _ok(_do(world, f"f-{tool['name']}", tool["operation"], examples[tool["name"]]))
        bound = {
            name: output[source.removeprefix("output.")]
            for name, source in tool["compensator"]["bind"].items()
        }
        stack.append((tool["compensator"]["operation"], bound))
    for index, (operation, payload) in enumerate(reversed(stack)):
        _ok(_do(world, f"c-{index}", operation, payload))
    _ok(_do(world, "teardown", "vm.terminate", {"vmId": vm}))
    assert is_back_to_start(world.audit())


def test_main_reads_its_configuration_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = TenureSettings()
    assert (defaults.sim_host, defaults.sim_port, defaults.sim_time_scale) == ("127.0.0.1", 9200, 0.0)
    env = {"TENURE_SIM_HOST": "0.0.0.0", "TENURE_SIM_PORT": "9300", "TENURE_SIM_TIME_SCALE": "0.5"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    configured = TenureSettings()
    assert (configured.sim_host, configured.sim_port, configured.sim_time_scale) == ("0.0.0.0", 9300, 0.5)
    for bad in ("70000", "x"):
        monkeypatch.setenv("TENURE_SIM_PORT", bad)
        with pytest.raises(ValidationError):
            TenureSettings()
    monkeypatch.setenv("TENURE_SIM_PORT", "9300")
    for bad_scale in ("-1", "nan", "inf", "fast"):
        monkeypatch.setenv("TENURE_SIM_TIME_SCALE", bad_scale)
        with pytest.raises(ValidationError):
            TenureSettings()


# --------------------------------------------------------------------------- for the fault scoreboard (DUR-3)


def test_a_fault_armed_for_a_work_id_fires_only_for_that_works_requests_dur3() -> None:
    world = World()
    world.arm(Fault("vm.provision", "error", problem="exhausted", work_id="run-b"))
    assert _do(world, "a1", "vm.provision", {"name": "web"}, work="run-a").status == 200
    assert world.faults()[0]["workId"] == "run-b" and world.faults()[0]["remaining"] == 1
    failed = _do(world, "b1", "vm.provision", {"name": "web"}, work="run-b")
    assert (failed.status, failed.body["type"]) == (507, "/problems/exhausted")
    assert world.faults() == []


def test_a_corrupt_answer_applies_the_effect_and_the_probe_has_the_true_body_dur3() -> None:
    world = World()
    world.arm(Fault("vm.provision", "corrupt-answer"))
    answer = _do(world, "k1", "vm.provision", {"name": "web"})
    assert answer.status == 200 and answer.raw_body is not None
    with pytest.raises(ValueError):
        json.loads(answer.raw_body)
    stored = world.probe("k1")
    assert stored is not None and stored["output"]["vmId"].startswith("vm-")
    whole = json.dumps(stored, sort_keys=True, separators=(",", ":"))
    assert len(answer.raw_body) < len(whole) and whole.startswith(answer.raw_body)
    retry = _do(world, "k1", "vm.provision", {"name": "web"})  # the same key: the true body, no new VM
    assert retry.replay and retry.body == stored and retry.raw_body is None
    assert len(world.audit()["live"]) == 1


def test_a_corrupt_answer_fault_on_a_refused_request_answers_the_refusal() -> None:
    world = World()
    world.arm(Fault("sandbox.compile", "corrupt-answer"))
    answer = _do(world, "k1", "sandbox.compile", {"vmId": "vm-none", "source": "x"})
    assert answer.status == 404 and answer.raw_body is None


def test_semantic_duplicates_are_the_same_effect_applied_under_several_keys_dur3() -> None:
    world = World()
    vm = _ok(_do(world, "k1", "vm.provision", {"name": "web"}))["vmId"]
    _do(world, "k2", "vm.provision", {"name": "web"})  # a naive retry with a fresh key: a second VM
    _do(world, "k3", "vm.provision", {"name": "web"}, work="run-2")  # another work: not a duplicate
    _do(world, "r1", "vm.terminate", {"vmId": vm})
    _do(world, "r2", "vm.terminate", {"vmId": vm})  # changes nothing: not an effect
    _do(world, "d1", "dns.publish", {"name": "a.example", "address": "10.0.0.1"})
    _do(world, "d2", "dns.publish", {"name": "a.example", "address": "10.0.0.1"})  # the same record
    assert world.audit()["duplicates"] == []  # no key was applied twice
    assert world.audit()["semanticDuplicates"] == [
        {
            "workId": WORK,
            "operation": "vm.provision",
            "payload": {"name": "web"},
            "keys": ["k1", "k2"],
            "applied": 2,
        }
    ]


def test_the_audit_can_be_limited_to_one_work_id_dur3() -> None:
    world = World()
    _do(world, "a1", "vm.provision", {"name": "web"}, work="run-a", epoch=2)
    _do(world, "b1", "vm.provision", {"name": "web"}, work="run-b")
    _do(world, "b2", "vm.provision", {"name": "web"}, work="run-b")
    world.arm(Fault("ip.reserve", "error", work_id="run-a"))
    world.arm(Fault("ip.reserve", "error", work_id="run-b"))
    mine = world.audit("run-a")
    assert mine["workId"] == "run-a"
    assert [r["workId"] for r in mine["live"]] == ["run-a"]
    assert [e["key"] for e in mine["effects"]] == ["a1"]
    assert mine["epochs"] == {"run-a": 2} and [f["workId"] for f in mine["faults"]] == ["run-a"]
    assert mine["semanticDuplicates"] == [] and not mine["backToStart"]
    theirs = world.audit("run-b")
    assert len(theirs["live"]) == 2 and theirs["semanticDuplicates"][0]["keys"] == ["b1", "b2"]
    assert world.audit("run-none")["live"] == [] and world.audit("run-none")["backToStart"]
    assert len(world.audit()["live"]) == 3


def test_a_compile_error_names_the_mistake_so_two_mistakes_read_differently_rec5() -> None:
    world = World()
    vm = _ok(_do(world, "k1", "vm.provision", {"name": "web"}))["vmId"]
    first = _do(world, "k2", "sandbox.compile", {"vmId": vm, "source": "a\nsyntax-error: wrong-type\nb"})
    second = _do(world, "k3", "sandbox.compile", {"vmId": vm, "source": "a\nsyntax-error: typo"})
    assert first.body["detail"] == "syntax error at line 2: wrong-type"
    assert second.body["detail"] == "syntax error at line 2: typo"


def test_http_work_scoped_and_corrupt_answer_faults_and_the_filtered_audit_dur3(client: TestClient) -> None:
    armed = client.post(
        "/faults", json={"operation": "vm.provision", "kind": "corrupt-answer", "workId": "run-x"}
    )
    assert armed.status_code == 201 and armed.json()["workId"] == "run-x"
    body = {"operation": "vm.provision", "payload": {"name": "web"}}
    plain = client.post("/effects", json=body, headers=_headers("k1", work="run-y"))
    assert plain.status_code == 200 and plain.json()["output"]["vmId"]
    corrupt = client.post("/effects", json=body, headers=_headers("k2", work="run-x"))
    assert corrupt.status_code == 200 and corrupt.headers["content-type"] == "application/json"
    with pytest.raises(ValueError):
        corrupt.json()
    probe = client.get("/effects/k2")
    assert probe.status_code == 200 and probe.json()["output"]["vmId"].startswith("vm-")
    audit = client.get("/audit", params={"workId": "run-x"}).json()
    assert [r["createdByKey"] for r in audit["live"]] == ["k2"] and audit["workId"] == "run-x"
    assert len(client.get("/audit").json()["live"]) == 2


@pytest.mark.parametrize(
    "fault",
    [
        {"operation": "vm.provision", "kind": "corrupt-answer", "status": 500},
        {"operation": "vm.provision", "kind": "corrupt-answer", "problem": "exhausted"},
        {"operation": "vm.provision", "kind": "error", "workId": ""},
        {"operation": "vm.provision", "kind": "error", "workId": 7},
    ],
)
def test_http_invalid_scoreboard_faults_are_refused(client: TestClient, fault: dict[str, Any]) -> None:
    refused = client.post("/faults", json=fault)
    assert refused.status_code == 422 and refused.json()["type"] == "/problems/invalid-fault"
