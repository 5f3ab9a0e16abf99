"""The web console's pages and fragments (issue 17), over the in-process harness.

The pages are shells with no data and need no key; the fragments are the data and authenticate
as the JSON routes do; every value is escaped; hostile query parameters are refused (problem+json
for a fragment, a readable HTML page for a page); each fragment shows what its JSON route shows.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.command_api.console import data
from tests.support.api_harness import api_client
from tests.support.console_scene import (
    KEYS,
    OLGA,
    RITA,
    SCRIPT,
    ConsoleTenure,
    Scene,
    build_scene,
    heartbeat,
    quarantine_scene,
)

pytestmark = pytest.mark.timeout(60)

RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
EPOCH_MS = re.compile(r"(?<![\w.:-])1\d{12}(?![\w.])")  # a bare epoch-ms number in the text


@pytest.fixture()
def console(tmp_path: Path) -> Iterator[tuple[httpx.Client, ConsoleTenure, Scene]]:
    tenure = ConsoleTenure()
    with api_client(tmp_path, api_keys=KEYS, decision_timeout_s=5.0, tenure=tenure) as (client, _):
        scene = build_scene(client, tenure)
        quarantine_scene(tenure, scene)
        yield client, tenure, scene


def _fragment(client: httpx.Client, path: str, headers: dict[str, str] = OLGA) -> str:
    response = client.get(path, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/html")
    return response.text


def _problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    body: dict[str, Any] = response.json()
    assert body["type"] == f"/problems/{slug}", body
    return body


def _runs(page: str) -> list[str]:
    return re.findall(r'data-run-id="(run_[0-9a-f]+)"', page)


# --- pages and authentication ---------------------------------------------------------------------


def test_pages_are_shells_that_hold_no_data_and_need_no_key(console: Any) -> None:
    client, _, scene = console
    for path in (
        "/ui/runs",
        f"/ui/runs/{scene.frozen}",
        f"/ui/runs/{scene.frozen}/trajectory",
        "/ui/incidents",
        "/ui/breakers",
        "/ui/schedules",
    ):
        page = client.get(path)
        assert page.status_code == 200, (path, page.text)
        assert page.headers["content-type"].startswith("text/html")
        assert "data-src=" in page.text and "tenant</dt>" not in page.text
        assert "acme" not in page.text, f"{path} shows data without a key"
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert page.headers["cache-control"] == "no-store"
    assert client.get("/ui", follow_redirects=False).headers["location"] == "/ui/runs"


def test_fragments_authenticate_exactly_as_the_json_routes_do(console: Any) -> None:
    client, _, scene = console
    paths = [
        "/ui/fragments/runs",
        f"/ui/fragments/runs/{scene.frozen}/timeline",
        "/ui/fragments/breakers",
        "/ui/fragments/incidents",
        "/ui/fragments/schedules",
        "/ui/fragments/whoami",
    ]
    for path in paths:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic b2xnYTp4"}):
            body = _problem(client.get(path, headers=headers), 401, "unauthenticated")
            assert "acme" not in str(body)
        assert client.get(path, headers=RITA).status_code == 200
    assert "rita" in _fragment(client, "/ui/fragments/whoami", RITA)


def test_development_mode_is_open_as_the_api_is(tmp_path: Path) -> None:
    with api_client(tmp_path) as (client, _):
        assert (
            client.post(
                "/runs",
                headers={"Idempotency-Key": "a"},
                json={"tenant": "t", "executionSpec": {}, "timeoutSeconds": 60},
            ).status_code
            == 201
        )
        assert len(_runs(_fragment(client, "/ui/fragments/runs", {}))) == 1
        assert "development mode" in _fragment(client, "/ui/fragments/whoami", {})


def test_static_files_are_an_allow_list(console: Any) -> None:
    client, _, _ = console
    css = client.get("/ui/static/console.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert client.get("/ui/static/console.js").headers["content-type"].startswith("text/javascript")
    missing = client.get("/ui/static/nope.js")
    assert missing.status_code == 404 and missing.headers["content-type"].startswith("text/html")
    for name in ("..%2Fapp.py", "%2E%2E%2Froutes.py", "..%5Croutes.py"):
        assert client.get(f"/ui/static/{name}").status_code == 404  # no path reaches the disk


# --- the runs list ----------------------------------------------------------------------------------


def test_the_runs_list_filters_by_status_tenant_label_time_and_id(console: Any) -> None:
    client, _, scene = console
    every = _runs(_fragment(client, "/ui/fragments/runs"))
    assert every == [scene.queued, scene.frozen, scene.cancelled, scene.looping], "submission order"
    assert _runs(_fragment(client, "/ui/fragments/runs?status=cancelled")) == [scene.cancelled]
    assert _runs(_fragment(client, "/ui/fragments/runs?status=running")) == [scene.frozen, scene.looping]
    assert _runs(_fragment(client, "/ui/fragments/runs?tenant=globex")) == [scene.looping]
    assert _runs(_fragment(client, "/ui/fragments/runs?status=running&tenant=acme")) == [scene.frozen]
    assert _runs(_fragment(client, "/ui/fragments/runs?label=schedule")) == [scene.queued]
    assert _runs(_fragment(client, "/ui/fragments/runs?label=schedule%3Dnightly")) == [scene.queued]
    assert _runs(_fragment(client, "/ui/fragments/runs?label=schedule%3Dhourly")) == []
    # Free text on ids: a piece of the run id, an attempt id, an idempotency key (any case).
    assert _runs(_fragment(client, f"/ui/fragments/runs?q={scene.looping[4:14].upper()}")) == [scene.looping]
    assert _runs(_fragment(client, f"/ui/fragments/runs?q={scene.lease['attemptId']}")) == [scene.frozen]
    assert _runs(_fragment(client, "/ui/fragments/runs?q=cancel-me")) == [scene.cancelled]
    # Time range over the submission time, RFC 3339 (a browser's datetime-local is read as UTC).
    views = {r: client.get(f"/runs/{r}", headers=OLGA).json() for r in every}
    cut = views[scene.cancelled]["submittedAt"]
    since = _iso(cut)
    assert _runs(_fragment(client, f"/ui/fragments/runs?since={since}")) == [scene.cancelled, scene.looping]
    assert _runs(_fragment(client, f"/ui/fragments/runs?until={since}")) == [
        scene.queued,
        scene.frozen,
        scene.cancelled,
    ]
    assert _runs(_fragment(client, "/ui/fragments/runs?until=2000-01-01T00:00")) == []


def _iso(ms: int) -> str:
    from services.command_api.console.render import rfc3339

    return rfc3339(ms)


def test_the_runs_list_pages_with_the_views_cursor_without_skipping_or_repeating(console: Any) -> None:
    client, _, scene = console
    seen: list[str] = []
    path = "/ui/fragments/runs?tenant=acme&limit=1"
    for _ in range(5):
        page = _fragment(client, path)
        seen += _runs(page)
        more = re.search(r'class="more" href="/ui/runs\?([^"]+)"', page)
        if more is None:
            break
        path = "/ui/fragments/runs?" + html.unescape(more.group(1))
    assert seen == [scene.queued, scene.frozen, scene.cancelled]


def test_a_filter_that_matches_little_reads_a_bounded_number_of_runs(
    console: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _, scene = console
    monkeypatch.setattr(data, "MAX_SCAN", 2)
    page = _fragment(client, "/ui/fragments/runs?tenant=globex")
    assert _runs(page) == [] and "Stopped after 2 runs" in page
    more = re.search(r'class="more" href="/ui/runs\?([^"]+)"', page)
    assert more is not None, "a cursor to go on from"
    rest = _fragment(client, "/ui/fragments/runs?" + html.unescape(more.group(1)))
    assert _runs(rest) == [scene.looping]


@pytest.mark.parametrize(
    "query",
    [
        "status=bogus",
        "since=yesterday",
        "until=2026-13-01T00:00:00Z",
        "since=2026-02-01T00:00:00Z&until=2026-01-01T00:00:00Z",
        "limit=0",
        "limit=201",
        "limit=ten",
        "label=%3Dvalue",
        "q=run%01",
        "tenant=" + "a" * 201,
        "cursor=" + "A" * 501,
    ],
)
def test_hostile_filters_are_refused_problem_json_for_a_fragment_and_a_page_for_a_page(
    console: Any, query: str
) -> None:
    client, _, _ = console
    _problem(client.get(f"/ui/fragments/runs?{query}", headers=OLGA), 422, "validation-failed")
    page = client.get(f"/ui/runs?{query}")
    assert page.status_code == 422 and page.headers["content-type"].startswith("text/html")
    assert "The request is not valid" in page.text and "<form" in page.text  # the site, not raw JSON


def test_a_cursor_that_this_api_did_not_issue_is_refused(console: Any) -> None:
    client, _, _ = console
    _problem(client.get("/ui/fragments/runs?cursor=bm90LW1pbmU=", headers=OLGA), 400, "invalid-cursor")


def test_malformed_and_unknown_run_ids_are_not_found(console: Any) -> None:
    client, _, _ = console
    page = client.get("/ui/runs/not-a-run")
    assert page.status_code == 404 and "Run not found" in page.text
    assert client.get("/ui/runs/run_" + "0" * 32 + "%00/lease").status_code == 404
    _problem(client.get("/ui/fragments/runs/not-a-run/timeline", headers=OLGA), 404, "run-not-found")
    unknown = "run_" + "0" * 32
    for tab in ("summary", "timeline", "lease", "trajectory", "watchdog", "quarantine"):
        _problem(client.get(f"/ui/fragments/runs/{unknown}/{tab}", headers=OLGA), 404, "run-not-found")
    _problem(client.get("/ui/fragments/runs/x/timeline?limit=0", headers=OLGA), 404, "run-not-found")


# --- escaping -----------------------------------------------------------------------------------------


def test_markup_in_a_label_or_a_reason_is_shown_as_text_never_as_markup(console: Any) -> None:
    client, _, scene = console
    shown = {
        "runs": _fragment(client, "/ui/fragments/runs"),
        "summary": _fragment(client, f"/ui/fragments/runs/{scene.queued}/summary"),
        "cancelled": _fragment(client, f"/ui/fragments/runs/{scene.cancelled}/timeline"),
        "step error": _fragment(client, f"/ui/fragments/runs/{scene.frozen}/trajectory"),
        "quarantine": _fragment(client, f"/ui/fragments/runs/{scene.frozen}/quarantine"),
        "schedules": _fragment(client, "/ui/fragments/schedules"),
    }
    for where, text in shown.items():
        assert "<script" not in text.lower(), where
        assert "&lt;script&gt;" in text, f"{where} does not show the markup as text"
    assert html.unescape(shown["runs"]).count(SCRIPT) == 1, "the label, whole, as text"


# --- each page shows what its JSON route shows ------------------------------------------------------


def test_the_timeline_shows_every_event_decoded_with_actor_causation_and_rfc3339_times(console: Any) -> None:
    client, _, scene = console
    view = client.get(f"/runs/{scene.frozen}", headers=OLGA).json()
    timeline = _fragment(client, f"/ui/fragments/runs/{scene.frozen}/timeline")
    versions = [int(v) for v in re.findall(r'data-version="(\d+)"', timeline)]
    every = sorted((e["version"] for e in view["history"]), reverse=True)
    assert versions == every, "every event, newest first"
    for entry in view["history"]:
        for value in (entry["type"], entry["actor"], entry["causationId"], entry["eventId"]):
            assert value in timeline
    assert "LeaseRenewed" in timeline and "sequence" in timeline, "details decoded"
    assert len(RFC3339.findall(timeline)) >= len(view["history"])
    assert not EPOCH_MS.search(timeline), "every time is RFC 3339"
    newest = _fragment(client, f"/ui/fragments/runs/{scene.frozen}/timeline?limit=2")
    assert re.findall(r'data-version="(\d+)"', newest) == [str(view["version"]), str(view["version"] - 1)]


def test_the_timeline_shows_a_command_sent_through_the_api(console: Any) -> None:
    client, _, scene = console
    before = _fragment(client, f"/ui/fragments/runs/{scene.frozen}/timeline")
    heartbeat(client, scene.lease, 4)
    after = _fragment(client, f"/ui/fragments/runs/{scene.frozen}/timeline")
    assert after != before
    assert re.findall(r'data-type="(\w+)"', after)[0] == "LeaseRenewed"


def test_the_lease_page_shows_holder_epoch_certainty_renewals_and_effects(console: Any) -> None:
    client, _, scene = console
    lease = client.get(f"/runs/{scene.frozen}/lease", headers=OLGA).json()["lease"]
    shown = _fragment(client, f"/ui/fragments/runs/{scene.frozen}/lease")
    assert f"epoch {lease['epoch']}" in shown and lease["holder"] in shown and lease["leaseId"] in shown
    assert f"s-{lease['certainty']}" in shown
    assert "Renewals (3)" in shown and f"Effects attempted ({len(lease['effects'])})" in shown
    assert len(lease["effects"]) == 2
    for effect in lease["effects"]:
        assert effect["effectId"] in shown and f"s-{effect['status']}" in shown
    assert not EPOCH_MS.search(shown)
    queued = _fragment(client, f"/ui/fragments/runs/{scene.queued}/lease")
    assert "no lease yet" in queued


def test_the_trajectory_page_shows_steps_stack_gate_and_every_decision_with_its_inputs(console: Any) -> None:
    client, _, scene = console
    view = client.get(f"/runs/{scene.frozen}/trajectory", headers=OLGA).json()
    shown = _fragment(client, f"/ui/fragments/runs/{scene.frozen}/trajectory")
    assert f"Steps ({len(view['steps'])})" in shown
    for step in view["steps"]:
        assert step["tool"] in shown and f"s-{step['status']}" in shown
    assert "Compensation stack" in shown and "vm.terminate" in shown
    assert "Pivot gate" in shown
    assert len(view["decisions"]) == 1
    for decision in view["decisions"]:
        assert decision["action"] in shown and decision["gate"] in shown
        for name, value in decision["inputs"].items():
            assert f"<dt>{name}</dt><dd>{html.escape(str(value), quote=True)}</dd>" in shown
    assert scene.incident_id in shown
    assert "has no trajectory" in _fragment(client, f"/ui/fragments/runs/{scene.queued}/trajectory")


def test_the_watchdog_page_shows_detections_and_the_intervention_ladder(console: Any) -> None:
    client, _, scene = console
    view = client.get(f"/runs/{scene.looping}/watchdog", headers=OLGA).json()
    shown = _fragment(client, f"/ui/fragments/runs/{scene.looping}/watchdog")
    assert f"Interventions ({len(view['interventions'])})" in shown
    assert f"Detections ({len(view['detections'])})" in shown
    for intervention in view["interventions"]:
        assert intervention["code"] in shown
    assert "no semantic watchdog yet" in _fragment(client, f"/ui/fragments/runs/{scene.queued}/watchdog")


def test_the_quarantine_page_shows_the_trigger_and_the_taint_graph(console: Any) -> None:
    client, _, scene = console
    view = client.get(f"/runs/{scene.frozen}/quarantine", headers=OLGA).json()
    shown = _fragment(client, f"/ui/fragments/runs/{scene.frozen}/quarantine")
    assert view["status"] == "quarantined" and "s-quarantined" in shown
    for artifact in view["taintedArtifacts"]:
        assert artifact["artifactId"] in shown
    assert scene.looping in shown, "the derived artifact's producer: the taint's reach"
    assert "is not quarantined" in _fragment(client, f"/ui/fragments/runs/{scene.queued}/quarantine")


def test_the_breakers_page_shows_state_window_and_cooldown(console: Any) -> None:
    client, _, _ = console
    breakers = {b["endpoint"]: b for b in client.get("/breakers", headers=OLGA).json()["breakers"]}
    shown = _fragment(client, "/ui/fragments/breakers")
    assert breakers["ledger/transfer"]["status"] == "open" and breakers["env"]["status"] == "closed"
    row = re.search(r'data-endpoint="ledger/transfer">(.*?)</tr>', shown, re.S)
    assert row is not None
    window = breakers["ledger/transfer"]["window"]
    assert "s-open" in row.group(1) and f"{window['failures']} failed of {window['calls']}" in row.group(1)
    assert f"{breakers['ledger/transfer']['cooldownMs']} ms" in row.group(1)


def test_the_schedules_page_shows_their_next_firings(console: Any) -> None:
    client, _, _ = console
    shown = _fragment(client, "/ui/fragments/schedules")
    assert "sch_0000000000000001" in shown and "Europe/Berlin" in shown
    assert re.search(r"<time>\d{4}-\d\d-\d\dT02:00:00\+0[12]:00</time>", shown), "local time of the firing"


def test_a_board_this_api_does_not_follow_is_503_with_retry_after(tmp_path: Path) -> None:
    with api_client(tmp_path, api_keys=KEYS) as (client, _):
        for path in ("/ui/fragments/schedules", "/ui/fragments/runs/run_" + "0" * 32 + "/quarantine"):
            answer = client.get(path, headers=OLGA)
            if "quarantine" in path:
                _problem(answer, 404, "run-not-found")  # the run is read first
                continue
            _problem(answer, 503, "unavailable")
            assert answer.headers["retry-after"]


# --- incidents: the resolve action is the JSON route's ------------------------------------------------


def test_incidents_offer_their_resolutions_and_only_an_operator_may_resolve(console: Any) -> None:
    client, _, scene = console
    as_operator = _fragment(client, "/ui/fragments/incidents", OLGA)
    assert scene.incident_id in as_operator and 'class="resolve"' in as_operator
    assert "needs the operator role" not in as_operator
    as_submitter = _fragment(client, "/ui/fragments/incidents", RITA)
    assert "needs the operator role" in as_submitter
    # The form posts to the JSON route with the page's bearer key: its checks are the console's.
    body = {"runId": scene.frozen, "resolution": "compensated-manually", "note": "terminated by hand"}
    path = f"/incidents/{scene.incident_id}/resolve"
    _problem(client.post(path, headers=RITA, json=body), 403, "forbidden")
    assert scene.incident_id in _fragment(client, "/ui/fragments/incidents", OLGA)
    assert client.post(path, headers=OLGA, json=body).status_code == 200
    assert "No open incident" in _fragment(client, "/ui/fragments/incidents", OLGA)
    trajectory = _fragment(client, f"/ui/fragments/runs/{scene.frozen}/trajectory")
    assert "compensated-manually by olga" in trajectory
