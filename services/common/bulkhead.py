"""Bulkheads per tool domain (BRK-4): bounded concurrency, a bounded queue, a timeout, per pool.

A hung external API must not starve the local tools: each tool domain has its own pool, so
calls to a saturated external endpoint hold only the external pool's slots while local calls
keep theirs. A pool runs at most `concurrency` calls at once and lets at most `queue` more wait
(first come, first served); a call that finds the queue full is refused at once with
ERR_BULKHEAD_FULL ("External tool queue saturated; defer execution"), and so is one that waited
longer than the pool's timeout for a slot. A queue is never unbounded. A call that runs longer
than the timeout is cancelled and raises ToolTimedOut (a transport failure to the breaker).

  local     tools on this host (file reads, parsers, linters): timeout <= 500 ms, e.g. 64 at once
  internal  RPC inside the deployment (vector stores, embeddings): e.g. 32 at once, 2 s
  external  third-party SaaS over the internet: e.g. 16 at once, 5 s

Limits are configurable per domain and per tool (TENURE_BULKHEAD_*); a tool with limits of its
own gets a pool of its own. Pools are asyncio objects: one `Bulkheads` per event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from services.common.settings import TenureSettings

__all__ = [
    "BULKHEAD_FULL",
    "DEFAULT_LIMITS",
    "LOCAL_TIMEOUT_MAX_MS",
    "BulkheadFull",
    "Bulkheads",
    "Domain",
    "Limits",
    "Pool",
    "ToolRule",
    "ToolTimedOut",
    "parse_tool_rules",
]

T = TypeVar("T")

BULKHEAD_FULL = "ERR_BULKHEAD_FULL"
LOCAL_TIMEOUT_MAX_MS = 500
_MAX_CONCURRENCY = 1024
_MAX_QUEUE = 10_000
_MAX_TIMEOUT_MS = 300_000


class Domain(StrEnum):
    LOCAL = "local"
    INTERNAL = "internal"
    EXTERNAL = "external"


@dataclass(frozen=True)
class Limits:
    concurrency: int
    queue: int
    timeout_ms: int

    def problems(self, domain: Domain) -> list[str]:
        """What is wrong with these limits for `domain`; empty when they are usable."""
        found = []
        if not 1 <= self.concurrency <= _MAX_CONCURRENCY:
            found.append(f"concurrency {self.concurrency} is outside [1, {_MAX_CONCURRENCY}]")
        if not 0 <= self.queue <= _MAX_QUEUE:
            found.append(f"queue {self.queue} is outside [0, {_MAX_QUEUE}]")
        cap = LOCAL_TIMEOUT_MAX_MS if domain is Domain.LOCAL else _MAX_TIMEOUT_MS
        if not 1 <= self.timeout_ms <= cap:
            found.append(f"timeout {self.timeout_ms} ms is outside [1, {cap}] for {domain.value} tools")
        return found


DEFAULT_LIMITS: Mapping[Domain, Limits] = {
    Domain.LOCAL: Limits(64, 64, 500),
    Domain.INTERNAL: Limits(32, 64, 2_000),
    Domain.EXTERNAL: Limits(16, 16, 5_000),
}


@dataclass(frozen=True)
class ToolRule:
    """A tool's domain, and optionally limits of its own (then it has a pool of its own)."""

    domain: Domain
    limits: Limits | None = None


class BulkheadFull(Exception):
    """The pool refused the call without running it: defer it (ERR_BULKHEAD_FULL)."""

    code = BULKHEAD_FULL

    def __init__(self, pool: str, domain: Domain, tool: str, limits: Limits, why: str) -> None:
        self.pool, self.domain, self.tool, self.limits, self.why = pool, domain, tool, limits, why
        self.message = f"{domain.value.capitalize()} tool queue saturated; defer execution"
        super().__init__(f"{self.message} ({tool} in pool {pool}: {why})")

    def observation(self) -> dict[str, Any]:
        """The synthetic observation for the agent (the seed's <ERR_RESOURCE_EXHAUSTED, ...>)."""
        return {
            "code": self.code,
            "message": self.message,
            "domain": self.domain.value,
            "tool": self.tool,
            "pool": self.pool,
            "concurrency": self.limits.concurrency,
            "queue": self.limits.queue,
            "detail": self.why,
        }


class ToolTimedOut(TimeoutError):
    """The call ran longer than its pool's timeout and was cancelled."""

    def __init__(self, pool: str, tool: str, timeout_ms: int) -> None:
        self.pool, self.tool, self.timeout_ms = pool, tool, timeout_ms
        super().__init__(f"{tool} took longer than {timeout_ms} ms (pool {pool})")


