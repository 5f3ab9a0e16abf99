"""The runner SDK respects the fleet's circuit breakers for its own calls (issue 13 part 3, BRK-2).

An effect the gateway refuses with `circuit-open` / ERR_CIRCUIT_OPEN raises CircuitOpen with the
dependency and the cooldown remaining; nothing was dispatched, so it is neither a lost lease nor
an unknown outcome; and the client does not send that call again before the cooldown has
passed. `breaker(endpoint)` reads GET /breakers/{endpoint} of the real API (in-process harness).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

import services.runner_sdk as sdk
from services.common.contracts import SUCCESS, TRANSPORT_FAILURE
from services.runner_sdk import (
    ERR_CIRCUIT_OPEN,
    CircuitOpen,
    JournalKind,
    Lease,
    LeaseKeeper,
    RequestRejected,
    TenureClient,
    TenureUnavailable,
)
from tests.support.api_harness import api_client
from tests.unit.runner_fakes import API, GATEWAY, RUN_ID, FakeClock, FakeTenure

pytestmark = pytest.mark.timeout(60)


def _circuit_open(cooldown_ms: int = 2_500) -> httpx.Response:
    """The gateway's fail-fast answer (services/effect_gateway/service.py circuit_open_problem):
    424 circuit-open, ERR_CIRCUIT_OPEN, the dependency, the cooldown remaining, the observation."""
    observation = {"code": ERR_CIRCUIT_OPEN, "dependency": "ledger", "cooldownRemainingMs": cooldown_ms}
    return httpx.Response(
        424,
        json={
            "type": "/problems/circuit-open",
            "title": "The tool's circuit breaker is open",
            "status": 424,
            "detail": "the circuit breaker of ledger is open: failing fast",
            "code": ERR_CIRCUIT_OPEN,
            "dependency": "ledger",
            "breakerStatus": "open",
            "cooldownRemainingMs": cooldown_ms,
            "retryAfterMs": cooldown_ms,
            "pendingIntent": False,
            "observation": observation,
        },
        headers={"Content-Type": "application/problem+json", "Retry-After": str(-(-cooldown_ms // 1000))},
    )


class Gateway:
    """FakeTenure's coordinator, and an effect gateway whose `ledger` breaker may be open."""

    def __init__(self, clock: FakeClock) -> None:
        self.tenure = FakeTenure(clock, clock.advance)
        self.open: httpx.Response | None = None
        self.effects: list[dict[str, Any]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/effects":
            body = json.loads(request.content)
            self.effects.append(body)
            if self.open is not None and body["tool"] == "ledger":
                return self.open
        return self.tenure.handle(request)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def gateway(clock: FakeClock) -> Gateway:
    return Gateway(clock)


@pytest.fixture
def client(gateway: Gateway, clock: FakeClock) -> Any:
    transport = httpx.MockTransport(gateway.handle)
    with TenureClient(API, GATEWAY, api_key="k", transport=transport, clock=clock) as opened:
        yield opened


@pytest.fixture
def keeper(client: TenureClient, clock: FakeClock) -> LeaseKeeper:
    return LeaseKeeper.claim(client, RUN_ID, "runner-7", ["checkpoint-v1"], clock=clock)


def test_circuit_open_is_exported_and_is_a_refusal_not_an_unknown_outcome() -> None:
    assert sdk.CircuitOpen is CircuitOpen and sdk.ERR_CIRCUIT_OPEN == "ERR_CIRCUIT_OPEN"
    assert "CircuitOpen" in sdk.__all__ and "BreakerView" in sdk.__all__
    assert issubclass(CircuitOpen, RequestRejected) and not issubclass(CircuitOpen, TenureUnavailable)


def test_an_open_breaker_raises_circuit_open_and_is_not_retried_before_its_cooldown_brk_2(
    keeper: LeaseKeeper, client: TenureClient, gateway: Gateway, clock: FakeClock
) -> None:
    gateway.open = _circuit_open(cooldown_ms=2_500)
    with pytest.raises(CircuitOpen) as raised:
        keeper.send_effect("k-1", "ledger", "transfer", {"amount": 5})
    error = raised.value
    assert error.dependency == "ledger" and error.status == 424 and error.problem_type == "circuit-open"
    assert error.cooldown_remaining_s == 2.5 and error.pending_intent is False
    assert error.local is False and len(gateway.effects) == 1
    # Nothing was dispatched: the keeper journals a failed effect and keeps its lease.
    assert keeper.journal[-1].kind is JournalKind.EFFECT_FAILED
    assert set(client.open_circuits()) == {"effect ledger/transfer"}
    # A retry before the cooldown is refused by the client itself: nothing reaches the gateway.
    clock.advance(2.0)
    with pytest.raises(CircuitOpen) as again:
        keeper.send_effect("k-1", "ledger", "transfer", {"amount": 5})
    assert again.value.local is True and again.value.dependency == "ledger"
    assert 0.49 <= again.value.cooldown_remaining_s <= 0.5
    assert len(gateway.effects) == 1
    # Another tool is not held back by the ledger's breaker.
    keeper.send_effect("k-2", "env", "provision", {"name": "a"})
    assert len(gateway.effects) == 2
    # After the cooldown the call goes out again (and succeeds once the breaker has closed).
    clock.advance(0.6)
    gateway.open = None
    result = keeper.send_effect("k-1", "ledger", "transfer", {"amount": 5})
    assert result.outcome and len(gateway.effects) == 3
    assert client.open_circuits() == {}


def test_the_cooldown_is_read_from_whichever_field_the_answer_carries(clock: FakeClock) -> None:
    answers = iter(
        [
            # A synthetic observation (the agent's <ERR_CIRCUIT_OPEN, dependency, cooldown>) in a 409.
            httpx.Response(
                409,
                json={
                    "type": "/problems/tool-refused",
                    "detail": "refused",
                    "observation": {
                        "code": ERR_CIRCUIT_OPEN,
                        "dependency": "search",
                        "cooldownRemainingS": 7,
                    },
                },
            ),
            # Only a Retry-After header.
            httpx.Response(
                503, json={"type": "/problems/circuit-open", "endpoint": "crm"}, headers={"Retry-After": "4"}
            ),
        ]
    )
    transport = httpx.MockTransport(lambda request: next(answers))
    lease = _lease()
    with TenureClient(API, GATEWAY, transport=transport, clock=clock) as client:
        with pytest.raises(CircuitOpen) as first:
            client.effect(lease, "k", "search", "query", {})
        assert (first.value.dependency, first.value.cooldown_remaining_s) == ("search", 7.0)
        with pytest.raises(CircuitOpen) as second:
            client.effect(lease, "k", "crm", "update", {})
        assert (second.value.dependency, second.value.cooldown_remaining_s) == ("crm", 4.0)
        assert set(client.open_circuits()) == {"effect search/query", "effect crm/update"}


def _lease() -> Lease:
    return Lease(RUN_ID, "att_x_1", 1, "lease-1", 1, 0, 90, 20, 0, {})


def test_breaker_reads_the_endpoints_breaker_from_the_api_brk_2(tmp_path: Path) -> None:
    with api_client(tmp_path, api_keys="rob-key=rob:runner") as (http, tenure):
        tenure.report_outcomes("ledger/transfer", [SUCCESS] * 2 + [TRANSPORT_FAILURE] * 8)
        transport = http._transport  # the in-process API behind the SDK's own HTTP client
        with TenureClient(str(http.base_url), GATEWAY, api_key="rob-key", transport=transport) as client:
            view = client.breaker("ledger/transfer")
            assert (view.endpoint, view.status, view.fails_fast) == ("ledger/transfer", "open", True)
            assert 0 < view.cooldown_remaining_s <= 30 and 0 < view.retry_after_s <= 30
            assert view.error_rate == 0.8 and view.canary_holder is None and view.reason is None
            assert view.view["transitions"][0]["type"] == "BreakerOpened"
            with pytest.raises(RequestRejected) as missing:
                client.breaker("nowhere")
            assert missing.value.status == 404 and missing.value.problem_type == "breaker-not-found"
