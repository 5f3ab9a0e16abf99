"""Hostile input to the running command API gets a 4xx problem, never a 500 (issue 10).

Each test reproduces one input that answered `500 text/plain` on the landed main (and once reset
the next request on the same keep-alive connection), against real processes on the real broker.
Every refusal must leave runs.commands untouched (DEVELOPERS.md: "hostile input gets a clear
answer, never a 500"; the bounds serve LEASE-3 and EXE-4, whose fencing epochs and sequences are
Avro longs).
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.common.kafka import PartitionReader
from services.common.topics import RUNS_COMMANDS
from tests.support.tenure import TenureSystem, claim, problem_type, submit

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TOO_BIG = 2**63  # one past the largest Avro long


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenureSystem]:
    s = TenureSystem(tenure_topics, tmp_path_factory.mktemp("hostile"), TENURE_MAX_BODY_BYTES="65536").start()
    yield s
    s.stop()


@pytest.fixture
def client(system: TenureSystem) -> Iterator[httpx.Client]:
    with system.client() as c:
        yield c


@pytest.fixture(scope="module")
def grant(system: TenureSystem) -> dict[str, Any]:
    with system.client() as c:
        run = submit(c, f"hostile-{uuid.uuid4()}")
        granted = claim(c, run["runId"], lease_seconds=600, heartbeat_seconds=60)
        assert granted.status_code == 201, granted.text
        body: dict[str, Any] = granted.json()
        return body


def end_offsets(system: TenureSystem) -> dict[tuple[str, int], int]:
    """The end of runs.commands, the topic every API write goes to.

    runs.events is not compared: the topics are shared by every e2e module, so this module's
    coordinator restores earlier modules' runs and records their lease expiries and jeopardy on
    its own clock while a test runs (a CI run saw two such events land mid-test). A refused
    request writes no command, so no event can follow from it.
    """
    reader = PartitionReader(system.bootstrap, client_id="tenure-test-offsets")
    try:
        return {
            (RUNS_COMMANDS.name, p): reader.end_offset(RUNS_COMMANDS.name, p)
            for p in range(RUNS_COMMANDS.partitions)
        }
    finally:
        reader.close()


def assert_refused(response: httpx.Response, status: int, slug: str | None = None) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json"), response.text
    if slug is not None:
        assert problem_type(response) == slug, response.text


def test_an_attempt_id_whose_run_part_is_not_a_run_id_is_unknown_not_500(
    system: TenureSystem, client: httpx.Client
) -> None:
    before = end_offsets(system)
    for path in (
        "/attempts/att_zzzz_1/heartbeat",
        "/attempts/att_zzzz_1/report",
        "/attempts/att_zzzz_1/input-request",
        "/attempts/att_zzzz_1/uploads",
    ):
        r = client.post(path, json={"leaseEpoch": 1, "sequence": 1})
        assert r.status_code < 500 and r.status_code in (404, 409, 422), (path, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
    assert_refused(
        client.post("/attempts/att_zzzz_1/heartbeat", json={"leaseEpoch": 1, "sequence": 1}),
        409,
        "unknown-attempt",
    )
    assert end_offsets(system) == before


@pytest.mark.parametrize(
    "path",
    [
        "/runs/run_zz/cancel",
        "/runs/run_zz/retry",
        "/runs/run_zz/attempts",
        "/runs/run_zz/lease/takeover",
        "/runs/run_zz/input",
        "/runs/run_zz/trajectory",
        "/runs/run_zz/trajectory/steps",
        "/runs/run_zz/trajectory/finish",
        "/runs/not-a-run/trajectory/abort",
        "/runs/run_%00/trajectory/lease",
        "/runs/run_zz/trajectory/steps/0/approval",
        "/incidents/inc_zz/resolve",
    ],
)
def test_every_route_with_a_malformed_path_id_answers_a_problem(client: httpx.Client, path: str) -> None:
    r = client.post(path, json={})
    assert r.status_code in (404, 409, 422), r.text
    assert r.headers["content-type"].startswith("application/problem+json")


def test_reads_and_uploads_with_a_malformed_id_are_404(client: httpx.Client, grant: dict[str, Any]) -> None:
    for read in ("/runs/run_zz", "/runs/run_zz/lease", "/runs/run_zz/trajectory"):
        assert_refused(client.get(read), 404, "run-not-found")
    assert_refused(client.put("/uploads/grant_zz_0", content=b"x"), 404, "grant-not-found")
    step = f"/runs/{grant['runId']}/trajectory/steps/{TOO_BIG}/approval"
    assert_refused(client.post(step, json={"decision": "approve"}), 422, "validation-failed")


def test_an_incident_resolution_naming_a_malformed_run_is_refused(client: httpx.Client) -> None:
    r = client.post("/incidents/inc_x/resolve", json={"runId": "run_zz", "resolution": "abandon"})
    assert r.status_code in (404, 422), r.text
    assert r.headers["content-type"].startswith("application/problem+json")


@pytest.mark.parametrize("field", ["leaseEpoch", "sequence"])
def test_epoch_and_sequence_beyond_an_avro_long_are_422_LEASE_3(
    system: TenureSystem, client: httpx.Client, grant: dict[str, Any], field: str
) -> None:
    before = end_offsets(system)
    body = {"leaseEpoch": grant["epoch"], "sequence": 1, field: TOO_BIG}
    assert_refused(client.post(f"/attempts/{grant['attemptId']}/heartbeat", json=body), 422)
    report = {**body, "outcome": "failed", "errorCode": "X"}
    assert_refused(client.post(f"/attempts/{grant['attemptId']}/report", json=report), 422)
    assert end_offsets(system) == before


def test_a_lone_surrogate_in_the_execution_spec_is_400(system: TenureSystem, client: httpx.Client) -> None:
    before = end_offsets(system)
    for raw in (
        '{"tenant":"acme","timeoutSeconds":60,"executionSpec":{"\\ud800":1}}',
        '{"tenant":"acme","timeoutSeconds":60,"executionSpec":{"a":"\\udfff"}}',
    ):
        r = client.post(
            "/runs",
            content=raw.encode(),
            headers={"Idempotency-Key": str(uuid.uuid4()), "Content-Type": "application/json"},
        )
        assert_refused(r, 400, "malformed-request")
    assert end_offsets(system) == before


@pytest.mark.parametrize(
    "changes",
    [{"heartbeatSeconds": True}, {"leaseSeconds": "5"}, {"heartbeatSeconds": 5.0}, {"runnerId": 7}],
)
def test_strings_and_booleans_are_not_integers(
    system: TenureSystem, client: httpx.Client, changes: dict[str, Any]
) -> None:
    with system.client() as c:
        run = submit(c, f"strict-{uuid.uuid4()}")
    before = end_offsets(system)
    r = client.post(f"/runs/{run['runId']}/attempts", json={"runnerId": "r", **changes})
    assert_refused(r, 422, "validation-failed")
    assert end_offsets(system) == before


def test_a_duplicate_key_is_400_and_a_nul_in_the_tenant_is_422(
    system: TenureSystem, client: httpx.Client
) -> None:
    before = end_offsets(system)
    headers = {"Idempotency-Key": str(uuid.uuid4()), "Content-Type": "application/json"}
    duplicate = b'{"tenant":"acme","tenant":"beta","timeoutSeconds":60,"executionSpec":{}}'
    assert_refused(client.post("/runs", content=duplicate, headers=headers), 400, "malformed-request")
    nested = b'{"tenant":"acme","timeoutSeconds":60,"executionSpec":{"a":1,"a":2}}'
    assert_refused(client.post("/runs", content=nested, headers=headers), 400, "malformed-request")
    nul = {"tenant": "ac\u0000me", "timeoutSeconds": 60, "executionSpec": {}}
    assert_refused(client.post("/runs", json=nul, headers=headers), 422, "validation-failed")
    assert end_offsets(system) == before


def test_a_body_over_the_limit_is_413_before_anything_is_published(
    system: TenureSystem, client: httpx.Client
) -> None:
    before = end_offsets(system)
    spec = {"blob": "x" * 200_000}  # the module's system allows 64 KiB
    big = {"tenant": "acme", "timeoutSeconds": 60, "executionSpec": spec}
    headers = {"Idempotency-Key": str(uuid.uuid4())}
    assert_refused(client.post("/runs", json=big, headers=headers), 413, "payload-too-large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: the guard must count
        yield b'{"tenant":"acme","timeoutSeconds":60,"executionSpec":{"blob":"'
        for _ in range(20):
            yield b"y" * 10_000
        yield b'"}}'

    chunked = client.post("/runs", content=chunks(), headers={**headers, "Content-Type": "application/json"})
    assert_refused(chunked, 413, "payload-too-large")
    assert end_offsets(system) == before


def test_a_refused_request_leaves_the_keep_alive_connection_usable(system: TenureSystem) -> None:
    """Raw HTTP/1.1 on one socket: refusal, then an ordinary request answered on the same socket."""
    with socket.create_connection(("127.0.0.1", system.port), timeout=10) as sock:
        body = b'{"leaseEpoch":1,"sequence":1}'
        for path in (b"/attempts/att_zzzz_1/heartbeat", b"/runs/run_zz/cancel"):
            sock.sendall(
                b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            assert _read_response(sock).startswith(b"HTTP/1.1 4")
        big = b'{"a":"' + b"z" * 70_000 + b'"}'
        sock.sendall(
            b"POST /runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nIdempotency-Key: k\r\n"
            b"Content-Length: " + str(len(big)).encode() + b"\r\n\r\n" + big
        )
        assert _read_response(sock).startswith(b"HTTP/1.1 413")
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(sock).startswith(b"HTTP/1.1 200")


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        rest += chunk
    return head


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#/definitions/nowhere"},
        {"$ref": "https://example.com/elsewhere.json"},
        {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    ],
)
def test_an_input_schema_that_cannot_validate_an_answer_is_refused_EXE_8(
    system: TenureSystem, client: httpx.Client, schema: dict[str, Any]
) -> None:
    """Such a schema passed the metaschema check, and the user's answer was then a 500."""
    run = submit(client, f"schema-{uuid.uuid4()}")
    granted = client.post(
        f"/runs/{run['runId']}/attempts",
        json={"runnerId": "r", "capabilities": ["checkpoint-v1"], "leaseSeconds": 600},
    )
    assert granted.status_code == 201, granted.text
    grant = granted.json()
    before = end_offsets(system)
    body = {
        "leaseEpoch": grant["epoch"],
        "sequence": 1,
        "checkpointDigest": "sha256:" + "0" * 64,
        "inputSchema": schema,
        "prompt": "which one?",
        "expiresAt": grant["serverTime"] + 600_000,
    }
    r = client.post(f"/attempts/{grant['attemptId']}/input-request", json=body)
    assert_refused(r, 422, "validation-failed")
    assert end_offsets(system) == before
