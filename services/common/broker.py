"""Run a real single-node Apache Kafka 4.x broker (KRaft, broker+controller) without Docker.

The broker jars come from Maven Central (scripts/kafka/pom.xml) into a git-ignored cache, so a
laptop or CI box with Java 17 and Maven gets the same broker the Docker Compose file runs.

CLI: ``python -m services.common.broker {fetch,start,stop,status,run}``.
Settings (TenureSettings, README "Configuration"): KAFKA_BOOTSTRAP_SERVERS (use that broker, start
nothing), TENURE_KAFKA_PORT (listener port), TENURE_STATE_DIR (launcher state lives in
``$TENURE_STATE_DIR/kafka``), TENURE_KAFKA_CACHE (jar folder), TENURE_KAFKA_JVM_OPTS (replaces the
default JVM flags), JAVA_HOME.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import random
import re
import shlex
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services.common._broker_config import (
    DEFAULT_JVM_OPTS,
    FAST_RESTART_PROPERTIES,
    HOST,
    KAFKA_DEFAULT_SESSION_PROPERTIES,
    LOG4J2_CONFIG,
    STARTED_LOG_LINE,
    TOOL_JVM_OPTS,
    server_properties,
)
from services.common.backoff import Backoff
from services.common.jvm import fetch_with_maven, find_java, log_tail
from services.common.lifeline import lifeline_argv
from services.common.settings import TenureSettings

__all__ = [
    "DEFAULT_JVM_OPTS",
    "FAST_RESTART_PROPERTIES",
    "KAFKA_DEFAULT_SESSION_PROPERTIES",
    "KAFKA_VERSION",
    "LOG4J2_CONFIG",
    "BrokerError",
    "BrokerHandle",
    "BrokerNotRunningError",
    "BrokerStartError",
    "JarFetchError",
    "api_versions",
    "broker_status",
    "default_cache_dir",
    "default_state_dir",
    "ensure_jars",
    "free_port",
    "main",
    "resolve_bootstrap",
    "start_broker",
    "stop_broker",
    "stop_process",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
POM_PATH = REPO_ROOT / "scripts" / "kafka" / "pom.xml"


def _kafka_version_from_pom() -> str:
    # The pom is the single source of truth for the version, so a bump there moves the cache too.
    found = re.search(r"<kafka.version>([^<]+)</kafka.version>", POM_PATH.read_text())
    if found is None:
        raise RuntimeError(f"{POM_PATH} has no <kafka.version> property")
    return found.group(1)


KAFKA_VERSION = _kafka_version_from_pom()
JARS_MARKER = ".tenure-complete"
STATE_FILE = "broker.json"


class BrokerError(RuntimeError):
    """Base class of launcher failures."""


class JarFetchError(BrokerError):
    """Maven could not provide the Kafka jars."""


class BrokerStartError(BrokerError):
    """The broker did not format, start or become ready."""


class BrokerNotRunningError(BrokerError):
    """No broker address is known: env var unset and no launcher broker is running."""


def _say(message: str) -> None:
    print(f"[kafka-launcher] {message}", file=sys.stderr, flush=True)


def default_state_dir() -> Path:
    return TenureSettings().state_dir / "kafka"


def default_cache_dir() -> Path:
    configured = TenureSettings().kafka_cache
    return configured if configured else REPO_ROOT / ".cache" / "kafka" / KAFKA_VERSION / "libs"


def ensure_jars(cache_dir: Path | None = None) -> Path:
    """Fill ``cache_dir`` with the broker's jars unless an earlier fetch already completed it."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    # The marker holds the pom's digest, so editing the pom (e.g. a version bump) refetches.
    pom_digest = hashlib.sha256(POM_PATH.read_bytes()).hexdigest()
    marker = cache_dir / JARS_MARKER
    if marker.is_file() and marker.read_text().strip() == pom_digest:
        return cache_dir
    _say(f"fetching Kafka {KAFKA_VERSION} jars with Maven into {cache_dir} ...")
    began = time.monotonic()

    def finish(staging: Path) -> None:
        if not list(staging.glob("*.jar")):
            raise JarFetchError(f"mvn fetched no Kafka {KAFKA_VERSION} jars into {staging}")
        (staging / JARS_MARKER).write_text(pom_digest + "\n")

    fetch_with_maven(
        cache_dir,
        f"the Kafka {KAFKA_VERSION} jars",
        lambda staging: [
            "-f",
            str(POM_PATH),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}",
            "-DincludeScope=runtime",
        ],
        finish,
        lambda cache: (cache / JARS_MARKER).is_file(),
        JarFetchError,
    )
    jars = list(cache_dir.glob("*.jar"))
    _say(f"fetched {len(jars)} jars in {time.monotonic() - began:.1f}s")
    return cache_dir


