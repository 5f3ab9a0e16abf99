"""`tenure runs|lease|incidents` (issue 17, the CLI in the conventions operators know).

The CLI talks to the real API app over tests/support/cli_api.py. What is checked: each verb asks
the right route with the caller's key, tables show times in RFC 3339, `-o json` and `-o yaml` are
the API's body as it came, writes pass their Idempotency-Key, a refused write is the problem's
words and exit 1, and `--watch` prints again when what it shows changes.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from services.tenure_cli.api_client import rfc3339
from tests.support.api_harness import InMemoryTenure
from tests.support.cli_api import cli_on_api, run_cli

pytestmark = pytest.mark.timeout(60)

KEYS = "rita-key=rita:submitter,olga-key=olga:operator,sam-key=sam:runner"
RITA = {"Authorization": "Bearer rita-key"}
SAM = {"Authorization": "Bearer sam-key"}
RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


@pytest.fixture()
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TestClient, InMemoryTenure]]:
    with cli_on_api(tmp_path, monkeypatch, KEYS) as (client, tenure):
        yield client, tenure


def _submit(client: TestClient, key: str, tenant: str = "acme") -> str:
    response = client.post(
        "/runs",
        headers={**RITA, "Idempotency-Key": key},
        json={"tenant": tenant, "executionSpec": {"k": key}, "timeoutSeconds": 600, "retrySafe": True},
    )
    assert response.status_code == 201, response.text
    return str(response.json()["runId"])


def _claim(client: TestClient, run_id: str) -> dict[str, Any]:
    response = client.post(f"/runs/{run_id}/attempts", headers=SAM, json={"runnerId": "runner-7"})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def test_runs_list_is_a_table_with_rfc3339_times_and_json_or_yaml_on_request(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    client, _ = api
    code, out, _ = run_cli(capsys, "runs", "list", "--api-key", "rita-key")
    assert code == 0 and out.strip() == "No runs."
    first, second = _submit(client, "a"), _submit(client, "b")
    _claim(client, first)
    code, out, _ = run_cli(capsys, "runs", "list", "--api-key", "rita-key")
    assert code == 0, out
    header, *rows = out.strip().splitlines()
    assert header.split() == ["RUN", "TENANT", "STATUS", "ATTEMPTS", "HOLDER", "EPOCH", "LEASE", "UPDATED"]
    by_run = {row.split()[0]: row.split() for row in rows}
    assert by_run[first][2:7] == ["preparing", "1", "runner-7", "1", "active"]
    assert by_run[second][2:5] == ["queued", "0", "-"]
    assert all(RFC3339.fullmatch(cells[-1]) for cells in by_run.values())

    code, out, _ = run_cli(capsys, "runs", "list", "-o", "json", "--api-key", "rita-key")
    api_body = client.get("/runs", headers=RITA).json()
    assert code == 0 and json.loads(out)["items"] == api_body["items"]
    code, out, _ = run_cli(
        capsys, "runs", "-o", "yaml", "list", "--status", "queued", "--api-key", "rita-key"
    )
    assert code == 0 and [r["runId"] for r in yaml.safe_load(out)["items"]] == [second]


def test_runs_list_all_follows_every_page(api: Any, capsys: pytest.CaptureFixture[str]) -> None:
    client, _ = api
    runs = {_submit(client, f"k{i}") for i in range(5)}
    code, out, _ = run_cli(capsys, "runs", "list", "--limit", "2", "--api-key", "rita-key")
    assert code == 0 and len(out.strip().splitlines()) == 1 + 2 + 1 and "--cursor" in out
    code, out, _ = run_cli(
        capsys, "runs", "list", "--limit", "2", "--all", "-o", "json", "--api-key", "rita-key"
    )
    assert code == 0 and {r["runId"] for r in json.loads(out)["items"]} == runs


def test_runs_describe_shows_the_lease_and_recent_events(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    client, _ = api
    run_id = _submit(client, "d")
    grant = _claim(client, run_id)
    code, out, _ = run_cli(capsys, "runs", "describe", run_id, "--api-key", "rita-key")
    assert code == 0, out
    assert f"Run:        {run_id}" in out and "Status:     preparing" in out
    assert "Holder:     runner-7 (runner)" in out and f"Attempt:    {grant['attemptId']}" in out
    view = client.get(f"/runs/{run_id}", headers=RITA).json()
    assert f"Expires:    {rfc3339(view['lease']['expiresAt'])}" in out
    assert "Trajectory:\n  none" in out
    events = out.split("Recent events:\n", 1)[1].strip().splitlines()
    assert [line.split()[2] for line in events[1:]] == ["RunSubmitted", "AttemptClaimed"]

    code, out, _ = run_cli(capsys, "runs", "describe", run_id, "-o", "json", "--api-key", "rita-key")
    assert code == 0 and json.loads(out) == {"run": view, "trajectory": None}


def test_runs_history_lists_every_event_in_version_order(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    client, _ = api
    run_id = _submit(client, "h")
    _claim(client, run_id)
    code, out, _ = run_cli(
        capsys, "runs", "cancel", run_id, "--reason", "wrong input", "--api-key", "rita-key"
    )
    assert code == 0 and out.strip() == f"{run_id}: cancelling"
    code, out, _ = run_cli(capsys, "runs", "history", run_id, "--api-key", "rita-key")
    assert code == 0, out
    header, *rows = out.strip().splitlines()
    assert header.split() == ["VERSION", "OCCURRED", "EVENT", "ACTOR", "CAUSATION"]
    assert [r.split()[0] for r in rows] == ["1", "2", "3"]
    assert [r.split()[2] for r in rows] == ["RunSubmitted", "AttemptClaimed", "RunCancelRequested"]
    assert all(RFC3339.fullmatch(r.split()[1]) for r in rows) and rows[2].split()[3] == "rita"
    code, out, _ = run_cli(capsys, "runs", "history", run_id, "-o", "yaml", "--api-key", "rita-key")
    history = client.get(f"/runs/{run_id}", headers=RITA).json()["history"]
    assert code == 0 and yaml.safe_load(out) == history


def test_a_refused_write_is_the_problems_words_and_exit_1(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    client, _ = api
    run_id = _submit(client, "r")
    code, _, err = run_cli(capsys, "runs", "retry", run_id, "--api-key", "rita-key")
    assert code == 1 and ("HTTP 409" in err or "HTTP 422" in err), err
    code, _, err = run_cli(
        capsys, "lease", "takeover", run_id, "--holder", "h", "--reason", "x", "--api-key", "rita-key"
    )
    assert code == 1 and "HTTP 403" in err, err
    code, _, err = run_cli(capsys, "runs", "describe", "run_00nothere", "--api-key", "rita-key")
    assert code == 1 and "HTTP 404 run-not-found" in err, err


def test_lease_show_and_an_operators_takeover_with_its_idempotency_key_lease_6(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    client, tenure = api
    run_id = _submit(client, "t")
    _claim(client, run_id)
    argv = (
        "lease",
        "takeover",
        run_id,
        "--holder",
        "olga",
        "--reason",
        "runner host lost",
        "--idempotency-key",
    )
    code, out, err = run_cli(capsys, *argv, "tk-1", "-o", "json", "--api-key", "olga-key")
    assert code == 0, err
    assert json.loads(out)["epoch"] == 2
    code, again, _ = run_cli(capsys, *argv, "tk-1", "-o", "json", "--api-key", "olga-key")
    assert code == 0 and json.loads(again)["epoch"] == 2  # the same command, answered again
    assert sum(type(c).__name__ == "TakeOverLease" for c in tenure.commands) == 1
    code, out, _ = run_cli(capsys, "lease", "show", run_id, "--api-key", "rita-key")
    assert code == 0, out
    assert (
        "Holder:     olga (human)" in out and "Epoch:      2" in out and "Taken over: runner host lost" in out
    )
    assert re.search(r"epoch 1: runner-7, \w+, ended " + RFC3339.pattern, out), out


def test_incidents_list_when_there_are_none(api: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "incidents", "list", "--api-key", "olga-key")
    assert code == 0 and out.strip() == "No open incidents."
    code, out, _ = run_cli(capsys, "incidents", "list", "-o", "json", "--api-key", "olga-key")
    assert code == 0 and json.loads(out) == {"items": []}


def test_watch_prints_again_when_the_run_changes_and_list_watch_prints_only_changed_rows(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    client, _ = api
    run_id, other = _submit(client, "w"), _submit(client, "w2")

    def claim_soon() -> None:
        time.sleep(0.3)
        _claim(client, run_id)

    worker = threading.Thread(target=claim_soon)
    worker.start()
    # 6 s: the claim lands 0.3 s in, but beside another pytest worker's brokers and services it was
    # once not seen within 1 s, and once (a fresh-clone CI run, 2026-12-06) not within 3 s.
    watch = ("--watch", "--interval", "0.05", "--watch-timeout", "6.0", "--api-key", "rita-key")
    code, out, _ = run_cli(capsys, "runs", "describe", run_id, *watch)
    worker.join()
    assert code == 0
    first, second = out.split("\n\nRun:", 1)  # two renderings, a blank line apart
    assert "Status:     queued" in first and "Status:     preparing" in second

    worker = threading.Thread(target=lambda: (time.sleep(0.3), _claim(client, other)))
    worker.start()
    code, out, _ = run_cli(capsys, "runs", "list", *watch)
    worker.join()
    lines = out.strip().splitlines()
    assert code == 0 and lines[0].startswith("RUN") and len(lines) == 1 + 2 + 1, out
    assert lines[-1].split()[:3] == [other, "acme", "preparing"]


def test_output_name_prints_one_id_per_line_for_shell_variables(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    client, _ = api
    first, second = _submit(client, "n1"), _submit(client, "n2")
    _claim(client, first)
    code, out, _ = run_cli(
        capsys, "runs", "list", "--status", "queued", "-o", "name", "--api-key", "rita-key"
    )
    assert code == 0 and out.splitlines() == [second]
    code, out, _ = run_cli(capsys, "runs", "list", "-o", "name", "--api-key", "rita-key")
    assert code == 0 and sorted(out.splitlines()) == sorted([first, second])


def test_runs_submit_is_idempotent_by_its_key_and_prints_the_run_id_with_o_name(
    api: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    client, tenure = api
    spec = tmp_path / "spec.json"
    spec.write_text('{"agent": "triage-bot", "input": "ticket 42"}')
    argv = ("runs", "submit", "--tenant", "acme", "--spec", f"@{spec}", "--timeout", "900", "-o", "name")
    code, out, _ = run_cli(capsys, *argv, "--idempotency-key", "demo-1", "--api-key", "rita-key")
    run_id = out.strip()
    assert code == 0 and run_id.startswith("run_")
    assert client.get(f"/runs/{run_id}", headers=RITA).json()["executionSpec"]["input"] == "ticket 42"
    code, again, _ = run_cli(capsys, *argv, "--idempotency-key", "demo-1", "--api-key", "rita-key")
    assert code == 0 and again.strip() == run_id
    assert sum(type(c).__name__ == "SubmitRun" for c in tenure.commands) == 1
    code, out, err = run_cli(capsys, *argv, "--api-key", "rita-key")  # no key: one is chosen and said
    assert code == 0 and out.strip() != run_id and "Idempotency-Key: " in err
    code, _, err = run_cli(capsys, "runs", "submit", "--tenant", "acme", "--spec", "[1]", "--timeout", "9")
    assert code == 1 and "--spec must be a JSON object" in err


def test_output_jsonpath_prints_one_field_the_way_kubectl_does(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    client, _ = api
    run_id = _submit(client, "jp")
    grant = _claim(client, run_id)
    show = ("lease", "show", run_id, "--api-key", "rita-key", "-o")
    code, out, _ = run_cli(capsys, *show, "jsonpath={.lease.attemptId}")
    assert code == 0 and out.strip() == grant["attemptId"]
    code, out, _ = run_cli(capsys, *show, "jsonpath=lease.epoch")
    assert code == 0 and out.strip() == "1"
    code, out, _ = run_cli(
        capsys, "runs", "list", "--api-key", "rita-key", "-o", "jsonpath={.items[0].runId}"
    )
    assert code == 0 and out.strip() == run_id
    code, _, err = run_cli(capsys, *show, "jsonpath={.lease.nothing}")
    assert code == 1 and "no such field" in err
    with pytest.raises(SystemExit):  # refused while parsing, before any request
        run_cli(capsys, *show, "jsonpath={.lease[}")
