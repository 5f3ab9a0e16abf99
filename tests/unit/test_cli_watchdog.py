"""`tenure watchdog show` (issue 17: the README's walkthrough without `curl | python3`; WD-5).

The CLI talks to the real API app over tests/support/cli_api.py, with the watchdog's pure core
deciding in process. A runner closes a loop twice; the operator's `tenure watchdog show` must
name the pending rollback, list every rung of the ladder, and give the rollback's id through
`-o jsonpath` exactly as the API's view holds it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.api_harness import InMemoryTenure
from tests.support.cli_api import cli_on_api, run_cli
from tests.unit.test_watchdog_routes import RITA, A, B, Runner

pytestmark = pytest.mark.timeout(60)

KEYS = "rita-key=rita:submitter,olga-key=olga:operator"


@pytest.fixture()
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TestClient, InMemoryTenure]]:
    with cli_on_api(tmp_path, monkeypatch, KEYS) as pair:
        yield pair


def test_watchdog_show_names_the_pending_rollback_and_every_rung_wd_5(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    client, _ = api
    runner = Runner(client)
    runner.start_trajectory()
    for params in (A, B, A, B):  # two loops within the ladder epoch: level 1, then level 2
        assert runner.observe(params).status_code == 202
    view = client.get(f"/runs/{runner.run_id}/watchdog", headers=RITA).json()
    pending = view["pendingRollback"]
    assert pending

    code, out, err = run_cli(capsys, "watchdog", "show", runner.run_id, "--api-key", "olga-key")
    assert code == 0, err
    assert f"Run {runner.run_id}: watchdog rollback-requested" in out
    assert f"Pending rollback: {pending}" in out
    rungs = [line for line in out.splitlines() if line.strip().startswith("level ")]
    assert [line.split()[1] for line in rungs] == ["1", "2"] and "ROLLBACK_REQUESTED" in rungs[1]

    args = ("watchdog", "show", runner.run_id, "--api-key", "olga-key", "-o")
    code, out, _ = run_cli(capsys, *args, "jsonpath={.pendingRollback}")
    assert code == 0 and out.strip() == pending
    code, out, _ = run_cli(capsys, *args, "json")
    assert code == 0 and json.loads(out)["interventions"] == view["interventions"]


def test_watchdog_show_of_a_run_without_a_watchdog_is_the_problems_words_and_exit_1(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    client, _ = api
    created = client.post(
        "/runs",
        headers={**RITA, "Idempotency-Key": "quiet"},
        json={"tenant": "acme", "executionSpec": {"k": "quiet"}, "timeoutSeconds": 600},
    )
    assert created.status_code == 201, created.text
    code, out, err = run_cli(capsys, "watchdog", "show", created.json()["runId"], "--api-key", "olga-key")
    assert code == 1 and out == "" and "404" in err
