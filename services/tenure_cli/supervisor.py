"""`tenure up` and friends: one foreground process that runs the whole system.

Children are restarted when they die (a processor exits on purpose when it cannot commit, so
that its commands are redelivered), and Ctrl-C stops everything, the broker last.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from services.common import broker as launcher
from services.common.kafka import create_topics, describe_topics, wait_for_broker
from services.common.messages import MessageCodec
from services.common.settings import TenureSettings
from services.common.store import RocksStore
from services.common.topics import TOPICS
from services.projections.service import rebuild as rebuild_views
from services.projections.service import views_path
from services.projections.store import RunViewStore

__all__ = ["broker", "rebuild", "topics", "up"]

SERVICES = (
    ("lease-coordinator", "services.lease_coordinator"),
    ("projections", "services.projections"),
    ("command-api", "services.command_api"),
    ("effect-gateway", "services.effect_gateway"),
    # The reference fenced resource, so the walkthrough has a recipient that checks epochs.
    ("fenced-ledger", "services.fenced_ledger"),
    # The reference environment of the saga's tools (VMs, IPs, DNS...), and the saga itself.
    ("sim-environment", "services.sim_environment"),
    ("saga-orchestrator", "services.saga_orchestrator"),
)


def broker(args: argparse.Namespace) -> int:
    return launcher.main([args.action])


def topics(args: argparse.Namespace) -> int:
    bootstrap = TenureSettings().bootstrap_servers()
    wait_for_broker(bootstrap)
    if args.action == "create":
        for name, outcome in create_topics(bootstrap, TOPICS).items():
            print(f"{name}: {outcome}")
    else:
        known = describe_topics(bootstrap)
        for spec in TOPICS:
            have = known.get(spec.name)
            print(f"{spec.name}: {'missing' if have is None else f'{have} partitions'} - {spec.purpose}")
    return 0


def rebuild(_: argparse.Namespace) -> int:
    settings = TenureSettings()
    views = RunViewStore(RocksStore(views_path(settings.state_dir)), MessageCodec())
    report = rebuild_views(settings.bootstrap_servers(), views)
    print(f"rebuilt {report.runs} run views from {report.events} events in {report.seconds:.2f}s")
    return 0


@dataclass
class _Child:
    name: str
    module: str
    process: subprocess.Popen[bytes] | None = None
    restarts: list[float] = field(default_factory=list)


def _spawn(child: _Child, env: dict[str, str]) -> None:
    child.process = subprocess.Popen([sys.executable, "-m", child.module], env=env)


def up(args: argparse.Namespace) -> int:
    settings = TenureSettings()
    started_broker: launcher.BrokerHandle | None = None
    if settings.kafka_bootstrap_servers:
        bootstrap = settings.kafka_bootstrap_servers
        print(f"using Kafka at {bootstrap} (KAFKA_BOOTSTRAP_SERVERS)")
    else:
        status = launcher.broker_status()
        if status is not None:
            bootstrap = launcher.resolve_bootstrap()
            print(f"using the running bundled Kafka at {bootstrap}")
        else:
            started_broker = launcher.start_broker()
            bootstrap = started_broker.bootstrap_servers
    wait_for_broker(bootstrap)
    for name, outcome in create_topics(bootstrap, TOPICS).items():
        print(f"topic {name}: {outcome}")
    port = args.port or settings.api_port
    gateway = os.environ.get("TENURE_GATEWAY_PORT", "8200")
    ledger = os.environ.get("TENURE_LEDGER_PORT", "9100")
    sim = os.environ.get("TENURE_SIM_PORT", "9200")
    env = dict(
        os.environ,
        KAFKA_BOOTSTRAP_SERVERS=bootstrap,
        TENURE_API_PORT=str(port),
        TENURE_STATE_DIR=str(settings.state_dir),
    )
    env.setdefault("TENURE_TOOLS", f"ledger=http://127.0.0.1:{ledger},env=http://127.0.0.1:{sim}")
    env.setdefault("TENURE_GATEWAY_URL", f"http://127.0.0.1:{gateway}")
    children = [_Child(name, module) for name, module in SERVICES]
    for child in children:
        _spawn(child, env)
        if child.name == "projections":
            time.sleep(1.0)  # the API opens the views store the projector creates
    print(
        f"Tenure is up.\n  API      http://{settings.api_host}:{port}  (OpenAPI: /docs)\n"
        f"  Gateway  http://{settings.api_host}:{gateway}  (effects under a lease)\n"
        f"  Ledger   http://127.0.0.1:{ledger}  (reference fenced resource)\n"
        f"  Sim env  http://127.0.0.1:{sim}  (reference saga tools; audit at /audit)\n"
        f"  Kafka    {bootstrap}\n  State    {settings.state_dir}\nPress Ctrl-C to stop.",
        flush=True,
    )
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while not stopping:
            time.sleep(0.5)
            for child in children:
                assert child.process is not None
                code = child.process.poll()
                if code is None or stopping:
                    continue
                now = time.monotonic()
                child.restarts = [t for t in child.restarts if now - t < 60] + [now]
                if len(child.restarts) > 5:
                    print(f"{child.name} exited {code} six times in a minute; stopping", file=sys.stderr)
                    stopping = True
                    break
                print(f"{child.name} exited with {code}; restarting", file=sys.stderr, flush=True)
                _spawn(child, env)
    finally:
        for child in reversed(children):
            if child.process is not None and child.process.poll() is None:
                launcher.stop_process(child.process.pid, grace_seconds=10.0, child=child.process)
        if started_broker is not None:
            started_broker.stop()
        print("Tenure stopped.")
    return 0
