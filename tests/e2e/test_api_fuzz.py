"""Property test: every route of the running command API, fuzzed, never answers a 5xx (issue 10).

The routes come from the API's own OpenAPI document (the same app the running process serves),
so a new route is fuzzed without anyone remembering to add it. For each route hypothesis draws
requests (path ids: the ids of a real run, attempt and upload grant, well-formed unknown ids and
arbitrary text; bodies: values built from the route's JSON Schema, mostly valid and sometimes
off by a type or a bound, arbitrary JSON, and raw hostile bytes: duplicate keys, lone
surrogates, bad UTF-8, NaN, deep nesting, a body over the limit; headers: arbitrary
Idempotency-Key and X-Correlation-Id values) and sends them on ONE keep-alive connection to the
API running with its real dependencies (real broker, lease coordinator, projector and saga
orchestrator as processes). Each answer must be:

* no 5xx, except a 503 `unavailable` (a real dependency outage, with Retry-After);
* every error `application/problem+json` whose `status` is the HTTP status;
* a refusal at the edge (a 4xx that names no decided command, i.e. has no `commandId`) wrote
  nothing: the end offsets of runs.commands, trajectories.commands and tenure.policy are as
  before. (Events are only ever caused by commands or by timers, so a request that published no
  command cannot have written an event; runs.events itself is not compared because timers of
  the fuzz's own accepted runs, deadlines and lease expiries, write to it at any moment.)

Bounded: a fixed number of derandomized examples per route, so the whole module takes about a
minute. Serves the "bad input" rules of DEVELOPERS.md and LEASE-3/EXE-4 (bounded epochs).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.command_api.app import create_app
from services.command_api.context import ApiDependencies
from services.common.ids import run_id_for
from services.common.kafka import PartitionReader
from services.common.topics import BREAKERS_COMMANDS, POLICY, RUNS_COMMANDS, TRAJECTORIES_COMMANDS
from tests.support.system import REPO_ROOT, ServiceProcess, service_env, stop_all, wait_for_http, wait_until
from tests.support.tenure import claim, free_port, submit

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

EXAMPLES_PER_ROUTE = 15
BODY_LIMIT = 65_536
OPERATOR_KEY, SUBMITTER_KEY = "fuzz-operator-key", "fuzz-submitter-key"
PROBLEM_JSON = "application/problem+json"
METHODS = ("get", "post", "put", "delete", "patch")


def _never_opened() -> ApiDependencies:
    raise AssertionError("only the OpenAPI document of this app is used")


SPEC: dict[str, Any] = create_app(_never_opened).openapi()
SPEC_COMPONENTS: dict[str, Any] = SPEC.get("components", {})
OPERATIONS = [
    (method.upper(), path, operation)
    for path, item in sorted(SPEC["paths"].items())
    for method, operation in item.items()
    if method in METHODS
]


# --- the running system -------------------------------------------------------------------------


class FuzzSystem:
    """Coordinator, projector, saga orchestrator and API: every process a route can wait for."""

    def __init__(self, bootstrap: str, tmp: Path) -> None:
        self.bootstrap = bootstrap
        self.port = free_port()
        self.env = service_env(
            bootstrap,
            tmp / "state",
            TENURE_API_PORT=str(self.port),
            TENURE_DECISION_TIMEOUT_S="3",
            TENURE_MAX_BODY_BYTES=str(BODY_LIMIT),
            # An operator may use every route, so the fuzz reaches past the role checks too.
            TENURE_API_KEYS=f"{OPERATOR_KEY}=olga:operator,{SUBMITTER_KEY}=sam:submitter",
            # Nothing listens there: dispatched steps fail and are retried, harmlessly.
            TENURE_GATEWAY_URL=f"http://127.0.0.1:{free_port()}",
            TENURE_COORDINATOR_HEALTH_PORT="0",
            TENURE_PROJECTIONS_HEALTH_PORT="0",
            TENURE_SAGA_HEALTH_PORT="0",
        )
        self.processes = [
            ServiceProcess(name, module, self.env, tmp)
            for name, module in (
                ("lease-coordinator", "services.lease_coordinator"),
                ("projections", "services.projections"),
                ("saga-orchestrator", "services.saga_orchestrator"),
                ("command-api", "services.command_api"),
            )
        ]
        self.base = f"http://127.0.0.1:{self.port}"
        self.tmp = tmp

    def start(self) -> FuzzSystem:
        *workers, api = self.processes
        for process in workers:
            process.start()
        views = self.tmp / "state" / "projections" / "run_views" / "CURRENT"
        wait_until(views.exists, 60, "the projector's store")
        api.start()
        wait_for_http(f"{self.base}/healthz", timeout_s=60)
        return self

    def stop(self) -> None:
        stop_all(reversed(self.processes))


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzSystem]:
    s = FuzzSystem(tenure_topics, tmp_path_factory.mktemp("fuzz")).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def http(system: FuzzSystem) -> Iterator[httpx.Client]:
    # One client, one keep-alive connection: a refusal that broke the connection fails the test.
    with httpx.Client(
        base_url=system.base,
        timeout=30,
        limits=httpx.Limits(max_connections=1),
        headers={"Authorization": f"Bearer {OPERATOR_KEY}"},
    ) as c:
        yield c


class CommandLog:
    """End offsets of the topics a request can write to, compared before and after each one."""

    TOPICS = (RUNS_COMMANDS, TRAJECTORIES_COMMANDS, POLICY, BREAKERS_COMMANDS)

    def __init__(self, bootstrap: str) -> None:
        self._reader = PartitionReader(bootstrap, client_id="tenure-test-fuzz-offsets")
        self.last = self.offsets()

    def offsets(self) -> dict[tuple[str, int], int]:
        return {
            (t.name, p): self._reader.end_offset(t.name, p) for t in self.TOPICS for p in range(t.partitions)
        }

    def changed(self) -> dict[tuple[str, int], tuple[int, int]]:
        now = self.offsets()
        moved = {k: (self.last[k], v) for k, v in now.items() if self.last.get(k) != v}
        self.last = now
        return moved

    def close(self) -> None:
        self._reader.close()


@pytest.fixture(scope="module")
def command_log(system: FuzzSystem) -> Iterator[CommandLog]:
    log = CommandLog(system.bootstrap)
    yield log
    log.close()


@dataclass
class World:
    """Real ids, so that drawn requests get past the edge and reach the routes' logic."""

    run_id: str
    attempt_id: str
    grant_id: str
    epoch: int


