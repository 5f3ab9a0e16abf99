"""The OpenAPI document matches the API (issue 17, "OpenAPI that matches the API").

The document is valid OpenAPI 3; every operation declares its problem answers as
application/problem+json with the Problem schema and a real example; 503s carry Retry-After;
operationIds are unique and stable (pinned below: renaming one breaks generated clients, so it
must be a decision); the Idempotency-Key the submission refuses to go without is required; and
`security` says exactly which operations answer 401 to a caller without a key, checked by
sending every operation of the running app without one. Every operation declares its 2xx
answers with a typed schema and an example that validates against it; the epoch-millisecond
times of the run, lease, attempt and trajectory views declare their RFC 3339 siblings; and the
generated client (tests/support/openapi_client.py) refuses what the document does not declare.
The walkthrough through that client on the real system is tests/e2e/test_openapi_client.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openapi_spec_validator import validate

from services.command_api.app import create_app
from services.command_api.responses import ANSWERS
from services.common.contracts.ids import attempt_id_for
from services.common.ids import run_id_for
from services.common.problem_json import PROBLEM_JSON
from tests.support.api_harness import InMemoryTenure, api_client
from tests.support.openapi_client import OpenApiClient, OpenApiMismatch, validator_for

pytestmark = pytest.mark.timeout(60)

RUN = run_id_for("acme", "openapi")
PATH_VALUES = {
    "run_id": RUN,
    "attempt_id": attempt_id_for(RUN, 1),
    "grant_id": "grant_" + "0" * 32 + "_" + "0" * 16,
    "incident_id": "inc_" + "0" * 32,
    "endpoint": "ledger",
    "schedule_id": "nightly",
    "artifact_id": "art_" + "0" * 32,
    "kind": "tenant",
    "subject": "acme",
    "index": "0",
    "slug": "not-found",
    "queue": "default",
}
OPERATION_IDS = {
    "abort_trajectory", "acknowledge_rollback", "adopt_lease", "approve_pivot", "block", "blocks",
    "bulkheads", "cancel_run", "claim", "claim_next", "clear_artifact", "clear_quarantine", "configure",
    "create_schedule", "describe_problem", "disable_breaker", "envelope", "finish_trajectory",
    "force_open_breaker", "get_breaker", "get_run", "get_schedule", "get_trajectory", "get_watchdog",
    "healthz", "heartbeat", "lease_record", "list_breakers", "list_incidents", "list_runs",
    "list_schedules", "listing", "observe", "patch_schedule", "pause_schedule", "propose_step",
    "provide_input", "quarantine", "read_artifact", "read_quarantine", "readyz", "renew_leases", "report",
    "request_input", "reset_breaker", "resolve_incident", "resume_schedule", "retry_run", "stage",
    "start_trajectory", "submit_run", "suspicion", "takeover", "trigger_schedule", "unblock", "upload",
    "upload_grant",
    "lock_artifact", "run_lock",  # local mode (EXE-16)
}  # fmt: skip


def _document() -> dict[str, Any]:
    def never() -> Any:
        raise AssertionError("only the document of this app is read")

    schema: dict[str, Any] = create_app(never).openapi()
    return schema


def _operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


def test_the_document_is_valid_openapi_with_unique_stable_operation_ids() -> None:
    doc = _document()
    validate(doc)
    ids = [op["operationId"] for _, _, op in _operations(doc)]
    assert len(ids) == len(set(ids))
    assert set(ids) == OPERATION_IDS


def test_every_operation_declares_its_problems_as_problem_json_with_an_example() -> None:
    doc = _document()
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    problem = doc["components"]["schemas"]["Problem"]
    assert set(problem["required"]) == {"type", "title", "status", "detail"}
    for path, method, operation in _operations(doc):
        responses = operation["responses"]
        for status in ("400", "422", "500", "503"):
            assert status in responses, (path, method, status)
        for status, response in responses.items():
            if int(status) < 400:
                continue
            content = response["content"][PROBLEM_JSON]
            assert content["schema"] == {"$ref": "#/components/schemas/Problem"}, (path, method, status)
            assert content["example"]["status"] == int(status), (path, method, status)
            assert content["example"]["type"].startswith("/problems/")
        assert "Retry-After" in responses["503"]["headers"]
        if method in ("post", "put", "patch"):
            assert "413" in responses, (path, method)


def test_the_submissions_idempotency_key_is_required_and_bearer_auth_is_declared() -> None:
    doc = _document()
    submit = doc["paths"]["/runs"]["post"]
    key = next(p for p in submit["parameters"] if p["name"] == "Idempotency-Key")
    assert key["in"] == "header" and key["required"] is True
    # The others take a key to make a repeat safe and act without one (create_schedule makes one up).
    optional = [
        op["operationId"]
        for _, _, op in _operations(doc)
        for p in op.get("parameters", [])
        if p["name"] == "Idempotency-Key" and p.get("required") and op["operationId"] != "submit_run"
    ]
    assert optional == []
    upload = doc["paths"]["/uploads/{grant_id}"]["put"]["requestBody"]
    assert upload["required"] and upload["content"]["*/*"]["schema"]["format"] == "binary"
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key this deployment knows (TENURE_API_KEYS), as a bearer token.",
    }


@pytest.fixture()
def keyed_api(tmp_path: Path) -> Iterator[TestClient]:
    with api_client(tmp_path, api_keys="olga-key=olga:operator", tenure=InMemoryTenure()) as (client, _):
        yield client


def test_security_names_exactly_the_operations_that_refuse_a_caller_without_a_key(
    keyed_api: TestClient,
) -> None:
    doc = keyed_api.get("/openapi.json").json()
    mismatches = []
    for path, method, operation in _operations(doc):
        url = path.format(**PATH_VALUES)
        answer = keyed_api.request(method.upper(), url, json={} if method != "get" else None)
        secured = "security" in operation
        if (answer.status_code == 401) != secured:
            mismatches.append((method, path, answer.status_code, secured))
    assert mismatches == []


def _resolved(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _typed(doc: dict[str, Any], schema: dict[str, Any]) -> bool:
    if "anyOf" in schema:
        return all(_typed(doc, s) for s in schema["anyOf"])
    shown = _resolved(doc, schema)
    return bool(shown.get("properties")) or shown.get("type") == "string"


def test_every_operation_declares_a_typed_2xx_answer_with_an_example_that_validates() -> None:
    """Issue 17: a generated client gets a type for every success, not `Any`."""
    doc = _document()
    untyped, no_example, invalid = [], [], []
    for path, method, operation in _operations(doc):
        name = f"{operation['operationId']} ({method.upper()} {path})"
        successes = {s: r for s, r in operation["responses"].items() if s.startswith("2")}
        if not successes:
            untyped.append(f"{name}: no 2xx answer declared")
        for status, response in successes.items():
            if status == "204":
                assert "content" not in response, name
                continue
            for media_type, media in response.get("content", {}).items():
                if not _typed(doc, media.get("schema", {})):
                    untyped.append(
                        f"{name} {status} {media_type}: untyped; add it to services/command_api/responses.py"
                    )
                if "example" not in media:
                    no_example.append(f"{name} {status} {media_type}")
                    continue
                errors = list(validator_for(doc, media["schema"]).iter_errors(media["example"]))
                if errors:
                    invalid.append(f"{name} {status}: {errors[0].message}")
            if not response.get("content"):
                untyped.append(f"{name} {status}: no body declared")
    assert untyped == [] and no_example == [] and invalid == []
    ids = {op["operationId"] for _, _, op in _operations(doc)}
    assert set(ANSWERS) <= ids, f"answers declared for no operation: {sorted(set(ANSWERS) - ids)}"


def test_answer_models_allow_more_fields_and_times_declare_their_rfc_3339_siblings() -> None:
    """Forward compatible (additionalProperties), and each `<x>At` of the run, lease, attempt and
    trajectory views has an optional `<x>AtRfc3339` string (date-time) beside it."""
    schemas = _document()["components"]["schemas"]
    for name in ("RunView", "LeaseView", "AttemptView", "HistoryEntry", "Renewal", "LeaseGrant",
                 "HeartbeatAnswer", "TrajectoryView", "IncidentView", "UploadGrantAnswer"):  # fmt: skip
        schema = schemas[name]
        assert schema.get("additionalProperties") is True, name
        properties = schema["properties"]
        times = [p for p, s in properties.items() if p.endswith("At") and "integer" in str(s)]
        assert times, name
        for field in times:
            sibling = properties.get(f"{field}Rfc3339")
            assert sibling is not None, f"{name}.{field} has no {field}Rfc3339"
            assert sibling.get("format") == "date-time" and f"{field}Rfc3339" not in schema.get(
                "required", []
            )


def test_the_generated_client_refuses_what_the_document_does_not_declare(tmp_path: Path) -> None:
    """The e2e walkthrough proves something only if its client fails on a mismatch."""
    with api_client(tmp_path, tenure=InMemoryTenure()) as (client, _):
        doc = client.get("/openapi.json").json()
        spec = {"tenant": "acme", "executionSpec": {"agent": "x"}, "timeoutSeconds": 60}
        api = OpenApiClient(client, doc)  # type: ignore[arg-type]
        assert api.submit_run(idempotency_key="k", body=spec).status == 201
        with pytest.raises(OpenApiMismatch, match="request body"):
            api.submit_run(idempotency_key="k", body={**spec, "timeoutSeconds": "60"})
        with pytest.raises(TypeError, match="idempotency_key"):
            api.submit_run(body=spec)
        strict = _mutated(doc, lambda d: d["components"]["schemas"]["RunView"]["required"].append("nope"))
        with pytest.raises(OpenApiMismatch, match="'nope' is a required property"):
            OpenApiClient(client, strict).submit_run(idempotency_key="k", body=spec)  # type: ignore[arg-type]
        fewer = _mutated(doc, lambda d: d["paths"]["/runs"]["post"]["responses"].pop("200"))
        with pytest.raises(OpenApiMismatch, match="answered 200, which the document does not declare"):
            OpenApiClient(client, fewer).submit_run(idempotency_key="k", body=spec)  # type: ignore[arg-type]


def _mutated(doc: dict[str, Any], change: Any) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(doc))
    change(copy)
    return copy
