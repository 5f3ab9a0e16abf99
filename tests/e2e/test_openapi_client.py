"""A client generated from GET /openapi.json drives the README's walkthrough on the real system.

Issue 17 ("OpenAPI that matches the API"): the client (tests/support/openapi_client.py) knows
nothing but the published document. Every request body is validated against the declared request
schema before it is sent; every answer, success or problem, must have a status the operation
declares and a body valid against that status's schema. The walkthrough runs against the real
broker and processes (lease coordinator, projector, command API), as a user's service would:
submit, repeat, conflict, list, read, cancel (queued and running), claim, heartbeat, batch renewal,
the lease record, upload and report with a manifest, retry, claim the queue's next run, an
operator's takeover and block policy, and the reads beside them (EXE-2, EXE-7, LEASE-2, LEASE-6).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.openapi_client import Answer, OpenApiClient
from tests.support.system import ServiceProcess, free_port, wait_for_ready, wait_until
from tests.support.tenure import TenureSystem

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

KEYS = "rita-key=rita:submitter,sam-key=sam:submitter,olga-key=olga:operator"


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenureSystem]:
    """The walkthrough's processes, and the schedules processor for the schedules' part."""
    tmp, port = tmp_path_factory.mktemp("openapi-client"), free_port()
    s = TenureSystem(tenure_topics, tmp, TENURE_API_KEYS=KEYS, TENURE_SCHEDULES_HEALTH_PORT=str(port))
    schedules = ServiceProcess("schedules", "services.schedules", s.env, tmp)
    s.start()
    schedules.start()
    try:
        wait_for_ready(port, process=schedules)
        yield s
    finally:
        schedules.stop()
        s.stop()


def _problem(answer: Answer, status: int, slug: str) -> dict[str, Any]:
    assert answer.status == status, answer.body
    assert answer.body["type"] == f"/problems/{slug}", answer.body
    body: dict[str, Any] = answer.body
    return body


def _clients(system: TenureSystem) -> tuple[OpenApiClient, ...]:
    document = httpx.get(f"{system.base}/openapi.json", timeout=30).json()
    return tuple(
        OpenApiClient(system.client(key), document) for key in (None, "rita-key", "sam-key", "olga-key")
    )


def test_a_client_generated_from_the_openapi_document_drives_the_walkthrough(system: TenureSystem) -> None:
    anonymous, rita, sam, olga = _clients(system)
    tag = uuid.uuid4().hex[:8]
    spec = {"tenant": "acme", "executionSpec": {"agent": "triage-bot", "input": tag}, "timeoutSeconds": 900}

    assert anonymous.healthz().status == 200
    wait_until(lambda: anonymous.readyz().status == 200, 60, "the API's readiness")  # 503s validated too
    _problem(anonymous.get_run(run_id="run_" + "0" * 32), 401, "unauthenticated")
    with pytest.raises(TypeError, match="idempotency_key"):
        rita.submit_run(body=spec)  # the document makes the key required, so the client does

    # Submit, repeat, conflict (EXE-2), list, read.
    created = rita.submit_run(idempotency_key=f"demo-{tag}", body=spec)
    assert created.status == 201 and created.body["status"] == "queued"
    run_id = created.body["runId"]
    assert created.headers["location"] == f"/runs/{run_id}"
    again = rita.submit_run(idempotency_key=f"demo-{tag}", body=spec)
    assert again.status == 200 and again.body["runId"] == run_id
    other = {**spec, "executionSpec": {"agent": "other"}}
    _problem(rita.submit_run(idempotency_key=f"demo-{tag}", body=other), 409, "idempotency-key-conflict")
    page = rita.list_runs(status="queued", limit=500)
    assert page.status == 200 and page.body["items"]
    assert rita.get_run(run_id=run_id).body["version"] == 1

    # Cancel a queued run (EXE-7); again is a problem that says why; problem types describe themselves.
    _problem(sam.cancel_run(run_id=run_id, body={"reason": "not mine"}), 403, "forbidden")
    cancelled = rita.cancel_run(run_id=run_id, body={"reason": "demo"})
    assert cancelled.status == 200 and cancelled.body["status"] == "cancelled"
    assert cancelled.body["queueReservationId"] is None
    before = rita.get_run(run_id=run_id, as_of="v1")  # the run as it was (read back from Kafka)
    assert before.body["status"] == "queued" and before.body["asOf"]["version"] == 1
    terminal = _problem(rita.cancel_run(run_id=run_id, body={}), 409, "run-already-terminal")
    assert terminal["code"] == "RUN_ALREADY_TERMINAL"
    assert rita.describe_problem(slug="run-already-terminal").body["status"] == 409
    _problem(rita.get_run(run_id="run_does_not_exist"), 404, "run-not-found")
    _problem(rita.list_runs(cursor="!!"), 400, "invalid-cursor")

    # Leases: claim, renew (singly and in a batch), a stale epoch refused, the lease record.
    # A queue of this test's own (executionSpec.queue), so the queue's next run is ours.
    spec2 = {**spec, "executionSpec": {"agent": "deployer", "queue": f"q-{tag}"}, "retrySafe": True}
    run2 = rita.submit_run(idempotency_key=f"lease-{tag}", body=spec2).body["runId"]
    claim = {"runnerId": "runner-a", "leaseSeconds": 30, "heartbeatSeconds": 10}
    grant = rita.claim(run_id=run2, body=claim)
    assert grant.status == 201 and grant.body["epoch"] == 1
    att = grant.body["attemptId"]
    beat = rita.heartbeat(attempt_id=att, body={"leaseEpoch": 1, "sequence": 1})
    assert beat.status == 200 and beat.body["stopRequested"] is False
    batch = rita.renew_leases(body={"renewals": [{"attemptId": att, "leaseEpoch": 1, "sequence": 2}]})
    assert batch.status == 200 and batch.body["accepted"] == 1
    stale = rita.heartbeat(attempt_id=att, body={"leaseEpoch": 2, "sequence": 3})
    assert stale.status == 409, stale.body
    record = rita.lease_record(run_id=run2)
    assert record.body["lease"]["attemptId"] == att and len(record.body["lease"]["renewals"]) == 2
    _problem(rita.get_trajectory(run_id=run2), 404, "trajectory-not-found")
    assert rita.get_watchdog(run_id=run2).status == 404

    # An artifact: a grant, the bytes, a success report carrying its manifest (EXE-15).
    upload = rita.upload_grant(
        attempt_id=att, body={"leaseEpoch": 1, "destination": "out.txt", "maxBytes": 100}
    )
    assert upload.status == 201, upload.body
    stored = rita.upload(grant_id=upload.body["grantId"], content=b"hello", content_type="text/plain")
    assert stored.status == 201 and stored.body["sizeBytes"] == 5
    entry = {k: stored.body[k] for k in ("artifactId", "digest", "sizeBytes", "mediaType")}
    report = {"leaseEpoch": 1, "sequence": 4, "outcome": "succeeded", "manifest": [entry]}
    done = rita.report(attempt_id=att, body=report)
    assert done.status == 200 and done.body["status"] == "succeeded", done.body

    # Retry a finished run: a new run with parentRunId, which the queue hands out next.
    child = rita.retry_run(run_id=run2, body={"acknowledgeRepeatedEffects": True})
    assert child.status == 201 and child.body["parentRunId"] == run2
    next_run = _claim_next_until(rita, f"q-{tag}", child.body["runId"])
    child_att = next_run["attemptId"]

    # Cancel a running run: the runner sees stopRequested and confirms with a report.
    cancelling = olga.cancel_run(run_id=child.body["runId"], body={"reason": "demo"})
    assert cancelling.status == 200 and cancelling.body["status"] == "cancelling"
    told = rita.heartbeat(attempt_id=child_att, body={"leaseEpoch": next_run["epoch"], "sequence": 1})
    assert told.body["stopRequested"] is True
    confirmed = rita.report(
        attempt_id=child_att, body={"leaseEpoch": next_run["epoch"], "sequence": 2, "outcome": "cancelled"}
    )
    assert confirmed.body["status"] == "cancelled", confirmed.body

    # An operator: takeover of a running run (LEASE-6), the block policy, breakers, bulkheads.
    run3 = rita.submit_run(idempotency_key=f"ops-{tag}", body=spec2).body["runId"]
    rita.claim(run_id=run3, body=claim)
    _problem(rita.takeover(run_id=run3, body={"reason": "stuck", "newHolder": "olga"}), 403, "forbidden")
    taken = olga.takeover(run_id=run3, body={"reason": "stuck", "newHolder": "olga"})
    assert taken.status == 200 and taken.body["epoch"] == 2, taken.body
    blocked = olga.block(kind="principal", subject=f"mallory-{tag}", body={"reason": "demo"})
    assert blocked.status in (200, 202) and blocked.body["blocked"] is True
    assert any(b["subject"] == f"mallory-{tag}" for b in olga.blocks().body["blocks"])
    assert olga.unblock(kind="principal", subject=f"mallory-{tag}").status in (200, 202)
    assert olga.list_breakers().status == 200
    assert olga.bulkheads().body["pools"]
    assert olga.list_incidents().status == 200

    driven = {operation for operation, _ in rita.seen | sam.seen | olga.seen | anonymous.seen}
    assert len(driven) >= 24, sorted(driven)


def test_the_generated_client_drives_the_schedules_walkthrough_EXE_14(system: TenureSystem) -> None:
    """Schedules (the README's DST section) through the generated client: create, the same key
    again, read, list, pause, resume, patch and a manual trigger; every answer validated."""
    _, rita, sam, olga = _clients(system)
    body = {
        "tenant": "acme", "agentRevisionId": "agrev-2026-03", "timeZone": "Europe/Berlin",
        "cron": "30 2 * * *",
        "runTemplate": {"executionSpec": {"entrypoint": "nightly-triage"}, "timeoutSeconds": 600},
    }  # fmt: skip
    _problem(rita.create_schedule(body={**body, "cron": "61 2 * * *"}), 422, "invalid-schedule")
    key = uuid.uuid4().hex
    created = rita.create_schedule(idempotency_key=key, body=body)
    assert created.status == 201, created.body
    sid = created.body["scheduleId"]
    assert rita.create_schedule(idempotency_key=key, body=body).status == 200
    assert len(rita.get_schedule(schedule_id=sid, next=3).body["nextFirings"]) == 3
    assert any(s["scheduleId"] == sid for s in rita.list_schedules(tenant="acme").body["items"])
    _problem(sam.pause_schedule(schedule_id=sid, body={"reason": "not mine"}), 403, "forbidden")
    assert rita.pause_schedule(schedule_id=sid, body={"reason": "maintenance"}).body["status"] == "paused"
    assert olga.resume_schedule(schedule_id=sid, body={}).body["status"] == "active"
    patched = rita.patch_schedule(schedule_id=sid, body={"cron": "0 6 * * 1-5"})
    assert patched.status == 200 and patched.body["cron"] == "0 6 * * 1-5"
    triggered = rita.trigger_schedule(schedule_id=sid, body={"reason": "now"})
    assert triggered.status in (200, 202), triggered.body


def _claim_next_until(client: OpenApiClient, queue: str, run_id: str) -> dict[str, Any]:
    """Claim the queue's next run, `run_id` (204 until the queue shows it)."""

    def claimed() -> dict[str, Any] | None:
        answer = client.claim_next(queue=queue, body={"runnerId": "runner-b", "leaseSeconds": 30})
        if answer.status == 201:
            assert answer.body["runId"] == run_id, answer.body
            body: dict[str, Any] = answer.body
            return body
        return None

    result: dict[str, Any] = wait_until(claimed, 60, f"a claim of {run_id} from the queue")
    return result