@pytest.fixture
def world(http: httpx.Client) -> World:
    run = submit(http, f"fuzz-{uuid.uuid4()}", tenant="fuzz")
    granted = claim(http, run["runId"], lease_seconds=3600, heartbeat_seconds=60)
    assert granted.status_code == 201, granted.text
    grant = granted.json()
    upload = http.post(
        f"/attempts/{grant['attemptId']}/uploads",
        json={"leaseEpoch": grant["epoch"], "destination": "out.txt", "maxBytes": 1000},
    )
    assert upload.status_code == 201, upload.text
    return World(run["runId"], grant["attemptId"], upload.json()["grantId"], grant["epoch"])


# --- strategies ---------------------------------------------------------------------------------
#
# Each example draws a mode: "valid" (every part well-formed, so the request reaches the route's
# logic and, often, Kafka), "mutated" (valid but for one part: a field of the wrong type or out
# of range, a malformed path id, a bad header) or "hostile" (any part may be anything).

MODES = st.sampled_from(["valid", "valid", "valid", "mutated", "mutated", "hostile"])
# Text that can travel in a URL or a JSON string (lone surrogates are raw bytes, below).
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
NASTY = st.sampled_from(["", "\x00", "a\x00b", "\n", "\x7f", "\u202e", "é", " ", "x" * 300, "%00", "../.."])
HOSTILE_TEXT = st.one_of(NASTY, TEXT)
NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789-._"
NAME = st.text(NAME_CHARS, min_size=1, max_size=20)
# What h11 lets a client put in a header value: tab, visible ASCII, space and obs-text.
HEADER_TEXT = st.text(
    "\t" + "".join(map(chr, range(0x20, 0x7F))) + "".join(map(chr, range(0x80, 0x100))), max_size=240
).map(lambda s: s.strip(" \t"))
UNKNOWN_RUN = run_id_for("fuzz-nobody", "no-such-run")
UNKNOWN_ATTEMPT = f"att_{UNKNOWN_RUN[4:]}_1"
INTEGER_EDGES = [0, 1, -1, 2**31, 2**53, 2**63 - 1, 2**63, -(2**63) - 1, 2**64]
TOOLS = [t["name"] for t in json.loads((REPO_ROOT / "services/sim_environment/tools.json").read_text())]
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
RAW_BODIES = st.sampled_from(
    [
        b'{"a":1,"a":2}',
        b'{"executionSpec":{"\\ud800":1},"tenant":"acme","timeoutSeconds":60}',
        b'{"tenant":"\\udfff"}',
        b'{"a":"\xff\xfe"}',
        b'{"a":NaN}',
        b'{"a":1e999}',
        b'{"a":' + b"9" * 5000 + b"}",
        b"[" * 70 + b"]" * 70,
        b'{"truncated":',
        b"\xef\xbb\xbf{}",
        b'{"blob":"' + b"x" * (BODY_LIMIT + 10) + b'"}',
        b"",
        b"null",
        b"[]",
    ]
)


