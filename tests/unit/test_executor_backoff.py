"""The saga executor retries the gateway politely (BRK-3) and presents its service key (LEASE-1).

It used to retry every 0.5 s forever and log a traceback each time: 16 workers made ~32
tracebacks a second while the gateway was down. Now every retry waits a capped full-jitter
backoff (services.common.backoff), reset by a success, and the log says only when the gateway
becomes unusable (one warning with the reason) and usable again (one info line).
"""

from __future__ import annotations

import logging
import random
import threading
from concurrent.futures import Future
from typing import Any

import httpx
import pytest

from services.common.clock import ManualClock
from services.common.ids import run_id_for
from services.common.kafka import OutboundRecord
from services.common.messages import MessageCodec
from services.lease_coordinator.domain import attempt_id_for
from services.saga_orchestrator.__main__ import DEFAULT_CATALOG
from services.saga_orchestrator.domain import DispatchStep, EvaluateGate, load_catalog
from services.saga_orchestrator.executor import BACKOFF_BASE_S, BACKOFF_CAP_S, GatewayHealth, SagaExecutor

pytestmark = pytest.mark.timeout(30)

LOGGER = "tenure.saga_orchestrator.executor"
RUN = run_id_for("acme", "backoff")
COMMITTED = {"effectId": "eff_1", "outcome": "committed", "toolResponse": {"output": {"id": 1}}}


class Publisher:
    def __init__(self) -> None:
        self.records: list[OutboundRecord] = []

    def publish(self, record: OutboundRecord) -> Future[int]:
        self.records.append(record)
        done: Future[int] = Future()
        done.set_result(len(self.records))
        return done


class Gateway:
    """Down (a connection error) for the first `down_for` calls, then answering `answer`."""

    def __init__(self, down_for: int, answer: httpx.Response | None = None) -> None:
        self.down_for = down_for
        self.answer = answer or httpx.Response(200, json=COMMITTED)
        self.requests: list[httpx.Request] = []
        self._lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            self.requests.append(request)
            calls = len(self.requests)
        if calls <= self.down_for:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return self.answer


def executor(
    gateway: Gateway, waits: list[float], draw: Any = None, key: str | None = "sagakey"
) -> SagaExecutor:
    return SagaExecutor(
        "http://gateway.test",
        Publisher(),  # type: ignore[arg-type]
        MessageCodec(),
        load_catalog(DEFAULT_CATALOG),
        ManualClock(),
        workers=1,
        service_key=key,
        transport=httpx.MockTransport(gateway),
        sleep=waits.append,
        draw=draw,
    )


def step(key: str = "k") -> DispatchStep:
    return DispatchStep(
        run_id=RUN,
        step_index=0,
        dispatch=1,
        attempt_id=attempt_id_for(RUN, 1),
        epoch=1,
        idempotency_key=f"{RUN}/{key}",
        gateway_tool="env",
        operation="vm.create",
        params={},
        not_before=0,
    )


def test_retries_wait_a_growing_full_jitter_backoff_capped_brk_3() -> None:
    waits: list[float] = []
    gateway = Gateway(down_for=12)
    saga = executor(gateway, waits, draw=lambda: 0.999)  # the top of each jitter range
    saga._run(step())
    assert len(waits) == 12 and saga.performed == 1
    ceilings = [min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**k) for k in range(12)]
    assert waits == pytest.approx([0.999 * c for c in ceilings])
    assert waits[0] < 0.11 and max(waits) < BACKOFF_CAP_S, "starts at the base, never above the cap"
    assert ceilings[-1] == BACKOFF_CAP_S


def test_the_waits_are_jittered_within_their_ceiling_not_fixed_brk_3() -> None:
    waits: list[float] = []
    rng = random.Random(7)
    saga = executor(Gateway(down_for=40), waits, draw=rng.random)
    saga._run(step())
    ceilings = [min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**k) for k in range(40)]
    assert all(0 <= w < c for w, c in zip(waits, ceilings, strict=True))
    capped = waits[10:]  # from the 8th retry on, every ceiling is the cap
    assert len(set(capped)) == len(capped), "full jitter: no two waits alike"
    assert min(capped) < BACKOFF_CAP_S / 2 < max(capped), "spread over [0, cap), not bunched"


