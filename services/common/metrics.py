"""The runtime's Prometheus metrics, each defined once: processors, streams, projections.

Naming (https://prometheus.io/docs/practices/naming/, checked by tests/unit/test_metric_names.py):
every series is `tenure_<area>_<what>`; a counter ends in `_total` (prometheus_client appends it);
a histogram is a time in `_seconds` (or a size in `_bytes`); a gauge names its unit (`_records`,
`_partitions`, `_seconds`) or is a 0/1 flag (`_state`, `_up`). Labels are bounded: an aggregate,
a topic, a partition, a gate, a reason code; never a run, attempt, lease or command id.

Each process has its own registry (`metrics_registry`: the process and platform collectors plus
what the process defines), served on /metrics: the processors' on their health port
(services/common/health.py), the HTTP services' on their app (services/common/http_metrics.py).
A family is defined at most once per registry (`counter`, `gauge`, `histogram` hand back the one
already there), so two users of a name in one process share its series instead of clashing.

What a processor commits is counted in one place: the aggregate runtime calls
`ProcessorMetrics.committed(events)` once a transaction of a batch or a timer tick committed, and
each area's meter (services/<area>/metrics.py) counts the events it knows (lease grants, recovery
decisions, interventions, firings). A restore folds events already counted by whoever committed
them, so it counts nothing but its own time and size.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from services.common.eventlog import EventLog
from services.common.heap import GC_PAUSE_BUCKETS, gc_pauses
from services.common.kafka import InboundRecord, OffsetsStalled, OutboundRecord, follower_lags

__all__ = [
    "SECONDS_BUCKETS",
    "CommitHook",
    "FollowerLagCollector",
    "GcPauseCollector",
    "ProcessorMetrics",
    "ProjectionMetrics",
    "StreamMetrics",
    "counter",
    "gauge",
    "histogram",
    "metrics_registry",
]

# Batches commit in milliseconds; a broker hiccup stretches one to seconds.
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

CommitHook = Callable[[Sequence[object]], None]
M = TypeVar("M", Counter, Gauge, Histogram)

_families: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, Any]] = weakref.WeakKeyDictionary()
_families_lock = threading.Lock()


def metrics_registry() -> CollectorRegistry:
    """A registry with the process (CPU, memory, file descriptors) and platform collectors, and
    the lag of every log follower the process has open."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    registry.register(FollowerLagCollector())
    registry.register(GcPauseCollector())
    return registry


class GcPauseCollector(Collector):
    """`tenure_process_gc_pause_seconds{generation}`: the cyclic collector's passes, timed
    (services/common/heap.py), and the longest of each generation. No thread of the process runs
    during a pass, so a pause lands on whatever answer is in flight: a p99 spike beside a full
    pass (generation 2) is the collector's."""

    def collect(self) -> Iterator[Metric]:
        pauses = sorted(gc_pauses().items())
        histogram_family = HistogramMetricFamily(
            "tenure_process_gc_pause_seconds",
            "Passes of the cyclic garbage collector, by generation (0 young, 1 middle, 2 full), "
            "since the process began serving.",
            labels=["generation"],
        )
        longest = GaugeMetricFamily(
            "tenure_process_gc_pause_longest_seconds",
            "The longest pass of each generation of the garbage collector since the process began serving.",
            labels=["generation"],
        )
        for generation, p in pauses:
            buckets = [(str(bound), float(n)) for bound, n in zip(GC_PAUSE_BUCKETS, p.buckets, strict=True)]
            buckets.append(("+Inf", float(p.count)))
            histogram_family.add_metric([str(generation)], buckets, p.total_s)
            longest.add_metric([str(generation)], p.longest_s)
        yield histogram_family
        yield longest


class FollowerLagCollector(Collector):
    """`tenure_follower_lag_records{follower,topic,partition}`: how far each log follower of the
    process (the API's own views and decision followers, the gateway's boards, the processors'
    policy feeds) is behind the partition's end, read at scrape time from what its fetches heard.

    The processors' command consumers report `tenure_consumer_lag_records`; these are the readers
    that follow a log without a consumer group. `follower` is the follower's client id: one per
    kind of follower, never a run's."""

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "tenure_follower_lag_records",
            "Records of a partition a log follower has not read yet: the partition's end as the "
            "follower's last fetch heard it, minus its position.",
            labels=["follower", "topic", "partition"],
        )
        # Two followers of one kind on one partition (concurrent as-of reads) are one series: the
        # further behind.
        worst: dict[tuple[str, str, str], int] = {}
        for client_id, topic, partition, lag in follower_lags():
            key = (client_id, topic, str(partition))
            worst[key] = max(lag, worst.get(key, 0))
        for labels, lag in sorted(worst.items()):
            family.add_metric(list(labels), lag)
        yield family


