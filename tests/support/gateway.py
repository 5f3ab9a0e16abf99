"""The effect gateway's real protocol and HTTP front, without Kafka, for unit tests.

`OfflineGateway` is the real `Gateway` (its `perform`, `verify`, fencing and authorization)
with the Kafka parts cut off: runs.events are folded by hand (`fold`), the watchdog's
interventions too (`fold_watchdog`), and every command it
would publish is kept in `sent` and answered by `decide` (Decided by default). The tool is an
`httpx.MockTransport` that records what it was sent. Tool protection is real too: the breakers
are a `BreakerFold` (fed by hand, `breakers`), the breaker client a `RecordingBreakerClient`,
the bulkheads the default ones unless given.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import httpx

from services.breakers.client import CanaryAnswer
from services.breakers.view import BreakerFold
from services.common.auth import Principal, parse_api_keys
from services.common.bulkhead import Bulkheads
from services.common.clock import SystemClock
from services.common.contracts import InterventionIssued, RecordEffectIntent, RecordEffectOutcome, RunEvent
from services.common.decisions import Decided, Decision
from services.common.messages import MessageCodec
from services.effect_gateway.app import create_app
from services.effect_gateway.fencing import fold_fencing
from services.effect_gateway.protection import ToolProtection
from services.effect_gateway.quarantine_guard import QuarantineGuard
from services.effect_gateway.service import Gateway
from services.effect_gateway.tools import ToolRegistry
from services.quarantine.view import QuarantineFold

Command = RecordEffectIntent | RecordEffectOutcome


class RecordingTool:
    """A tool that applies every effect and remembers every request it was sent."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.applied: dict[str, dict[str, Any]] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.method == "POST" and request.url.path == "/effects":
            key = request.headers["Idempotency-Key"]
            self.applied[key] = {"output": {"ok": True, "key": key}}
            return httpx.Response(200, json=self.applied[key])
        if request.method == "GET" and request.url.path.startswith("/effects/"):
            return httpx.Response(404, json={"type": "/problems/effect-not-found"})
        if request.method == "POST" and request.url.path.startswith("/verifiers/"):
            return httpx.Response(200, json={"ok": True, "detail": "verified"})
        return httpx.Response(404, json={})


class RecordingBreakerClient:
    """What the gateway tells the breakers, kept: outcomes, canary requests and reports.

    `canary` answers every canary request (granted by default, as `cny-<n>`)."""

    def __init__(self, instance_id: str = "gw-test") -> None:
        self.instance_id = instance_id
        self.outcomes: list[tuple[str, str, int, str]] = []
        self.canary_requests: list[str] = []
        self.reports: list[tuple[str, str, str, int]] = []
        self.canary: Callable[[str], CanaryAnswer] = lambda endpoint: CanaryAnswer(
            True, f"cny-{len(self.canary_requests)}", 2**62
        )

    def record_outcome(self, endpoint: str, outcome: str, duration_ms: int, detail: str = "") -> None:
        self.outcomes.append((endpoint, outcome, duration_ms, detail))

    async def request_canary(self, endpoint: str, timeout_s: float = 2.0) -> CanaryAnswer:
        self.canary_requests.append(endpoint)
        return self.canary(endpoint)

    async def report_canary(
        self,
        endpoint: str,
        canary_id: str,
        outcome: str,
        duration_ms: int,
        detail: str = "",
        timeout_s: float = 2.0,
    ) -> None:
        self.reports.append((endpoint, canary_id, outcome, duration_ms))


class RecordingPublisher:
    """The gateway publishes an effect's outcome straight to Kafka (durable, not decided): here
    it is kept in the gateway's `sent` with the rest, and acknowledged at once."""

    def __init__(self, gateway: OfflineGateway) -> None:
        self.gateway = gateway

    def publish(self, record: Any) -> Future[int]:
        self.gateway.sent.append(self.gateway._codec.decode(record.value))
        done: Future[int] = Future()
        done.set_result(0)
        return done


class OfflineGateway(Gateway):
    def __init__(
        self,
        tool: RecordingTool | None = None,
        *,
        caught_up: bool = True,
        tools: dict[str, str] | None = None,
        bulkheads: Bulkheads | None = None,
        tool_timeout_s: float = 5.0,
        egress: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        # Deliberately not Gateway.__init__: that opens Kafka clients.
        self.tool = tool or RecordingTool()
        self._codec = MessageCodec()
        self._clock = SystemClock()
        self._tools = ToolRegistry(
            tools or {"ledger": "http://ledger.test"}, transport=httpx.MockTransport(self.tool)
        )
        self.breakers = BreakerFold()
        self.breaker_client = RecordingBreakerClient()
        self._protection = ToolProtection(
            self.breakers, self.breaker_client, bulkheads or Bulkheads(), tool_timeout_s=tool_timeout_s
        )
        self._timeout = 1.0
        self._views = {}
        self._tombstones = {}
        self._lock = threading.Lock()
        self._caught_up = threading.Event()
        if caught_up:
            self._caught_up.set()
        self.sent: list[Command] = []
        self._publisher = RecordingPublisher(self)  # type: ignore[assignment]
        self.decide: Callable[[Command], Decision | None] = Decided
        # QUA-1: quarantines folded by hand (`quarantine_fold.apply`), egress rules as given.
        self.quarantine_fold = QuarantineFold()
        publisher: Any = self._publisher
        self._quarantine = QuarantineGuard(
            self.quarantine_fold, publisher, self._codec, egress or {}, publish_timeout_s=1.0
        )

    def fold(self, *events: RunEvent) -> OfflineGateway:
        with self._lock:
            for event in events:
                self._views[event.run_id] = fold_fencing(self._views.get(event.run_id), event)
        return self

    def fold_watchdog(self, *events: InterventionIssued) -> OfflineGateway:
        for event in events:
            self.tombstone(event)
        return self

    def catch_up(self) -> None:
        self._caught_up.set()

    @property
    def ready(self) -> bool:
        # No feed here: caught up when the test says so.
        return self._caught_up.is_set()

    async def _send(self, command: Command) -> Any:
        self.sent.append(command)
        return self.decide(command)

    def readiness(self) -> dict[str, dict[str, Any]]:
        return {
            "caughtUp": {"ok": self._caught_up.is_set(), "detail": "folded by hand"},
            "kafka": {"ok": True, "detail": "no Kafka here"},
            "breakers": {"ok": True, "detail": "folded by hand"},
        }

    async def close(self) -> None:
        await self._tools.close()


def gateway_app(gateway: OfflineGateway, api_keys: str | dict[str, Principal] = "") -> Any:
    keys = parse_api_keys(api_keys) if isinstance(api_keys, str) else api_keys
    return create_app(lambda: gateway, api_keys=keys, max_body_bytes=64 * 1024)


def effect_body(
    run: Any, key: str = "k-1", payload: dict[str, Any] | None = None, **overrides: Any
) -> dict[str, Any]:
    """A POST /effects body for the lease `run` holds now (a tests.unit Run), a credit by default."""
    lease = run.state.lease
    assert lease is not None
    body = {
        "runId": run.run_id,
        "attemptId": lease.attempt_id,
        "epoch": lease.epoch,
        "idempotencyKey": key,
        "tool": "ledger",
        "operation": "credit",
        "payload": payload if payload is not None else {"account": "a", "amount": 1},
    }
    return {**body, **overrides}
