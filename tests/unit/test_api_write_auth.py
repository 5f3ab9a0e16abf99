"""Every write endpoint of the API authenticates its caller and checks it may act (issue 10).

DEVELOPERS.md: "Every write endpoint authenticates and checks the caller may act on that lease
or run." The first test walks the app's own route table (its OpenAPI), so a new POST/PUT/DELETE route cannot
forget authentication: an unknown caller is 401 (before its body is even validated) and
nothing is published. The others check who may act: a run's submitter or an operator cancels,
retries and answers it; only the lease's holder uploads under its grant (LEASE-1); operators
take over, block, approve and resolve; only submitters and operators submit and claim.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.ids import derived_id, run_id_for
from tests.support.api_harness import api_client

KEYS = (
    "rita-key=rita:submitter,sam-key=sam:submitter,olga-key=olga:operator,"
    "vera-key=vera:verifier,saga-key=saga:service"
)
RITA = {"Authorization": "Bearer rita-key"}
SAM = {"Authorization": "Bearer sam-key"}
OLGA = {"Authorization": "Bearer olga-key"}
VERA = {"Authorization": "Bearer vera-key"}
SAGA = {"Authorization": "Bearer saga-key"}


@pytest.fixture()
def api(tmp_path: Path) -> Any:
    with api_client(tmp_path, api_keys=KEYS) as pair:
        yield pair


def _forbidden(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 403, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["type"] in ("/problems/forbidden", "/problems/not-lease-holder"), body
    return body


def _path(template: str) -> str:
    run_id = run_id_for("acme", "auth")
    hexpart = run_id.removeprefix("run_")
    values = {
        "run_id": run_id,
        "attempt_id": f"att_{hexpart}_1",
        "grant_id": f"grant_{hexpart}_{'0' * 16}",
        "incident_id": derived_id("inc", run_id, "3"),
        "index": "0",
        "kind": "principal",
        "subject": "mallory",
        "endpoint": "ledger",
        "artifact_id": "art_" + "0" * 32,
        "schedule_id": "sch_0123456789abcdef",
        "queue": "default",
    }
    for name, value in values.items():
        template = template.replace("{" + name + "}", value)
    assert "{" not in template, template
    return template


def test_every_write_route_refuses_an_unknown_caller_before_anything_else(api: Any) -> None:
    client, tenure = api
    schema = client.get("/openapi.json").json()
    writes = [
        (method.upper(), path)
        for path, operations in schema["paths"].items()
        for method in operations
        if method in ("post", "put", "delete")
    ]
    assert len(writes) >= 18, writes  # the table really was walked
    for method, template in writes:
        for headers in ({}, {"Authorization": "Bearer not-a-key"}):
            response = client.request(method, _path(template), headers=headers, content=b"{}")
            assert response.status_code == 401, f"{method} {template}: {response.status_code} {response.text}"
            assert response.json()["type"] == "/problems/unauthenticated"
            assert response.headers["www-authenticate"] == "Bearer"
    assert tenure.commands == [], "nothing was published for an unauthenticated request"


def _run(client: Any, headers: dict[str, str] = RITA, key: str = "r-1") -> str:
    response = client.post(
        "/runs",
        headers={**headers, "Idempotency-Key": key},
        json={"tenant": "acme", "executionSpec": {"k": key}, "timeoutSeconds": 600},
    )
    assert response.status_code == 201, response.text
    return str(response.json()["runId"])


def test_only_submitters_and_operators_submit_and_claim(api: Any) -> None:
    client, _ = api
    body = {"tenant": "acme", "executionSpec": {}, "timeoutSeconds": 60}
    for headers in (VERA, SAGA):
        _forbidden(client.post("/runs", headers={**headers, "Idempotency-Key": "x"}, json=body))
    run_id = _run(client)
    for headers in (VERA, SAGA):
        _forbidden(client.post(f"/runs/{run_id}/attempts", headers=headers, json={"runnerId": "r"}))
    assert client.post(f"/runs/{run_id}/attempts", headers=SAM, json={"runnerId": "r"}).status_code == 201


def test_only_the_submitter_or_an_operator_cancels_or_retries_a_run(api: Any) -> None:
    client, _ = api
    run_id = _run(client)
    _forbidden(client.post(f"/runs/{run_id}/cancel", headers=SAM, json={}))
    assert client.post(f"/runs/{run_id}/cancel", headers=OLGA, json={}).status_code == 200
    retry = {"acknowledgeRepeatedEffects": True}
    _forbidden(client.post(f"/runs/{run_id}/retry", headers=SAM, json=retry))
    assert client.post(f"/runs/{run_id}/retry", headers=RITA, json=retry).status_code == 201


def test_only_the_lease_holder_uploads_under_its_grant(api: Any) -> None:
    client, _ = api
    run_id = _run(client)
    grant = client.post(f"/runs/{run_id}/attempts", headers=RITA, json={"runnerId": "r"}).json()
    issued = client.post(
        f"/attempts/{grant['attemptId']}/uploads",
        headers=RITA,
        json={"leaseEpoch": grant["epoch"], "destination": "out.txt", "maxBytes": 100},
    )
    assert issued.status_code == 201, issued.text
    url = issued.json()["uploadUrl"]
    _forbidden(client.put(url, headers=SAM, content=b"not yours"))
    stored = client.put(url, headers=RITA, content=b"hello")
    assert stored.status_code == 201, stored.text
    assert stored.json()["sizeBytes"] == 5, "the refused upload left nothing behind"


def test_operator_routes_refuse_other_roles(api: Any) -> None:
    client, _ = api
    run_id = _run(client)
    grant = client.post(f"/runs/{run_id}/attempts", headers=RITA, json={"runnerId": "r"}).json()
    lease = {"attemptId": grant["attemptId"], "leaseEpoch": grant["epoch"]}
    _forbidden(client.post(f"/runs/{run_id}/trajectory", headers=SAM, json=lease))  # not the holder
    assert client.post(f"/runs/{run_id}/trajectory", headers=RITA, json=lease).status_code == 201
    takeover = {"reason": "r", "newHolder": "rita"}
    _forbidden(client.post(f"/runs/{run_id}/lease/takeover", headers=RITA, json=takeover))
    _forbidden(client.put("/admin/blocks/principal/mallory", headers=RITA, json={"reason": "r"}))
    _forbidden(client.delete("/admin/blocks/principal/mallory", headers=RITA))
    approval = {"decision": "approve"}
    _forbidden(client.post(f"/runs/{run_id}/trajectory/steps/0/approval", headers=RITA, json=approval))
    resolve = {"runId": run_id, "resolution": "abandon"}
    incident = derived_id("inc", run_id, "3")
    _forbidden(client.post(f"/incidents/{incident}/resolve", headers=RITA, json=resolve))
    _forbidden(client.post(f"/runs/{run_id}/input", headers=SAM, json={"responseId": "a", "answer": 1}))
    blocked = client.put("/admin/blocks/principal/mallory", headers=OLGA, json={"reason": "r"})
    assert blocked.status_code == 200, blocked.text
