"""Admission control for batch renewals (issue 16, TENURE_API_SHED_AFTER_MS).

A coordinator far behind decides every renewal late; past the request's deadline each answer is
wasted, and the queue never drains. The API refuses new batches, unpublished, with 503
`overloaded` and Retry-After while a batch it published earlier has waited longer than the
limit, or a batch it admitted has been unanswered that long: the book says how long its oldest
waiting group has waited, the context how long its oldest admitted request has run."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from services.command_api.admission import AdmissionControl
from services.command_api.problems import ApiProblem
from services.command_api.view_reader import ViewReader
from services.common.contracts import RenewLease
from services.common.contracts.ids import run_id_of_attempt
from services.common.decisions import DecisionBook
from tests.support.api_harness import InMemoryTenure, api_client
from tests.unit.test_lease_batch_renewal import RITA, _held, item
from tests.unit.test_renewal_envelopes import _decision

pytestmark = pytest.mark.timeout(60)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --- the book: how long the oldest waiting group has waited ---------------------------------------


def test_the_oldest_waiting_group_sets_the_wait_and_leaves_when_decided_or_released() -> None:
    async def scenario() -> None:
        clock = _Clock()
        book = DecisionBook(monotonic=clock)
        assert book.oldest_wait_s() == 0.0, "nothing waits"
        first = book.register_many(["a1", "a2"])
        clock.now += 1.0
        second = book.register_many(["b1"])
        clock.now += 0.5
        assert book.oldest_wait_s() == pytest.approx(1.5)
        book.deliver("a1", _decision("a1"))
        assert book.oldest_wait_s() == pytest.approx(1.5), "a2 still pending: the first group waits"
        book.deliver("a2", _decision("a2"))
        await asyncio.sleep(0)  # the wake-up is scheduled on the loop
        assert first.done.done() and book.oldest_wait_s() == pytest.approx(0.5)
        book.release(second, ["b1"])  # the request's deadline: it stops waiting, undecided
        assert book.oldest_wait_s() == 0.0
        book.deliver("b1", _decision("b1"))  # a late decision changes nothing
        assert book.oldest_wait_s() == 0.0

    asyncio.run(scenario())


def test_a_group_decided_before_it_registered_never_waits() -> None:
    async def scenario() -> None:
        book = DecisionBook(monotonic=_Clock())
        book.deliver("known", _decision("known"))
        group = book.register_many(["known"])
        assert group.done.done() and book.oldest_wait_s() == 0.0

    asyncio.run(scenario())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["register", "deliver", "release", "tick"]), st.integers(0, 5)), max_size=40
    )
)
def test_the_wait_is_always_that_of_the_oldest_group_with_a_command_pending(
    steps: list[tuple[str, int]],
) -> None:
    """Against a plain model: each group's registration time and its pending commands."""

    async def scenario() -> None:
        clock = _Clock()
        book = DecisionBook(monotonic=clock)
        groups: list[tuple[Any, float, set[str]]] = []
        for n, (op, k) in enumerate(steps):
            if op == "register":
                ids = [f"g{n}-{i}" for i in range(k % 3 + 1)]
                groups.append((book.register_many(ids), clock.now, set(ids)))
            elif op == "tick":
                clock.now += k / 4
            elif groups:
                group, _, pending = groups[k % len(groups)]
                if pending:
                    command_id = sorted(pending)[0]
                    if op == "deliver":
                        book.deliver(command_id, _decision(command_id))
                    else:
                        book.release(group, [command_id])
                    pending.discard(command_id)
            waiting = [at for _, at, pending in groups if pending]
            expected = clock.now - min(waiting) if waiting else 0.0
            assert book.oldest_wait_s() == pytest.approx(expected)

    asyncio.run(scenario())


# --- the route: refused unpublished while a batch waits too long ----------------------------------


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[tuple[TestClient, InMemoryTenure]]:
    tenure = InMemoryTenure()
    tenure.shed_after_s = 0.3
    with api_client(
        tmp_path, api_keys="rita-key=rita:submitter", decision_timeout_s=2.0, tenure=tenure
    ) as pair:
        yield pair


def test_a_batch_is_refused_unpublished_while_an_earlier_one_waits_past_the_limit(
    api: tuple[TestClient, InMemoryTenure],
) -> None:
    client, tenure = api
    first, second, third = _held(client, 3)
    assert (
        client.post(
            "/leases:renew", headers=RITA, json={"renewals": [item(first["attemptId"], 1, 1)]}
        ).json()["accepted"]
        == 1
    ), "a coordinator that keeps up: admitted"

    tenure.mode = "undecided"  # the coordinator falls behind: nothing is decided
    stuck: dict[str, Any] = {}

    def waiting_batch() -> None:
        body = {"renewals": [item(first["attemptId"], 1, 2)]}
        stuck["answer"] = client.post("/leases:renew", headers=RITA, json=body)

    waiter = threading.Thread(target=waiting_batch)
    waiter.start()
    time.sleep(0.8)  # past the 0.3 s limit, within the 2 s deadline
    published = len(tenure.commands_of(RenewLease))
    refused = client.post("/leases:renew", headers=RITA, json={"renewals": [item(second["attemptId"], 1, 1)]})
    assert refused.status_code == 503, refused.text
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert int(refused.headers["retry-after"]) >= 1
    problem = refused.json()
    assert problem["type"] == "/problems/overloaded" and problem["status"] == 503
    assert problem["oldestWaitMs"] >= 300 and "nothing was sent" in problem["detail"]
    assert len(tenure.commands_of(RenewLease)) == published, "a refused batch publishes nothing"

    waiter.join(10)
    assert stuck["answer"].status_code == 200 and stuck["answer"].json()["pending"] == 1
    tenure.mode = "up"  # the waiting batch was released at its deadline: admitted again
    again = client.post("/leases:renew", headers=RITA, json={"renewals": [item(third["attemptId"], 1, 1)]})
    assert again.status_code == 200 and again.json()["accepted"] == 1, again.text
    shed = client.get("/metrics").text
    assert 'tenure_api_requests_shed_total{route="renew_leases"} 1.0' in shed


