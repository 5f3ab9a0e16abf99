"""Schedules through the HTTP API on the real system (EXE-14): create, describe with the next
firings in local time and UTC, 422 problems for a bad cron or zone, owner-only changes,
pause/resume, a manual trigger that starts its own run, and `tenure schedules` over the same API."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.system import ServiceProcess, free_port, wait_for_ready, wait_until
from tests.support.tenure import TenureSystem, problem_type

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.timeout(180)]
KEYS = "alice-key=alice:submitter,bob-key=bob:submitter,ops-key=ops:operator"


@pytest.fixture
def system(tenure_topics: str, tmp_path: Path) -> Iterator[TenureSystem]:
    port = free_port()
    tenure = TenureSystem(
        tenure_topics, tmp_path, TENURE_API_KEYS=KEYS, TENURE_SCHEDULES_HEALTH_PORT=str(port)
    )
    schedules = ServiceProcess("schedules", "services.schedules", tenure.env, tmp_path)
    tenure.start()
    schedules.start()
    wait_for_ready(port, process=schedules)
    try:
        yield tenure
    finally:
        schedules.stop()
        tenure.stop()


def _body(**overrides: Any) -> dict[str, Any]:
    return {
        "tenant": "acme",
        "agentRevisionId": "agrev-2026-03",
        "runTemplate": {"executionSpec": {"entrypoint": "nightly-triage"}, "timeoutSeconds": 600},
        "timeZone": "Europe/Berlin",
        "cron": "30 2 * * *",
        **overrides,
    }


def test_schedule_api_end_to_end_EXE_14(system: TenureSystem) -> None:
    alice, bob, ops = (system.client(k) for k in ("alice-key", "bob-key", "ops-key"))
    bad_cron = alice.post("/schedules", json=_body(cron="61 2 * * *"))
    assert bad_cron.status_code == 422 and problem_type(bad_cron).endswith("invalid-schedule")
    assert bad_cron.json()["field"] == "cron"
    bad_zone = alice.post("/schedules", json=_body(timeZone="Europe/Atlantis"))
    assert bad_zone.status_code == 422 and bad_zone.json()["field"] == "timeZone"
    assert system.client(None).post("/schedules", json=_body()).status_code == 401

    key = uuid.uuid4().hex
    created = alice.post("/schedules", json=_body(), headers={"Idempotency-Key": key})
    assert created.status_code == 201, created.text
    view = created.json()
    sid = view["scheduleId"]
    assert view["agentRevisionId"] == "agrev-2026-03" and view["status"] == "active"
    again = alice.post("/schedules", json=_body(), headers={"Idempotency-Key": key})
    assert again.status_code == 200 and again.json()["scheduleId"] == sid

    described = alice.get(f"/schedules/{sid}", params={"next": 3}).json()
    assert len(described["nextFirings"]) == 3
    first = described["nextFirings"][0]
    assert first["local"].endswith(("T02:30:00+01:00", "T02:30:00+02:00")) and first["utc"].endswith("Z")

    assert bob.post(f"/schedules/{sid}/pause", json={"reason": "mine now"}).status_code == 403
    paused = alice.post(f"/schedules/{sid}/pause", json={"reason": "maintenance"})
    assert paused.status_code == 200 and paused.json()["status"] == "paused"
    twice = alice.post(f"/schedules/{sid}/pause", json={})
    assert twice.status_code == 409 and problem_type(twice).endswith("schedule-conflict")
    assert ops.post(f"/schedules/{sid}/resume", json={}).json()["status"] == "active"
    patched = alice.patch(f"/schedules/{sid}", json={"cron": "0 6 * * 1-5", "overlapPolicy": "queue"})
    assert patched.status_code == 200 and patched.json()["cron"] == "0 6 * * 1-5"
    assert alice.patch(f"/schedules/{sid}", json={"timeZone": "Nowhere/Land"}).status_code == 422

    triggered = alice.post(f"/schedules/{sid}/trigger", json={"reason": "now"})
    assert triggered.status_code == 200, triggered.text
    manual = triggered.json()["history"][0]
    assert manual["manual"] and manual["runId"]
    run = wait_until(
        lambda: (r := alice.get(f"/runs/{manual['runId']}")).status_code == 200 and r.json(), 30, "the run"
    )
    assert run["tenant"] == "acme"
    # The run names what it runs and which schedule started it.
    assert run["agentRevisionId"] == "agrev-2026-03" and run["labels"]["schedule"] == sid
    listed = alice.get("/schedules", params={"tenant": "acme"}).json()["items"]
    assert sid in {s["scheduleId"] for s in listed}
    assert alice.get("/schedules/sch_ffffffffffffffff").status_code == 404

    # The CLI, kubectl-like, through the same API.
    url, key = ("--api-url", system.base), ("--api-key", "alice-key")
    listing = system.cli("schedules", "list", *url, *key)
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.startswith("NAME") and sid in listing.stdout
    described_cli = system.cli("schedules", "describe", sid, "--next", "2", *url, *key)
    assert described_cli.returncode == 0 and "Next firings:" in described_cli.stdout
    assert "0 6 * * 1-5 (Europe/Berlin)" in described_cli.stdout
    fired = system.cli("schedules", "trigger", sid, "--reason", "cli", *url, *key)
    assert fired.returncode == 0, fired.stderr
    assert fired.stdout.count("manual") >= 2
    missing = system.cli("schedules", "describe", "sch_ffffffffffffffff", *url, *key)
    assert missing.returncode == 1 and "HTTP 404 schedule-not-found" in missing.stderr
