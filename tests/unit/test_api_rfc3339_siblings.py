"""Every epoch-ms `<x>At` of the API's JSON views has `<x>AtRfc3339` beside it (issue 17).

The siblings are added at one point, the `Rfc3339Siblings` middleware
(services/command_api/view_times.py), so the test drives the real app over the in-process
harness through a scene with runs in every state (tests/support/console_scene.py: leases with
renewals, trajectories with committed and failed steps, an incident, the watchdog's ladder,
breakers, schedules, quarantine) and checks EVERY application/json answer it got, the writes'
answers (201 grants, 202 tickets) as well as the reads: each integer `<x>At` keeps its epoch ms
and has a sibling equal to rfc3339(<x>At), nothing else changes, and what a caller gave (an
executionSpec, a step's params) comes back exactly as given.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.command_api.view_times import (
    OPAQUE_FIELDS,
    Rfc3339Siblings,
    add_rfc3339_siblings,
    siblings_in_body,
)
from services.common.times import MAX_RFC3339_MS, rfc3339, rfc3339_or_none
from tests.support.api_harness import api_client
from tests.support.console_scene import (
    KEYS,
    OLGA,
    RITA,
    ConsoleTenure,
    Scene,
    build_scene,
    quarantine_scene,
)

pytestmark = pytest.mark.timeout(90)

SUFFIX = "Rfc3339"


def _is_time(key: str, value: Any) -> bool:
    return type(value) is int and key.endswith("At") and key != "At"


def check_siblings(shown: Any, where: str = "$") -> int:
    """Assert every integer `<x>At` in `shown` (outside OPAQUE_FIELDS) has its sibling, equal to
    rfc3339(<x>At); and that each `<x>AtRfc3339` is the text of an `<x>At`. The number checked."""
    checked = 0
    if isinstance(shown, list):
        return sum(check_siblings(item, f"{where}[{i}]") for i, item in enumerate(shown))
    if not isinstance(shown, dict):
        return 0
    for key, value in shown.items():
        if _is_time(key, value):
            expected = rfc3339_or_none(value)
            assert shown.get(key + SUFFIX) == expected, f"{where}.{key}={value}: {shown.get(key + SUFFIX)!r}"
            checked += expected is not None
        elif key.endswith("At" + SUFFIX):
            base = shown.get(key.removesuffix(SUFFIX))
            assert isinstance(value, str) and isinstance(base, int), f"{where}.{key}: {value!r} of {base!r}"
        elif isinstance(value, dict | list) and key not in OPAQUE_FIELDS:
            checked += check_siblings(value, f"{where}.{key}")
    return checked


def without_siblings(shown: Any) -> Any:
    if isinstance(shown, list):
        return [without_siblings(item) for item in shown]
    if isinstance(shown, dict):
        return {
            k: v if k in OPAQUE_FIELDS else without_siblings(v)
            for k, v in shown.items()
            if not (
                k.endswith("At" + SUFFIX)
                and _is_time(k.removesuffix(SUFFIX), shown.get(k.removesuffix(SUFFIX)))
            )
        }
    return shown


# --- the walk ---------------------------------------------------------------------------------------


def test_siblings_at_every_depth_and_nothing_else_changes() -> None:
    at = 1_796_152_509_123
    view = {
        "submittedAt": at,
        "leaseMs": 90_000,  # a duration: untouched
        "endedAt": None,  # not set: no sibling
        "updatedAt": "2026-12-01T19:15:09.123Z",  # already text (the watchdog's views): no sibling
        "pinnedAt": True,  # a bool is no time
        "ratioAt": 0.5,  # a float is no epoch ms
        "lease": {"expiresAt": at + 1, "renewals": [{"at": at, "expiresAt": at + 2}]},
        "history": [{"occurredAt": at, "details": {"deadlineAt": at + 3}}],
        "executionSpec": {"notBeforeAt": 5, "steps": [{"runAt": 6}]},  # the caller's: as given
        "params": {"startAt": 7},
        "farAt": 2**63 - 1,  # beyond year 9999: no sibling, no failure
        "declaredAtRfc3339": None,  # a model's declared sibling, null: filled
        "declaredAt": at,
    }
    given_view = copy.deepcopy(view)
    shown = add_rfc3339_siblings(json.loads(json.dumps(view)))
    assert shown["submittedAtRfc3339"] == "2026-12-01T19:15:09.123Z" == rfc3339(at)
    assert shown["lease"]["expiresAtRfc3339"] == rfc3339(at + 1)
    assert shown["lease"]["renewals"][0]["expiresAtRfc3339"] == rfc3339(at + 2)
    assert shown["history"][0]["occurredAtRfc3339"] == rfc3339(at)
    assert shown["history"][0]["details"]["deadlineAtRfc3339"] == rfc3339(at + 3)
    assert shown["declaredAtRfc3339"] == rfc3339(at)
    for absent in (
        "leaseMsRfc3339",
        "endedAtRfc3339",
        "updatedAtRfc3339",
        "pinnedAtRfc3339",
        "ratioAtRfc3339",
    ):
        assert absent not in shown
    assert "farAtRfc3339" not in shown and shown["farAt"] == 2**63 - 1
    assert shown["executionSpec"] == given_view["executionSpec"] and shown["params"] == {"startAt": 7}
    given_view.pop("declaredAtRfc3339")
    assert without_siblings(shown) == given_view
    assert check_siblings(shown) == 6


JSON_KEYS = st.sampled_from(
    ["occurredAt", "expiresAt", "at", "leaseMs", "name", "At", "executionSpec", "params"]
)
JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.text(max_size=5)
    | st.floats(allow_nan=False, allow_infinity=False)
)
JSON_TREES = st.recursive(
    JSON_LEAVES,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(JSON_KEYS, children, max_size=5),
    max_leaves=30,
)


@given(JSON_TREES)
def test_any_json_gets_its_siblings_and_loses_nothing(tree: Any) -> None:
    body = json.dumps(tree).encode()
    shown = json.loads(siblings_in_body(body))
    check_siblings(shown)
    assert without_siblings(shown) == tree


def test_a_body_that_is_not_json_passes_as_it_is() -> None:
    assert siblings_in_body(b"not json") == b"not json"
    infinite = b'{"expiresAt":1,"ratio":Infinity}'  # no such body is sent; were one, it passes
    assert siblings_in_body(infinite) is infinite
    assert (
        siblings_in_body(b'{"expiresAt": 1}')
        == b'{"expiresAt":1,"expiresAtRfc3339":"1970-01-01T00:00:00.001Z"}'
    )


# --- the app: every JSON answer of a scene with runs in every state ---------------------------------


@pytest.fixture()
def scene(tmp_path: Path) -> Iterator[tuple[httpx.Client, Scene, list[httpx.Response]]]:
    answers: list[httpx.Response] = []

    def record(response: httpx.Response) -> None:
        response.read()
        answers.append(response)

    tenure = ConsoleTenure()
    with api_client(tmp_path, api_keys=KEYS, decision_timeout_s=5.0, tenure=tenure) as (client, _):
        client.event_hooks["response"].append(record)
        built = build_scene(client, tenure)
        quarantine_scene(tenure, built)
        yield client, built, answers


def _views_of(client: httpx.Client, scene: Scene) -> None:
    """GET every view the API has, for every run of the scene."""
    for run_id in (scene.queued, scene.frozen, scene.cancelled, scene.looping):
        for path in ("", "/lease", "/trajectory", "/watchdog", "/quarantine"):
            client.get(f"/runs/{run_id}{path}", headers=OLGA)
    trajectory = client.get(f"/runs/{scene.frozen}/trajectory", headers=OLGA).json()
    client.get(
        f"/runs/{scene.frozen}/trajectory?afterVersion={trajectory['version'] - 1}&waitMs=0", headers=OLGA
    )
    for path in ("/runs", "/runs?limit=2", "/incidents", "/breakers", "/bulkheads", "/schedules"):
        client.get(path, headers=OLGA)
    client.get(f"/breakers/{scene.open_endpoint}", headers=OLGA)
    client.get("/schedules/sch_0000000000000001", headers=OLGA)
    artifacts = client.get("/artifacts?tenant=acme", headers=OLGA)
    assert artifacts.status_code == 200, artifacts.text
    for artifact in artifacts.json()["items"]:
        client.get(f"/artifacts/{artifact['artifactId']}", headers=OLGA)


def test_every_json_answer_has_an_rfc3339_sibling_for_each_epoch_ms_time(
    scene: tuple[httpx.Client, Scene, list[httpx.Response]],
) -> None:
    client, built, answers = scene
    _views_of(client, built)
    checked: dict[str, int] = {}
    for answer in answers:
        if answer.headers.get("content-type", "").split(";")[0] != "application/json":
            continue
        assert int(answer.headers["content-length"]) == len(answer.content), answer.request.url
        where = f"{answer.request.method} {answer.request.url.path} {answer.status_code}"
        checked[where] = checked.get(where, 0) + check_siblings(answer.json(), where)
    assert len(checked) >= 25, sorted(checked)  # the writes' answers and every view above
    # The views the issue names carry siblings (not only "no integer time, nothing to check").
    for route in (
        "POST /runs 201",
        f"POST /runs/{built.frozen}/attempts 201",
        f"POST /attempts/{built.lease['attemptId']}/heartbeat 200",
        f"GET /runs/{built.frozen} 200",
        f"GET /runs/{built.frozen}/lease 200",
        f"GET /runs/{built.frozen}/trajectory 200",
        f"POST /runs/{built.frozen}/trajectory 201",
        f"POST /runs/{built.cancelled}/cancel 200",
        "GET /runs 200",
        "GET /incidents 200",
    ):
        assert checked.get(route, 0) > 0, (route, sorted(checked))


def test_the_run_view_shows_its_times_both_ways(
    scene: tuple[httpx.Client, Scene, list[httpx.Response]],
) -> None:
    client, built, _ = scene
    view = client.get(f"/runs/{built.frozen}", headers=RITA).json()
    lease = view["lease"]
    assert isinstance(lease["expiresAt"], int) and lease["expiresAtRfc3339"] == rfc3339(lease["expiresAt"])
    assert view["submittedAtRfc3339"] == rfc3339(view["submittedAt"])
    assert all(e["occurredAtRfc3339"] == rfc3339(e["occurredAt"]) for e in view["history"])
    page = client.get("/runs", headers=RITA).json()
    assert all(item["submittedAtRfc3339"] == rfc3339(item["submittedAt"]) for item in page["items"])
    trajectory = client.get(f"/runs/{built.frozen}/trajectory", headers=RITA).json()
    assert trajectory["startedAtRfc3339"] == rfc3339(trajectory["startedAt"])
    assert trajectory["steps"][0]["params"] == {"name": "web-1"}  # the caller's, as given


def test_a_grant_hands_the_runner_its_spec_unchanged(tmp_path: Path) -> None:
    spec = {"notBeforeAt": 1_796_152_509_123, "schedule": [{"runAt": 5}]}  # time-like, but the caller's
    with api_client(tmp_path, api_keys=KEYS, decision_timeout_s=5.0) as (client, _):
        created = client.post(
            "/runs",
            headers={**RITA, "Idempotency-Key": "spec-1"},
            json={"tenant": "acme", "executionSpec": spec, "timeoutSeconds": 600},
        )
        assert created.status_code == 201, created.text
        assert created.json()["executionSpec"] == spec
        run_id = created.json()["runId"]
        grant = client.post(f"/runs/{run_id}/attempts", headers=RITA, json={"runnerId": "r-1"})
        assert grant.status_code == 201, grant.text
        assert grant.json()["assignment"]["executionSpec"] == spec
        assert grant.json()["expiresAtRfc3339"] == rfc3339(grant.json()["expiresAt"])
        client.post(
            "/runs",
            headers={**RITA, "Idempotency-Key": "spec-2"},
            json={"tenant": "acme", "executionSpec": {**spec, "queue": "q"}, "timeoutSeconds": 600},
        )
        claimed = client.post("/queues/q/claim", headers=RITA, json={"runnerId": "r-2"})  # claim-next
        assert claimed.status_code == 201, claimed.text
        assert claimed.json()["assignment"]["executionSpec"] == {**spec, "queue": "q"}
        assert check_siblings(claimed.json()) > 0


def test_problems_and_the_openapi_document_pass_untouched(
    scene: tuple[httpx.Client, Scene, list[httpx.Response]],
) -> None:
    client, _, _ = scene
    document = client.get("/openapi.json")
    assert document.status_code == 200 and document.json() == client.app.openapi()  # type: ignore[attr-defined]
    missing = client.get("/runs/run_00000000000000000000000000000000", headers=RITA)
    assert missing.headers["content-type"].startswith("application/problem+json")
    assert not any(key.endswith(SUFFIX) for key in missing.json())


async def _through_middleware(*messages: dict[str, Any]) -> list[dict[str, Any]]:
    """What the middleware sends on when the app inside it sends `messages`."""

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        for message in messages:
            await send(message)

    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    await Rfc3339Siblings(inner)({"type": "http", "path": "/runs/x", "method": "GET"}, receive, send)
    return sent


def _start(content_type: bytes, length: int) -> dict[str, Any]:
    headers = [(b"content-type", content_type), (b"content-length", str(length).encode())]
    return {"type": "http.response.start", "status": 200, "headers": headers}


def test_the_middleware_joins_chunks_fixes_the_length_and_leaves_the_rest_alone() -> None:
    body = b'{"expiresAt":1000}'
    start, part = _start(b"application/json", len(body)), {"type": "http.response.body", "more_body": True}
    sent = asyncio.run(
        _through_middleware(
            start, {**part, "body": body[:5]}, {"type": "http.response.body", "body": body[5:]}
        )
    )
    shown = b'{"expiresAt":1000,"expiresAtRfc3339":"1970-01-01T00:00:01.000Z"}'
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert (
        dict(sent[0]["headers"])[b"content-length"] == str(len(shown)).encode() and sent[1]["body"] == shown
    )
    # A HEAD (no body): its length is the GET's, kept. Text and problems: passed as they are.
    head = asyncio.run(_through_middleware(start, {"type": "http.response.body", "body": b""}))
    assert head[0] == start and head[1]["body"] == b""
    for other in (b"text/plain; charset=utf-8", b"application/problem+json"):
        plain = [_start(other, len(body)), {"type": "http.response.body", "body": body}]
        assert asyncio.run(_through_middleware(*plain)) == plain
    # An artifact's stored bytes (GET /artifacts/{id}, QUA-2) are served as hashed, JSON or not.
    stored = _start(b"application/json", len(body))
    stored["headers"].append((b"X-Tenure-Content-Hash", b"sha256:" + b"0" * 64))
    artifact = [stored, {"type": "http.response.body", "body": body}]
    assert asyncio.run(_through_middleware(*artifact)) == artifact
    # No name ending in At: not parsed, passed as it is.
    other_body = b'{"version": 3}'
    untimed = [
        _start(b"application/json", len(other_body)),
        {"type": "http.response.body", "body": other_body},
    ]
    passed = asyncio.run(_through_middleware(*untimed))
    assert passed[0] == untimed[0] and passed[1]["body"] is other_body


def test_the_edge_of_the_range_is_no_failure() -> None:
    assert rfc3339_or_none(MAX_RFC3339_MS + 1) is None
    shown = json.loads(siblings_in_body(json.dumps({"expiresAt": MAX_RFC3339_MS + 1}).encode()))
    assert shown == {"expiresAt": MAX_RFC3339_MS + 1}
