"""A run as it was at a time or a version, through the API and the CLI, on real processes
(issue 17, "Point in time"): `GET /runs/{id}?asOf=` and `tenure runs describe --as-of`."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.common.times import rfc3339
from tests.support.tenure import TenureSystem, claim, heartbeat, problem_type, submit

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenureSystem]:
    s = TenureSystem(tenure_topics, tmp_path_factory.mktemp("as-of")).start()
    yield s
    s.stop()


def test_a_run_as_of_each_version_and_time_is_the_fold_of_its_events_then(system: TenureSystem) -> None:
    with system.client() as client:
        run_id = submit(client, f"as-of-{uuid.uuid4()}")["runId"]
        grant = claim(client, run_id, lease_seconds=60, heartbeat_seconds=10).json()
        assert heartbeat(client, grant, 1).status_code == 200
        assert heartbeat(client, grant, 2).status_code == 200
        now = client.get(f"/runs/{run_id}").json()
        # The second renewal is kept off runs.events (issue 16): three versions, two renewals.
        assert now["version"] == 3 and now["status"] == "running"
        assert [r["sequence"] for r in now["lease"]["renewals"]] == [1, 2]
        history = now["history"]

        first = client.get(f"/runs/{run_id}", params={"asOf": "v1"}).json()
        assert first["version"] == 1 and first["status"] == "queued" and first["lease"] is None
        at = history[0]["occurredAt"]
        assert first["asOf"] == {"version": 1, "occurredAt": at, "occurredAtRfc3339": rfc3339(at)}
        second = client.get(f"/runs/{run_id}", params={"asOf": "v2"}).json()
        assert second["status"] == "preparing" and second["lease"]["epoch"] == 1
        assert second["history"] == history[:2]
        at_claim = client.get(f"/runs/{run_id}", params={"asOf": str(history[1]["occurredAt"])}).json()
        assert at_claim["version"] >= 2 and at_claim["history"] == history[: at_claim["version"]]

        before = client.get(f"/runs/{run_id}", params={"asOf": str(history[0]["occurredAt"] - 1)})
        assert before.status_code == 404 and problem_type(before) == "run-not-found"
        bad = client.get(f"/runs/{run_id}", params={"asOf": "yesterday"})
        assert bad.status_code == 422 and problem_type(bad) == "validation-failed"

    described = system.cli("runs", "describe", run_id, "--as-of", "v2", "--api", system.base, "-o", "json")
    assert described.returncode == 0, described.stderr
    assert json.loads(described.stdout)["run"]["status"] == "preparing"
    table = system.cli("runs", "describe", run_id, "--as-of", "v2", "--api", system.base)
    assert table.returncode == 0 and f"Run:        {run_id} as of version 2" in table.stdout


def test_the_cli_finds_run_ids_without_piping_curl(system: TenureSystem, tmp_path: Path) -> None:
    key = f"cli-{uuid.uuid4()}"
    argv = ("runs", "submit", "--tenant", "acme", "--spec", '{"agent":"demo"}', "--timeout", "600")
    submitted = system.cli(*argv, "--idempotency-key", key, "-o", "name", "--api", system.base)
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    listed = system.cli("runs", "list", "--status", "queued", "--all", "-o", "name", "--api", system.base)
    assert listed.returncode == 0 and run_id in listed.stdout.split()
    history = system.cli("runs", "history", run_id, "--api", system.base)
    assert history.returncode == 0 and "RunSubmitted" in history.stdout
