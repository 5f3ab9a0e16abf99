"""Hostile input is refused at the edge with a problem, never a 500 (issue 10, DEVELOPERS.md).

Three layers, each tested here without Kafka: the HTTP guard (services.common.http_guard: body
size, UTF-8 JSON without duplicate keys or lone surrogates, bounded headers), the strict and
bounded body models (services.command_api.models: Avro-sized integers, no "5" or true for an
integer, no control characters in names) and the API's path-id check (create_app). The same
inputs against the running system are in tests/e2e/test_api_hostile_input.py.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from pydantic import BaseModel, ValidationError

from services.command_api import models, routes_admin, routes_trajectories, routes_work
from services.command_api.app import create_app
from services.command_api.context import ApiDependencies
from services.command_api.input_schemas import answer_problem, schema_problem
from services.command_api.problems import CATALOG
from services.common.contracts import SubmitRun
from services.common.http_guard import MAX_JSON_DEPTH, HttpGuard
from services.common.ids import canonical_json, run_id_for
from services.common.messages import MessageCodec
from services.common.problem_json import PROBLEM_JSON
from services.common.routing import NotARunId, RecordTooLarge, command_record, partition_for_run

LIMIT = 4096
LONG_MAX = 2**63 - 1


# --- the HTTP guard on a toy application -----------------------------------------------------


@pytest.fixture
def echo() -> Iterator[tuple[TestClient, list[Any]]]:
    seen: list[Any] = []
    app = FastAPI()

    @app.post("/echo")
    async def echo_body(request: Request) -> Any:
        body = await request.body()
        seen.append(body)
        return {"size": len(body)}

    @app.put("/uploads/{name}")
    async def upload(name: str, request: Request) -> Any:
        size = sum([len(c) async for c in request.stream()])
        seen.append(size)
        return {"size": size}

    app.add_middleware(HttpGuard, catalog=CATALOG, max_body_bytes=LIMIT, raw_body_prefixes=("/uploads/",))
    with TestClient(app) as client:
        yield client, seen


def _post(client: TestClient, raw: bytes, content_type: str | None = "application/json") -> Any:
    headers = {"Content-Type": content_type} if content_type else {}
    return client.post("/echo", content=raw, headers=headers)


def _refused(response: Any, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    body: dict[str, Any] = response.json()
    assert body["type"] == f"/problems/{slug}" and body["status"] == status
    return body


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a":1,"a":2}',
        b'{"spec":{"k":1,"k":1}}',
        b'[{"x":true},{"y":1,"y":1}]',
    ],
)
def test_a_duplicate_key_anywhere_is_malformed(echo: tuple[TestClient, list[Any]], raw: bytes) -> None:
    client, seen = echo
    body = _refused(_post(client, raw), 400, "malformed-request")
    assert "duplicate key" in body["detail"]
    assert seen == []


@pytest.mark.parametrize(
    "raw",
    [b'{"\\ud800":1}', b'{"a":"\\udfff"}', b'{"a":["ok","x\\ud83d"]}', b'"\\ude00 alone"'],
)
def test_a_lone_surrogate_in_a_key_or_string_is_malformed(
    echo: tuple[TestClient, list[Any]], raw: bytes
) -> None:
    client, seen = echo
    assert "surrogate" in _refused(_post(client, raw), 400, "malformed-request")["detail"]
    assert seen == []


def test_a_surrogate_pair_is_an_ordinary_character(echo: tuple[TestClient, list[Any]]) -> None:
    client, seen = echo
    assert _post(client, b'{"smile":"\\ud83d\\ude00"}').status_code == 200
    assert len(seen) == 1


@pytest.mark.parametrize(
    ("raw", "content_type"),
    [
        (b'{"a":NaN}', "application/json"),
        (b'{"a":-Infinity}', "application/json"),
        (b'{"a":1e999}', "application/json"),
        (b'{"a":' + b"9" * 5000 + b"}", "application/json"),
        (b'{"a":"\xff"}', "application/json"),
        ('{"a":1}'.encode("utf-16"), "application/json"),
        (b'\xef\xbb\xbf{"a":1}', "application/json"),
        (b'{"a":1', "application/json"),
        (b'{"a":1}', "text/plain"),
        (b"a=1", "application/x-www-form-urlencoded"),
        (b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), "application/json"),
        (b"[" * 100_000, "application/json"),
    ],
)
def test_a_body_that_is_not_acceptable_utf8_json_is_malformed(
    echo: tuple[TestClient, list[Any]], raw: bytes, content_type: str
) -> None:
    client, seen = echo
    if len(raw) > LIMIT:
        raw = raw[: LIMIT - 1]
    _refused(_post(client, raw, content_type), 400, "malformed-request")
    assert seen == []


def test_acceptable_json_reaches_the_application_unchanged(echo: tuple[TestClient, list[Any]]) -> None:
    client, seen = echo
    nested = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    for raw, content_type in (
        (b'{"a":1.5,"b":[1,2,{"c":null}],"d":"\\u0000 is data here"}', "application/json"),
        (nested, "application/json; charset=utf-8"),
        (b'{"x":1}', "application/problem+json"),
        (b'{"x":1}', None),
        (b"", "text/plain"),  # no body: nothing to check
    ):
        assert _post(client, raw, content_type).status_code == 200
        assert seen[-1] == raw


def test_a_body_over_the_limit_is_413_by_content_length_and_counted(
    echo: tuple[TestClient, list[Any]],
) -> None:
    client, seen = echo
    exactly = b'"' + b"x" * (LIMIT - 2) + b'"'
    assert _post(client, exactly).status_code == 200
    seen.clear()
    body = _refused(_post(client, exactly + b" "), 413, "payload-too-large")
    assert body["maxBodyBytes"] == LIMIT

    def chunked() -> Iterator[bytes]:
        yield b'"'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"'

    response = client.post("/echo", content=chunked(), headers={"Content-Type": "application/json"})
    _refused(response, 413, "payload-too-large")
    assert "connection" not in response.headers  # drained: the connection may be reused
    assert seen == []


def test_upload_bodies_are_streamed_to_their_route_unchecked(echo: tuple[TestClient, list[Any]]) -> None:
    client, seen = echo
    big = b"\xff\x00" * LIMIT  # larger than the limit and not UTF-8: bytes, not JSON
    assert client.put("/uploads/a", content=big).json() == {"size": len(big)}
    assert seen == [len(big)]


@pytest.mark.parametrize(
    "headers",
    [
        {"Idempotency-Key": "k" * 201},
        {"Idempotency-Key": "tab\there"},
        {"Idempotency-Key": "caf\u00e9"},
        {"X-Correlation-Id": "c" * 500},
    ],
)
def test_bounded_headers_are_validated(echo: tuple[TestClient, list[Any]], headers: dict[str, str]) -> None:
    client, seen = echo
    encoded = {k: v.encode("latin-1") for k, v in headers.items()}
    response = client.post("/echo", content=b"{}", headers={**encoded, "Content-Type": "application/json"})
    body = _refused(response, 422, "validation-failed")
    assert body["errors"][0]["location"][0] == "header"
    assert seen == []
    ok = client.post("/echo", content=b"{}", headers={"Idempotency-Key": "k" * 200})
    assert ok.status_code == 200


# --- the bounded, strict body models ---------------------------------------------------------


@pytest.mark.parametrize("field", ["leaseEpoch", "sequence"])
@pytest.mark.parametrize("value", [2**63, 0, -1, True, "5", 5.0, None])
def test_epochs_and_sequences_are_strict_avro_longs_LEASE_3(field: str, value: Any) -> None:
    with pytest.raises(ValidationError):
        models.HeartbeatRequest.model_validate({"leaseEpoch": 1, "sequence": 1, field: value})
    with pytest.raises(ValidationError):
        models.ReportRequest.model_validate(
            {"leaseEpoch": 1, "sequence": 1, "outcome": "failed", field: value}
        )
    largest = models.HeartbeatRequest.model_validate({"leaseEpoch": 1, "sequence": 1, field: LONG_MAX})
    assert getattr(largest, field) == LONG_MAX


@pytest.mark.parametrize(
    "changes",
    [{"heartbeatSeconds": True}, {"leaseSeconds": "5"}, {"runnerId": 7}, {"capabilities": ["ok\x00"]}],
)
def test_claims_take_no_loose_types(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        models.ClaimRequest.model_validate({"runnerId": "r", **changes})


@pytest.mark.parametrize("tenant", ["ac\x00me", "line\nbreak", "del\x7f", "", "t" * 201, 5])
def test_a_tenant_is_a_name_without_control_characters(tenant: Any) -> None:
    with pytest.raises(ValidationError):
        models.SubmitRunRequest.model_validate({"tenant": tenant, "executionSpec": {}, "timeoutSeconds": 60})


def test_free_text_keeps_tab_and_newline_but_no_other_control_character() -> None:
    assert models.CancelRequest.model_validate({"reason": "a\n\tb\r"}).reason == "a\n\tb\r"
    for bad in ("nul\x00", "bell\x07", "esc\x1b[31m"):
        with pytest.raises(ValidationError):
            models.CancelRequest.model_validate({"reason": bad})
    with pytest.raises(ValidationError):
        models.SubmitRunRequest.model_validate(
            {"tenant": "acme", "executionSpec": {}, "timeoutSeconds": 60, "retrySafe": 1}
        )


def test_saga_quantities_and_money_stay_summable_and_finite() -> None:
    lease = {"attemptId": "att_x_1", "leaseEpoch": 1, "tool": "t"}
    ok = routes_trajectories.ProposeStepBody.model_validate({**lease, "tokensUsed": 2**53 - 1})
    assert ok.tokensUsed == 2**53 - 1
    for bad in (
        {"tokensUsed": 2**53},
        {"moneyUsed": float("inf")},
        {"moneyUsed": 1e300},
        {"repairOf": 2**63},
    ):
        with pytest.raises(ValidationError):
            routes_trajectories.ProposeStepBody.model_validate({**lease, **bad})
    with pytest.raises(ValidationError):
        routes_trajectories.ResolveIncidentBody.model_validate({"runId": "run_zz", "resolution": "abandon"})
    run_id = run_id_for("acme", "k")
    resolved = routes_trajectories.ResolveIncidentBody.model_validate(
        {"runId": run_id, "resolution": "abandon"}
    )
    assert resolved.runId == run_id


def _body_models() -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    for module in (models, routes_work, routes_admin, routes_trajectories):
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseModel)
                and value.__module__ == module.__name__
            ):
                found.append(value)
    return found


def test_every_request_body_is_strict_and_every_integer_and_string_is_bounded() -> None:
    """Every integer an API body accepts fits an Avro long (the int fields are bounded tighter)."""
    responses = {models.PendingCommand, models.RunPage}
    bodies = [m for m in _body_models() if m not in responses]
    assert len(bodies) >= 15
    for model in bodies:
        assert issubclass(model, models.ApiBody), model
        assert model.model_config.get("strict") is True and model.model_config.get("extra") == "forbid"
        schema = model.model_json_schema()
        for name, prop in _properties(schema):
            for option in prop.get("anyOf", [prop]):
                if option.get("type") == "integer":
                    assert option["minimum"] >= -(2**63) and option["maximum"] <= LONG_MAX, (model, name)
                if option.get("type") == "number":
                    assert "maximum" in option, (model, name)
                if option.get("type") == "string":
                    assert "maxLength" in option or "pattern" in option or "enum" in option, (model, name)


def _properties(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for definition in [schema, *schema.get("$defs", {}).values()]:
        for name, prop in definition.get("properties", {}).items():
            yield name, prop
            if "items" in prop:
                yield f"{name}[]", prop["items"]


# --- the API application: path ids, version ------------------------------------------------


def _no_dependencies() -> ApiDependencies:
    raise AssertionError("these tests never open the API's dependencies")


@pytest.fixture(scope="module")
def api() -> TestClient:
    # No lifespan: the dependencies stay closed, so a request that passes the edge checks
    # answers 503 "starting"; one refused by them answers its 4xx without touching anything.
    return TestClient(create_app(_no_dependencies, max_body_bytes=LIMIT), raise_server_exceptions=False)


@pytest.mark.parametrize(
    ("method", "path", "status", "slug"),
    [
        ("POST", "/attempts/att_zzzz_1/heartbeat", 409, "unknown-attempt"),
        ("POST", "/attempts/att_0123/report", 409, "unknown-attempt"),
        ("POST", "/attempts/att_" + "a" * 32 + "_0/uploads", 409, "unknown-attempt"),
        ("POST", "/attempts/att_" + "a" * 32 + "_\u0661/input-request", 409, "unknown-attempt"),
        ("GET", "/runs/run_zz", 404, "run-not-found"),
        ("POST", "/runs/run_zz/cancel", 404, "run-not-found"),
        ("POST", "/runs/RUN_" + "A" * 32 + "/attempts", 404, "run-not-found"),
        ("GET", "/runs/run_%00/lease", 404, "run-not-found"),
        ("POST", "/runs/not-a-run/trajectory/steps/1/approval", 404, "run-not-found"),
        ("PUT", "/uploads/grant_zz_1", 404, "grant-not-found"),
        ("POST", "/incidents/inc_zz/resolve", 404, "not-found"),
        ("PUT", "/admin/blocks/tenant/a%00b", 404, "not-found"),
        ("DELETE", "/admin/blocks/tenant/" + "s" * 201, 404, "not-found"),
    ],
)
def test_a_malformed_path_id_is_no_such_resource(
    api: TestClient, method: str, path: str, status: int, slug: str
) -> None:
    response = api.request(method, path, json={"leaseEpoch": 1, "sequence": 1})
    _refused(response, status, slug)


def test_a_well_formed_id_passes_the_edge(api: TestClient) -> None:
    run_id = run_id_for("acme", "k")
    _refused(api.get(f"/runs/{run_id}"), 503, "unavailable")


def test_every_path_and_query_integer_is_bounded_like_its_avro_long() -> None:
    spec = create_app(_no_dependencies).openapi()
    integers = [
        (path, p["name"], schema)
        for path, item in spec["paths"].items()
        for operation in item.values()
        for p in operation.get("parameters", [])
        for schema in p["schema"].get("anyOf", [p["schema"]])
        if schema.get("type") == "integer"
    ]
    assert any(name == "index" for _, name, _ in integers)
    for path, name, schema in integers:
        assert schema["minimum"] >= 0 and schema["maximum"] <= LONG_MAX, (path, name)


def test_the_api_refuses_bodies_through_its_guard(api: TestClient) -> None:
    headers = {"Idempotency-Key": "k", "Content-Type": "application/json"}
    _refused(api.post("/runs", content=b"x" * (LIMIT + 1), headers=headers), 413, "payload-too-large")
    dup = b'{"tenant":"a","tenant":"b","executionSpec":{},"timeoutSeconds":60}'
    _refused(api.post("/runs", content=dup, headers=headers), 400, "malformed-request")


def test_the_openapi_has_one_version_the_package_s() -> None:
    spec = create_app(_no_dependencies).openapi()
    assert spec["info"]["version"] == version("tenure")
    assert "What the API refuses" in spec["info"]["description"]
    assert json.dumps(spec)  # every bound is representable in the published document


def test_routing_refuses_a_command_kafka_would_refuse_before_publishing() -> None:
    """A body under the HTTP limit can still make a record over Kafka's: 413, never a 503."""
    run_id = run_id_for("acme", "k")
    spec = canonical_json({"blob": "x" * 1_000_000})
    command = SubmitRun(
        command_id="cmd_1",
        run_id=run_id,
        issued_at=0,
        correlation_id=run_id,
        actor="a",
        tenant="acme",
        idempotency_key="k",
        execution_spec=spec,
        timeout_seconds=60,
    )
    with pytest.raises(RecordTooLarge):
        command_record(MessageCodec(), command)
    assert command_record(MessageCodec(), dataclasses.replace(command, execution_spec="{}")).value


def test_routing_refuses_what_is_not_a_run_id() -> None:
    assert 0 <= partition_for_run(run_id_for("acme", "k")) < 64
    for bad in ("run_zzzz", "run_zz" + "0" * 30, "run_" + "a" * 32 + "\n", "att_" + "a" * 32):
        with pytest.raises(NotARunId):
            partition_for_run(bad)


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#/definitions/nowhere"},
        {"$ref": "https://example.com/elsewhere.json"},
        {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {"type": "string", "pattern": "("},
    ],
)
def test_an_input_schema_must_be_able_to_validate_answers_EXE_8(schema: dict[str, Any]) -> None:
    assert schema_problem(schema)
    assert answer_problem("x", schema) is not None  # an answer is refused, never an exception


def test_a_self_contained_input_schema_is_accepted_EXE_8() -> None:
    schema = {"$defs": {"n": {"type": "string"}}, "properties": {"x": {"$ref": "#/$defs/n"}}}
    assert schema_problem(schema) is None
    assert answer_problem({"x": "ok"}, schema) is None
    assert answer_problem({"x": 1}, schema) == (
        "the answer does not match the input schema: 1 is not of type 'string'",
        ["x"],
    )
