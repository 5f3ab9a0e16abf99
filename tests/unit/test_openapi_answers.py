"""The answers of the operations the e2e walkthrough cannot reach cheaply match the document too.

Issue 17: tests/e2e/test_openapi_client.py drives the README's walkthrough through a client
generated from GET /openapi.json on the real system. This drives the rest (a saga's trajectory
commands, an approval, an abort, the watchdog's configuration and observations, input requests
and answers, an operator's takeover, blocks and breaker overrides) through the same client over
the in-memory stand-in (the real app and pure cores), so each 2xx and problem answer is checked
against the schema its status declares, and an undeclared status fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.common.contracts import SUCCESS, TRANSPORT_FAILURE
from tests.support.api_harness import InMemoryTenure, api_client
from tests.support.openapi_client import Answer, OpenApiClient

pytestmark = pytest.mark.timeout(60)

KEYS = "rita-key=rita:submitter,olga-key=olga:operator"


class _Keyed:
    """The app's TestClient with one caller's API key on every request."""

    def __init__(self, client: TestClient, key: str) -> None:
        self.client, self.key = client, key

    def request(self, method: str, url: str, **kwargs: Any) -> Any:
        headers = {**(kwargs.pop("headers", None) or {}), "Authorization": f"Bearer {self.key}"}
        return self.client.request(method, url, headers=headers, **kwargs)


@pytest.fixture()
def tenure(tmp_path: Path) -> Iterator[tuple[TestClient, InMemoryTenure]]:
    with api_client(tmp_path, api_keys=KEYS, decision_timeout_s=5.0) as pair:
        yield pair


@pytest.fixture()
def callers(tenure: tuple[TestClient, InMemoryTenure]) -> tuple[OpenApiClient, OpenApiClient]:
    client, _ = tenure
    document = client.get("/openapi.json").json()
    return (
        OpenApiClient(_Keyed(client, "rita-key"), document),  # type: ignore[arg-type]
        OpenApiClient(_Keyed(client, "olga-key"), document),  # type: ignore[arg-type]
    )


def _claimed(rita: OpenApiClient, key: str) -> tuple[str, dict[str, Any]]:
    spec = {"tenant": "acme", "executionSpec": {"agent": key}, "timeoutSeconds": 600}
    run_id = rita.submit_run(idempotency_key=key, body=spec).body["runId"]
    claim = {"runnerId": "r1", "capabilities": ["checkpoint-v1"], "leaseSeconds": 120}
    grant = rita.claim(run_id=run_id, body=claim).body
    return run_id, {"attemptId": grant["attemptId"], "leaseEpoch": grant["epoch"]}


def _ok(answer: Answer) -> Any:
    assert 200 <= answer.status < 300, answer.body
    return answer.body


def test_trajectory_commands_answer_what_the_document_declares(
    callers: tuple[OpenApiClient, OpenApiClient],
) -> None:
    rita, olga = callers
    run_id, lease = _claimed(rita, "saga")
    _ok(rita.start_trajectory(run_id=run_id, body={**lease, "pivotApproval": "human"}))
    ticket = _ok(
        rita.propose_step(run_id=run_id, body={**lease, "tool": "vm.provision", "params": {"name": "a"}})
    )
    assert ticket["stepIndex"] == 0
    _ok(rita.get_trajectory(run_id=run_id))
    refused = rita.approve_pivot(run_id=run_id, index=0, body={"decision": "approve"})
    assert refused.status == 403  # approval is an operator's (SAGA-6); declared and validated
    olga.approve_pivot(run_id=run_id, index=0, body={"decision": "approve"})  # 200 or a declared 409
    _ok(rita.adopt_lease(run_id=run_id, body=lease))
    for name, end in (("abort", rita.abort_trajectory), ("finish", rita.finish_trajectory)):
        other, held = _claimed(rita, name)  # nothing in flight: the end is decided at once
        _ok(rita.start_trajectory(run_id=other, body=held))
        ended = _ok(end(run_id=other, body={**held, "reason": "changed plans"}))
        assert ended["terminal"] or ended["status"] == "unwinding", ended["status"]
    assert _ok(olga.list_incidents())["items"] == []
    bogus = {"runId": run_id, "resolution": "abandon"}
    assert olga.resolve_incident(incident_id="inc_" + "0" * 32, body=bogus).status == 409  # no such incident


def test_watchdog_input_takeover_and_operator_answers_match_the_document(
    callers: tuple[OpenApiClient, OpenApiClient],
) -> None:
    rita, olga = callers
    run_id, lease = _claimed(rita, "watchdog")
    _ok(rita.heartbeat(attempt_id=lease["attemptId"], body={"leaseEpoch": 1, "sequence": 1}))
    again = _ok(rita.heartbeat(attempt_id=lease["attemptId"], body={"leaseEpoch": 1, "sequence": 1}))
    assert again["replayed"] is True  # a repeated sequence: answered, in the same declared shape
    watchdog = _ok(olga.configure(run_id=run_id, body={"window": 10}))
    assert watchdog["thresholds"]["window"] == 10
    observed = _ok(
        rita.observe(run_id=run_id, body={**lease, "stepSeq": 1, "tool": "env.read", "arguments": {}})
    )
    assert observed["status"] == "accepted"
    _ok(rita.get_watchdog(run_id=run_id))
    _ok(rita.get_run(run_id=run_id))
    rollback = {**lease, "interventionId": "none", "checkpointStep": -1}
    assert rita.acknowledge_rollback(run_id=run_id, body=rollback).status in (200, 404, 409)

    question = {
        "leaseEpoch": 1, "sequence": 2, "checkpointDigest": "sha256:ab", "prompt": "Which region?",
        "inputSchema": {"type": "string"}, "expiresAt": 4_102_444_800_000,
    }  # fmt: skip
    asked = _ok(rita.request_input(attempt_id=lease["attemptId"], body=question))
    answered = _ok(rita.provide_input(run_id=run_id, body={"responseId": "a1", "answer": "eu-west"}))
    assert asked["leaseReleased"] is True and answered["runId"] == run_id

    other, held = _claimed(rita, "takeover")
    taken = _ok(olga.takeover(run_id=other, body={"reason": "host lost", "newHolder": "olga"}))
    assert taken["epoch"] == held["leaseEpoch"] + 1
    _ok(rita.lease_record(run_id=other))
    assert _ok(olga.block(kind="tenant", subject="globex", body={"reason": "unpaid"}))["blocked"] is True
    assert _ok(olga.blocks())["blocks"][0]["subject"] == "globex"
    assert _ok(olga.unblock(kind="tenant", subject="globex"))["blocked"] is False
    spec = {"tenant": "acme", "executionSpec": {"agent": "q", "queue": "q1"}, "timeoutSeconds": 600}
    rita.submit_run(idempotency_key="queued", body=spec)
    first = _ok(rita.claim_next(queue="q1", idempotency_key="c1", body={"runnerId": "r2"}))
    repeat = rita.claim_next(queue="q1", idempotency_key="c1", body={"runnerId": "r2"})
    assert repeat.status == 201 and repeat.body["attemptId"] == first["attemptId"]  # the same grant
    assert rita.claim_next(queue="q1", body={"runnerId": "r2"}).status == 204


def test_breaker_answers_match_the_document(
    tenure: tuple[TestClient, InMemoryTenure], callers: tuple[OpenApiClient, OpenApiClient]
) -> None:
    rita, olga = callers
    tenure[1].report_outcomes("ledger", [SUCCESS] * 2 + [TRANSPORT_FAILURE] * 8)  # opens it (BRK-1)
    assert _ok(rita.list_breakers())["breakers"][0]["status"] == "open"
    assert _ok(rita.get_breaker(endpoint="ledger"))["transitions"]
    for override in (olga.force_open_breaker, olga.disable_breaker, olga.reset_breaker):
        assert _ok(override(endpoint="ledger", body={"reason": "maintenance"}))["replayed"] is False
    _ok(olga.bulkheads())
