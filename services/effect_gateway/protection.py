"""Tool protection at the gateway: the fleet's circuit breakers and the bulkheads (BRK-1, 2, 4).

The endpoint a breaker guards is the TOOL, by its name in TENURE_TOOLS (`endpoint_of`): one base
URL, one host, one failure domain. A tool's operations fail together when its host does (a
timeout, a refused connection, a 503 from its load balancer), and one ring per tool fills fast
enough to decide: per tool/operation, a rarely used operation would need min_calls failures of
its own before its breaker could open, and every operation would need a canary of its own
to find the host back up.

Per effect, before anything is recorded at the coordinator (`guard`):
  1. the breaker's verdict, read from the BreakerBoard in memory (a lookup, microseconds): open,
     forced open, or half-open with the canary slot taken -> `CircuitOpen` (ERR_CIRCUIT_OPEN,
     with the dependency and the cooldown remaining); nothing is recorded or dispatched;
  2. a slot of the tool's bulkhead (its domain's pool, or its own): a full pool -> `BulkheadFull`
     (ERR_BULKHEAD_FULL) at once; a queued call that waits longer than the pool's timeout too;
  3. half-open with the slot free: this instance asks the breaker for the one canary slot (like
     a lease, K_canary = 1 across the fleet). Granted: this effect is the canary. Refused (another
     instance was quicker, or no decision in time): `CircuitOpen`. One request per endpoint at a
     time asks from this instance; the others fail fast meanwhile.
Then every call to the tool (`Guarded.call`) is bounded by min(TENURE_TOOL_TIMEOUT_S, the pool's
timeout), and the outcome class of each dispatch (and verifier call) goes to the breaker: fire
and forget (`record_outcome`) while Closed, `report_canary` for the canary's call. Transport
failures are a timeout, a connect or other transport error, a 5xx or 429 answer, and a 2xx answer
that is not JSON (a malformed frame); every other answer (404, 409, 422: the endpoint answered)
is a success, or SLOW when slow calls count (TENURE_BREAKER_SLOW_CALL_MS).

The REC-6 probes that follow a failed dispatch are not counted (except as a canary's one call):
they are the gateway's own reads, and a tool whose every effect fails with a 503 while its probe
answers 404 would otherwise show a failure rate of exactly one half and never trip its breaker.
Calls refused here are not calls to the endpoint and are reported to nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from services.breakers.client import CanaryAnswer
from services.common.bulkhead import Bulkheads, Pool
from services.common.contracts import SLOW, SUCCESS, TRANSPORT_FAILURE
from services.effect_gateway.tools import ToolAnswer, ToolUnreachable

__all__ = [
    "CIRCUIT_OPEN",
    "BreakerReader",
    "BreakerReporter",
    "CircuitOpen",
    "Guarded",
    "ToolProtection",
    "VerdictView",
    "answer_outcome",
    "endpoint_of",
]

log = logging.getLogger("tenure.effect_gateway.protection")
CIRCUIT_OPEN = "ERR_CIRCUIT_OPEN"
# How long a canary request waits for the breaker's decision before the call fails fast instead.
CANARY_DECISION_S = 2.0


class VerdictView(Protocol):
    """What the gateway reads of a breaker (services.breakers.view BreakerFold.verdict)."""

    @property
    def status(self) -> str: ...
    @property
    def open(self) -> bool: ...
    @property
    def cooldown_remaining_ms(self) -> int: ...
    @property
    def canary_free(self) -> bool: ...
    @property
    def canary_holder(self) -> str: ...


class BreakerReader(Protocol):
    """The read side: a BreakerBoard in the gateway process, a BreakerFold in tests."""

    def verdict(self, endpoint: str, now_ms: int | None = None) -> VerdictView: ...


class BreakerReporter(Protocol):
    """The write side: services.breakers.client BreakerClient."""

    instance_id: str

    def record_outcome(self, endpoint: str, outcome: str, duration_ms: int, detail: str = "") -> object: ...

    async def request_canary(self, endpoint: str, timeout_s: float = 2.0) -> CanaryAnswer: ...

    async def report_canary(
        self,
        endpoint: str,
        canary_id: str,
        outcome: str,
        duration_ms: int,
        detail: str = "",
        timeout_s: float = 2.0,
    ) -> object: ...


def endpoint_of(tool: str) -> str:
    """The breaker endpoint of a tool: its name (see the module's docstring for why)."""
    return tool


def answer_outcome(answer: ToolAnswer) -> tuple[str, str]:
    """(outcome class, detail) of an answer the tool gave (BRK-1): 5xx and 429 are the endpoint
    failing, and so is a 2xx whose body is not JSON; anything else is the endpoint answering."""
    if answer.status >= 500 or answer.status == 429:
        return TRANSPORT_FAILURE, f"answered {answer.status}"
    if 200 <= answer.status < 300 and "raw" in answer.body:
        return TRANSPORT_FAILURE, f"malformed answer ({answer.status}, not JSON)"
    return SUCCESS, ""


class CircuitOpen(Exception):
    """The breaker of `endpoint` fails this call fast (BRK-2): nothing was recorded or sent."""

    code = CIRCUIT_OPEN

    def __init__(self, endpoint: str, status: str, cooldown_remaining_ms: int, why: str) -> None:
        self.endpoint, self.status, self.why = endpoint, status, why
        self.cooldown_remaining_ms = max(0, cooldown_remaining_ms)
        super().__init__(
            f"the circuit breaker of {endpoint} is {status}: failing fast, "
            f"{self.cooldown_remaining_ms} ms of cooldown remaining ({why}); nothing was recorded or sent"
        )

    def observation(self) -> dict[str, Any]:
        """The synthetic observation for the agent: <ERR_CIRCUIT_OPEN, dependency, cooldown>."""
        return {
            "code": self.code,
            "dependency": self.endpoint,
            "cooldownRemainingMs": self.cooldown_remaining_ms,
            "breakerStatus": self.status,
        }


class Guarded:
    """One effect admitted by `ToolProtection.guard`: its calls to the tool go through `call`."""

    def __init__(
        self,
        protection: ToolProtection,
        tool: str,
        pool: Pool,
        timeout_s: float,
        canary: CanaryAnswer | None,
    ) -> None:
        self._protection = protection
        self.tool = tool
        self.endpoint = endpoint_of(tool)
        self.pool = pool
        self.timeout_s = timeout_s
        self.canary = canary
        self.canary_outcome = ""  # what the canary's call was reported as ("" = not yet)

    @property
    def blocked(self) -> bool:
        """No further call may be sent for this effect: the canary's call failed (the breaker
        re-opens on it), or, for an ordinary call, the breaker opened meanwhile. Then the effect's
        follow-up calls (a probe, a second dispatch) wait for the next try under the same key."""
        if self.canary is not None:
            return self.canary_outcome not in ("", SUCCESS, SLOW)
        return self._protection.verdict(self.endpoint).open

    async def call(self, send: Callable[[], Awaitable[ToolAnswer]], *, probe: bool = False) -> ToolAnswer:
        """One request to the tool, bounded by the pool's timeout; its outcome goes to the breaker
        unless it is a `probe` (see the module's docstring), or the canary's report if first.

        A timeout is raised as ToolUnreachable (no usable answer), like a transport error."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                answer = await send()
        except TimeoutError as exc:
            self.pool.timed_out += 1
            elapsed = _ms_since(started)
            await self._observe(TRANSPORT_FAILURE, elapsed, f"timeout after {elapsed} ms", probe)
            raise ToolUnreachable(
                f"{self.tool}: no answer within {round(self.timeout_s * 1000)} ms (pool {self.pool.name})"
            ) from exc
        except ToolUnreachable as exc:
            await self._observe(TRANSPORT_FAILURE, _ms_since(started), str(exc), probe)
            raise
        outcome, detail = answer_outcome(answer)
        await self._observe(outcome, _ms_since(started), detail, probe)
        return answer

    async def _observe(self, outcome: str, duration_ms: int, detail: str, probe: bool) -> None:
        slow_ms = self._protection.slow_call_ms
        if outcome == SUCCESS and 0 < slow_ms <= duration_ms:
            outcome = SLOW
        if self.canary is not None and not self.canary_outcome:
            self.canary_outcome = outcome
            await self._protection.report_canary(self.endpoint, self.canary, outcome, duration_ms, detail)
            return
        if not probe:
            self._protection.record_outcome(self.endpoint, outcome, duration_ms, detail)


def _ms_since(started: float) -> int:
    return round((time.perf_counter() - started) * 1000)


class ToolProtection:
    """The breakers as this gateway instance follows them, its bulkheads, and what it reports.

    `board` and `client` are a BreakerBoard and a BreakerClient in the gateway process (see
    Gateway), a BreakerFold and a recording fake in tests. Counters are for GET /bulkheads and
    GET /breakers."""

    def __init__(
        self,
        board: BreakerReader,
        client: BreakerReporter,
        bulkheads: Bulkheads,
        *,
        tool_timeout_s: float = 5.0,
        slow_call_ms: int = 0,
        canary_decision_s: float = CANARY_DECISION_S,
    ) -> None:
        self.board = board
        self.client = client
        self.bulkheads = bulkheads
        self.tool_timeout_s = tool_timeout_s
        self.slow_call_ms = slow_call_ms
        self.canary_decision_s = canary_decision_s
        self._asking: set[str] = set()  # endpoints this instance is asking a canary of, or holds
        self.failed_fast: dict[str, int] = {}
        self.canaries: dict[str, int] = {}
        self.reported = 0
        self.dropped = 0

    def verdict(self, endpoint: str) -> VerdictView:
        return self.board.verdict(endpoint)

    def check(self, tool: str) -> None:
        """Fail fast (CircuitOpen) when the breaker of `tool` lets no call through from here now.

        In memory only: this is the whole cost of a refused call, before anything is recorded."""
        endpoint = endpoint_of(tool)
        found = self.board.verdict(endpoint)
        if found.open and (not found.canary_free or endpoint in self._asking):
            raise self._open(endpoint, found)

    def _open(self, endpoint: str, found: VerdictView, why: str = "") -> CircuitOpen:
        self.failed_fast[endpoint] = self.failed_fast.get(endpoint, 0) + 1
        if not why:
            if found.canary_holder:
                why = f"half-open, the canary slot is held by {found.canary_holder}"
            elif endpoint in self._asking:
                why = "half-open, this instance's canary is in flight"
            else:
                why = found.status
        return CircuitOpen(endpoint, found.status, found.cooldown_remaining_ms, why)

    def timeout_for(self, pool: Pool) -> float:
        return min(self.tool_timeout_s, pool.limits.timeout_ms / 1000)

    @contextlib.asynccontextmanager
    async def guard(self, tool: str) -> AsyncIterator[Guarded]:
        """Admit one effect to `tool`, or refuse it (CircuitOpen, BulkheadFull) before anything
        is recorded; the body records the intent and makes the calls through the Guarded."""
        self.check(tool)
        endpoint = endpoint_of(tool)
        async with self.bulkheads.slot(tool) as pool:
            canary: CanaryAnswer | None = None
            found = self.board.verdict(endpoint)  # again: the slot may have taken a while
            if found.open:
                if not found.canary_free or endpoint in self._asking:
                    raise self._open(endpoint, found)
                self._asking.add(endpoint)
                try:
                    canary = await self._ask_canary(endpoint)
                    if not canary.granted:
                        why = f"canary refused: {canary.code} {canary.detail}"
                        raise self._open(endpoint, self.board.verdict(endpoint), why)
                    self.canaries[endpoint] = self.canaries.get(endpoint, 0) + 1
                    log.info("%s: this instance sends the canary %s", endpoint, canary.canary_id)
                    guarded = Guarded(self, tool, pool, self.timeout_for(pool), canary)
                    yield guarded
                    if not guarded.canary_outcome:
                        # Nothing was sent (the coordinator refused the intent, say): the slot
                        # comes free when its lease runs out, as after a crash.
                        log.warning("%s: canary %s granted but not sent", endpoint, canary.canary_id)
                finally:
                    self._asking.discard(endpoint)
                return
            yield Guarded(self, tool, pool, self.timeout_for(pool), None)

    async def _ask_canary(self, endpoint: str) -> CanaryAnswer:
        try:
            return await self.client.request_canary(endpoint, self.canary_decision_s)
        except Exception as exc:  # Kafka away: no canary, the call fails fast (safe either way)
            return CanaryAnswer(False, code="UNREACHABLE", detail=f"{type(exc).__name__}: {exc}")

    # --- reporting: telemetry never fails a call ------------------------------------------------

    def record_outcome(self, endpoint: str, outcome: str, duration_ms: int, detail: str) -> None:
        try:
            self.client.record_outcome(endpoint, outcome, duration_ms, detail)
            self.reported += 1
        except Exception as exc:
            self.dropped += 1
            log.debug("outcome for %s not reported: %s", endpoint, exc)

    async def report_canary(
        self, endpoint: str, canary: CanaryAnswer, outcome: str, duration_ms: int, detail: str
    ) -> None:
        try:
            await self.client.report_canary(
                endpoint, canary.canary_id, outcome, duration_ms, detail, self.canary_decision_s
            )
        except Exception as exc:  # the slot's lease runs out and the breaker moves on without us
            log.warning("canary %s of %s not reported: %s", canary.canary_id, endpoint, exc)
        else:
            log.info("%s: canary %s reported %s", endpoint, canary.canary_id, outcome)

    def snapshot(self, endpoints: list[str]) -> dict[str, Any]:
        """The breakers of `endpoints` as this instance sees them (GET /breakers)."""
        verdicts = {}
        for endpoint in endpoints:
            found = self.board.verdict(endpoint)
            verdicts[endpoint] = {
                "status": found.status,
                "failFast": found.open and (not found.canary_free or endpoint in self._asking),
                "cooldownRemainingMs": found.cooldown_remaining_ms,
                "canaryFree": found.canary_free,
                "canaryHolder": found.canary_holder,
                "failedFast": self.failed_fast.get(endpoint, 0),
                "canariesSent": self.canaries.get(endpoint, 0),
            }
        return {
            "instanceId": self.client.instance_id,
            "endpoints": verdicts,
            "outcomesReported": self.reported,
            "outcomesDropped": self.dropped,
        }