def test_a_success_resets_the_backoff() -> None:
    waits: list[float] = []
    gateway = Gateway(down_for=6)
    saga = executor(gateway, waits, draw=lambda: 0.999)
    saga._run(step("a"))
    first = list(waits)
    gateway.down_for = len(gateway.requests) + 2  # down again, briefly
    saga._run(step("b"))
    assert waits[len(first) :] == pytest.approx([0.999 * BACKOFF_BASE_S, 0.999 * BACKOFF_BASE_S * 2])


def test_one_log_line_per_change_of_state_and_no_traceback_brk_3(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    waits: list[float] = []
    saga = executor(Gateway(down_for=25), waits, draw=lambda: 0.0)
    saga._run(step())
    ours = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.INFO]
    assert [r.levelname for r in ours] == ["WARNING", "INFO"], [r.getMessage() for r in ours]
    assert "unusable" in ours[0].getMessage() and "ConnectError" in ours[0].getMessage()
    assert "answers again" in ours[1].getMessage()
    assert all(r.exc_info is None for r in caplog.records), "a transport error is expected: no traceback"
    assert len(waits) == 25


def test_many_workers_failing_together_log_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    health = GatewayHealth()
    threads = [threading.Thread(target=lambda: [health.failed("down") for _ in range(50)]) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    health.answered()
    health.answered()
    assert [r.levelname for r in caplog.records if r.name == LOGGER] == ["WARNING", "INFO"]


def test_every_gateway_call_presents_the_service_key_lease_1() -> None:
    waits: list[float] = []
    gateway = Gateway(down_for=0)
    saga = executor(gateway, waits)
    saga._run(step())
    gateway.answer = httpx.Response(
        200, json={"runId": RUN, "epoch": 1, "leaseHeld": True, "result": {"ok": True}}
    )
    spec = next(s for s in load_catalog(DEFAULT_CATALOG).specs() if s.verifiers)
    saga._run(EvaluateGate(run_id=RUN, step_index=0, dispatch=1, tool=spec.name, epoch=1, params={}))
    paths = {(r.method, r.url.path) for r in gateway.requests}
    assert {("POST", "/effects"), ("GET", f"/runs/{RUN}/fencing"), ("POST", "/verify")} <= paths
    assert {r.headers.get("authorization") for r in gateway.requests} == {"Bearer sagakey"}


def test_a_refused_service_key_is_retried_not_a_failed_step(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    waits: list[float] = []
    refused = httpx.Response(401, json={"type": "/problems/unauthenticated", "status": 401})
    gateway = Gateway(down_for=0, answer=refused)
    saga = executor(gateway, waits, key=None, draw=lambda: 0.0)
    ok = httpx.Response(200, json=COMMITTED)

    def wait_and_fix_after_five(delay: float) -> None:
        # The operator fixes the key after six refusals; nothing of the step failed meanwhile.
        waits.append(delay)
        if len(waits) == 6:
            gateway.answer = ok

    saga._sleep = wait_and_fix_after_five
    saga._run(step())
    assert len(waits) == 6 and saga.performed == 1
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "TENURE_SERVICE_KEY" in warning.getMessage()
    assert "authorization" not in gateway.requests[0].headers, "development mode: no key, no header"
    (report,) = saga._publisher.records  # type: ignore[attr-defined]
    assert MessageCodec().decode(report.value).outcome == "committed"


def test_kafka_refusing_the_report_is_retried_with_backoff_and_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    waits: list[float] = []
    saga = executor(Gateway(down_for=0), waits, draw=lambda: 0.999)
    publisher: Publisher = saga._publisher  # type: ignore[assignment]
    failures = iter([RuntimeError("Local: Message timed out")] * 3)

    def flaky(record: OutboundRecord) -> Future[int]:
        answer: Future[int] = Future()
        error = next(failures, None)
        if error is None:
            return Publisher.publish(publisher, record)
        answer.set_exception(error)
        return answer

    publisher.publish = flaky  # type: ignore[method-assign]
    saga._run(step())
    assert saga.performed == 1 and len(publisher.records) == 1
    assert waits == pytest.approx([0.999 * BACKOFF_BASE_S * 2**k for k in range(3)])
    lines = [r for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1 and lines[0].exc_info is None, [r.getMessage() for r in lines]
