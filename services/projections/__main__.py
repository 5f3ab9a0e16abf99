"""`python -m services.projections [follow|rebuild]`: the Run, trajectory and watchdog view projector."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from services.common.health import ProjectionMetrics, metrics_registry, serve_health
from services.common.heap import freeze_startup_heap
from services.common.logs import configure_logging
from services.common.messages import MessageCodec
from services.common.settings import TenureSettings
from services.common.store import RocksStore
from services.projections.service import (
    FollowProgress,
    follow,
    rebuild,
    rebuild_trajectories,
    rebuild_watchdogs,
    views_path,
)
from services.projections.store import RunViewStore
from services.projections.trajectory_store import TrajectoryViewStore
from services.projections.watchdog_store import WatchdogViewStore


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.projections")
    parser.add_argument("command", nargs="?", default="follow", choices=["follow", "rebuild"])
    args = parser.parse_args(argv)
    settings = TenureSettings()
    configure_logging(settings.log_level, service="tenure-projections")
    bootstrap = settings.bootstrap_servers()
    path = views_path(settings.state_dir)
    if args.command == "rebuild":
        from tqdm import tqdm

        bar = tqdm(unit="event", desc="rebuilding run views")

        def progress(seen: int, total: int) -> None:
            bar.total = total
            bar.n = seen
            bar.refresh()

        store, codec = RocksStore(path), MessageCodec()
        report = rebuild(bootstrap, RunViewStore(store, codec), progress)
        bar.close()
        print(f"rebuilt {report.runs} run views from {report.events} events in {report.seconds:.2f}s")
        bar = tqdm(unit="event", desc="rebuilding trajectory views")
        sagas = rebuild_trajectories(bootstrap, TrajectoryViewStore(store, codec), progress)
        bar.close()
        print(f"rebuilt {sagas.runs} trajectory views from {sagas.events} events in {sagas.seconds:.2f}s")
        bar = tqdm(unit="event", desc="rebuilding watchdog views")
        dogs = rebuild_watchdogs(bootstrap, WatchdogViewStore(store, codec), progress)
        bar.close()
        print(f"rebuilt {dogs.runs} watchdog views from {dogs.events} events in {dogs.seconds:.2f}s")
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    registry, caught_up = metrics_registry(), FollowProgress()
    health = serve_health(
        "tenure-projections", settings.projections_health_port, caught_up.checks, registry, settings.api_host
    )
    freeze_startup_heap(settings.collector_schedule())
    try:
        follow(bootstrap, path, stop, caught_up, ProjectionMetrics(registry))
    finally:
        if health is not None:
            health.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
