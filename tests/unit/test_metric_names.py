"""Every tenure_* metric follows Prometheus naming, is defined once, and has bounded labels.

https://prometheus.io/docs/practices/naming/: a counter's samples end in `_total`; a histogram
measures a time in `_seconds` (or a size in `_bytes`); a gauge names its unit (`_seconds`,
`_bytes`, `_records`, `_partitions`, `_ratio`) or is a 0/1 flag (`_state`, `_up`, `_info`);
names are snake_case with one `tenure_` prefix. Labels never carry an id of a run, attempt,
lease, command or event, nor a raw path: the series count must not grow with the traffic.

Two views, so neither can hide a metric: the families the metrics classes register (collected
from real registries), and every definition site in services/ (read from the source), each of
which must name a distinct metric.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from services.breakers.domain import BreakerState, BreakerStatus
from services.breakers.metrics import BreakerStateCollector
from services.command_api.context import ApiContext
from services.common.http_metrics import HttpMetrics
from services.common.metrics import ProcessorMetrics, ProjectionMetrics, StreamMetrics
from services.lease_coordinator.metrics import LeaseMetrics
from services.saga_orchestrator.metrics import RecoveryMetrics
from services.schedules.metrics import ScheduleMetrics
from services.watchdog.metrics import WatchdogMetrics

SERVICES = Path(__file__).resolve().parents[2] / "services"
NAME = re.compile(r"^tenure_[a-z][a-z0-9]*(_[a-z0-9]+)*$")
GAUGE_SUFFIXES = ("_seconds", "_bytes", "_records", "_partitions", "_ratio", "_state", "_up", "_info")
HISTOGRAM_SUFFIXES = ("_seconds", "_bytes")
# Labels whose values grow with the traffic: one series per run (or request) is a memory leak.
UNBOUNDED_LABELS = {
    "run_id",
    "run",
    "attempt_id",
    "lease_id",
    "command_id",
    "event_id",
    "correlation_id",
    "idempotency_key",
    "path",
    "url",
    "holder",
    "actor",
    "tenant",
}
# Where metrics are defined: the helpers of services/common/metrics.py and prometheus_client's
# own constructors (e.g. the runner host's histogram, the breaker collector's family).
DEFINITION = re.compile(
    r"\b(counter|gauge|histogram)\(\s*\w+,\s*\"(tenure_\w+)\""
    r"|\b(Counter|Gauge|Histogram|Summary|GaugeMetricFamily|CounterMetricFamily|HistogramMetricFamily)\(\s*\"(tenure_\w+)\"",
)
KIND = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "summary": "summary"}


def registries() -> list[CollectorRegistry]:
    """The registries of a processor (every metrics class) and of the API, as the processes build them."""
    processor = CollectorRegistry()
    for aggregate in ("run", "trajectory", "watchdog", "schedule", "breaker", "quarantine"):
        ProcessorMetrics(aggregate, processor)
    metrics = ProcessorMetrics("run", processor)
    LeaseMetrics(metrics)
    RecoveryMetrics(metrics)
    WatchdogMetrics(metrics)
    ScheduleMetrics(metrics)
    StreamMetrics("tenure-test", processor)
    ProjectionMetrics(processor)
    breaker = BreakerState(endpoint="env/vm.provision", version=1, status=BreakerStatus.CLOSED)
    BreakerStateCollector(lambda: [breaker]).register(processor)
    api = ApiContext().metrics
    HttpMetrics(lambda scope, receive, send: None, api)  # type: ignore[arg-type,return-value]
    return [processor, api]


def registered_families() -> list[tuple[Metric, set[str]]]:
    """Every tenure_ family with its label names (declared ones, or those of its samples)."""
    families = []
    for registry in registries():
        # prometheus_client keeps a metric's declared label names on it; a collector's are on
        # its samples. Both are what a scrape would show.
        declared = {
            name: set(getattr(collector, "_labelnames", ()))
            for collector in list(registry._collector_to_names)
            for name in registry._collector_to_names[collector]
        }
        for family in registry.collect():
            if family.name.startswith("tenure_"):
                labels = {label for sample in family.samples for label in sample.labels} - {"le"}
                families.append((family, labels | declared.get(family.name, set())))
    return families


def check(name: str, kind: str, labels: set[str]) -> list[str]:
    problems = []
    if not NAME.match(name):
        problems.append(f"{name}: not tenure_ snake_case")
    if kind == "counter" and name.endswith("_total"):
        problems.append(f"{name}: a counter's family name gets `_total` from the client, once")
    if kind == "histogram" and not name.endswith(HISTOGRAM_SUFFIXES):
        problems.append(f"{name}: a histogram measures seconds or bytes")
    if kind == "gauge" and not name.endswith(GAUGE_SUFFIXES):
        problems.append(f"{name}: a gauge names its unit ({', '.join(GAUGE_SUFFIXES)})")
    if kind not in ("counter", "gauge", "histogram"):
        problems.append(f"{name}: {kind}s are not used (a histogram aggregates across instances)")
    unbounded = labels & UNBOUNDED_LABELS
    if unbounded or any(label.endswith("_id") for label in labels):
        problems.append(f"{name}: unbounded label(s) {sorted(labels)}")
    return problems


def test_every_registered_family_follows_the_prometheus_naming_rules() -> None:
    families = registered_families()
    names = {f.name for f, _ in families}
    assert {
        "tenure_processor_batch_seconds",
        "tenure_processor_transactions_aborted",
        "tenure_consumer_lag_records",
        "tenure_lease_grants",
        "tenure_recovery_decisions",
        "tenure_breaker_state",
        "tenure_watchdog_interventions",
        "tenure_schedule_firing_lag_seconds",
        "tenure_http_requests",
        "tenure_http_request_duration_seconds",
    } <= names
    problems = []
    for family, labels in families:
        problems += check(family.name, family.type, labels)
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family.name
    assert problems == []


def test_every_definition_in_services_follows_the_rules_and_names_a_distinct_metric() -> None:
    sites: list[tuple[str, str, str]] = []
    for source in sorted(SERVICES.rglob("*.py")):
        text = source.read_text(encoding="utf-8")
        for match in DEFINITION.finditer(text):
            helper, helper_name, constructor, constructor_name = match.groups()
            kind = (helper or constructor).lower().removesuffix("metricfamily")
            sites.append(
                (helper_name or constructor_name, KIND.get(kind, kind), str(source.relative_to(SERVICES)))
            )
    # A counter may be spelled with `_total` (the client strips it): the family name counts.
    names = Counter(name.removesuffix("_total") for name, _, _ in sites)
    assert [name for name, count in names.items() if count > 1] == [], "each metric is defined once"
    registered = {f.name for f, _ in registered_families()}
    assert registered <= set(names), f"definitions the scan missed: {registered - set(names)}"
    problems = [p for name, kind, _ in sites for p in check(name.removesuffix("_total"), kind, set())]
    assert problems == []
    assert "tenure_runner_host_containment_seconds" in names, "the scan sees prometheus_client's own"


def test_the_rules_refuse_a_unitless_gauge_a_unitless_histogram_and_a_run_id_label() -> None:
    assert check("tenure_stream_partitions_assigned", "gauge", set())
    assert check("tenure_processor_batch", "histogram", set())
    assert check("tenure_lease_grants", "counter", {"run_id"})
    assert check("tenure_lease_grants", "counter", {"lease_id"})
    assert check("tenure_http_requests", "counter", {"path"})
    assert check("tenure_lease_grants_total", "counter", set())
    assert check("tenure_lease_grants", "counter", {"via"}) == []
