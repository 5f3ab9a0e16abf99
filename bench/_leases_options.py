"""The lease benchmark's command line (bench/leases.py): its options, their defaults and the
checks on their ranges."""

from __future__ import annotations

import argparse

from bench._leases_io import CLIENTS
from bench._leases_system import LEASE_SECONDS, keepalive_fraction

__all__ = ["parse_args"]


def parse_args(argv: list[str] | None, description: str | None) -> argparse.Namespace:
    """The options of `python -m bench.leases`; `description` is that module's docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.leases",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=2000, help="runs heartbeating in each step (R)")
    parser.add_argument(
        "--heartbeat-seconds",
        default="8,4,2",
        help="heartbeat interval H of each step, comma-separated whole seconds",
    )
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of heartbeats per step (D)")
    parser.add_argument("--runners", type=int, default=20, help="simulated runners (one HTTP pool each)")
    parser.add_argument(
        "--lease-seconds",
        type=int,
        default=LEASE_SECONDS,
        help=f"the TTL each run is claimed with (default {LEASE_SECONDS}; up to 3600, Tenure's bound): "
        "claims go at about 150/s here, so 100,000 runs need a TTL longer than their claiming "
        "(bench/_leases_keeper.py)",
    )
    parser.add_argument(
        "--expiry-runs",
        type=int,
        default=200,
        help="2 s leases left to expire, idle and again in each step (K; 0: skip)",
    )
    parser.add_argument("--raw-n", type=int, default=20_000, help="records in the raw phase")
    parser.add_argument(
        "--client",
        choices=sorted(CLIENTS),
        default="aiohttp",
        help="HTTP client of the simulated runners and claims (httpx costs the bench "
        "~1-3 ms CPU per request, aiohttp ~0.15 ms: see docs/benchmarks.md)",
    )
    parser.add_argument("--concurrency", type=int, default=32, help="claims/reports in flight at once")
    parser.add_argument(
        "--batch",
        type=int,
        default=0,
        help="renew through POST /leases:renew, this many leases a request (1-500; 0: one "
        "POST /attempts/{id}/heartbeat per lease)",
    )
    parser.add_argument(
        "--tenants",
        type=int,
        default=1,
        help="tenants the runs are spread over (1-64): a tenant's runs share one partition, so "
        "only several tenants spread the load over partitions and coordinator instances",
    )
    parser.add_argument(
        "--coordinators",
        type=int,
        default=1,
        help="lease coordinator instances in one consumer group (1-4; issue 16's two-instance figures)",
    )
    parser.add_argument(
        "--logged-every",
        type=int,
        default=0,
        help="at the shortest H, one renewal in this many goes on runs.events (the coordinator's "
        "keepalive fraction is set for it): 3 is what Tenure's defaults gave at a 20 s heartbeat "
        "until 2026-12-06's evening; 0 (the default) leaves the fraction at Tenure's default (40 "
        "TTLs: one renewal an hour there, none in a window at H=1)",
    )
    parser.add_argument(
        "--warm-up-seconds",
        type=float,
        default=None,
        help="heartbeats before each measured window, on a row of their own (default: 3 heartbeats, "
        "at least 10 s): each run's first heartbeat starts it, so without a warm-up every run of the "
        "step starts inside the window (0: none, the figures before 2026-12-06)",
    )
    parser.add_argument(
        "--start-at-claim",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="send each run's first heartbeat (which starts it, on runs.events) right after its "
        "claim, so runs start at the claim rate; --no-start-at-claim leaves every start to the "
        "warm-up's first H (the figures before 2026-12-06 noon)",
    )
    parser.add_argument(
        "--output",
        default="docs/benchmarks.md",
        help="markdown file whose section for this configuration is replaced or added ('-' writes nothing)",
    )
    parser.add_argument("--keep-temp", action="store_true", help="keep the temp dir (service logs, stores)")
    args = parser.parse_args(argv)
    args.steps = [int(h) for h in args.heartbeat_seconds.split(",") if h.strip()]
    if not 0 <= args.batch <= 500:
        parser.error("--batch: 0 to 500 leases a request")
    if not 1 <= args.coordinators <= 4:
        parser.error("--coordinators: 1 to 4 instances")
    if not 1 <= args.tenants <= 64:
        parser.error("--tenants: 1 to 64")
    if not 10 <= args.lease_seconds <= 3600:
        parser.error("--lease-seconds: 10 to 3600")
    if not args.steps or min(args.steps) < 1 or max(args.steps) * 2 > args.lease_seconds:
        parser.error(f"--heartbeat-seconds: whole seconds from 1 to {args.lease_seconds // 2}")
    if not 0 <= args.logged_every <= 20:
        parser.error("--logged-every: 0 to 20")
    if args.logged_every and keepalive_fraction(args.logged_every, min(args.steps), args.lease_seconds) >= 1:
        parser.error(
            f"--logged-every {args.logged_every} at a {min(args.steps)} s heartbeat needs a keepalive "
            f"fraction of 1 or more ({args.lease_seconds} s leases): log more often or shorten the heartbeat"
        )
    if args.warm_up_seconds is not None and not 0 <= args.warm_up_seconds <= 600:
        parser.error("--warm-up-seconds: 0 to 600")
    return args
