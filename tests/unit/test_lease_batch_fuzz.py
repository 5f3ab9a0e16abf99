"""Property test of POST /leases:renew's body (issue 16): whatever hypothesis sends (valid
batches of real and made-up leases, items off by a type or a bound, duplicates, too many
items, arbitrary JSON), the answer is never a 5xx other than 503, every error is problem+json
whose `status` is the HTTP status, a refusal of the whole body published nothing, and a 200
answers exactly one result per item, in order. Over the real app and the coordinator's pure
core (tests/support/api_harness.py); derandomized and bounded, so it takes seconds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.command_api.lease_batch import MAX_BATCH_RENEWALS
from tests.support.api_harness import InMemoryTenure, api_client

pytestmark = pytest.mark.timeout(120)

KEYS = "rita-key=rita:submitter"
RITA = {"Authorization": "Bearer rita-key", "Content-Type": "application/json"}
STATUSES = {"accepted", "replayed", "refused", "pending", "unavailable"}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, InMemoryTenure, list[Any]]]:
    with api_client(tmp_path_factory.mktemp("fuzz"), api_keys=KEYS, decision_timeout_s=2.0) as (
        client,
        tenure,
    ):
        grants = []
        for i in range(3):
            run = client.post(
                "/runs",
                headers={**RITA, "Idempotency-Key": f"fuzz-{i}"},
                json={"tenant": "acme", "executionSpec": {"i": i}, "timeoutSeconds": 600},
            ).json()
            grants.append(
                client.post(f"/runs/{run['runId']}/attempts", headers=RITA, json={"runnerId": "h"}).json()
            )
        yield client, tenure, grants


LONGS = st.one_of(
    st.integers(min_value=1, max_value=2**63 - 1),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 2**63, True, False, 1.5, "1", None]),
)
ATTEMPT_IDS = st.one_of(
    st.sampled_from(["GRANT0", "GRANT1", "GRANT2"]),
    st.from_regex(r"att_[0-9a-f]{32}_[0-9]{1,3}", fullmatch=True),
    st.text(max_size=220),
    st.sampled_from(["", "att_x_1", "\x00", 7, None]),
)
ITEMS = st.fixed_dictionaries(
    {"attemptId": ATTEMPT_IDS, "leaseEpoch": LONGS, "sequence": LONGS},
    optional={"extra": st.integers()},
)
BODIES = st.one_of(
    st.fixed_dictionaries({"renewals": st.lists(ITEMS, max_size=12)}),
    # one more item than allowed (built, not drawn: drawing 500 items is slow)
    st.integers(min_value=MAX_BATCH_RENEWALS + 1, max_value=MAX_BATCH_RENEWALS + 3).map(
        lambda n: {
            "renewals": [{"attemptId": f"att_x_{i}", "leaseEpoch": 1, "sequence": 1} for i in range(n)]
        }
    ),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
        max_leaves=12,
    ),
)


def _with_real_ids(body: Any, grants: list[Any]) -> Any:
    """Swap the placeholders for the attempts the fixture really holds (with their epochs, mostly)."""
    if isinstance(body, dict) and isinstance(body.get("renewals"), list):
        for item in body["renewals"]:
            if isinstance(item, dict) and item.get("attemptId") in ("GRANT0", "GRANT1", "GRANT2"):
                grant = grants[int(item["attemptId"][-1])]
                item["attemptId"] = grant["attemptId"]
    return body


@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(body=BODIES)
def test_no_body_makes_the_batch_renewal_answer_5xx_or_publish_when_refused(
    api: tuple[TestClient, InMemoryTenure, list[Any]], body: Any
) -> None:
    client, tenure, grants = api
    body = _with_real_ids(body, grants)
    before = len(tenure.commands)
    answer = client.post("/leases:renew", headers=RITA, content=json.dumps(body).encode())
    assert answer.status_code < 500 or answer.status_code == 503, answer.text
    if answer.status_code != 200:
        assert answer.headers["content-type"].startswith("application/problem+json"), answer.text
        assert answer.json()["status"] == answer.status_code
        if answer.status_code in (400, 413, 422):
            assert len(tenure.commands) == before, "a refused body published nothing"
        return
    results = answer.json()["results"]
    sent = body["renewals"]
    assert [r["attemptId"] for r in results] == [i["attemptId"] for i in sent]
    assert all(r["status"] in STATUSES for r in results)
    assert len(tenure.commands) - before <= len(sent)
    for r in results:
        if "problem" in r:
            assert r["problem"]["type"].startswith("/problems/") and isinstance(r["problem"]["status"], int)