def _loose(value: Any) -> st.SearchStrategy[Any]:
    """The same value with a wrong JSON type: what strict models must refuse."""
    return st.sampled_from([str(value), [value], {"v": value}, None, True])


def _path_value(name: str, world: World, valid: bool) -> st.SearchStrategy[str]:
    good = {
        "run_id": [world.run_id, world.run_id, UNKNOWN_RUN],
        "attempt_id": [world.attempt_id, world.attempt_id, UNKNOWN_ATTEMPT],
        "grant_id": [world.grant_id, f"grant_{UNKNOWN_RUN[4:]}_{'0' * 16}"],
        "incident_id": [f"inc_{'0' * 32}"],
        "index": ["0", "1", "2"],
        "kind": ["principal", "tenant"],
        "slug": ["not-found", "malformed-request", "nothing-like-it"],
    }
    bad = {
        "run_id": ["run_zz", "RUN_" + "A" * 32, world.run_id + "0"],
        "attempt_id": ["att_zzzz_1", world.attempt_id + "x", "att_0"],
        "grant_id": ["grant_zz_1"],
        "incident_id": ["inc_zz"],
        "index": ["-1", str(2**63), str(2**64), "1e3", "x"],
        "kind": ["nobody"],
    }
    if valid:
        # Block subjects never name the fuzz's own principals, or later routes could not claim.
        return st.sampled_from(good[name]) if name in good else NAME.map(lambda s: f"blk-{s}")
    return st.one_of(st.sampled_from(bad.get(name, ["x"])), HOSTILE_TEXT)


