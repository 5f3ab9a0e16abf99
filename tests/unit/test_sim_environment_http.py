"""The simulated environment's HTTP app: effects with their idempotency key, fencing epoch and work
id headers (EXE-6, LEASE-3), the probe (REC-6), problem+json for malformed requests, faults armed
over HTTP (including the DUR-3 scoreboard's), the audit, the verifiers and health."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from services.sim_environment.app import create_app
from services.sim_environment.world import World
from tests.support.sim_world import PROBLEM_JSON, WORK

pytestmark = pytest.mark.timeout(30)


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
