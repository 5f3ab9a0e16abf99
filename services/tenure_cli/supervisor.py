"""`tenure up` and friends: one foreground process that runs the whole system.

`tenure up` supervises every process it starts, the bundled broker included:

- Each child runs in a session of its own (so the terminal's Ctrl-C reaches only the supervisor,
  which stops them in order) under a lifeline (services.common.lifeline): if the supervisor is
  SIGKILLed, the kernel SIGKILLs every child, so nothing is left running.
- A child that exits is restarted after a full-jitter backoff: a processor exits on purpose
  when it cannot commit, so that its commands are redelivered; a crashed broker comes back on
  the same port and data dir. Six exits of one child within a minute stop everything.
- "Tenure is up" is printed once every child answers its readiness probe (readiness.py).
- SIGTERM or Ctrl-C stops the services (SIGTERM, SIGKILL after a grace), then the broker;
  "Tenure stopped." is printed once none of them runs.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from services.common import broker as launcher
from services.common.backoff import Backoff
from services.common.kafka import create_topics, describe_topics, wait_for_broker
from services.common.lifeline import lifeline_argv
from services.common.messages import MessageCodec
from services.common.settings import TenureSettings, child_environment
from services.common.store import RocksStore
from services.common.topics import TOPICS
from services.projections.service import rebuild as rebuild_views
from services.projections.service import views_path
from services.projections.store import RunViewStore
from services.tenure_cli.instances import SCALABLE, parse_instances, plan_instances
from services.tenure_cli.readiness import PROBE_INTERVAL_S, ReadinessCheck, probe_host

__all__ = ["SCALABLE", "SERVICES", "StoreInUse", "broker", "rebuild", "store_in_use", "topics", "up"]

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
    # The semantic watchdog: judges each run's progress by its observations (WD-1..WD-6).
    ("watchdog", "services.watchdog"),
    # The fleet-wide circuit breakers of the tool endpoints (BRK-1, BRK-2).
    ("breakers", "services.breakers"),
    # Schedules: cron in an IANA zone, overlap, misfire and DST policies (EXE-14).
    ("schedules", "services.schedules"),
    # Quarantine and taint: runs' quarantines and tenants' provenance graphs (QUA-1, QUA-2).
    ("quarantine", "services.quarantine"),
)
# The API opens the Run views as a secondary of the projector's store: it must exist first.
STARTED_BEFORE_THE_REST = ("lease-coordinator", "projections")
RESTART_WINDOW_S = 60.0
MAX_EXITS_PER_WINDOW = 5  # the sixth exit of one child within the window stops everything
STOP_GRACE_S = 10.0
TICK_S = 0.2
WAITING_NOTE_S = 15.0  # how often a slow start-up says what it is still waiting for


class StoreInUse(RuntimeError):
    """A store another process holds open (RocksDB allows one writer per store)."""


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


def store_in_use(path: Path) -> bool:
    """True if another process holds the RocksDB LOCK of the store at `path`.

    RocksDB takes a POSIX record lock (fcntl F_SETLK) on <store>/LOCK. Probing it here, before
    this process opens the store, is safe: closing our descriptor drops only our own locks."""
    lock = path / "LOCK"
    try:
        handle = lock.open("r+b")
    except FileNotFoundError:
        return False
    with handle:
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in (errno.EACCES, errno.EAGAIN):
                return True
            raise
        fcntl.lockf(handle, fcntl.LOCK_UN)
    return False


def _in_use(path: Path) -> StoreInUse:
    return StoreInUse(
        f"the Run views store {path} is open in a running projector (`tenure up` or "
        "`python -m services.projections` on this state dir); stop it first, or point "
        "TENURE_STATE_DIR at another state dir"
    )


def rebuild(args: argparse.Namespace) -> int:
    settings = TenureSettings()
    path = views_path(settings.state_dir)
    if store_in_use(path):
        raise _in_use(path)
    try:
        store = RocksStore(path)
    except Exception:
        if store_in_use(path):  # a projector started between the probe and the open
            raise _in_use(path) from None
        raise
    seeded = not getattr(args, "fold_every_event", False)
    progress = _RebuildProgress()
    report = rebuild_views(
        settings.bootstrap_servers(), RunViewStore(store, MessageCodec()), progress, seeded=seeded
    )
    how = (
        f"; {report.seeded} seeded from {report.changelog_records} state changelog records, "
        f"{report.runs - report.seeded} folded"
        if seeded
        else "; every event folded"
    )
    print(f"rebuilt {report.runs} run views from {report.events} records in {report.seconds:.2f}s{how}")
    return 0


class _RebuildProgress:
    """Long work shows progress: a line on stderr at most every 2 s while records are read."""

    def __init__(self) -> None:
        self._said_at = time.monotonic()

    def __call__(self, read: int, total: int) -> None:
        if time.monotonic() - self._said_at >= 2.0:
            self._said_at = time.monotonic()
            share = f" ({100 * read / total:.0f}%)" if total else ""
            print(f"read {read:,} of {total:,} records{share}", file=sys.stderr, flush=True)


class _Child:
    """One supervised process: how to start it, how to tell it is ready, its restart record."""

    def __init__(self, name: str, check: ReadinessCheck) -> None:
        self.name = name
        self.check = check
        self.started_at = 0.0
        self.exits: list[float] = []
        # Restart quickly once, back off if it keeps dying (BRK-3: the one full-jitter backoff).
        self.backoff = Backoff(base_s=0.25, cap_s=8.0)
        self.restart_at: float | None = None

    def launch(self) -> None:
        raise NotImplementedError

    def exit_code(self) -> int | None:
        raise NotImplementedError


class _Service(_Child):
    def __init__(self, name: str, module: str, check: ReadinessCheck, env: dict[str, str]) -> None:
        super().__init__(name, check)
        self.module = module
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    def launch(self) -> None:
        self.process = subprocess.Popen(
            lifeline_argv([sys.executable, "-m", self.module]), env=self.env, start_new_session=True
        )
        self.started_at = time.monotonic()

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def signal_group(self, signum: int) -> None:
        # Only while unreaped: the pid (= its group id) cannot have been reused yet.
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signum)


class _RunnerHost(_Service):
    """The managed runner host (`tenure up --runner-host RUN_ID --agent-command ...`): one run,
    so once it has exited it is not restarted (its run is over), and its exit is said once."""

    def __init__(
        self, supervisor: _Supervisor, argv: list[str], check: ReadinessCheck, env: dict[str, str]
    ) -> None:
        super().__init__("runner-host", "services.runner_host", check, env)
        self.supervisor = supervisor
        self.argv = argv
        self.said = False

    def launch(self) -> None:
        argv = lifeline_argv([sys.executable, "-m", self.module, *self.argv])
        self.process = subprocess.Popen(argv, env=self.env, start_new_session=True)
        self.started_at = time.monotonic()

    def exit_code(self) -> int | None:
        code = super().exit_code()
        if code is None or self.supervisor.stopping:
            return code
        if not self.said:
            self.said = True
            print(f"runner-host exited with {code}; a managed runner runs one run, not restarted", flush=True)
        return None


class _Broker(_Child):
    """The bundled broker as a child: restarted on the port and data dir it first got."""

    def __init__(self, port: int | None, state_dir: Path) -> None:
        super().__init__("kafka", ReadinessCheck())  # start_broker returns once it is ready
        self.port = port
        self.state_dir = state_dir
        self.handle: launcher.BrokerHandle | None = None
        self.failed_launch = False

    def launch(self) -> None:
        self.started_at = time.monotonic()
        try:
            self.handle = launcher.start_broker(
                port=self.port, state_dir=self.state_dir, die_with_parent=True
            )
        except launcher.BrokerError:
            self.failed_launch = True  # seen as an exit by the next tick, which retries
            raise
        self.failed_launch = False
        self.port = int(self.handle.bootstrap_servers.rsplit(":", 1)[1])

    def exit_code(self) -> int | None:
        if self.failed_launch:
            return 1
        return None if self.handle is None else self.handle.exit_code()

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.stop()
        # Also a broker started on this state dir behind our back (`tenure broker start` by hand).
        launcher.stop_broker(self.state_dir)


class _Supervisor:
    def __init__(self) -> None:
        self.children: list[_Child] = []
        self.stopping = False
        self.failure: str | None = None

    def request_stop(self, *_: object) -> None:
        self.stopping = True

    def fail(self, reason: str) -> None:
        print(f"tenure up: {reason}", file=sys.stderr, flush=True)
        self.failure = reason
        self.stopping = True

    def launch(self, child: _Child) -> None:
        self.children.append(child)
        child.launch()

    def tick(self) -> None:
        """Notice exits, schedule restarts with backoff, perform the restarts that are due."""
        for child in self.children:
            if self.stopping:
                return
            now = time.monotonic()
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self._relaunch(child)
                continue
            code = child.exit_code()
            if code is None:
                if now - child.started_at > RESTART_WINDOW_S:
                    child.backoff.reset()
                continue
            child.exits = [t for t in child.exits if now - t < RESTART_WINDOW_S] + [now]
            if len(child.exits) > MAX_EXITS_PER_WINDOW:
                self.fail(f"{child.name} exited {len(child.exits)} times within a minute; stopping")
                return
            delay = child.backoff.next_delay()
            print(f"{child.name} exited with {code}; restarting in {delay:.1f}s", file=sys.stderr, flush=True)
            child.restart_at = now + delay

    def _relaunch(self, child: _Child) -> None:
        child.restart_at = None
        began = time.monotonic()
        try:
            child.launch()
        except launcher.BrokerError as error:
            print(f"{child.name} did not restart: {error}", file=sys.stderr, flush=True)
            return
        took = f" in {time.monotonic() - began:.1f}s" if isinstance(child, _Broker) else ""
        print(f"{child.name} restarted{took}", file=sys.stderr, flush=True)

    def wait_ready(self, waits: list[tuple[_Child, ReadinessCheck]], timeout_s: float) -> bool:
        """Supervise until each child passes its check; False on a timeout or a stop request."""
        pending = {child.name: (child, check) for child, check in waits}
        why: dict[str, str] = {}
        asked: dict[str, float] = {}
        began = time.monotonic()
        deadline, said = began + timeout_s, began
        while pending and not self.stopping:
            self.tick()
            for name, (child, check) in list(pending.items()):
                if child.restart_at is not None or child.exit_code() is not None:
                    why[name] = "restarting"
                    continue
                if time.monotonic() - asked.get(name, -PROBE_INTERVAL_S) < PROBE_INTERVAL_S:
                    continue
                asked[name] = time.monotonic()
                ready, why[name] = check.state(time.monotonic() - child.started_at)
                if ready:
                    print(f"  {name}: ready ({why[name]})", flush=True)
                    del pending[name]
            waiting = "; ".join(f"{name}: {why.get(name, '?')}" for name in pending)
            if pending and time.monotonic() > deadline:
                self.fail(f"not ready after {timeout_s:g}s: {waiting}")
            elif pending:
                if time.monotonic() - said >= WAITING_NOTE_S:
                    said = time.monotonic()
                    print(f"  still waiting ({said - began:.0f}s) for {waiting}", flush=True)
                time.sleep(TICK_S)
        return not pending

    def shutdown(self) -> None:
        """Services first (all at once: SIGTERM, then SIGKILL after the grace), the broker last."""
        services = [c for c in reversed(self.children) if isinstance(c, _Service)]
        for service in services:
            service.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while any(s.exit_code() is None for s in services) and time.monotonic() < deadline:
            time.sleep(0.05)
        for service in services:
            if service.exit_code() is None:
                print(f"{service.name} ignored SIGTERM for {STOP_GRACE_S:g}s; killing it", file=sys.stderr)
                service.signal_group(signal.SIGKILL)
                assert service.process is not None
                service.process.wait(10)
        brokers = [c for c in self.children if isinstance(c, _Broker)]
        if services and brokers:
            print("services stopped; stopping kafka", flush=True)
        for child in brokers:
            child.stop()


def _checks(settings: TenureSettings, api_port: int) -> dict[str, ReadinessCheck]:
    host = probe_host(settings.api_host)

    def processor(port: int) -> ReadinessCheck:
        return ReadinessCheck(url=f"http://{host}:{port}" if port else None, optional_endpoint=True)

    views_store = views_path(settings.state_dir) / "CURRENT"
    projections = processor(settings.projections_health_port)
    return {
        "lease-coordinator": processor(settings.coordinator_health_port),
        "projections": ReadinessCheck(projections.url, True, (views_store,)),
        "command-api": ReadinessCheck(f"http://{host}:{api_port}"),
        "effect-gateway": ReadinessCheck(f"http://{host}:{settings.gateway_port}"),
        "fenced-ledger": ReadinessCheck(f"http://127.0.0.1:{settings.ledger_port}"),
        "sim-environment": ReadinessCheck(f"http://127.0.0.1:{settings.sim_port}"),
        "saga-orchestrator": processor(settings.saga_health_port),
        "watchdog": processor(settings.watchdog_health_port),
        "breakers": processor(settings.breakers_health_port),
        "schedules": processor(settings.schedules_health_port),
        "quarantine": processor(settings.quarantine_health_port),
    }


def _bootstrap(settings: TenureSettings, supervisor: _Supervisor) -> str:
    if settings.kafka_bootstrap_servers:
        print(f"using Kafka at {settings.kafka_bootstrap_servers} (KAFKA_BOOTSTRAP_SERVERS)")
        return settings.kafka_bootstrap_servers
    if launcher.broker_status() is not None:
        bootstrap = launcher.resolve_bootstrap()
        print(f"using the running bundled Kafka at {bootstrap} (not ours: it is left running)")
        return bootstrap
    kafka = _Broker(settings.kafka_port, launcher.default_state_dir())
    supervisor.launch(kafka)
    assert kafka.handle is not None
    return kafka.handle.bootstrap_servers


def _start_runner_host(
    args: argparse.Namespace,
    settings: TenureSettings,
    supervisor: _Supervisor,
    env: dict[str, str],
    port: int,
) -> None:
    """Start the managed runner host for `args.runner_host` (it waits for the run to be submitted)."""
    command = shlex.split(args.agent_command or "")
    if not command:
        raise ValueError("--runner-host needs --agent-command (the agent the host runs and contains)")
    host_env = dict(env)
    if "runner_host_api_url" not in settings.model_fields_set:
        host_env["TENURE_RUNNER_HOST_API_URL"] = f"http://{probe_host(settings.api_host)}:{port}"
    argv = ["--run-id", args.runner_host, "--claim-wait", str(args.runner_host_claim_wait), "--", *command]
    health = settings.runner_host_health_port
    check = ReadinessCheck(f"http://{probe_host(settings.api_host)}:{health}" if health else None, True)
    supervisor.launch(_RunnerHost(supervisor, argv, check, host_env))
    print(f"  Runner host  run {args.runner_host}: {shlex.join(command)} (health port {health})", flush=True)


def up(args: argparse.Namespace) -> int:
    settings = TenureSettings()
    if getattr(args, "runner_host", None) and not shlex.split(args.agent_command or ""):
        raise ValueError("--runner-host needs --agent-command (the agent the host runs and contains)")
    supervisor = _Supervisor()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, supervisor.request_stop)
    try:
        bootstrap = _bootstrap(settings, supervisor)
        wait_for_broker(bootstrap)
        for name, outcome in create_topics(bootstrap, TOPICS).items():
            print(f"topic {name}: {outcome}")
        port = args.port or settings.api_port
        overrides = {
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "TENURE_API_PORT": str(port),
            "TENURE_STATE_DIR": str(settings.state_dir),
        }
        if "tools" not in settings.model_fields_set:
            overrides["TENURE_TOOLS"] = (
                f"ledger=http://127.0.0.1:{settings.ledger_port},env=http://127.0.0.1:{settings.sim_port}"
            )
        if "gateway_url" not in settings.model_fields_set:
            overrides["TENURE_GATEWAY_URL"] = f"http://127.0.0.1:{settings.gateway_port}"
        env = child_environment(**overrides)
        checks = _checks(settings, port)
        host = probe_host(settings.api_host)
        services: list[_Service] = []
        counts = parse_instances(getattr(args, "instances", None), SERVICES)
        plans = plan_instances(SERVICES, settings, counts)
        for plan in plans:
            check, child_env = checks[plan.service], env
            if plan.instance_id is not None:
                child_env = {**env, "TENURE_INSTANCE_ID": plan.instance_id}
                if "group_fence" not in settings.model_fields_set:
                    # Several instances of one processor: partitions move between them, so an
                    # evicted one must not commit (the generation fence, issue 16).
                    child_env["TENURE_GROUP_FENCE"] = "true"
                url = f"http://{host}:{plan.health_port}" if plan.health_port else None
                check = ReadinessCheck(url, check.optional_endpoint, check.files)
            services.append(_Service(plan.name, plan.module, check, child_env))
        scaled = Counter(p.service for p in plans if p.instance_id is not None)
        if scaled:
            print("instances: " + ", ".join(f"{name} x{n}" for name, n in scaled.items()), flush=True)
        first = [s for s in services if s.name in STARTED_BEFORE_THE_REST]
        for service in first:
            supervisor.launch(service)
        projections = next(s for s in first if s.name == "projections")
        store_only = ReadinessCheck(files=projections.check.files)
        if not supervisor.wait_ready([(projections, store_only)], args.ready_timeout):
            return 1 if supervisor.failure else 0
        for service in services:
            if service not in first:
                supervisor.launch(service)
        if not supervisor.wait_ready([(s, s.check) for s in services], args.ready_timeout):
            return 1 if supervisor.failure else 0  # a failure, or a stop asked for during start-up
        print(
            f"Tenure is up.\n  API      http://{settings.api_host}:{port}  (OpenAPI: /docs)\n"
            f"  Gateway  http://{settings.api_host}:{settings.gateway_port}  (effects under a lease)\n"
            f"  Ledger   http://127.0.0.1:{settings.ledger_port}  (reference fenced resource)\n"
            f"  Sim env  http://127.0.0.1:{settings.sim_port}  (reference saga tools; audit at /audit)\n"
            f"  Kafka    {bootstrap}\n  State    {settings.state_dir}\nPress Ctrl-C to stop.",
            flush=True,
        )
        if getattr(args, "runner_host", None):
            _start_runner_host(args, settings, supervisor, env, port)
        while not supervisor.stopping:
            supervisor.tick()
            time.sleep(TICK_S)
    finally:
        supervisor.shutdown()
        print("Tenure stopped.", flush=True)
    return 1 if supervisor.failure else 0
