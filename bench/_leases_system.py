"""The system the lease benchmark drives (bench/leases.py): its services as subprocesses (one or
more lease coordinator instances in one consumer group, each with its own health port, which says
the partitions it owns), the runs it submits straight to runs.commands, and a watcher of
runs.events for expiry stamps and commit markers; plus the tenant and lease length its phases use."""

from __future__ import annotations

import bisect
import re
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
from confluent_kafka import Producer

from bench._foundation_toolkit import wait_for_views
from bench.foundation import Service, ViewTracker, publish_all, say, service_env, spawn, submit_command
from services.common.broker import free_port
from services.common.kafka import TopicFollower
from services.common.messages import MessageCodec
from services.common.topics import RUNS_EVENTS

__all__ = [
    "COORDINATOR_HEALTH_PORTS",
    "DECISION_TIMEOUT_S",
    "LEASE_EXPIRED",
    "LEASE_SECONDS",
    "TENANT",
    "EventWatch",
    "coordinator_partitions",
    "gc_pauses",
    "gc_summary",
    "keepalive_fraction",
    "start_services",
    "submit_runs",
]

TENANT = "bench"
# Each run's deadline (EXE-10) from its claim: 100,000 runs take 9-14 minutes to claim, and with
# the foundation bench's 10 minutes the first runs' deadlines fell in the window (2026-12-06 18:54:
# 6,994 DeadlineReached and 6,947 RunInterrupted, each materialising a kept renewal first).
RUN_TIMEOUT_SECONDS = 24 * 3600
LEASE_SECONDS = 90  # renewal runs: long enough that no lease of a step goes at risk (45 s) or expires


def keepalive_fraction(logged_every: int, heartbeat_s: int, lease_s: int = LEASE_SECONDS) -> float:
    """The coordinator's TENURE_LEASE_KEEPALIVE_FRACTION that puts one renewal in `logged_every`
    on runs.events at heartbeat H with `lease_s` leases: a renewal goes there once the last
    one there is `fraction` x TTL old. Tenure's defaults until 2026-12-06's evening (90 s lease,
    20 s heartbeat, 0.5) logged one renewal in three (at 20 and 40 s kept, at 60 s logged); the
    bench compresses the heartbeat to 1-5 s at the same 90 s lease, where 0.5 would log one in 45
    at H=1, so for `--logged-every N` it sets the threshold
    to `logged_every` heartbeats (minus half a heartbeat, so jitter does not move a renewal across
    it). One value for the whole run, set from its shortest H: a longer H logs more, not fewer."""
    return (logged_every - 0.5) * heartbeat_s / lease_s


DECISION_TIMEOUT_S = 10
LEASE_EXPIRED = b"tenure.runs.events.LeaseExpired"


# --- following runs.events: expiry stamps and commit markers ----------------------------------


