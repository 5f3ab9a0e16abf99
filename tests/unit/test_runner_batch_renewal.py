"""The runner SDK's batch renewal, `TenureClient.renew_leases` (issue 16), over
httpx.MockTransport: requests of at most BATCH_RENEWAL_MAX leases, one result per lease in
order, each item's refusal mapped as the single heartbeat's would be, a whole-request outage
raised, an answer that does not match what was sent refused, and a replayed item (a retried
batch) read as an accepted one: its lease expiry, stop request and intervention (LEASE-1,
EXE-7, WD-5), an older API's bare replay being no news."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from services.runner_sdk import (
    BATCH_RENEWAL_MAX,
    AsyncTenureClient,
    Intervention,
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
    with TenureClient(API, GATEWAY, transport=down) as client, pytest.raises(TenureUnavailable) as raised:
        client.renew_leases([(lease(1), 1)])
    assert raised.value.retry_after_s == 1.0 and raised.value.problem_type == "unavailable"
    shed = httpx.MockTransport(  # admission control: nothing was sent; wait Retry-After
        lambda request: httpx.Response(
            503, json={"type": "/problems/overloaded", "oldestWaitMs": 2400}, headers={"Retry-After": "3"}
        )
    )
    with TenureClient(API, GATEWAY, transport=shed) as client, pytest.raises(TenureUnavailable) as raised:
        client.renew_leases([(lease(1), 1)])
    assert raised.value.problem_type == "overloaded" and raised.value.retry_after_s == 3.0
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


def replayed(item: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A replayed item as this API answers it: every key of an accepted one (no `replayed` key:
    the status says it), from the run as it stands now."""
    return {**accepted(item), "status": "replayed", **fields}


def _answering(make: Any) -> httpx.MockTransport:
    def api(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json={"results": [make(i) for i in json.loads(request.content)["renewals"]]}
        )

    return httpx.MockTransport(api)


INTERRUPT_BODY = {
    "interventionId": "wdi_1",
    "level": 1,
    "code": "STATE_OSCILLATION_DETECTED",
    "actionHash": "h" * 16,
    "period": 2,
    "message": "you are going in circles",
}


def test_exe_7_a_replayed_item_carrying_a_stop_request_makes_the_runner_see_the_stop() -> None:
    """EXE-7/EXE-10: a stop requested since the first send reaches the runner on a retried batch,
    with its kind and grace, as on an accepted item; the answer is marked replayed."""
    stop = {"stopRequested": True, "stopKind": "cancel", "stopGraceUntil": 123_456, "runStatus": "cancelling"}
    with TenureClient(API, GATEWAY, transport=_answering(lambda i: replayed(i, **stop))) as client:
        [result] = client.renew_leases([(lease(1), 4)])
    assert result.ok and result.status == "replayed" and result.error is None
    assert result.answer is not None and result.answer.replayed
    assert result.answer.stop_requested and result.answer.stop_kind == "cancel"
    assert result.answer.stop_grace_until == 123_456 and result.answer.run_status == "cancelling"
    assert (result.answer.epoch, result.answer.sequence) == (lease(1).epoch, 4)


def test_lease_1_a_replayed_items_expiry_updates_the_lease_and_its_intervention_is_delivered() -> None:
    """LEASE-1/WD-5: the replayed item's expiresAt (the lease as it stands) is the answer's expiry,
    and its watchdog intervention reaches on_intervention, as an accepted item's would."""
    seen: list[Intervention] = []

    def renewed(item: dict[str, Any]) -> dict[str, Any]:
        return replayed(item, expiresAt=777_000, serverTime=700_000, watchdog=INTERRUPT_BODY)

    transport = _answering(renewed)
    with TenureClient(API, GATEWAY, transport=transport, on_intervention=seen.append) as client:
        [result] = client.renew_leases([(lease(2), 9)])
    assert lease(2).expires_at != 777_000
    assert result.answer is not None and result.answer.expires_at == 777_000
    assert result.answer.server_time == 700_000 and result.server_time == 700_000
    assert result.answer.certainty == "active"
    assert result.answer.watchdog is not None and result.answer.watchdog.intervention_id == "wdi_1"
    assert [x.intervention_id for x in seen] == ["wdi_1"]


def test_lease_1_an_old_style_replayed_item_without_the_fields_changes_nothing_and_raises_nothing() -> None:
    """An older API answered a replay with its ids and serverTime only: no news, no error, no
    intervention; and a replay whose lease this API could not read (expiresAt null) still hands
    on its intervention (WD-5) without inventing an expiry."""
    seen: list[Intervention] = []

    def old_and_unread(item: dict[str, Any]) -> dict[str, Any]:
        if item["attemptId"] == lease(1).attempt_id:
            return {"attemptId": item["attemptId"], "status": "replayed", "serverTime": 5}
        return replayed(item, expiresAt=None, certainty=None, watchdog=INTERRUPT_BODY)

    with TenureClient(
        API, GATEWAY, transport=_answering(old_and_unread), on_intervention=seen.append
    ) as client:
        old, unread = client.renew_leases([(lease(1), 3), (lease(2), 3)])
    assert old.ok and old.status == "replayed" and old.answer is None and old.error is None
    assert old.server_time == 5
    assert unread.ok and unread.answer is None and unread.error is None
    assert [x.intervention_id for x in seen] == ["wdi_1"]


def test_exe_7_the_async_client_reads_a_replayed_item_as_an_accepted_one() -> None:
    """EXE-7/LEASE-1 through AsyncTenureClient: the same parsing (one ClientCore)."""
    stop = {"stopRequested": True, "stopKind": "deadline", "expiresAt": 55_000}

    async def go() -> list[Any]:
        transport = _answering(lambda i: replayed(i, **stop))
        async with AsyncTenureClient(API, GATEWAY, transport=transport) as client:
            return await client.renew_leases([(lease(3), 2)])

    [result] = asyncio.run(go())
    assert result.answer is not None and result.answer.stop_requested
    assert result.answer.stop_kind == "deadline"
    assert result.answer.expires_at == 55_000 and result.answer.replayed
