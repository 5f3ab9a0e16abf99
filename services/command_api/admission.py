"""Admission control for batch renewals (TENURE_API_SHED_AFTER_MS; docs/architecture.md,
"Admission control for batch renewals").

A request is refused with 503 `overloaded` and Retry-After, before anything is published, while
a request this API instance admitted earlier has been unanswered longer than the limit, or a
batch it published has waited that long for its decisions. Otherwise it counts as admitted
until it answers.

Why: a coordinator that falls behind decides every renewal late, and past the request's
deadline each answer is work thrown away, so a queue that outgrows the deadline never drains
(docs/benchmarks.md, "100,000 live leases"). Refusing new batches keeps it short: what is
admitted is decided in time, and a runner's retry after Retry-After (its lease has a TTL of many
heartbeats) finds the queue drained. Nothing refused was recorded.

The admitted request's whole time counts, not only its wait for decisions: a batch can also
wait before it publishes anything (its brief reads queue for the thread pool, the event loop is
behind), and that wait is the API's backlog as much as the coordinator's.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter

from services.command_api.problems import ApiProblem

__all__ = ["AdmissionControl"]


class AdmissionControl:
    """Admits or refuses requests by the age of the oldest one still unanswered."""

    def __init__(
        self,
        registry: CollectorRegistry,
        retry_after_s: int,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._shed_total = Counter(
            "tenure_api_requests_shed_total",
            "Requests refused unpublished by admission control (TENURE_API_SHED_AFTER_MS), by route.",
            ["route"],
            registry=registry,
        )
        self._retry_after_s = retry_after_s
        self._monotonic = monotonic
        # Admitted requests still unanswered: admission time by ticket, oldest first.
        self._admitted: dict[int, float] = {}
        self._tickets = itertools.count()

    @contextmanager
    def admitted(self, route: str, limit_s: float, published_wait_s: float) -> Iterator[None]:
        """Refuse (`check`), or count the request as admitted until the block ends.

        `published_wait_s`: how long the oldest batch this instance published has waited for
        its decisions; `limit_s` <= 0 admits everything."""
        self.check(route, limit_s, published_wait_s)
        ticket = next(self._tickets)
        self._admitted[ticket] = self._monotonic()
        try:
            yield
        finally:
            del self._admitted[ticket]

    def oldest_admitted_s(self) -> float:
        """How long the oldest admitted, unanswered request has run (0: none runs)."""
        oldest = next(iter(self._admitted.values()), None)
        return 0.0 if oldest is None else max(0.0, self._monotonic() - oldest)

    def check(self, route: str, limit_s: float, published_wait_s: float) -> None:
        """503 `overloaded` with Retry-After while the oldest admitted or published request has
        waited longer than `limit_s`."""
        if limit_s <= 0:
            return
        waited = max(published_wait_s, self.oldest_admitted_s())
        if waited <= limit_s:
            return
        self._shed_total.labels(route).inc()
        raise ApiProblem(
            "overloaded",
            f"this API is behind: a batch renewal it admitted or published {waited:.1f}s ago is "
            f"still unanswered (TENURE_API_SHED_AFTER_MS={limit_s * 1000:g}); nothing was sent",
            headers={"Retry-After": str(self._retry_after_s)},
            retryAfterSeconds=self._retry_after_s,
            oldestWaitMs=int(waited * 1000),
        )
