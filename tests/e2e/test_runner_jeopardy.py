"""LEASE-4 against the real coordinator: when renewals go unanswered the SDK enters jeopardy
before expiry and sends no effect, still checkpoints, and recovers or loses the lease correctly
once the coordinator answers again."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from services.runner_sdk import Certainty, LeaseInJeopardy, LeaseKeeper, LeaseLost, TenureClient
from tests.support.proxy import CuttableProxy
from tests.support.system import wait_until
from tests.support.tenure import TenureSystem, submit

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenureSystem]:
    s = TenureSystem(tenure_topics, tmp_path_factory.mktemp("jeopardy"), gateway=True).start()
    yield s
    s.stop()


@pytest.fixture
def proxy(system: TenureSystem) -> Iterator[CuttableProxy]:
    p = CuttableProxy("127.0.0.1", system.port)
    yield p
    p.close()


def _keeper(system: TenureSystem, proxy: CuttableProxy, lease_seconds: int) -> LeaseKeeper:
    with system.client() as c:
        run_id = submit(c, f"jeopardy-{uuid.uuid4()}")["runId"]
    client = TenureClient(proxy.url, system.gateway_url, timeout_s=0.5)
    return LeaseKeeper.claim(client, run_id, "runner-j", [], lease_seconds, 1)


def test_unanswered_renewals_mean_jeopardy_then_valid_again_LEASE_4(
    system: TenureSystem, proxy: CuttableProxy
) -> None:
    keeper = _keeper(system, proxy, lease_seconds=9)
    with keeper:
        wait_until(
            lambda: keeper.state is Certainty.VALID and keeper.sequence >= 1, 10, "a confirmed renewal"
        )
        ok = keeper.send_effect(f"ok-{uuid.uuid4()}", "ledger", "credit", {"account": "j", "amount": 1})
        assert ok.outcome == "committed"

        proxy.blackhole()
        cut_at = time.monotonic()
        wait_until(lambda: keeper.state is Certainty.JEOPARDY, 8, "jeopardy")
        assert time.monotonic() - cut_at < 9, "jeopardy must come before the lease could expire"
        with pytest.raises(LeaseInJeopardy):
            keeper.send_effect(f"refused-{uuid.uuid4()}", "ledger", "credit", {"account": "j", "amount": 1})
        keeper.checkpoint("sha256:feedface", note="saved while in jeopardy")
        kinds = [str(entry.kind) for entry in keeper.journal]
        assert any("checkpoint" in k for k in kinds) and any("refused" in k for k in kinds), kinds

        proxy.restore()
        wait_until(lambda: keeper.state is Certainty.VALID, 8, "a confirmed renewal after the partition")
        again = keeper.send_effect(f"again-{uuid.uuid4()}", "ledger", "credit", {"account": "j", "amount": 1})
        assert again.outcome == "committed"


def test_a_partition_longer_than_the_lease_ends_lost_and_effects_stay_refused_LEASE_4(
    system: TenureSystem, proxy: CuttableProxy
) -> None:
    keeper = _keeper(system, proxy, lease_seconds=3)
    with keeper:
        wait_until(
            lambda: keeper.state is Certainty.VALID and keeper.sequence >= 1, 10, "a confirmed renewal"
        )
        proxy.blackhole()
        wait_until(
            lambda: keeper.state is Certainty.LOST, 10, "the lease to be lost on the runner's own clock"
        )
        proxy.restore()
        time.sleep(1.5)
        assert keeper.state is Certainty.LOST, "a lost lease never comes back"
        with pytest.raises(LeaseLost):
            keeper.send_effect(f"late-{uuid.uuid4()}", "ledger", "credit", {"account": "j", "amount": 1})