class Pool:
    """At most `concurrency` calls at once, at most `queue` waiting for a slot, in arrival order."""

    def __init__(self, name: str, domain: Domain, limits: Limits) -> None:
        problems = limits.problems(domain)
        if problems:
            raise ValueError(f"bulkhead {name}: " + "; ".join(problems))
        self.name, self.domain, self.limits = name, domain, limits
        self.active = 0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self.refused = 0
        self.timed_out = 0
        self.completed = 0

    @property
    def queued(self) -> int:
        return len(self._waiting)

    async def run(self, tool: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run `call()` in a slot of this pool, bounded by the pool's timeout."""
        await self._acquire(tool)
        try:
            try:
                async with asyncio.timeout(self.limits.timeout_ms / 1000):
                    return await call()
            except TimeoutError as exc:
                self.timed_out += 1
                raise ToolTimedOut(self.name, tool, self.limits.timeout_ms) from exc
        finally:
            self.completed += 1
            self._release()

    @contextlib.asynccontextmanager
    async def slot(self, tool: str) -> AsyncIterator[Pool]:
        """Hold one slot of this pool for a protocol of several calls (the gateway's intent,
        dispatch and probes of one effect): admitted or refused exactly like `run`, but the
        caller bounds each of its calls by `limits.timeout_ms` itself (and counts `timed_out`)."""
        await self._acquire(tool)
        try:
            yield self
        finally:
            self.completed += 1
            self._release()

    async def _acquire(self, tool: str) -> None:
        if self.active < self.limits.concurrency and not self._waiting:
            self.active += 1
            return
        if len(self._waiting) >= self.limits.queue:
            self.refused += 1
            why = f"{self.active} running, {len(self._waiting)} waiting (queue {self.limits.queue})"
            raise BulkheadFull(self.name, self.domain, tool, self.limits, why)
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(slot)
        try:
            async with asyncio.timeout(self.limits.timeout_ms / 1000):
                await slot
        except BaseException as exc:
            if slot.done() and not slot.cancelled():
                self._release()  # the slot was handed over as we gave up: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiting.remove(slot)
            if isinstance(exc, TimeoutError):
                self.refused += 1
                why = f"no slot within {self.limits.timeout_ms} ms"
                raise BulkheadFull(self.name, self.domain, tool, self.limits, why) from exc
            raise

    def _release(self) -> None:
        """Hand the slot to the first live waiter, or free it."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.active -= 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "pool": self.name,
            "domain": self.domain.value,
            "concurrency": self.limits.concurrency,
            "queue": self.limits.queue,
            "timeoutMs": self.limits.timeout_ms,
            "active": self.active,
            "queued": self.queued,
            "refused": self.refused,
            "timedOut": self.timed_out,
            "completed": self.completed,
        }


class Bulkheads:
    """The pools of one gateway: one per domain, and one per tool that has limits of its own."""

    def __init__(
        self,
        domains: Mapping[Domain, Limits] = DEFAULT_LIMITS,
        tools: Mapping[str, ToolRule] | None = None,
        default_domain: Domain = Domain.EXTERNAL,
    ) -> None:
        missing = set(Domain) - set(domains)
        if missing:
            raise ValueError(f"bulkhead limits missing for {sorted(d.value for d in missing)}")
        self._domains = {domain: Pool(domain.value, domain, domains[domain]) for domain in Domain}
        self._tools = dict(tools or {})
        self.default_domain = default_domain
        self._own = {
            tool: Pool(f"tool:{tool}", rule.domain, rule.limits)
            for tool, rule in self._tools.items()
            if rule.limits is not None
        }

    @classmethod
    def from_settings(cls, settings: TenureSettings) -> Bulkheads:
        """From TenureSettings' bulkhead_* fields (TENURE_BULKHEAD_*)."""
        domains = {
            domain: Limits(
                getattr(settings, f"bulkhead_{domain.value}_concurrency"),
                getattr(settings, f"bulkhead_{domain.value}_queue"),
                getattr(settings, f"bulkhead_{domain.value}_timeout_ms"),
            )
            for domain in Domain
        }
        return cls(
            domains, parse_tool_rules(settings.bulkhead_tools), Domain(settings.bulkhead_default_domain)
        )

    def domain_of(self, tool: str) -> Domain:
        rule = self._tools.get(tool)
        return rule.domain if rule is not None else self.default_domain

    def pool_for(self, tool: str) -> Pool:
        return self._own.get(tool) or self._domains[self.domain_of(tool)]

    async def run(self, tool: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run `call()` in `tool`'s pool: BulkheadFull at once when it is full, ToolTimedOut late."""
        return await self.pool_for(tool).run(tool, call)

    def slot(self, tool: str) -> contextlib.AbstractAsyncContextManager[Pool]:
        """Hold a slot of `tool`'s pool for several calls (see `Pool.slot`)."""
        return self.pool_for(tool).slot(tool)

    def connection_limit(self) -> int:
        """HTTP connections the pools can use at once: size the client's pool to this."""
        return sum(p.limits.concurrency for p in (*self._domains.values(), *self._own.values()))

    def snapshot(self) -> list[dict[str, Any]]:
        return [p.snapshot() for p in (*self._domains.values(), *self._own.values())]


def parse_tool_rules(text: str) -> dict[str, ToolRule]:
    """`tool=domain[:concurrency/queue/timeout_ms],...` (TENURE_BULKHEAD_TOOLS), checked."""
    rules: dict[str, ToolRule] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        tool, _, rest = item.partition("=")
        domain_name, _, numbers = rest.partition(":")
        tool = tool.strip()
        try:
            domain = Domain(domain_name.strip())
        except ValueError:
            raise ValueError(
                f"bulkhead rule {item!r}: the domain must be local, internal or external"
            ) from None
        if not tool:
            raise ValueError(f"bulkhead rule {item!r} names no tool")
        limits = None
        if numbers:
            parts = numbers.split("/")
            if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
                raise ValueError(f"bulkhead rule {item!r}: limits are concurrency/queue/timeout_ms")
            limits = Limits(*(int(p) for p in parts))
            problems = limits.problems(domain)
            if problems:
                raise ValueError(f"bulkhead rule {item!r}: " + "; ".join(problems))
        rules[tool] = ToolRule(domain, limits)
    return rules
