"""A keyed claim-next repeat answers the same grant on ANY API instance (issue 16: any number of
instances behind a load balancer give the same answers), over two real apps sharing one log and
the lease coordinator's real pure core (tests/support/api_harness.py).

The instance that made the grant remembers the key; another finds the grant in the log: among
the runs whose lease the caller holds now (the views' held/ index), the one whose AttemptClaimed
was caused by the command id this key derives. So a runner whose 201 was lost and whose repeat
reaches another instance keeps its one lease (LEASE-1) instead of claiming a second run and
leaving the first to expire unrenewed (LEASE-5); the repeat's `waitedMs` is 0 there, which can
only make the runner believe its lease ends earlier (LEASE-4).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.common.contracts import ClaimRun
from tests.support.api_harness import InMemoryTenure, api_client

pytestmark = pytest.mark.timeout(60)

KEYS = "rita-key=rita:submitter,rob-key=rob:runner,rae-key=rae:runner"
RITA = {"Authorization": "Bearer rita-key"}
ROB = {"Authorization": "Bearer rob-key"}
RAE = {"Authorization": "Bearer rae-key"}

Apis = tuple[TestClient, TestClient, InMemoryTenure]


@pytest.fixture()
def apis(tmp_path: Path) -> Iterator[Apis]:
    """Two API apps (each with its own memory of keys) over one log and one coordinator."""
    system = InMemoryTenure()
    with ExitStack() as stack:
        a, _ = stack.enter_context(
            api_client(tmp_path / "a", api_keys=KEYS, decision_timeout_s=3.0, tenure=system)
        )
        b, _ = stack.enter_context(
            api_client(tmp_path / "b", api_keys=KEYS, decision_timeout_s=3.0, tenure=system)
        )
        yield a, b, system


_submitted = iter(range(10**6))


def submit(client: TestClient, queue: str) -> str:
    answer = client.post(
        "/runs",
        headers={**RITA, "Idempotency-Key": f"any-{next(_submitted)}"},
        json={"tenant": "acme", "executionSpec": {"queue": queue}, "timeoutSeconds": 600},
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["runId"])


def keyed_claim(client: TestClient, queue: str, key: str, who: dict[str, str] = ROB) -> Any:
    return client.post(
        f"/queues/{queue}/claim", headers={**who, "Idempotency-Key": key}, json={"runnerId": "host-1"}
    )


def test_a_repeat_on_another_instance_answers_the_same_grant_and_claims_nothing_more_LEASE_1_LEASE_5(
    apis: Apis,
) -> None:
    a, b, system = apis
    first, second = submit(a, "any"), submit(a, "any")
    granted = keyed_claim(a, "any", "lost-201")
    assert granted.status_code == 201, granted.text
    claims_before = len(system.commands_of(ClaimRun))
    again = keyed_claim(b, "any", "lost-201")
    assert again.status_code == 201, again.text
    assert again.json()["runId"] == granted.json()["runId"] == first
    assert again.headers["location"] == f"/runs/{first}"
    # Every field of the first answer, but waitedMs: B cannot know A's wait and answers 0 (LEASE-4).
    same = {k: v for k, v in granted.json().items() if k != "waitedMs"}
    assert {k: v for k, v in again.json().items() if k != "waitedMs"} == same
    assert again.json()["waitedMs"] == 0
    # B sent no claim at all, and the second run is still queued for the next claim.
    assert len(system.commands_of(ClaimRun)) == claims_before
    assert a.get(f"/runs/{second}", headers=RITA).json()["status"] == "queued"
    # B now remembers the key too: a third send answers the same grant again.
    assert keyed_claim(b, "any", "lost-201").json()["attemptId"] == granted.json()["attemptId"]
    assert keyed_claim(a, "any", "next").json()["runId"] == second


def test_another_key_on_another_instance_claims_a_new_run_LEASE_1(apis: Apis) -> None:
    a, b, _ = apis
    first, second = submit(a, "keys"), submit(a, "keys")
    assert keyed_claim(a, "keys", "key-1").json()["runId"] == first
    other = keyed_claim(b, "keys", "key-2")
    assert other.status_code == 201, other.text
    assert other.json()["runId"] == second and other.json()["attemptId"] != first


def test_another_principal_with_the_same_key_does_not_get_the_first_callers_grant_LEASE_1(apis: Apis) -> None:
    a, b, _ = apis
    first, second = submit(a, "who"), submit(a, "who")
    mine = keyed_claim(a, "who", "shared-key", who=ROB)
    assert mine.json()["runId"] == first
    theirs = keyed_claim(b, "who", "shared-key", who=RAE)
    assert theirs.status_code == 201, theirs.text
    assert theirs.json()["runId"] == second
    assert b.get(f"/runs/{first}", headers=RITA).json()["lease"]["holderPrincipal"] == "rob"
    assert b.get(f"/runs/{second}", headers=RITA).json()["lease"]["holderPrincipal"] == "rae"


def test_a_lease_no_longer_held_is_not_answered_by_another_instance_LEASE_5(apis: Apis) -> None:
    a, b, system = apis
    first, second = submit(a, "done"), submit(a, "done")
    granted = keyed_claim(a, "done", "finished").json()
    report = a.post(
        f"/attempts/{granted['attemptId']}/report",
        headers=ROB,
        json={"leaseEpoch": granted["epoch"], "sequence": 1, "outcome": "failed", "detail": "gave up"},
    )
    assert report.status_code == 200, report.text
    assert system.run_views.held_by("rob") == {}
    # The lease ended: B finds no held grant under the key, so the repeat claims anew.
    anew = keyed_claim(b, "done", "finished")
    assert anew.status_code == 201, anew.text
    assert anew.json()["runId"] == second != first


def test_the_held_index_names_the_claiming_command_of_the_callers_lease_LEASE_2(apis: Apis) -> None:
    a, _, system = apis
    run = submit(a, "idx")
    assert system.run_views.held_by("rob") == {}
    granted = keyed_claim(a, "idx", "idx-key").json()
    claim = next(c for c in system.commands_of(ClaimRun) if c.run_id == run)
    assert system.run_views.held_by("rob") == {run: claim.command_id}
    assert system.run_views.held_by("ro") == {} and system.run_views.held_by("rob/x") == {}
    assert granted["runId"] == run