class EventWatch:
    """Follows runs.events (read_committed) in a thread: when each LeaseExpired became readable,
    and the offsets of every event, so the commit markers of a time window can be counted."""

    def __init__(self, bootstrap: str) -> None:
        self._follower = TopicFollower(bootstrap, [RUNS_EVENTS.name], "end", client_id="tenure-bench-watch")
        self.expired_seen_ms: dict[str, int] = {}
        self._offsets: dict[int, list[int]] = {}
        self._types: dict[int, list[bytes]] = {}  # each offset's schema, beside `_offsets`
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="event-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for r in self._follower.poll(max_records=5000, timeout_s=0.05):
                    self._offsets.setdefault(r.partition, []).append(r.offset)
                    schema = next((v for k, v in r.headers if k == "tenure-schema"), b"")
                    self._types.setdefault(r.partition, []).append(schema)
                    if schema == LEASE_EXPIRED:
                        run_id = r.key.decode() if r.key else ""
                        self.expired_seen_ms.setdefault(run_id, time.time_ns() // 1_000_000)
        except BaseException as exc:  # reported by check(): a dead watcher would make figures wrong
            self._error = exc

    def check(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"runs.events watcher failed: {self._error!r}") from self._error

    def markers(self, start: dict[int, int], end: dict[int, int]) -> tuple[int, int]:
        """(events, non-event offsets) between two end-offset snapshots: the latter are the
        transaction markers, one per partition a transaction wrote to."""
        time.sleep(0.5)  # let the watcher read up to `end`; the range is fixed, later records don't count
        self.check()
        events = 0
        for partition, stop in end.items():
            seen = self._offsets.get(partition, [])
            events += bisect.bisect_left(seen, stop) - bisect.bisect_left(seen, start.get(partition, 0))
        return events, sum(end.values()) - sum(start.values()) - events

    def types(self, start: dict[int, int], end: dict[int, int]) -> Counter[str]:
        """Events between two end-offset snapshots by schema (call after `markers`): what a
        window put on runs.events."""
        counts: Counter[str] = Counter()
        for partition, stop in end.items():
            seen, types = self._offsets.get(partition, []), self._types.get(partition, [])
            low, high = bisect.bisect_left(seen, start.get(partition, 0)), bisect.bisect_left(seen, stop)
            counts.update(t.decode(errors="replace").rsplit(".", 1)[-1] for t in types[low:high])
        return counts

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10.0)
        self._follower.close()


# --- the services, one or more coordinator instances, and the runs they serve -----------------


# Each coordinator's health port, to say which partitions each owned during a step.
COORDINATOR_HEALTH_PORTS: dict[str, int] = {}


def coordinator_partitions() -> str:
    """How many command partitions each coordinator owns now (its tenure_stream_assigned_partitions)."""
    owned = []
    for name, port in COORDINATOR_HEALTH_PORTS.items():
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=3.0).text
            found = re.search(r"^tenure_stream_assigned_partitions\{[^}]*\} (\S+)$", text, re.M)
            owned.append(f"{name} {int(float(found.group(1))) if found else '?'}")
        except httpx.HTTPError as exc:
            owned.append(f"{name} ? ({type(exc).__name__})")
    return ", ".join(owned)


def gc_pauses(api_port: int) -> dict[str, dict[str, float]]:
    """Per service (the API and each coordinator): the garbage collector's passes so far from its
    /metrics (tenure_process_gc_pause_seconds): count and seconds of each generation, how many
    passes of any generation took over 100 ms, and the longest of each generation since the
    process began. Empty for a service that did not answer."""
    ports = {"command_api": api_port, **COORDINATOR_HEALTH_PORTS}
    found: dict[str, dict[str, float]] = {}
    for name, port in ports.items():
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10.0).text
        except httpx.HTTPError:
            found[name] = {}
            continue
        figures: dict[str, float] = {"over_100ms": 0.0}
        for suffix, generation, value in re.findall(
            r'^tenure_process_gc_pause_seconds_(count|sum)\{generation="(\d)"\} (\S+)$', text, re.M
        ):
            figures[f"g{generation}_{suffix}"] = float(value)
        for generation, value in re.findall(
            r'^tenure_process_gc_pause_seconds_bucket\{generation="(\d)",le="0\.1"\} (\S+)$', text, re.M
        ):
            figures["over_100ms"] += figures.get(f"g{generation}_count", 0.0) - float(value)
        for generation, value in re.findall(
            r'^tenure_process_gc_pause_longest_seconds\{generation="(\d)"\} (\S+)$', text, re.M
        ):
            figures[f"g{generation}_longest"] = float(value)
        found[name] = figures
    return found