def _value(
    schema: dict[str, Any], world: World, name: str, valid: bool, depth: int = 0
) -> st.SearchStrategy[Any]:
    """A value for `schema`: well-formed when `valid`, else possibly anything."""
    if "$ref" in schema:
        target = SPEC_COMPONENTS["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
        return _value(target, world, name, valid, depth)
    if not valid:
        return st.one_of(_value(schema, world, name, True, depth), _hostile(schema))
    if "anyOf" in schema:
        return st.one_of([_value(s, world, name, True, depth) for s in schema["anyOf"]])
    if "enum" in schema or "const" in schema:
        return st.sampled_from(schema.get("enum") or [schema["const"]])
    special: dict[str, st.SearchStrategy[Any]] = {
        "attemptId": st.just(world.attempt_id),
        "runId": st.just(world.run_id),
        "leaseEpoch": st.just(world.epoch),
        "tool": st.sampled_from(TOOLS),
        "digest": st.just("sha256:" + "0" * 64),
        "inputSchema": st.just({"type": "object"}),
        "executionSpec": st.dictionaries(NAME, ANY_JSON, max_size=3),
        "params": st.just({}),
    }
    if name in special:
        return special[name]
    kind = schema.get("type")
    if kind == "integer":
        low = schema.get("minimum", 0)
        return st.integers(low, min(schema.get("maximum", 10**6), low + 10**6))
    if kind == "number":
        return st.floats(0, min(schema.get("maximum", 1e6), 1e6))
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        low = max(1, schema.get("minLength", 0))
        return st.text(NAME_CHARS, min_size=low, max_size=max(low, min(20, schema.get("maxLength", 20))))
    if kind == "array":
        if depth >= 3:
            return st.just([])
        return st.lists(_value(schema.get("items", {}), world, name, True, depth + 1), max_size=2)
    if kind == "object" and "properties" in schema and depth < 4:
        required = set(schema.get("required", []))
        fields = {k: _value(v, world, k, True, depth + 1) for k, v in schema["properties"].items()}
        return st.fixed_dictionaries(
            {k: s for k, s in fields.items() if k in required},
            optional={k: s for k, s in fields.items() if k not in required},
        )
    return ANY_JSON


def _hostile(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    kind = schema.get("type")
    if kind == "integer":
        low, high = schema.get("minimum", -(2**63)), schema.get("maximum", 2**63 - 1)
        return st.one_of(st.sampled_from([low - 1, high + 1, *INTEGER_EDGES]), _loose(low), st.floats())
    if kind == "number":
        return st.one_of(st.sampled_from([-1.0, 1e300, 1e13, -0.0]), _loose(1.5))
    if kind == "boolean":
        return st.sampled_from([0, 1, "true", None, []])
    if kind == "string":
        return st.one_of(HOSTILE_TEXT, _loose(7))
    return st.one_of(ANY_JSON, _loose(0))


def _body(schema: dict[str, Any], world: World, mode: str) -> st.SearchStrategy[Any]:
    if "$ref" in schema:
        schema = SPEC_COMPONENTS["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    if "anyOf" in schema:  # an optional body: one of its object forms
        schema = next((s for s in schema["anyOf"] if s.get("type") != "null"), schema)
        return _body(schema, world, mode)
    valid = _value(schema, world, "", True)
    if mode == "valid":
        return valid
    if mode == "hostile":
        return st.one_of(_value(schema, world, "", False), ANY_JSON)
    props = schema.get("properties", {})
    if not props:
        return st.one_of(valid, ANY_JSON)

    def mutate(base: dict[str, Any], name: str, replacement: Any) -> dict[str, Any]:
        changed = dict(base)
        if replacement is _DROP:
            changed.pop(name, None)
        else:
            changed[name] = replacement
        return changed

    return st.builds(
        mutate,
        valid,
        st.sampled_from([*props, "unknownMember"]),
        st.one_of(st.just(_DROP), ANY_JSON, HOSTILE_TEXT, st.sampled_from(INTEGER_EDGES), _loose(1)),
    )


_DROP = object()


@dataclass
class Drawn:
    method: str
    path: str
    params: dict[str, Any]
    headers: dict[str, bytes]
    content: bytes | None


def _draw(data: st.DataObject, method: str, template: str, operation: dict[str, Any], world: World) -> Drawn:
    mode = data.draw(MODES, label="mode")
    # In a mutated request exactly one part is off; in a hostile one any part may be.
    off = (
        data.draw(st.sampled_from(["path", "query", "header", "body"]), label="off")
        if mode == "mutated"
        else ""
    )
    path, params, headers = template, {}, {}
    for p in operation.get("parameters", []):
        name, where = p["name"], p["in"]
        valid = mode == "valid" or (mode == "mutated" and off != where)
        if where == "path":
            value = data.draw(_path_value(name, world, valid), label=name)
            path = path.replace("{" + name + "}", quote(value, safe="") or "%20")
        elif where == "query" and data.draw(st.booleans(), label=f"send {name}"):
            value = data.draw(_value(p["schema"], world, name, valid) if valid else HOSTILE_TEXT, label=name)
            if value is not None:
                params[name] = value if isinstance(value, str | int) else json.dumps(value)
    for name in ("Idempotency-Key", "X-Correlation-Id"):
        if data.draw(st.booleans(), label=f"send {name}"):
            valid = mode == "valid" or (mode == "mutated" and off != "header")
            value = data.draw(st.just(str(uuid.uuid4())) if valid else HEADER_TEXT, label=name)
            headers[name] = value.encode("latin-1")
    if mode == "hostile" or off == "header":
        caller = data.draw(st.sampled_from(["operator", "submitter", "unknown", "empty"]), label="caller")
        authorization = {"submitter": f"Bearer {SUBMITTER_KEY}", "unknown": "Bearer nope", "empty": ""}
        if caller in authorization:
            headers["Authorization"] = authorization[caller].encode()
    content: bytes | None = None
    body_schema = (
        operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    )
    body_mode = mode if mode != "mutated" else ("mutated" if off == "body" else "valid")
    if body_schema is not None and body_mode != "hostile":
        content = json.dumps(data.draw(_body(body_schema, world, body_mode), label="json")).encode()
    elif body_mode == "hostile" or data.draw(st.integers(0, 9), label="stray body") == 0:
        choice = data.draw(st.sampled_from(["schema", "any", "raw", "raw", "none"]), label="hostile body")
        if choice == "schema" and body_schema is not None:
            content = json.dumps(data.draw(_body(body_schema, world, "hostile"), label="json")).encode()
        elif choice in ("any", "schema"):
            content = json.dumps(data.draw(ANY_JSON, label="json")).encode()
        elif choice == "raw":
            content = data.draw(RAW_BODIES, label="raw")
    if content is not None:
        headers["Content-Type"] = b"application/json"
    return Drawn(method, path, params, headers, content)


# --- the property -------------------------------------------------------------------------------


def test_the_running_api_serves_the_routes_that_are_fuzzed(http: httpx.Client) -> None:
    served = http.get("/openapi.json").json()["paths"]
    fuzzed = {path for _, path, _ in OPERATIONS}
    assert fuzzed == set(served), "the fuzz must cover every route of the running API"
    assert len(OPERATIONS) >= 20


@pytest.mark.parametrize(
    ("method", "template", "operation"), OPERATIONS, ids=[f"{m} {p}" for m, p, _ in OPERATIONS]
)
@settings(
    max_examples=EXAMPLES_PER_ROUTE,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(data=st.data())
def test_no_route_answers_5xx_and_every_refusal_is_a_problem_that_recorded_nothing(
    http: httpx.Client,
    command_log: CommandLog,
    world: World,
    method: str,
    template: str,
    operation: dict[str, Any],
    data: st.DataObject,
) -> None:
    drawn = _draw(data, method, template, operation, world)
    command_log.changed()  # whatever the fixture or an earlier example wrote is not this one's
    response = http.request(
        drawn.method, drawn.path, params=drawn.params, headers=drawn.headers, content=drawn.content
    )
    where = f"{drawn.method} {drawn.path} -> {response.status_code} {response.text[:400]}"
    moved = command_log.changed()
    if response.status_code >= 500:
        assert response.status_code == 503, where
        assert response.json()["type"] == "/problems/unavailable" and "retry-after" in response.headers, where
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith(PROBLEM_JSON), where
        problem = response.json()
        assert problem["status"] == response.status_code and problem["type"].startswith("/problems/"), where
        if response.status_code < 500 and "commandId" not in problem:
            assert not moved, f"a refused request wrote {moved}: {where}"
