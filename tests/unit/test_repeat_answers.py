"""A repeated request answers with the same fields as the first (issue 17), from the run as it
stands now: a repeated heartbeat and a retried batch renewal still tell the runner of a stop
requested since (EXE-7/EXE-10) and of the watchdog's intervention (WD-5); a repeated claim-next
still says how long the claim waited (LEASE-5 counting).

Over the real app and pure cores (tests/support/api_harness.py), called through the client
generated from GET /openapi.json (tests/support/openapi_client.py), so every answer is also
validated against its declared schema, where these fields are now required.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.runner_sdk import Intervention, Lease, TenureClient
from tests.support.api_harness import api_client
from tests.support.openapi_client import Answer, OpenApiClient

pytestmark = pytest.mark.timeout(60)

KEYS = "rita-key=rita:submitter,rob-key=rob:runner"
RITA = "rita-key"
STOP_FIELDS = ("stopRequested", "stopKind", "stopGraceUntil")
# WD-5: a 2-state loop (provision "a" -> state A, "b" -> state B, "a" -> A again) is level 1.
LOOP = ({"name": "a"}, {"name": "b"}, {"name": "a"})
STATE = {"a": "a" * 64, "b": "b" * 64}


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[tuple[TestClient, OpenApiClient]]:
    with api_client(tmp_path, api_keys=KEYS, decision_timeout_s=5.0) as (client, _stand_in):
        yield client, OpenApiClient(client, client.get("/openapi.json").json())


def _ok(answer: Answer, status: int = 200) -> dict[str, Any]:
    assert answer.status == status, answer.body
    body: dict[str, Any] = answer.body
    return body


def _claimed(api: OpenApiClient, key: str, **spec: Any) -> tuple[str, dict[str, Any]]:
    run = {"tenant": "acme", "executionSpec": {"k": key, **spec}, "timeoutSeconds": 600}
    run_id = _ok(api.submit_run(idempotency_key=key, body=run, auth=RITA), 201)["runId"]
    grant = _ok(api.claim(run_id=run_id, body={"runnerId": "r-1"}, auth=RITA), 201)
    return run_id, {"attemptId": grant["attemptId"], "leaseEpoch": grant["epoch"]}


def _heartbeat(api: OpenApiClient, lease: dict[str, Any], sequence: int) -> dict[str, Any]:
    body = {"leaseEpoch": lease["leaseEpoch"], "sequence": sequence}
    return _ok(api.heartbeat(attempt_id=lease["attemptId"], body=body, auth=RITA))


def _renew(api: OpenApiClient, *items: dict[str, Any]) -> list[dict[str, Any]]:
    answer = _ok(api.renew_leases(body={"renewals": list(items)}, auth=RITA))
    results: list[dict[str, Any]] = answer["results"]
    return results


def _loop_into_an_interrupt(client: TestClient, run_id: str, lease: dict[str, Any]) -> None:
    """WD-5 level 1: the run's own observations of a period-2 orbit put an intervention in force."""
    auth = {"Authorization": f"Bearer {RITA}"}
    started = client.post(f"/runs/{run_id}/trajectory", headers=auth, json=lease)
    assert started.status_code == 201, started.text
    for step, params in enumerate(LOOP, start=1):
        body = {
            **lease,
            "stepSeq": step,
            "tool": "vm.provision",
            "arguments": params,
            "stateHash": STATE[params["name"]],
            "summary": f"provisioned {params['name']}",
        }
        observed = client.post(f"/runs/{run_id}/observations", headers=auth, json=body)
        assert observed.status_code in (200, 202), observed.text


def test_a_repeated_heartbeat_tells_of_a_cancel_requested_since_EXE_7(
    api: tuple[TestClient, OpenApiClient],
) -> None:
    _, tenure = api
    run_id, lease = _claimed(tenure, "hb-cancel")
    first = _heartbeat(tenure, lease, 1)
    assert first["stopRequested"] is False and first["stopKind"] is None and "replayed" not in first
    cancelled = _ok(tenure.cancel_run(run_id=run_id, body={"reason": "changed plans"}, auth=RITA))
    assert cancelled["status"] == "cancelling"  # a running run: the runner must stop and confirm

    repeat = _heartbeat(tenure, lease, 1)  # the runner's first answer was lost: the same sequence
    assert repeat["replayed"] is True
    assert set(repeat) == set(first) | {"replayed"}, "a repeat answers every field of a first answer"
    assert repeat["stopRequested"] is True and repeat["stopKind"] == "cancel"
    assert repeat["runStatus"] == "cancelling" and repeat["watchdog"] is None
    # Exactly what a fresh heartbeat of the same moment says of the stop.
    fresh = _heartbeat(tenure, lease, 2)
    assert {f: repeat[f] for f in STOP_FIELDS} == {f: fresh[f] for f in STOP_FIELDS}
    assert fresh["stopGraceUntil"] == repeat["stopGraceUntil"] == cancelled["stop"]["graceUntil"]


def test_a_repeated_heartbeat_carries_the_intervention_in_force_WD_5(
    api: tuple[TestClient, OpenApiClient],
) -> None:
    client, tenure = api
    run_id, lease = _claimed(tenure, "hb-watchdog")
    assert _heartbeat(tenure, lease, 1)["watchdog"] is None
    _loop_into_an_interrupt(client, run_id, lease)
    repeat = _heartbeat(tenure, lease, 1)
    assert repeat["replayed"] is True
    assert repeat["watchdog"]["code"] == "STATE_OSCILLATION_DETECTED" and repeat["watchdog"]["level"] == 1
    assert repeat["watchdog"] == _heartbeat(tenure, lease, 2)["watchdog"]