# Listening ports are drawn below Linux's ephemeral range (32768-60999 by default): a port the
# kernel hands out for bind(0) is also what it hands out for outgoing connections, so a port
# chosen that way can be taken by any client's connection before the child that is meant to
# listen on it starts (seen as "address already in use" in the test suite).
_LISTEN_PORTS = range(20_000, 32_000)


# Ports this process handed out lately. A caller binds its port later (a service it starts may
# take seconds to), so the same port must not go to two callers in between: two services of one
# system were once given the same port, and the second one's health server answered for the
# first (a test's POST /runs got a 404 from it).
_HANDED_OUT: deque[int] = deque(maxlen=1024)


def free_port() -> int:
    """A TCP port nothing listens on right now, outside the ephemeral range, and none of the last
    ones this process handed out."""
    for _ in range(200):
        port = random.choice(_LISTEN_PORTS)
        if port not in _HANDED_OUT and _port_free(port):
            _HANDED_OUT.append(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # a crowded range: any
        probe.bind((HOST, 0))
        port = int(probe.getsockname()[1])
    _HANDED_OUT.append(port)
    return port


def _port_free(port: int) -> bool:
    try:
        _require_free(port)
    except BrokerStartError:
        return False
    return True


def _require_free(port: int) -> None:
    # Kafka reports a busy port only deep in a stack trace after start-up; say it plainly first.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # Like Kafka's acceptor, tolerate TIME_WAIT leftovers of a broker that just stopped.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError as error:
            raise BrokerStartError(f"port {HOST}:{port} is not free: {error}") from error


def api_versions(host: str, port: int, timeout: float = 2.0) -> dict[int, tuple[int, int]]:
    """Send a Kafka ApiVersions v0 request on a raw socket; return {api_key: (min, max)}."""
    correlation_id = 0x7E0A
    client_id = b"tenure-launcher"
    # Header v1: api_key 18 (ApiVersions), api_version 0, correlation id, client id; empty body.
    # v0 keeps both request and response free of the flexible-version varint encoding.
    payload = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    with socket.create_connection((host, port), timeout=timeout) as connection:
        connection.sendall(struct.pack(">i", len(payload)) + payload)
        with connection.makefile("rb") as reader:
            size = struct.unpack(">i", reader.read(4))[0]
            body = reader.read(size)
    if len(body) < 10 or len(body) != size:
        raise BrokerError(f"ApiVersions response truncated: {len(body)} of {size} bytes")
    received_id, error_code, count = struct.unpack_from(">ihi", body, 0)
    if received_id != correlation_id or error_code != 0:
        raise BrokerError(f"ApiVersions answered correlation={received_id} error={error_code}")
    entries = struct.iter_unpack(">hhh", body[10 : 10 + 6 * count])
    return {key: (low, high) for key, low, high in entries}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie still answers kill(0) but is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def stop_process(pid: int, grace_seconds: float = 15.0, child: subprocess.Popen[bytes] | None = None) -> str:
    """SIGTERM, then SIGKILL after ``grace_seconds``.

    Returns 'already-exited', 'terminated' or 'killed'. Pass ``child`` when the process is our
    own child, so it is reaped (polling the pid alone would see the zombie as alive).
    """

    def exited() -> bool:
        return child.poll() is not None if child is not None else not _pid_alive(pid)

    def gone(deadline: float) -> bool:
        while time.monotonic() < deadline:
            if exited():
                return True
            time.sleep(0.05)
        return exited()

    if exited():
        return "already-exited"
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "already-exited"
    if gone(time.monotonic() + grace_seconds):
        return "terminated"
    _say(f"pid {pid} ignored SIGTERM for {grace_seconds:g}s; sending SIGKILL")
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "terminated"
    if not gone(time.monotonic() + 10.0):
        raise BrokerError(f"pid {pid} survived SIGKILL")
    return "killed"


@dataclass
class BrokerHandle:
    """A broker address; ``stop()`` only stops a broker this handle started (``owned``)."""

    bootstrap_servers: str
    pid: int | None = None
    state_dir: Path | None = None
    owned: bool = False
    _child: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def stop(self, grace_seconds: float = 15.0) -> str:
        if not self.owned or self.pid is None:
            return "not-owned"
        outcome = stop_process(self.pid, grace_seconds, self._child)
        if self.state_dir is not None:
            _forget_state(self.state_dir, self.pid)
        self.owned = False
        return outcome

    def running(self) -> bool:
        if self._child is not None:
            return self._child.poll() is None
        return self.pid is not None and _pid_alive(self.pid)

    def exit_code(self) -> int | None:
        """The broker's exit status once it has exited (-N: killed by signal N), else None."""
        if self._child is not None:
            return self._child.poll()
        return None if self.running() else -1


def _read_state(state_dir: Path) -> dict[str, object] | None:
    try:
        loaded = json.loads((state_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def _forget_state(state_dir: Path, pid: int) -> None:
    state = _read_state(state_dir)
    if state is not None and state.get("pid") == pid:
        (state_dir / STATE_FILE).unlink(missing_ok=True)


def _is_kafka_process(pid: int) -> bool:
    try:
        return b"kafka.Kafka" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc (macOS): trust the pid


def broker_status(state_dir: Path | None = None) -> dict[str, object] | None:
    """The recorded state of the launcher broker in ``state_dir``, or None if it is not running."""
    state_dir = Path(state_dir) if state_dir else default_state_dir()
    state = _read_state(state_dir)
    if state is None:
        return None
    pid = state.get("pid")
    if not isinstance(pid, int) or not _pid_alive(pid) or not _is_kafka_process(pid):
        (state_dir / STATE_FILE).unlink(missing_ok=True)  # stale: broker died or pid was reused
        return None
    return state


def resolve_bootstrap(state_dir: Path | None = None) -> str:
    """KAFKA_BOOTSTRAP_SERVERS if set, else the address of the running launcher broker."""
    configured = TenureSettings().kafka_bootstrap_servers
    if configured:
        return configured
    state = broker_status(state_dir)
    if state is None:
        raise BrokerNotRunningError(
            "KAFKA_BOOTSTRAP_SERVERS is unset and no launcher broker runs; "
            "start one with `python -m services.common.broker start`"
        )
    return str(state["bootstrap_servers"])


def _cluster_id() -> str:
    # Same shape as Kafka's Uuid.randomUuid(): 16 random bytes, base64url without padding,
    # never starting with '-' (Kafka rejects those as command-line-unfriendly).
    while True:
        encoded = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not encoded.startswith("-"):
            return encoded


def _previous_controller_port(config_file: Path, data_dir: Path) -> int | None:
    """The controller port a formatted data dir was started with, if it is free again.

    The standalone format writes the controller's endpoint into the metadata log's voter set;
    coming back on the same port keeps that record true instead of updating it on every start."""
    if not (data_dir / "meta.properties").exists():
        return None
    try:
        found = re.search(r"^controller\.quorum\.bootstrap\.servers=.*:(\d+)$", config_file.read_text(), re.M)
    except OSError:
        return None
    port = int(found.group(1)) if found else None
    return port if port is not None and _port_free(port) else None


def _java() -> str:
    return find_java(BrokerStartError)


def _wait_until_ready(handle: BrokerHandle, log_file: Path, timeout: float) -> None:
    host, port = handle.bootstrap_servers.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    # Full jitter (BRK-3) with a low cap: a restart is ready within ~0.1 s of its log line.
    backoff = Backoff(base_s=0.02, cap_s=0.2)
    while time.monotonic() < deadline:
        if not handle.running():
            raise BrokerStartError(f"broker exited during start-up; {log_tail(log_file)}")
        # The log line means start-up finished (broker unfenced); ApiVersions proves it serves.
        if STARTED_LOG_LINE in log_file.read_text(errors="replace"):
            try:
                api_versions(host, int(port))
                return
            except (OSError, BrokerError, struct.error):
                pass
        time.sleep(backoff.next_delay())
    raise BrokerStartError(f"broker not ready after {timeout:g}s; {log_tail(log_file)}")


def _format_storage(jars: Path, config_file: Path, data_dir: Path) -> None:
    if (data_dir / "meta.properties").exists():
        return  # formatted earlier: keep its topics and offsets
    data_dir.mkdir(parents=True, exist_ok=True)
    command = [
        _java(),
        *TOOL_JVM_OPTS,
        "-cp",
        f"{jars}{os.sep}*",
        "kafka.tools.StorageTool",
        "format",
        "--standalone",
        "-t",
        _cluster_id(),
        "-c",
        str(config_file),
    ]
    result = subprocess.run(command, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise BrokerStartError(f"formatting {data_dir} failed:\n{result.stdout}{result.stderr}")


def _jvm_options(explicit: list[str] | None) -> list[str]:
    if explicit is not None:
        return explicit
    configured = TenureSettings().kafka_jvm_opts
    return shlex.split(configured) if configured.strip() else list(DEFAULT_JVM_OPTS)


def start_broker(
    port: int | None = None,
    data_dir: Path | None = None,
    state_dir: Path | None = None,
    cache_dir: Path | None = None,
    timeout: float = 60.0,
    jvm_options: list[str] | None = None,
    *,
    properties: Mapping[str, str] | None = None,
    die_with_parent: bool = False,
) -> BrokerHandle:
    """Start (or reuse) the launcher broker; return once it has started and answers ApiVersions.

    KAFKA_BOOTSTRAP_SERVERS set: nothing starts and the handle carries that address. A broker
    already recorded in ``state_dir`` is reused; ``stop()`` on such handles does nothing.
    ``properties`` override server properties (the restart benchmark's baseline uses it).
    ``die_with_parent``: the broker is SIGKILLed if this process dies (Linux; see lifeline), for
    a supervisor that must leave nothing behind; call it from the main thread then.
    """
    settings = TenureSettings()
    configured = settings.kafka_bootstrap_servers
    if configured:
        return BrokerHandle(bootstrap_servers=configured)
    state_dir = Path(state_dir) if state_dir else default_state_dir()
    running = broker_status(state_dir)
    if running is not None:
        address, pid = str(running["bootstrap_servers"]), int(str(running["pid"]))
        _say(f"reusing running broker pid {pid} at {address}")
        reused = BrokerHandle(address, pid, state_dir)
        _wait_until_ready(reused, Path(str(running["log_file"])), timeout)
        return reused
    jars = ensure_jars(cache_dir)
    data_dir = Path(data_dir) if data_dir else state_dir / "data"
    port = port or settings.kafka_port or free_port()
    _require_free(port)
    config_file, log4j_file = state_dir / "server.properties", state_dir / "log4j2.properties"
    controller_port = _previous_controller_port(config_file, data_dir) or free_port()
    while controller_port == port:
        controller_port = free_port()
    state_dir.mkdir(parents=True, exist_ok=True)
    config_file.write_text(server_properties(port, controller_port, data_dir, properties))
    log4j_file.write_text(LOG4J2_CONFIG)
    _format_storage(jars, config_file, data_dir)
    log_file = state_dir / "broker.log"
    if log_file.exists():
        log_file.replace(state_dir / "broker.log.previous")
    command = [
        _java(),
        *_jvm_options(jvm_options),
        f"-Dlog4j2.configurationFile={log4j_file}",
        "-cp",
        f"{jars}{os.sep}*",
        "kafka.Kafka",
        str(config_file),
    ]
    with log_file.open("wb") as log_stream:
        # Own session: Ctrl-C in the launching terminal must not kill the broker behind our back.
        child = subprocess.Popen(
            lifeline_argv(command) if die_with_parent else command,
            stdin=subprocess.DEVNULL,
            stdout=log_stream,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    handle = BrokerHandle(f"{HOST}:{port}", child.pid, state_dir, owned=True, _child=child)
    # Recorded before readiness so a launcher killed mid-start leaves a broker `stop` can find.
    state = {
        "pid": child.pid,
        "bootstrap_servers": handle.bootstrap_servers,
        "port": port,
        "controller_port": controller_port,
        "data_dir": str(data_dir),
        "log_file": str(log_file),
        "started_at": time.time(),
    }
    (state_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    _say(f"starting Kafka {KAFKA_VERSION} pid {child.pid} on {handle.bootstrap_servers}")
    began = time.monotonic()
    try:
        _wait_until_ready(handle, log_file, timeout)
    except BrokerStartError:
        handle.stop(grace_seconds=5.0)
        raise
    _say(f"broker ready in {time.monotonic() - began:.1f}s (log {log_file})")
    return handle


def stop_broker(state_dir: Path | None = None, grace_seconds: float = 15.0) -> bool:
    """Stop the launcher broker recorded in ``state_dir``; False if none was running."""
    state_dir = Path(state_dir) if state_dir else default_state_dir()
    state = broker_status(state_dir)
    if state is None:
        return False
    pid = int(str(state["pid"]))
    began = time.monotonic()
    outcome = stop_process(pid, grace_seconds)
    _forget_state(state_dir, pid)
    _say(f"broker pid {pid} {outcome} in {time.monotonic() - began:.1f}s")
    return True


def _run_foreground(handle: BrokerHandle, grace_seconds: float) -> int:
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # Explicit SIGINT too: a shell starting `run` in the background leaves SIGINT ignored.
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)  # `kill <launcher pid>` stops the broker too
    try:
        while handle.running():
            time.sleep(0.5)
    except KeyboardInterrupt:
        _say(f"stopping broker: {handle.stop(grace_seconds)}")
        return 0
    _say("broker exited on its own; see its log")
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.common.broker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["fetch", "start", "stop", "status", "run"])
    parser.add_argument("--port", type=int, help="PLAINTEXT port (default: env or a free one)")
    parser.add_argument("--grace", type=float, default=15.0, help="seconds from SIGTERM to SIGKILL")
    arguments = parser.parse_args(argv)
    try:
        if arguments.command == "fetch":
            print(ensure_jars())
        elif arguments.command == "status":
            state = broker_status()
            external = TenureSettings().kafka_bootstrap_servers
            if external:
                print(f"external broker (KAFKA_BOOTSTRAP_SERVERS): {external}")
            print(json.dumps(state, indent=2) if state else "launcher broker: not running")
            return 0 if state or external else 3
        elif arguments.command == "stop":
            if not stop_broker(grace_seconds=arguments.grace):
                print("launcher broker: not running")
        else:
            handle = start_broker(port=arguments.port)
            print(f"KAFKA_BOOTSTRAP_SERVERS={handle.bootstrap_servers}", flush=True)
            if arguments.command == "run":
                return _run_foreground(handle, arguments.grace)
    except BrokerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