def gc_summary(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> str:
    """What the collector did between two `gc_pauses`, per service, for the report."""
    parts = []
    for name, late in after.items():
        early = before.get(name, {})
        if not late or not early:
            parts.append(f"{name}: not scraped")
            continue
        delta = {k: late.get(k, 0.0) - early.get(k, 0.0) for k in late}
        # The longest pass is kept since the process began: one in the window only if it grew.
        longest = max(
            (late[k] for k in late if k.endswith("_longest") and late[k] > early.get(k, 0.0)), default=None
        )
        parts.append(
            f"{name}: {delta.get('g2_count', 0):.0f} full passes ({delta.get('g2_sum', 0) * 1000:,.0f} ms), "
            f"{delta.get('g1_count', 0):.0f} middle ({delta.get('g1_sum', 0) * 1000:,.0f} ms), "
            f"{delta.get('g0_count', 0):.0f} young ({delta.get('g0_sum', 0) * 1000:,.0f} ms), "
            f"{delta.get('over_100ms', 0):.0f} over 100 ms"
            + (f", the longest {longest * 1000:,.0f} ms" if longest is not None else "")
        )
    return "; ".join(parts)


def start_services(
    bootstrap: str, workdir: Path, tag: str, coordinators: int = 1, keepalive: float | None = None
) -> tuple[list[Service], int]:
    """As bench.foundation's, plus the decision timeout the lease API is run with; with
    `coordinators` > 1, that many lease coordinators in one consumer group (issue 16), each with
    its own instance id, state folder and health port, listed after the API; `keepalive`: the
    coordinators' TENURE_LEASE_KEEPALIVE_FRACTION (None: Tenure's default)."""
    port, views_dir = free_port(), workdir / "views"
    api_env = service_env(
        bootstrap, views_dir, TENURE_API_PORT=str(port), TENURE_DECISION_TIMEOUT_S=str(DECISION_TIMEOUT_S)
    )

    def coordinator(index: int) -> Service:
        name = "lease_coordinator" if index == 0 else f"lease_coordinator-{index}"
        state = workdir / ("coordinator" if index == 0 else f"coordinator-{index}")
        COORDINATOR_HEALTH_PORTS[name] = port = free_port()
        env = service_env(
            bootstrap,
            state,
            TENURE_INSTANCE_ID=f"bench-{tag}" if coordinators == 1 else f"bench-{tag}-{index}",
            TENURE_COORDINATOR_HEALTH_PORT=str(port),
            **({} if keepalive is None else {"TENURE_LEASE_KEEPALIVE_FRACTION": f"{keepalive:.6f}"}),
        )
        return spawn(name, "services.lease_coordinator", state, env)

    services = [
        coordinator(0),
        spawn("projections", "services.projections", views_dir, service_env(bootstrap, views_dir)),
        spawn("command_api", "services.command_api", workdir / "api", api_env),
    ]
    services += [coordinator(i) for i in range(1, coordinators)]
    return services, port


def submit_runs(
    bootstrap: str, workdir: Path, run_count: int, tag: str, services: list[Service], tenants: int = 1
) -> tuple[list[str], float]:
    path = wait_for_views(workdir / "views", services[1])
    tracker = ViewTracker(bootstrap, path, workdir / "tracker")
    try:
        codec = MessageCodec()
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": "tenure-bench-commands",
                "partitioner": "murmur2_random",
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
            }
        )
        warmup = [submit_command(codec, TENANT, f"{tag}-warmup")]
        publish_all(producer, tracker, warmup)
        tracker.wait([warmup[0][0]], 120.0, "(b) warm-up", services)
        # Runs are routed by tenant (services/common/routing.py: a tenant's runs share a
        # partition), so only several tenants spread the load over partitions and coordinators.
        names = [TENANT] if tenants == 1 else [f"{TENANT}-{t}" for t in range(tenants)]
        prepared = [
            submit_command(codec, names[i % tenants], f"{tag}-lease-{i:07d}", RUN_TIMEOUT_SECONDS)
            for i in range(run_count)
        ]
        say(f"(b) producing {run_count} SubmitRun commands, waiting for their views")
        started = time.monotonic()
        publish_all(producer, tracker, prepared)
        run_ids = [r for r, _ in prepared]
        tracker.wait(run_ids, max(120.0, run_count / 50), "(b) submit", services)
        return run_ids, time.monotonic() - started
    finally:
        tracker.close()