def test_a_retried_batch_renewal_answers_the_fields_of_a_first_one_EXE_7_WD_5(
    api: tuple[TestClient, OpenApiClient],
) -> None:
    client, tenure = api
    cancel_id, to_cancel = _claimed(tenure, "batch-cancel")
    loop_id, looping = _claimed(tenure, "batch-loop")
    items = [{**to_cancel, "sequence": 1}, {**looping, "sequence": 1}]
    first = _renew(tenure, *items)
    assert [r["status"] for r in first] == ["accepted", "accepted"]
    assert all(r["stopRequested"] is False and r["watchdog"] is None for r in first)
    _ok(tenure.cancel_run(run_id=cancel_id, body={"reason": "changed plans"}, auth=RITA))
    _loop_into_an_interrupt(client, loop_id, looping)

    again = _renew(tenure, *items)  # a retried batch: every sequence was used already
    assert [r["status"] for r in again] == ["replayed", "replayed"]
    for replayed, accepted in zip(again, first, strict=True):
        assert set(replayed) == set(accepted), "a replayed item has the keys of an accepted one"
    cancelled, looped = again
    assert cancelled["stopRequested"] is True and cancelled["stopKind"] == "cancel"
    assert cancelled["stopGraceUntil"] is not None and cancelled["runStatus"] == "cancelling"
    assert looped["stopRequested"] is False and looped["watchdog"]["code"] == "STATE_OSCILLATION_DETECTED"
    assert all(r["certainty"] == "active" and r["expiresAt"] > 0 for r in again)
    # A replayed item agrees with the single heartbeat's repeat of the same sequence.
    single = _heartbeat(tenure, to_cancel, 1)
    assert {f: single[f] for f in (*STOP_FIELDS, "runStatus", "expiresAt", "certainty", "watchdog")} == {
        f: cancelled[f] for f in (*STOP_FIELDS, "runStatus", "expiresAt", "certainty", "watchdog")
    }


def test_a_repeated_claim_next_answers_waited_ms_the_first_one_waited(
    api: tuple[TestClient, OpenApiClient],
) -> None:
    """LEASE-5: the runner counts its lease from its first send plus waitedMs, so a repeat (the
    first 201 was lost) answers the first request's wait, never a later or missing one."""
    _, tenure = api
    run = {"tenant": "acme", "executionSpec": {"k": "claim", "queue": "rq"}, "timeoutSeconds": 600}
    _ok(tenure.submit_run(idempotency_key="claim-run", body=run, auth=RITA), 201)
    claim = {"runnerId": "r-2"}
    first = _ok(tenure.claim_next(queue="rq", idempotency_key="c-1", body=claim, auth="rob-key"), 201)
    repeat = _ok(tenure.claim_next(queue="rq", idempotency_key="c-1", body=claim, auth="rob-key"), 201)
    assert repeat["attemptId"] == first["attemptId"], "the same grant, not a second claim"
    assert set(repeat) == set(first), "a repeat answers every field of the first grant"
    assert isinstance(first["waitedMs"], int) and repeat["waitedMs"] == first["waitedMs"] >= 0


def test_the_runner_sdk_reads_a_retried_batch_as_an_accepted_one_EXE_7_WD_5_LEASE_1(
    api: tuple[TestClient, OpenApiClient],
) -> None:
    """The runner SDK's renew_leases over this app: a retried batch tells the runner of the stop
    requested since (EXE-7), of the intervention in force (WD-5, on_intervention) and of its
    lease's expiry as it stands (LEASE-1), as the first answer would have."""
    client, tenure = api
    cancel_id, to_cancel = _claimed(tenure, "sdk-cancel")
    loop_id, looping = _claimed(tenure, "sdk-loop")
    seen: list[Intervention] = []
    leases = [_sdk_lease(tenure, cancel_id, to_cancel), _sdk_lease(tenure, loop_id, looping)]
    # The app in-process: the TestClient's own transport, so the SDK's requests reach it.
    transport = client._transport
    with TenureClient(
        str(client.base_url), "http://gateway.test", RITA, transport=transport, on_intervention=seen.append
    ) as sdk:
        first = sdk.renew_leases([(x, 1) for x in leases])
        assert [r.status for r in first] == ["accepted", "accepted"]
        _ok(tenure.cancel_run(run_id=cancel_id, body={"reason": "changed plans"}, auth=RITA))
        _loop_into_an_interrupt(client, loop_id, looping)
        cancelled, looped = sdk.renew_leases([(x, 1) for x in leases])
    assert (cancelled.status, looped.status) == ("replayed", "replayed")
    assert cancelled.answer is not None and cancelled.answer.replayed
    assert cancelled.answer.stop_requested and cancelled.answer.stop_kind == "cancel"
    lease_now = _ok(tenure.lease_record(run_id=cancel_id, auth=RITA))["lease"]
    assert cancelled.answer.expires_at == lease_now["expiresAt"]
    assert looped.answer is not None and looped.answer.watchdog is not None
    assert [x.code for x in seen] == ["STATE_OSCILLATION_DETECTED"]


def _sdk_lease(api: OpenApiClient, run_id: str, lease: dict[str, Any]) -> Lease:
    return Lease(run_id, lease["attemptId"], 1, "", lease["leaseEpoch"], 0, 90, 20, 0, {})