def _family(kind: type[M], registry: CollectorRegistry, name: str, make: Callable[[], M]) -> M:
    with _families_lock:
        known = _families.setdefault(registry, {})
        family = known.get(name)
        if family is None:
            family = known[name] = make()
        if not isinstance(family, kind):
            raise TypeError(f"{name} is already a {type(family).__name__} in this registry")
        return family


def counter(registry: CollectorRegistry, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
    """The counter `name` (without `_total`: the client appends it) of `registry`."""
    return _family(Counter, registry, name, lambda: Counter(name, doc, list(labels), registry=registry))


def gauge(registry: CollectorRegistry, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
    return _family(Gauge, registry, name, lambda: Gauge(name, doc, list(labels), registry=registry))


def histogram(
    registry: CollectorRegistry,
    name: str,
    doc: str,
    labels: Sequence[str] = (),
    buckets: Sequence[float] = SECONDS_BUCKETS,
) -> Histogram:
    return _family(
        Histogram,
        registry,
        name,
        lambda: Histogram(name, doc, list(labels), buckets=tuple(buckets), registry=registry),
    )


def _deadletters(registry: CollectorRegistry) -> Counter:
    """One name and meaning for dead letters, whichever process sets them aside."""
    return counter(
        registry, "tenure_deadletters", "Records set aside on tenure.deadletter, by reason code.", ["reason"]
    )


class ProcessorMetrics:
    """What a command processor counts; `aggregate` ("run", "trajectory") labels every series."""

    def __init__(self, aggregate: str, registry: CollectorRegistry | None = None) -> None:
        self.aggregate = aggregate
        self.registry = registry if registry is not None else CollectorRegistry()
        r, labels = self.registry, ["aggregate"]
        self._batches = counter(r, "tenure_processor_batches", "Command batches committed.", labels)
        self._commands = counter(
            r,
            "tenure_processor_commands",
            "Commands handled, by outcome: accepted, rejected, duplicate, deadlettered (undecodable "
            "or misaddressed) or failed (its handling raised: dead-lettered and refused).",
            [*labels, "outcome"],
        )
        self._events = counter(r, "tenure_processor_events", "Events committed.", labels)
        self._batch_seconds = histogram(
            r,
            "tenure_processor_batch_seconds",
            "Time to handle one command batch: decide every command, one transaction, one store write.",
            labels,
        )
        self._transaction = histogram(
            r,
            "tenure_processor_transaction_seconds",
            "Time of one Kafka transaction of a batch or timer tick (produce, flush, commit).",
            labels,
        )
        self._aborted = counter(
            r,
            "tenure_processor_transactions_aborted",
            "Kafka transactions that did not commit (aborted, or the writer fenced): the batch or "
            "tick is restored from the log and retried.",
            labels,
        )
        self._offsets_stalled = counter(
            r,
            "tenure_processor_offsets_stalled",
            "Generation-fence offset sends that librdkafka did not return from in time (the group "
            "coordinator away): the writer took a new producer under the same transactional id.",
            labels,
        )
        self._restores = counter(r, "tenure_processor_restores", "Partitions restored from the log.", labels)
        self._restored_events = counter(
            r,
            "tenure_processor_restored_events",
            "Events restored partitions hold the fold of: folded, or counted by the versions of the states"
            " taken from the state changelog.",
            labels,
        )
        self._restore_seconds = histogram(
            r, "tenure_processor_restore_seconds", "Time to restore one partition from the log.", labels
        )
        self._changelog_states = counter(
            r,
            "tenure_processor_changelog_states",
            "States a restore took from the aggregate's state changelog instead of folding their events.",
            labels,
        )
        self._changelog_records = counter(
            r,
            "tenure_processor_changelog_records",
            "State changelog records read by restores (what compaction had not yet removed included).",
            labels,
        )
        self._deadletters = _deadletters(r)
        self._hooks: list[CommitHook] = []

    def batch(self, outcomes: dict[str, int], events: int) -> None:
        self._batches.labels(self.aggregate).inc()
        for outcome, count in outcomes.items():
            if count:
                self._commands.labels(self.aggregate, outcome).inc(count)
        if events:
            self._events.labels(self.aggregate).inc(events)

    def batch_took(self, seconds: float) -> None:
        self._batch_seconds.labels(self.aggregate).observe(seconds)

    def transaction(self, seconds: float) -> None:
        self._transaction.labels(self.aggregate).observe(seconds)

    def aborted(self) -> None:
        self._aborted.labels(self.aggregate).inc()

    def offsets_stalled(self) -> None:
        self._offsets_stalled.labels(self.aggregate).inc()

    def restored(self, events: int, seconds: float) -> None:
        self._restores.labels(self.aggregate).inc()
        if events:
            self._restored_events.labels(self.aggregate).inc(events)
        self._restore_seconds.labels(self.aggregate).observe(seconds)

    def restored_from_changelog(self, states: int, records: int) -> None:
        self._changelog_states.labels(self.aggregate).inc(states)
        self._changelog_records.labels(self.aggregate).inc(records)

    def deadlettered(self, reason: str) -> None:
        self._deadletters.labels(reason).inc()

    # --- what was committed -------------------------------------------------------------------

    def on_commit(self, hook: CommitHook) -> None:
        """Have `hook` see the events of every committed transaction (an area's meter)."""
        self._hooks.append(hook)

    def committed(self, events: Iterable[tuple[object, int]]) -> None:
        """The runtime's one call after a transaction committed: (event, partition) pairs."""
        if not self._hooks:
            return
        decided = [event for event, _ in events]
        if decided:
            for hook in self._hooks:
                hook(decided)

    def watch(self, event_log: EventLog) -> EventLog:
        """`event_log`, with every commit that raises counted as an aborted transaction."""
        return _MeteredLog(event_log, self)


class _MeteredLog:
    """The processor's event log, counting the transactions that did not commit."""

    def __init__(self, inner: EventLog, metrics: ProcessorMetrics) -> None:
        self._inner = inner
        self._metrics = metrics

    def commit(self, records: Sequence[OutboundRecord]) -> dict[tuple[str, int], int]:
        try:
            return self._inner.commit(records)
        except BaseException as exc:
            if records:
                self._metrics.aborted()
                if isinstance(exc, OffsetsStalled):
                    self._metrics.offsets_stalled()
            raise

    def read(self, topic: str, partition: int, start_offset: int) -> Iterator[InboundRecord]:
        return self._inner.read(topic, partition, start_offset)

    def end_offset(self, topic: str, partition: int) -> int:
        return self._inner.end_offset(topic, partition)

    def __getattr__(self, name: str) -> Any:
        # Whatever else the log offers (close, batch reads) is the log's own.
        return getattr(self._inner, name)


Highwater = Callable[[str, int], int | None]


class StreamMetrics:
    """What the stream runtime counts: retried transient failures, rebalances and consumer lag."""

    def __init__(self, app: str, registry: CollectorRegistry | None = None) -> None:
        self.app = app
        self.registry = r = registry if registry is not None else CollectorRegistry()
        self._retries = counter(
            r,
            "tenure_stream_retries",
            "Transient failures retried with backoff, by the work that failed (batch, tick, assign).",
            ["app", "work"],
        )
        self._assignments = counter(
            r, "tenure_stream_assignments", "Partition assignments received.", ["app"]
        )
        self._partitions = gauge(
            r,
            "tenure_stream_assigned_partitions",
            "Partitions of the command topic this process owns.",
            ["app"],
        )
        self._lag = gauge(
            r,
            "tenure_consumer_lag_records",
            "Records of a partition not yet handled: the partition's high watermark as the consumer "
            "last fetched it, minus the offset after the last batch handled.",
            ["topic", "partition"],
        )

    def retried(self, work: str) -> None:
        self._retries.labels(self.app, work).inc()

    def assigned(self, partitions: int) -> None:
        self._assignments.labels(self.app).inc()
        self._partitions.labels(self.app).set(partitions)

    def revoked(self) -> None:
        self._partitions.labels(self.app).set(0)
        self._lag.clear()  # whoever owns them now reports their lag

    def consumed(self, records: Sequence[InboundRecord], highwater: Highwater) -> None:
        """After a batch was handled: the lag of each partition it came from."""
        last: dict[tuple[str, int], int] = {}
        for record in records:
            key = (record.topic, record.partition)
            last[key] = max(last.get(key, -1), record.offset)
        for (topic, partition), offset in last.items():
            end = highwater(topic, partition)
            if end is not None:
                self._lag.labels(topic, str(partition)).set(max(0, end - offset - 1))


class ProjectionMetrics:
    """What the projector counts: records folded into views and dead letters, per topic."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        self._records = counter(
            r, "tenure_projection_records", "Records of an event topic folded into the views.", ["topic"]
        )
        self._caught_up = gauge(
            r,
            "tenure_projection_caught_up",
            "1 once the views have folded their topic up to its end as of start-up.",
            ["topic"],
        )
        self._deadletters = _deadletters(r)

    def folded(self, topic: str, records: int) -> None:
        self._records.labels(topic).inc(records)

    def caught_up(self, topic: str) -> None:
        self._caught_up.labels(topic).set(1)

    def deadlettered(self, reason: str) -> None:
        self._deadletters.labels(reason).inc()
