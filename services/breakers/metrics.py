"""The circuit breakers' state as a Prometheus gauge (BRK-1, BRK-2).

`tenure_breaker_state{endpoint,state}`: 1 for the state each breaker is in, 0 for the other four,
read from the breakers processor's store when scraped. Read, not counted from events, so it is
right after a restart (the restore folds transitions no hook sees) and forgets the breakers of
partitions this instance no longer owns. Endpoints are the tools' ids: a bounded set.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from services.breakers.domain import BreakerState, BreakerStatus

__all__ = ["BreakerStateCollector"]


class BreakerStateCollector(Collector):
    def __init__(self, states: Callable[[], Iterable[BreakerState]]) -> None:
        self._states = states

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "tenure_breaker_state",
            "1 for the state the endpoint's breaker is in (closed, open, half-open, forced-open, "
            "disabled), 0 for the others.",
            labels=["endpoint", "state"],
        )
        for state in sorted(self._states(), key=lambda s: s.endpoint):
            for status in BreakerStatus:
                family.add_metric([state.endpoint, status.value], 1.0 if state.status is status else 0.0)
        yield family

    def register(self, registry: CollectorRegistry) -> None:
        with contextlib.suppress(ValueError):  # another breakers processor here reports them
            registry.register(self)
