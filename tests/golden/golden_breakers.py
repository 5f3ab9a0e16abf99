"""Golden sample values of the circuit breakers' records (tenure.breakers.*, BRK-1, BRK-2)."""

from __future__ import annotations

from typing import Any

from golden_base import _COMMAND, _EVENT

__all__ = ["SAMPLES"]

# The circuit breakers' records (tenure.breakers.*, BRK-1, BRK-2): one endpoint's story, from a
# failing window through a failed and a successful canary; the aggregate id is the endpoint.
_BREAKER_COMMAND = {**_COMMAND, "runId": "env/vm.provision", "actor": "service:gateway-a"}
_BREAKER_EVENT = {
    **_EVENT,
    "runId": "env/vm.provision",
    "actor": "service:gateway-a",
    "causationId": "cmd-brk-1",
}
_CANARY = {"canaryId": "cny_4c1f9a", "instanceId": "gateway-a"}
SAMPLES: dict[tuple[str, int], dict[str, Any]] = dict(
    {
        ("tenure.breakers.commands.RecordCallOutcome", 1): {
            **_BREAKER_COMMAND,
            "instanceId": "gateway-a",
            "seq": 1_767_225_600_123_000,
            "outcome": "transport-failure",
            "durationMs": 5002,
            "detail": "HTTP 504 Gateway Timeout",
        },
        ("tenure.breakers.commands.RequestCanary", 1): {**_BREAKER_COMMAND, "instanceId": "gateway-a"},
        ("tenure.breakers.commands.ReportCanary", 1): {
            **_BREAKER_COMMAND,
            **_CANARY,
            "outcome": "success",
            "durationMs": 21,
            "detail": "HTTP 404 (an application error: the endpoint answered)",
        },
        ("tenure.breakers.commands.ForceOpenBreaker", 1): {
            **_BREAKER_COMMAND,
            "actor": "user:ops@example.org",
            "reason": "vendor incident INC-77 — maintenance window",
        },
        ("tenure.breakers.commands.DisableBreaker", 1): {
            **_BREAKER_COMMAND,
            "actor": "user:ops@example.org",
            "reason": "flaky health of the breaker itself",
        },
        ("tenure.breakers.commands.ResetBreaker", 1): {
            **_BREAKER_COMMAND,
            "actor": "user:ops@example.org",
            "reason": "vendor recovered",
        },
        ("tenure.breakers.events.CallOutcomeRecorded", 1): {
            **_BREAKER_EVENT,
            "eventId": "brk_0001",
            "version": 20,
            "instanceId": "gateway-b",
            "seq": 1_767_225_600_200_001,
            "outcome": "transport-failure",
            "durationMs": 5001,
            "detail": "connect timeout",
            "failure": True,
            "counted": True,
            "windowSize": 20,
        },
        ("tenure.breakers.events.BreakerOpened", 1): {
            **_BREAKER_EVENT,
            "eventId": "brk_0002",
            "version": 21,
            "window": [False] * 8 + [True] * 12,
            "calls": 20,
            "failures": 12,
            "errorRate": 0.6,
            "threshold": 0.5,
            "minCalls": 10,
            "cooldownMs": 30_000,
            "halfOpenAt": 1_767_225_630_456,
        },
        ("tenure.breakers.events.BreakerHalfOpened", 1): {
            **_BREAKER_EVENT,
            "eventId": "brk_0003",
            "version": 22,
            "actor": "tenure-breakers",
            "causationId": "timer/env/vm.provision/1767225600456",
            "openedAt": 1_767_225_600_456,
            "cooldownMs": 30_000,
        },
        ("tenure.breakers.events.CanaryGranted", 1): {
            **_BREAKER_EVENT,
            **_CANARY,
            "eventId": "brk_0004",
            "version": 23,
            "grantedFrom": "half-open",
            "expiresAt": 1_767_225_615_456,
            "expiredCanaryId": "",
        },
        ("tenure.breakers.events.CanaryExpired", 1): {
            **_BREAKER_EVENT,
            **_CANARY,
            "eventId": "brk_0005",
            "version": 24,
            "actor": "tenure-breakers",
            "causationId": "timer/cny_4c1f9a",
            "expiresAt": 1_767_225_615_456,
        },
        ("tenure.breakers.events.BreakerReopened", 1): {
            **_BREAKER_EVENT,
            **_CANARY,
            "eventId": "brk_0006",
            "version": 25,
            "outcome": "transport-failure",
            "durationMs": 5000,
            "detail": "HTTP 503",
            "previousCooldownMs": 30_000,
            "cooldownMs": 60_000,
            "halfOpenAt": 1_767_225_660_456,
        },
        ("tenure.breakers.events.BreakerClosed", 1): {
            **_BREAKER_EVENT,
            **_CANARY,
            "eventId": "brk_0007",
            "version": 26,
            "outcome": "success",
            "durationMs": 21,
            "openForMs": 90_000,
        },
        ("tenure.breakers.events.BreakerForcedOpen", 1): {
            **_BREAKER_EVENT,
            "eventId": "brk_0008",
            "version": 27,
            "actor": "user:ops@example.org",
            "reason": "vendor incident INC-77 — maintenance window",
            "previousStatus": "closed",
        },
        ("tenure.breakers.events.BreakerDisabled", 1): {
            **_BREAKER_EVENT,
            "eventId": "brk_0009",
            "version": 28,
            "actor": "user:ops@example.org",
            "reason": "flaky health of the breaker itself",
            "previousStatus": "forced-open",
        },
        ("tenure.breakers.events.BreakerReset", 1): {
            **_BREAKER_EVENT,
            "eventId": "brk_0010",
            "version": 29,
            "actor": "user:ops@example.org",
            "reason": "vendor recovered",
            "previousStatus": "disabled",
        },
    }
)
