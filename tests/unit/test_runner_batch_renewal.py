"""The runner SDK's batch renewal, `TenureClient.renew_leases` (issue 16), over
httpx.MockTransport: requests of at most BATCH_RENEWAL_MAX leases, one result per lease in
order, each item's refusal mapped as the single heartbeat's would be, a whole-request outage
raised, and an answer that does not match what was sent refused."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from services.runner_sdk import (
    BATCH_RENEWAL_MAX,
    Lease,
    LeaseConflict,
    RequestRejected,
    TenureClient,
    TenureUnavailable,
    UnexpectedResponse,
)

API, GATEWAY = "http://api.test", "http://gateway.test"


def lease(i: int) -> Lease:
    return Lease(f"run_{i:032x}", f"att_{i:032x}_1", 1, f"lease-{i}", 3, 0, 90, 20, 0, {})


def accepted(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "attemptId": item["attemptId"],
        "status": "accepted",
        "epoch": item["leaseEpoch"],
        "sequence": item["sequence"],
        "expiresAt": 90_000,
        "serverTime": 1_000,
        "certainty": "active",
        "runStatus": "running",
        "stopRequested": False,
        "stopKind": None,
        "stopGraceUntil": None,
        "watchdog": None,
    }


def test_leases_go_in_requests_of_at_most_the_maximum_one_result_each_in_order() -> None:
    sizes: list[int] = []

    def api(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/leases:renew" and request.method == "POST"
        items = json.loads(request.content)["renewals"]
        sizes.append(len(items))
        return httpx.Response(200, json={"results": [accepted(i) for i in items]})

    leases = [(lease(i), 7) for i in range(BATCH_RENEWAL_MAX + 3)]
    with TenureClient(API, GATEWAY, transport=httpx.MockTransport(api)) as client:
        results = client.renew_leases(leases)
    assert sizes == [BATCH_RENEWAL_MAX, 3]
    assert [r.attempt_id for r in results] == [x.attempt_id for x, _ in leases]
    assert all(r.ok and r.answer is not None and r.answer.sequence == 7 for r in results)
    assert results[0].answer is not None and results[0].answer.expires_at == 90_000


def test_each_refused_item_is_the_error_its_single_heartbeat_would_raise() -> None:
    def problem(slug: str, status: int) -> dict[str, Any]:
        return {"type": f"/problems/{slug}", "title": slug, "status": status, "detail": f"{slug}!"}

    def api(request: httpx.Request) -> httpx.Response:
        items = json.loads(request.content)["renewals"]
        answers = [
            {"attemptId": items[0]["attemptId"], "status": "refused", "problem": problem("stale-epoch", 409)},
            {
                "attemptId": items[1]["attemptId"],
                "status": "refused",
                "problem": problem("not-lease-holder", 403),
            },
            {"attemptId": items[2]["attemptId"], "status": "pending", "commandId": "cmd_1"},
            {
                "attemptId": items[3]["attemptId"],
                "status": "unavailable",
                "problem": problem("unavailable", 503),
            },
            {"attemptId": items[4]["attemptId"], "status": "replayed", "serverTime": 5},
        ]
        return httpx.Response(200, json={"results": answers})

    with TenureClient(API, GATEWAY, transport=httpx.MockTransport(api)) as client:
        r = client.renew_leases([(lease(i), 2) for i in range(5)])
    assert isinstance(r[0].error, LeaseConflict) and r[0].error.problem_type == "stale-epoch"
    assert isinstance(r[1].error, RequestRejected) and r[1].error.status == 403
    assert isinstance(r[2].error, TenureUnavailable) and isinstance(r[3].error, TenureUnavailable)
    assert r[4].ok and r[4].status == "replayed" and r[4].server_time == 5
    assert [x.ok for x in r] == [False, False, False, False, True]


def test_a_whole_request_outage_raises_and_a_mismatched_answer_is_refused() -> None:
    down = httpx.MockTransport(
        lambda request: httpx.Response(
            503, json={"type": "/problems/unavailable"}, headers={"Retry-After": "1"}
        )
    )
    with TenureClient(API, GATEWAY, transport=down) as client, pytest.raises(TenureUnavailable):
        client.renew_leases([(lease(1), 1)])
    short = httpx.MockTransport(lambda request: httpx.Response(200, json={"results": []}))
    with TenureClient(API, GATEWAY, transport=short) as client, pytest.raises(UnexpectedResponse):
        client.renew_leases([(lease(1), 1)])
    other = httpx.MockTransport(
        lambda request: httpx.Response(
            200, json={"results": [{"attemptId": "att_x_9", "status": "accepted"}]}
        )
    )
    with TenureClient(API, GATEWAY, transport=other) as client, pytest.raises(UnexpectedResponse):
        client.renew_leases([(lease(1), 1)])