def test_with_the_limit_at_zero_nothing_is_ever_refused(tmp_path: Path) -> None:
    tenure = InMemoryTenure()
    with api_client(
        tmp_path, api_keys="rita-key=rita:submitter", decision_timeout_s=1.0, tenure=tenure
    ) as pair:
        client, _ = pair
        grant = _held(client, 1)[0]
        tenure.mode = "undecided"
        done = threading.Thread(
            target=client.post,
            args=("/leases:renew",),
            kwargs={"headers": RITA, "json": {"renewals": [item(grant["attemptId"], 1, 1)]}},
        )
        done.start()
        time.sleep(0.5)
        answer = client.post(
            "/leases:renew", headers=RITA, json={"renewals": [item(grant["attemptId"], 1, 2)]}
        )
        done.join(10)
        assert answer.status_code == 200 and answer.json()["pending"] == 1


def test_a_batch_admitted_but_not_yet_published_counts_as_a_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch can wait before it publishes anything (its brief reads queue for the thread pool):
    the admitted request's whole time counts, not only its wait for decisions."""
    tenure = InMemoryTenure()
    tenure.shed_after_s = 0.3
    with api_client(tmp_path, api_keys="rita-key=rita:submitter", decision_timeout_s=3.0, tenure=tenure) as (
        client,
        _,
    ):
        first, second = _held(client, 2)
        stuck_run = run_id_of_attempt(first["attemptId"])
        entered, go_on = threading.Event(), threading.Event()
        read_briefs = ViewReader.briefs

        def slow_briefs(self: ViewReader, run_ids: list[str]) -> Any:
            if stuck_run in run_ids and not go_on.is_set():
                entered.set()
                go_on.wait(5)
            return read_briefs(self, run_ids)

        monkeypatch.setattr(ViewReader, "briefs", slow_briefs)
        stuck: dict[str, Any] = {}

        def stuck_batch() -> None:
            body = {"renewals": [item(first["attemptId"], 1, 1)]}
            stuck["answer"] = client.post("/leases:renew", headers=RITA, json=body)

        waiter = threading.Thread(target=stuck_batch)
        waiter.start()
        assert entered.wait(5), "the first batch is admitted and reading its briefs"
        time.sleep(0.5)  # past the 0.3 s limit; nothing published, no decision awaited
        published = len(tenure.commands_of(RenewLease))
        refused = client.post(
            "/leases:renew", headers=RITA, json={"renewals": [item(second["attemptId"], 1, 1)]}
        )
        assert refused.status_code == 503, refused.text
        assert refused.json()["type"] == "/problems/overloaded" and refused.json()["oldestWaitMs"] >= 300
        assert len(tenure.commands_of(RenewLease)) == published, "nothing of either batch was sent yet"
        go_on.set()
        waiter.join(10)
        assert stuck["answer"].status_code == 200 and stuck["answer"].json()["accepted"] == 1
        again = client.post(
            "/leases:renew", headers=RITA, json={"renewals": [item(second["attemptId"], 1, 1)]}
        )
        assert again.status_code == 200 and again.json()["accepted"] == 1, "admitted once it answered"


@given(
    limit_s=st.floats(0.0, 5.0),
    published_wait_s=st.floats(0.0, 10.0),
    admitted_ago_s=st.one_of(st.none(), st.floats(0.0, 10.0)),
)
@settings(max_examples=200, deadline=None)
def test_admission_refuses_exactly_when_the_oldest_admitted_or_published_wait_passes_the_limit(
    limit_s: float, published_wait_s: float, admitted_ago_s: float | None
) -> None:
    clock = _Clock()
    control = AdmissionControl(CollectorRegistry(), retry_after_s=1, monotonic=clock)
    with ExitStack() as held:
        age = 0.0
        if admitted_ago_s is not None:  # one request admitted earlier, still unanswered
            held.enter_context(control.admitted("renew_leases", 0.0, 0.0))
            began = clock.now
            clock.now += admitted_ago_s
            age = clock.now - began
        refused = limit_s > 0 and max(published_wait_s, age) > limit_s
        try:
            with control.admitted("renew_leases", limit_s, published_wait_s):
                assert control.oldest_admitted_s() == age
            answered = "admitted"
        except ApiProblem as problem:
            answered = problem.slug
            assert problem.headers == {"Retry-After": "1"}
        assert answered == ("overloaded" if refused else "admitted")
    assert control.oldest_admitted_s() == 0.0  # every admitted request counted out when it ended
