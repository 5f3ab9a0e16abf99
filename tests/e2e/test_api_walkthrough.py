"""The README walkthrough, driven the way a user's service would: HTTP against real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.topics import RUNS_EVENTS
from tests.support.system import (
    ServiceProcess,
    decode_all,
    free_port,
    read_topic,
    service_env,
    stop_all,
    wait_for_http,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


class System:
    def __init__(self, bootstrap: str, tmp: Path) -> None:
        self.port = free_port()
        self.env = service_env(
            bootstrap, tmp / "state", TENURE_API_PORT=str(self.port), TENURE_DECISION_TIMEOUT_S="10"
        )
        self.processor = ServiceProcess("lease-coordinator", "services.lease_coordinator", self.env, tmp)
        self.projector = ServiceProcess("projections", "services.projections", self.env, tmp)
        self.api = ServiceProcess("command-api", "services.command_api", self.env, tmp)
        self.base = f"http://127.0.0.1:{self.port}"
        self.bootstrap = bootstrap

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "services.tenure_cli", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture
def system(tenure_topics: str, tmp_path: Path) -> Iterator[System]:
    s = System(tenure_topics, tmp_path)
    s.processor.start()
    s.projector.start()
    wait_until(
        lambda: (tmp_path / "state" / "projections" / "run_views" / "CURRENT").exists(),
        30,
        "the projector's store",
    )
    s.api.start()
    wait_for_http(f"{s.base}/healthz")
    yield s
    stop_all((s.api, s.projector, s.processor))


def _submit(
    client: httpx.Client, key: str, spec: dict[str, Any] | None = None, tenant: str = "acme"
) -> httpx.Response:
    return client.post(
        "/runs",
        headers={"Idempotency-Key": key},
        json={"tenant": tenant, "executionSpec": spec or {"agent": "demo"}, "timeoutSeconds": 600},
    )


def _problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["type"] == f"/problems/{slug}"
    assert body["status"] == status and body["title"] and body["detail"]
    return body


def test_submit_duplicate_cancel_and_inspect_through_the_api_EXE_2_EXE_7(system: System) -> None:
    key = f"walkthrough-{uuid.uuid4()}"
    with httpx.Client(base_url=system.base, timeout=30) as client:
        created = _submit(client, key)
        assert created.status_code == 201, created.text
        run = created.json()
        run_id = run["runId"]
        assert created.headers["location"] == f"/runs/{run_id}"
        assert run["status"] == "queued" and run["version"] == 1
        assert run["queueReservationId"], "EXE-2: the queue reservation is made with the run"
        assert run["specDigest"].startswith("sha256:")

        # The same Idempotency-Key again: the same run, 200, and no new event on the log.
        again = _submit(client, key)
        assert again.status_code == 200 and again.json()["runId"] == run_id
        # A different spec under the same key is a conflict, not a second run.
        _problem(_submit(client, key, {"agent": "other"}), 409, "idempotency-key-conflict")

        cancelled = client.post(f"/runs/{run_id}/cancel", json={"reason": "changed my mind"})
        assert cancelled.status_code == 200, cancelled.text
        view = cancelled.json()
        assert view["status"] == "cancelled" and view["statusReason"] == "changed my mind"
        assert view["queueReservationId"] is None, "EXE-7: cancel of a queued run releases the reservation"
        assert [h["type"] for h in view["history"]] == ["RunSubmitted", "RunCancelled"]

        body = _problem(client.post(f"/runs/{run_id}/cancel", json={}), 409, "run-already-terminal")
        assert body["code"] == "RUN_ALREADY_TERMINAL" and body["currentStatus"] == "cancelled"

        assert client.get(f"/runs/{run_id}").json() == view
        _problem(client.get("/runs/run_does_not_exist"), 404, "run-not-found")
        _problem(client.post("/runs/run_does_not_exist/cancel", json={}), 404, "run-not-found")
        _problem(
            client.post("/runs", json={"tenant": "acme", "executionSpec": {}, "timeoutSeconds": 60}),
            400,
            "idempotency-key-required",
        )
        invalid = _problem(
            client.post(
                "/runs", headers={"Idempotency-Key": "x"}, json={"tenant": "acme", "timeoutSeconds": 0}
            ),
            422,
            "validation-failed",
        )
        assert {tuple(e["location"]) for e in invalid["errors"]} == {
            ("body", "executionSpec"),
            ("body", "timeoutSeconds"),
        }
        _problem(client.get("/runs", params={"status": "bogus"}), 422, "validation-failed")
        _problem(client.get("/runs", params={"cursor": "!!"}), 400, "invalid-cursor")
        meaning = client.get("/problems/run-not-found").json()
        assert meaning["status"] == 404 and meaning["meaning"]
        assert client.get("/docs").status_code == 200
        assert "tenure_api_commands_total" in client.get("/metrics").text

    events = [
        e
        for e in decode_all(read_topic(system.bootstrap, RUNS_EVENTS.name, RUNS_EVENTS.partitions))
        if e.run_id == run_id
    ]
    assert [type(e).__name__ for e in events] == ["RunSubmitted", "RunCancelled"]

    tail = system.cli(
        "tail",
        "runs.events",
        "--from-beginning",
        "--run",
        run_id,
        "--json",
        "--max",
        "2",
        "--idle-exit",
        "10",
    )
    assert tail.returncode == 0, tail.stderr
    lines = [json.loads(line) for line in tail.stdout.splitlines()]
    assert [line["type"] for line in lines] == ["RunSubmitted", "RunCancelled"]
    assert lines[1]["fields"]["reason"] == "changed my mind"


def test_listing_pages_through_every_run_of_a_status_once(system: System) -> None:
    tenant = f"pager-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=system.base, timeout=30) as client:
        ids = [_submit(client, f"{tenant}-{i}", tenant=tenant).json()["runId"] for i in range(7)]
        seen: list[str] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"status": "queued", "limit": 3}
            if cursor:
                params["cursor"] = cursor
            page = client.get("/runs", params=params).json()
            seen.extend(item["runId"] for item in page["items"])
            cursor = page["nextCursor"]
            if cursor is None:
                break
    assert len(seen) == len(set(seen)), "a run appeared on two pages"
    assert set(ids) <= set(seen)


def test_a_command_without_a_timely_decision_is_accepted_with_202_and_decided_later(system: System) -> None:
    system.processor.stop()
    key = f"late-{uuid.uuid4()}"
    system.env["TENURE_DECISION_TIMEOUT_S"] = "1"
    with httpx.Client(base_url=system.base, timeout=30) as client:
        system.api.stop()
        system.api.start()
        wait_for_http(f"{system.base}/healthz")
        pending = _submit(client, key)
        assert pending.status_code == 202, pending.text
        run_id = pending.json()["runId"]
        assert pending.headers["location"] == f"/runs/{run_id}"
        system.processor.start()
        view = wait_until(
            lambda: client.get(f"/runs/{run_id}").status_code == 200 and client.get(f"/runs/{run_id}").json(),
            60,
            "the late decision",
        )
        assert view["status"] == "queued"


def test_replay_writes_json_lines_for_analysts(system: System, tmp_path: Path) -> None:
    with httpx.Client(base_url=system.base, timeout=30) as client:
        run_id = _submit(client, f"replay-{uuid.uuid4()}").json()["runId"]
    out = tmp_path / "events.jsonl"
    started = time.time()
    result = system.cli("replay", "--from-offset", "0", "--output", str(out))
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert any(r["key"] == run_id and r["type"] == "RunSubmitted" for r in rows)
    assert all({"topic", "partition", "offset", "type", "fields"} <= r.keys() for r in rows)
    assert time.time() - started < 60
