"""Hostile input at the effect gateway gets a clear 4xx problem, never a 500, and records nothing.

`epoch` >= 2^63 used to overflow the Avro `long` of RecordEffectIntent and answer 500; "5" and
true were accepted as integers; a runId that is not a run id, control characters, a key that
cannot travel in an HTTP header, or a payload that cannot be sent on were found only after the
intent was recorded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.common.auth import Principal
from services.common.avro import SchemaViolation
from services.common.contracts import RecordEffectIntent
from services.common.messages import MessageCodec
from services.common.routing import command_record
from services.effect_gateway import app as gateway_app_module
from services.effect_gateway.app import CATALOG, MAX_EPOCH
from tests.support.gateway import OfflineGateway, gateway_app
from tests.support.lease_run import Run

pytestmark = pytest.mark.timeout(30)

KEYS = {"runkey": Principal("runner:runner-a", "submitter")}
AUTH = {"Authorization": "Bearer runkey"}


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


def body(run: Run, **overrides: Any) -> dict[str, Any]:
    lease = run.state.lease
    assert lease is not None
    return {
        "runId": run.run_id,
        "attemptId": lease.attempt_id,
        "epoch": lease.epoch,
        "idempotencyKey": "k-1",
        "tool": "ledger",
        "operation": "credit",
        "payload": {"amount": 1},
        **overrides,
    }


def assert_refused(response: Any, status: int = 422, slug: str = "validation-failed") -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json"), response.text
    assert response.json()["type"] == f"/problems/{slug}"


@pytest.mark.parametrize(
    "epoch",
    [2**63, 2**64 + 5, "5", True, False, 0, -1, 1.0, None],
    ids=["2^63", "2^64+5", "string-5", "true", "false", "zero", "negative", "float", "null"],
)
def test_an_epoch_avro_cannot_carry_or_that_is_not_an_integer_is_422_lease_3(
    http: TestClient, gateway: OfflineGateway, run: Run, epoch: Any
) -> None:
    response = http.post("/effects", json=body(run, epoch=epoch), headers=AUTH)
    assert_refused(response)
    assert response.json()["errors"][0]["location"] == ["body", "epoch"]
    assert gateway.sent == [], "nothing is recorded for a refused request"


def test_the_largest_avro_long_is_a_valid_epoch_and_its_intent_encodes(
    http: TestClient, gateway: OfflineGateway, run: Run
) -> None:
    response = http.post("/effects", json=body(run, epoch=MAX_EPOCH), headers=AUTH)
    # Valid input: the coordinator, not the validator, says that no lease has this epoch.
    assert response.status_code == 200, response.text
    (intent, *_) = gateway.sent
    assert isinstance(intent, RecordEffectIntent) and intent.lease_epoch == MAX_EPOCH
    codec = MessageCodec()
    assert codec.decode(command_record(codec, intent).value) == intent
    with pytest.raises(SchemaViolation):  # what the bound keeps out: the Avro long overflows
        command_record(codec, replace(intent, lease_epoch=MAX_EPOCH + 1))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("runId", "att_zzzz_1"),  # not a run id: used to be a ValueError in partition routing
        ("runId", "run_zz0123"),
        ("runId", "run_ab\x00cd"),
        ("runId", "r" * 201),
        ("attemptId", "att\x00nul"),
        ("attemptId", "att with space"),
        ("attemptId", "att_\u00e9"),
        ("attemptId", ""),
        ("attemptId", 7),
        ("attemptId", "att_" + "0" * 32 + "_" + "9" * 20),  # an epoch no Avro long can carry
        ("idempotencyKey", "line\nbreak"),
        ("idempotencyKey", "cl\u00e9"),  # not sendable as an HTTP header
        ("idempotencyKey", " padded "),
        ("idempotencyKey", "k" * 201),
        ("tool", "led\x7fger"),
        ("operation", "credit\x00"),
        ("operation", "o" * 201),
        ("payload", [1, 2]),
    ],
)
def test_ids_text_and_payload_the_gateway_cannot_carry_are_422(
    http: TestClient, gateway: OfflineGateway, run: Run, field: str, value: Any
) -> None:
    response = http.post("/effects", json=body(run, **{field: value}), headers=AUTH)
    assert_refused(response)
    assert response.json()["errors"][0]["location"][:2] == ["body", field]
    assert gateway.sent == [] and gateway.tool.requests == []


@pytest.mark.parametrize(
    "payload_text",
    ['{"x": NaN}', '{"x": Infinity}', '{"x": "\\ud800"}', '{"\\udfff": 1}', '{"x": 1, "x": 2}'],
    ids=["nan", "infinity", "lone-surrogate-value", "lone-surrogate-key", "duplicate-key"],
)
def test_a_payload_that_cannot_be_sent_on_is_refused_before_the_intent(
    http: TestClient, gateway: OfflineGateway, run: Run, payload_text: str
) -> None:
    raw = json.dumps(body(run)).replace('{"amount": 1}', payload_text)
    assert payload_text in raw
    response = http.post("/effects", content=raw, headers={**AUTH, "Content-Type": "application/json"})
    assert_refused(response, 400, "malformed-request")
    assert gateway.sent == [] and gateway.tool.requests == []


def test_unknown_fields_malformed_json_and_oversized_bodies_are_problems(
    http: TestClient, gateway: OfflineGateway, run: Run
) -> None:
    assert_refused(http.post("/effects", json={**body(run), "extra": 1}, headers=AUTH))
    json_headers = {**AUTH, "Content-Type": "application/json"}
    assert_refused(
        http.post("/effects", content=b'{"runId": ', headers=json_headers), 400, "malformed-request"
    )
    deep = b'{"payload": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"
    assert_refused(http.post("/effects", content=deep, headers=json_headers), 400, "malformed-request")
    huge = body(run, payload={"blob": "x" * 100_000})
    assert_refused(http.post("/effects", json=huge, headers=AUTH), 413, "payload-too-large")
    assert gateway.sent == []


def test_verify_and_fencing_bound_their_input_too(http: TestClient, run: Run) -> None:
    verify = {"runId": run.run_id, "tool": "ledger", "verifier": "ok", "payload": {}}
    assert_refused(http.post("/verify", json={**verify, "verifier": "a\x00b"}, headers=AUTH))
    assert_refused(http.post("/verify", json={**verify, "runId": "nope"}, headers=AUTH))
    assert_refused(http.get("/runs/" + "r" * 300 + "/fencing", headers=AUTH))
    assert_refused(http.get(f"/runs/run_{'f' * 32}/fencing", headers=AUTH), 404, "run-not-found")


def test_every_gateway_problem_type_is_documented_at_its_type_uri(http: TestClient) -> None:
    assert not hasattr(gateway_app_module, "_problem"), "the gateway uses the shared problem implementation"
    slugs = ["stale-epoch", "fenced-by-recipient", "run-not-found", "unknown-tool", "tool-failed"]
    slugs += ["outcome-unknown", "not-lease-holder", "unknown-attempt", "unavailable", "not-ready"]
    for slug in slugs:
        assert slug in CATALOG
        described = http.get(f"/problems/{slug}")
        assert described.status_code == 200 and described.json()["meaning"], slug
