"""What a lease is for, and what it is not for, on real processes (LEASE-1, LEASE-8).

LEASE-1: admission (may the work start at all), the lease (who may advance it now) and
commit-time authorization (may this particular effect happen now) are three decisions. One run
goes through all three and is refused by each in turn, for its own reason, and each refusal is
its own record on `runs.rejections`: a SubmitRun refused ADMISSION_QUEUE_FULL, a ClaimRun refused
RUN_NOT_CLAIMABLE, a RecordEffectIntent refused LEASE_EXPIRED. The three grants are three
records as well (RunSubmitted, AttemptClaimed, EffectIntentRecorded).

LEASE-8: leases only where exclusive ownership is needed, no global mutex. While one run's lease
is held, reads, submissions, claims of other runs and effects of other runs all go ahead at the
same time; only the same run's claim and effects need that run's lease.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
import pytest

from services.common.contracts import CommandRejected
from services.common.ids import run_id_for
from services.common.topics import RUNS_REJECTIONS
from services.runner_sdk import Lease, LeaseConflict, RunNotClaimable, TenureClient
from tests.support.system import decode_all, read_topic, wait_until
from tests.support.tenure import TenureSystem, problem_type

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

T = TypeVar("T")


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenureSystem]:
    s = TenureSystem(
        tenure_topics, tmp_path_factory.mktemp("lease-scope"), gateway=True, TENURE_MAX_QUEUED_PER_TENANT="1"
    ).start()
    yield s
    s.stop()


@pytest.fixture
def api(system: TenureSystem) -> Iterator[httpx.Client]:
    with system.client() as c:
        yield c


@pytest.fixture
def sdk(system: TenureSystem) -> Iterator[TenureClient]:
    with TenureClient(system.base, system.gateway_url, timeout_s=10.0) as c:
        yield c


def _submit(api: httpx.Client, tenant: str, key: str) -> httpx.Response:
    return api.post(
        "/runs",
        headers={"Idempotency-Key": key},
        json={"tenant": tenant, "executionSpec": {"agent": "scope", "key": key}, "timeoutSeconds": 600},
    )


def _credit(sdk: TenureClient, lease: Lease, key: str) -> str:
    payload = {"account": f"acct-{lease.run_id}", "amount": 1}
    return sdk.effect(lease, key, "ledger", "credit", payload).outcome


def _rejections(bootstrap: str, run_id: str) -> list[CommandRejected]:
    records = decode_all(read_topic(bootstrap, RUNS_REJECTIONS.name, RUNS_REJECTIONS.partitions))
    return [r for r in records if isinstance(r, CommandRejected) and r.run_id == run_id]


def _all_at_once(calls: list[Callable[[], T]]) -> list[T]:
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


def test_admission_lease_and_commit_time_are_three_decisions_with_three_records_LEASE_1(
    system: TenureSystem, api: httpx.Client, sdk: TenureClient
) -> None:
    tenant = f"l1-{uuid.uuid4().hex[:8]}"
    first = _submit(api, tenant, "first")
    assert first.status_code == 201, first.text

    # (a) Admission: the tenant's one queue place is taken, so the run may not start at all.
    refused = _submit(api, tenant, "second")
    assert refused.status_code == 429 and problem_type(refused) == "admission-queue-full", refused.text
    run_id = run_id_for(tenant, "second")
    assert api.get(f"/runs/{run_id}").status_code == 404, "an admission refusal records no run"
    assert api.post(f"/runs/{first.json()['runId']}/cancel", json={}).json()["status"] == "cancelled"
    admitted = _submit(api, tenant, "second")
    assert admitted.status_code == 201, admitted.text
    assert admitted.json()["runId"] == run_id
    assert admitted.json()["lease"] is None, "admitted work may wait without a lease"

    # (b) The lease: runner A holds the run, so nobody else may advance it now.
    lease_a = sdk.claim(run_id, "runner-a", [], lease_seconds=3, heartbeat_seconds=1)
    assert lease_a.epoch == 1
    with pytest.raises(RunNotClaimable) as not_claimable:
        sdk.claim(run_id, "runner-b", [], lease_seconds=30, heartbeat_seconds=5)
    assert not_claimable.value.problem_type == "run-not-claimable"

    # (c) Commit time: each effect is authorised when it is to happen. The first, under the live
    # lease, is; after the lease has expired on the coordinator's clock (A went quiet), the same
    # holder's next effect is refused although its epoch is still the run's newest.
    assert _credit(sdk, lease_a, f"{run_id}-1") == "committed"
    wait_until(
        lambda: api.get(f"/runs/{run_id}").json()["status"] == "interrupted", 30, "the lease to expire"
    )
    with pytest.raises(LeaseConflict) as late:
        _credit(sdk, lease_a, f"{run_id}-2")
    assert late.value.problem_type == "lease-expired", late.value
    works = httpx.get(f"{system.ledger_url}/works/{run_id}").json()
    assert [e["idempotencyKey"] for e in works["effects"]] == [f"{run_id}-1"], "the late one never landed"

    # Three refusals, three records, three reasons, each named for the decision that refused.
    refusals = {(r.command_type, r.code) for r in _rejections(system.bootstrap, run_id)}
    assert refusals == {
        ("SubmitRun", "ADMISSION_QUEUE_FULL"),
        ("ClaimRun", "RUN_NOT_CLAIMABLE"),
        ("RecordEffectIntent", "LEASE_EXPIRED"),
    }, refusals
    # And the three grants are three records of their own on the run's history.
    history = [h["type"] for h in api.get(f"/runs/{run_id}").json()["history"]]
    for granted in ("RunSubmitted", "AttemptClaimed", "EffectIntentRecorded"):
        assert history.count(granted) == 1, (granted, history)


def test_leases_only_where_exclusive_ownership_is_needed_no_global_mutex_LEASE_8(
    system: TenureSystem, api: httpx.Client, sdk: TenureClient
) -> None:
    held_run = _submit(api, f"l8-{uuid.uuid4().hex[:8]}", "held").json()["runId"]
    held = sdk.claim(held_run, "runner-held", [], lease_seconds=60, heartbeat_seconds=5)
    assert _credit(sdk, held, f"{held_run}-0") == "committed"

    # While that lease is held: reads need no lease at all ...
    reads = _all_at_once(
        [lambda: api.get(f"/runs/{held_run}"), lambda: api.get(f"/runs/{held_run}/lease")]
        + [lambda: api.get("/runs", params={"status": "preparing"})] * 2
    )
    assert [r.status_code for r in reads] == [200] * 4

    # ... nor do submissions of other runs, made at the same time ...
    tenants = [f"l8-{uuid.uuid4().hex[:8]}" for _ in range(4)]
    submitted = _all_at_once([lambda t=t: _submit(api, t, "other") for t in tenants])
    assert [r.status_code for r in submitted] == [201] * 4, [r.text for r in submitted]
    others = [r.json()["runId"] for r in submitted]

    # ... and other runs are claimed at the same time, each getting its OWN lease (epoch 1):
    # holding one run's lease locks nothing but that run.
    leases = _all_at_once(
        [lambda r=r, i=i: sdk.claim(r, f"runner-{i}", [], 60, 5) for i, r in enumerate(others)]
    )
    assert [lease.epoch for lease in leases] == [1] * 4
    assert len({lease.lease_id for lease in [held, *leases]}) == 5

    # Effects of different runs go through the gateway at the same time, each under its run's lease.
    outcomes = _all_at_once(
        [lambda lease=lease: _credit(sdk, lease, f"{lease.run_id}-1") for lease in [held, *leases]]
    )
    assert outcomes == ["committed"] * 5

    # Only the same run's claim and effects need its lease.
    with pytest.raises(RunNotClaimable):
        sdk.claim(held_run, "runner-intruder", [], 60, 5)
    not_the_holder = Lease(held_run, leases[0].attempt_id, 1, "x", 1, 0, 60, 5, 0, {})
    with pytest.raises(LeaseConflict) as refused:
        _credit(sdk, not_the_holder, f"{held_run}-intruder")
    assert refused.value.problem_type == "stale-epoch", "another run's attempt does not hold this run"
    lease_view: dict[str, Any] = api.get(f"/runs/{held_run}/lease").json()["lease"]
    assert lease_view["epoch"] == 1 and lease_view["attemptId"] == held.attempt_id
    assert lease_view["certainty"] in ("active", "at_risk"), "nothing of the others touched the held lease"
