"""Two effect gateway processes share one circuit breaker per tool, on a real broker (BRK-1, BRK-2).

The lease coordinator, the breakers' processor, the simulated environment and two gateways (A
and B) run as OS processes. Faults are armed at the environment for one run's requests only, and
the environment's audit (which is not Tenure) counts what reached it. Each test has a tool name
of its own (all pointing at the same environment), so each has a breaker of its own, and no
breaker this module leaves behind can touch another test's tools on the shared broker.

  * failures seen at A open the breaker; B fails fast after a measured propagation time, with
    ERR_CIRCUIT_OPEN, recording nothing at the coordinator and sending nothing;
  * in Half-open exactly one canary is sent across both instances, however many calls race;
  * a SIGKILL of the canary's holder in Half-open does not lose the slot (B gets it once the
    holder's lease runs out) and does not duplicate it (B fails fast until then); a SIGKILL of the
    other instance changes nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.contracts import (
    BreakerClosed,
    CanaryExpired,
    CanaryGranted,
    EffectIntentRecorded,
)
from services.common.topics import BREAKERS_EVENTS, RUNS_EVENTS
from tests.support.saga import Lease, SagaRunner
from tests.support.system import (
    ServiceProcess,
    decode_all,
    free_port,
    read_topic,
    service_env,
    stop_all,
    wait_for_http,
    wait_for_ready,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

COOLDOWN_MS = 1_500
CANARY_LEASE_MS = 3_000
TOOL_TIMEOUT_S = 2.0  # the canary's call ends well inside its lease
TAG = f"brk{time.time_ns() % 10**10}"
TOOLS = {name: f"{TAG}-{name}" for name in ("propagate", "canary", "kill-holder", "kill-other")}
OPERATION = "vm.provision"


class Fleet:
    def __init__(self, bootstrap: str, tmp: Path) -> None:
        self.bootstrap = bootstrap
        sim_port = free_port()
        self.sim_url = f"http://127.0.0.1:{sim_port}"
        self.breakers_port = free_port()
        env = service_env(
            bootstrap,
            tmp / "state",
            TENURE_SIM_PORT=str(sim_port),
            TENURE_TOOLS=",".join(f"{tool}={self.sim_url}" for tool in TOOLS.values()),
            TENURE_DECISION_TIMEOUT_S="10",
            TENURE_TOOL_TIMEOUT_S=str(TOOL_TIMEOUT_S),
            TENURE_BREAKERS_HEALTH_PORT=str(self.breakers_port),
            TENURE_COORDINATOR_HEALTH_PORT=str(free_port()),
            TENURE_BREAKER_MIN_CALLS="10",
            TENURE_BREAKER_COOLDOWN_MS=str(COOLDOWN_MS),
            TENURE_BREAKER_COOLDOWN_MAX_MS=str(4 * COOLDOWN_MS),
            TENURE_BREAKER_CANARY_LEASE_MS=str(CANARY_LEASE_MS),
            TENURE_TIMER_INTERVAL_S="0.05",
        )
        self.urls: dict[str, str] = {}
        self.gateways: dict[str, ServiceProcess] = {}
        for name in ("A", "B"):
            port = free_port()
            self.urls[name] = f"http://127.0.0.1:{port}"
            gateway_env = {**env, "TENURE_GATEWAY_PORT": str(port), "TENURE_INSTANCE_ID": name.lower()}
            self.gateways[name] = ServiceProcess(
                f"gateway-{name}", "services.effect_gateway", gateway_env, tmp
            )
        self.coordinator = ServiceProcess("lease-coordinator", "services.lease_coordinator", env, tmp)
        self.breakers = ServiceProcess("breakers", "services.breakers", env, tmp)
        self.sim = ServiceProcess("sim-environment", "services.sim_environment", env, tmp)
        self.http = httpx.Client(timeout=30)

    def start(self) -> Fleet:
        for service in (self.coordinator, self.breakers, self.sim, *self.gateways.values()):
            service.start()
        wait_for_http(f"{self.sim_url}/healthz")
        wait_for_ready(self.breakers_port, 90, self.breakers)
        for name in self.gateways:
            self.wait_ready(name)
        return self

    def wait_ready(self, name: str) -> None:
        wait_for_http(f"{self.urls[name]}/readyz", timeout_s=90)

    def stop(self) -> None:
        self.http.close()
        stop_all((*self.gateways.values(), self.sim, self.breakers, self.coordinator))

    # --- talking to the gateways and the environment ------------------------------------------

    def effect(self, name: str, lease: Lease, tool: str, key: str) -> httpx.Response:
        return self.http.post(
            f"{self.urls[name]}/effects",
            json={
                "runId": lease.run_id,
                "attemptId": lease.attempt_id,
                "epoch": lease.epoch,
                "idempotencyKey": key,
                "tool": tool,
                "operation": OPERATION,
                "payload": {"name": key.replace("/", "-")},
            },
        )

    def breaker(self, name: str, tool: str) -> dict[str, Any]:
        found: dict[str, Any] = self.http.get(f"{self.urls[name]}/breakers").json()["endpoints"][tool]
        return found

    def arm(self, lease: Lease, **fault: Any) -> None:
        answer = self.http.post(
            f"{self.sim_url}/faults", json={"operation": OPERATION, "workId": lease.run_id, **fault}
        )
        assert answer.status_code == 201, answer.text

    def posts(self, lease: Lease) -> dict[str, int]:
        """What reached the environment for this run: POST /effects per idempotency key."""
        audit = self.http.get(f"{self.sim_url}/audit", params={"workId": lease.run_id}).json()
        return {e["key"]: e["requests"] for e in audit["effects"]}

    def breaker_events(self, tool: str) -> list[Any]:
        records = read_topic(self.bootstrap, BREAKERS_EVENTS.name, BREAKERS_EVENTS.partitions)
        return [e for e in decode_all(records) if e.run_id == tool]

    def intents(self, lease: Lease) -> set[str]:
        records = read_topic(self.bootstrap, RUNS_EVENTS.name, RUNS_EVENTS.partitions)
        return {
            e.idempotency_key
            for e in decode_all(records)
            if isinstance(e, EffectIntentRecorded) and e.run_id == lease.run_id
        }

    def open_at_a(self, lease: Lease, tool: str) -> float:
        """Ten transport failures (503) seen at A: min_calls, all failing. Returns when A had its
        last answer (monotonic)."""
        self.arm(lease, kind="error", status=503, problem="unavailable", times=10)
        for i in range(10):
            answer = self.effect("A", lease, tool, f"{lease.run_id}/open-{i}")
            assert answer.status_code == 502, answer.text  # the tool's definite failure
        return time.monotonic()

    def wait_canary_free(self, tool: str) -> None:
        wait_until(
            lambda: all(self.breaker(n, tool)["canaryFree"] for n in self.gateways),
            30,
            f"{tool}'s cooldown to run out at both gateways",
            poll_s=0.05,
        )


@pytest.fixture(scope="module")
def fleet(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    started = Fleet(tenure_topics, tmp_path_factory.mktemp("gateway-breakers")).start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def runner(tenure_topics: str) -> Iterator[SagaRunner]:
    client = SagaRunner(tenure_topics, name="brk-runner")
    try:
        yield client
    finally:
        client.close()


def kinds(events: list[Any]) -> list[str]:
    return [type(e).__name__ for e in events if type(e).__name__ != "CallOutcomeRecorded"]


# --- BRK-1/BRK-2: A's failures open the breaker, B fails fast -----------------------------------


def test_failures_at_a_open_the_breaker_and_b_fails_fast_within_the_propagation_time_brk_2(
    fleet: Fleet, runner: SagaRunner, record_property: Any
) -> None:
    tool = TOOLS["propagate"]
    lease = runner.claim_new_run(f"{TAG}-propagate")
    last_failure = fleet.open_at_a(lease, tool)
    wait_until(lambda: fleet.breaker("B", tool)["failFast"], 10, "B to see the breaker open", poll_s=0.005)
    propagation_ms = (time.monotonic() - last_failure) * 1000
    record_property("propagation_ms", round(propagation_ms, 1))
    print(f"breaker propagation A -> B: {propagation_ms:.1f} ms")
    assert propagation_ms < 5_000

    before = fleet.posts(lease)
    began = time.perf_counter()
    answer = fleet.effect("B", lease, tool, f"{lease.run_id}/at-b")
    took_ms = (time.perf_counter() - began) * 1000
    assert answer.status_code == 424, answer.text
    problem = answer.json()
    assert problem["type"] == "/problems/circuit-open" and problem["code"] == "ERR_CIRCUIT_OPEN"
    assert problem["dependency"] == tool and 0 < problem["cooldownRemainingMs"] <= COOLDOWN_MS
    assert int(answer.headers["retry-after"]) >= 1
    assert took_ms < 500, f"failing fast took {took_ms:.1f} ms over HTTP"
    assert fleet.posts(lease) == before, "nothing was sent"
    assert f"{lease.run_id}/at-b" not in fleet.intents(lease), "nothing was recorded"
    opened = [e for e in fleet.breaker_events(tool) if type(e).__name__ == "BreakerOpened"]
    assert len(opened) == 1 and opened[0].failures == 10


# --- Half-open: one canary across the fleet -------------------------------------------------------


def test_in_half_open_exactly_one_canary_is_sent_across_both_instances_brk_2(
    fleet: Fleet, runner: SagaRunner
) -> None:
    tool = TOOLS["canary"]
    lease = runner.claim_new_run(f"{TAG}-canary")
    fleet.open_at_a(lease, tool)
    # The canary takes a while (applied, answered 0.5 s late), so every racer arrives while it flies.
    fleet.arm(lease, kind="timeout-after-commit", delayS=0.5, times=1)
    fleet.wait_canary_free(tool)
    keys = [f"{lease.run_id}/race-{i}" for i in range(16)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        racing: list[Future[httpx.Response]] = [
            pool.submit(fleet.effect, "AB"[i % 2], lease, tool, key) for i, key in enumerate(keys)
        ]
        answers = [f.result() for f in racing]
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] + [424] * 15, [a.text for a in answers if a.status_code not in (200, 424)]
    reached = {k: n for k, n in fleet.posts(lease).items() if k in keys}
    assert sum(reached.values()) == 1, f"exactly one canary reached the tool: {reached}"
    events = fleet.breaker_events(tool)
    assert kinds(events)[-2:] == ["CanaryGranted", "BreakerClosed"], kinds(events)
    assert len([e for e in events if isinstance(e, CanaryGranted)]) == 1
    wait_until(
        lambda: all(fleet.breaker(n, tool)["status"] == "closed" for n in fleet.gateways), 10, "closed"
    )
    assert fleet.effect("B", lease, tool, f"{lease.run_id}/after").status_code == 200


# --- SIGKILL in Half-open -------------------------------------------------------------------------


def test_a_sigkill_of_the_canary_holder_neither_loses_nor_duplicates_the_slot_brk_2(
    fleet: Fleet, runner: SagaRunner
) -> None:
    tool = TOOLS["kill-holder"]
    lease = runner.claim_new_run(f"{TAG}-kill-holder")
    fleet.open_at_a(lease, tool)
    fleet.arm(lease, kind="timeout-before-commit", delayS=60, times=1)  # A's canary hangs at the tool
    fleet.wait_canary_free(tool)
    canary_key = f"{lease.run_id}/canary-a"
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(_ignore_errors, fleet.effect, "A", lease, tool, canary_key)
        wait_until(lambda: fleet.posts(lease).get(canary_key) == 1, 10, "A's canary at the tool", poll_s=0.01)
        fleet.gateways["A"].sigkill()
        killed_at = time.monotonic()
        # Held by a dead instance: B fails fast (no second canary) until the lease runs out...
        refused, passed = [], None
        while passed is None and time.monotonic() - killed_at < CANARY_LEASE_MS / 1000 + 10:
            key = f"{lease.run_id}/b-{len(refused)}"
            answer = fleet.effect("B", lease, tool, key)
            if answer.status_code == 424:
                refused.append((time.monotonic() - killed_at, answer.json()))
                time.sleep(0.1)
            else:
                passed = (time.monotonic() - killed_at, key, answer)
    assert passed is not None, "the slot was lost: B never got the canary"
    after_s, b_key, answer = passed
    assert answer.status_code == 200 and answer.json()["outcome"] == "committed", answer.text
    assert refused and all("held by gw-a@" in body["detail"] for _, body in refused[:3]), refused[:3]
    assert after_s < CANARY_LEASE_MS / 1000 + 3, f"B got the slot {after_s:.1f} s after the kill"
    reached = {k: n for k, n in fleet.posts(lease).items() if "/open-" not in k}
    assert reached == {canary_key: 1, b_key: 1}, reached
    slot = (CanaryGranted, CanaryExpired, BreakerClosed)
    events = [e for e in fleet.breaker_events(tool) if isinstance(e, slot)]
    granted = [e for e in events if isinstance(e, CanaryGranted)]
    assert [g.instance_id.split("@")[0] for g in granted] == ["gw-a", "gw-b"], events
    assert granted[1].expired_canary_id in ("", granted[0].canary_id)
    assert isinstance(events[-1], BreakerClosed) and events[-1].instance_id == granted[1].instance_id
    fleet.gateways["A"].start()
    fleet.wait_ready("A")


def test_a_sigkill_of_the_other_instance_in_half_open_changes_nothing_brk_2(
    fleet: Fleet, runner: SagaRunner
) -> None:
    tool = TOOLS["kill-other"]
    lease = runner.claim_new_run(f"{TAG}-kill-other")
    fleet.open_at_a(lease, tool)
    fleet.arm(lease, kind="timeout-after-commit", delayS=1.0, times=1)
    fleet.wait_canary_free(tool)
    canary_key = f"{lease.run_id}/canary-a"
    with ThreadPoolExecutor(max_workers=1) as pool:
        flying = pool.submit(fleet.effect, "A", lease, tool, canary_key)
        wait_until(lambda: fleet.posts(lease).get(canary_key) == 1, 10, "A's canary at the tool", poll_s=0.01)
        fleet.gateways["B"].sigkill()
        answer = flying.result()
    assert answer.status_code == 200 and answer.json()["outcome"] == "committed", answer.text
    events = [e for e in fleet.breaker_events(tool) if isinstance(e, (CanaryGranted, BreakerClosed))]
    assert [type(e).__name__ for e in events] == ["CanaryGranted", "BreakerClosed"]
    assert events[0].instance_id.startswith("gw-a@")
    reached = {k: n for k, n in fleet.posts(lease).items() if "/open-" not in k}
    assert reached == {canary_key: 1}
    fleet.gateways["B"].start()
    fleet.wait_ready("B")
    wait_until(lambda: fleet.breaker("B", tool)["status"] == "closed", 30, "B to fold the closed breaker")
    assert fleet.effect("B", lease, tool, f"{lease.run_id}/after").status_code == 200


def _ignore_errors(call: Any, *args: Any) -> None:
    with contextlib.suppress(httpx.HTTPError):  # SIGKILLed under this request: no answer is the point
        call(*args)
