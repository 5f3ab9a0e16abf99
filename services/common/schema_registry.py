"""Run a real Apicurio Registry (in-memory storage) for the Confluent wire format, without Docker.

Like the bundled broker (services/common/broker.py), it comes from Maven Central: the
`io.apicurio:apicurio-registry-app` release's `all` tar.gz holds the Quarkus runner jar and its
lib/ folder, with H2 in-memory storage as the default. It is fetched once with Maven into a
git-ignored cache (.cache/apicurio/<version>) and run with the Java 17 the broker uses. The 2.6
line runs on Java 17 and serves the Confluent-compatible API at /apis/ccompat/v7 (what
TENURE_SCHEMA_REGISTRY_URL names); state is lost when it stops, which suits tests and demos.

CLI: ``python -m services.common.schema_registry {fetch,run} [--port N]``.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from services.common.backoff import Backoff
from services.common.broker import REPO_ROOT, free_port, stop_process
from services.common.jvm import fetch_with_maven, find_java, log_tail
from services.common.lifeline import lifeline_argv
from services.common.settings import TenureSettings

__all__ = [
    "APICURIO_VERSION",
    "RegistryHandle",
    "RegistryStartError",
    "ensure_registry",
    "main",
    "start_registry",
]

APICURIO_VERSION = "2.6.13.Final"
_ARTIFACT = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all"
_RUNNER = f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"
_MARKER = ".tenure-complete"
HOST = "127.0.0.1"
# Small heap and the C1 compiler only: it starts in ~6 s on two shared cores and serves a test.
_JVM_OPTS = ["-Xms64m", "-Xmx384m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]


class RegistryStartError(RuntimeError):
    """Apicurio could not be fetched, or did not start and answer."""


def _say(message: str) -> None:
    print(f"[registry-launcher] {message}", file=sys.stderr, flush=True)


def default_cache_dir() -> Path:
    return REPO_ROOT / ".cache" / "apicurio" / APICURIO_VERSION


def ensure_registry(cache_dir: Path | None = None) -> Path:
    """The folder holding the runner jar and lib/, fetched with Maven on first use."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    if (cache_dir / _MARKER).is_file() and (cache_dir / _RUNNER).is_file():
        return cache_dir
    _say(f"fetching {_ARTIFACT} with Maven into {cache_dir} ...")

    def finish(staging: Path) -> None:
        archives = list(staging.glob("*.tar.gz"))
        if len(archives) != 1:
            raise RegistryStartError(f"mvn fetched {len(archives)} Apicurio archives, not one")
        with tarfile.open(archives[0]) as archive:
            archive.extractall(staging, filter="data")
        archives[0].unlink()
        if not (staging / _RUNNER).is_file():
            raise RegistryStartError(f"the Apicurio archive has no {_RUNNER}")
        (staging / _MARKER).write_text(APICURIO_VERSION + "\n")

    fetch_with_maven(
        cache_dir,
        f"Apicurio Registry {APICURIO_VERSION}",
        lambda staging: ["dependency:copy", f"-Dartifact={_ARTIFACT}", f"-DoutputDirectory={staging}"],
        finish,
        lambda cache: (cache / _MARKER).is_file(),
        RegistryStartError,
    )
    return cache_dir


@dataclass
class RegistryHandle:
    """A running Apicurio Registry this process started; `stop()` ends it."""

    port: int
    pid: int
    log_file: Path
    _child: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def ccompat_url(self) -> str:
        """The Confluent-compatible API: the value of TENURE_SCHEMA_REGISTRY_URL."""
        return f"{self.url}/apis/ccompat/v7"

    def running(self) -> bool:
        return self._child is not None and self._child.poll() is None

    def stop(self, grace_seconds: float = 10.0) -> str:
        return stop_process(self.pid, grace_seconds, self._child)


def start_registry(
    work_dir: Path, port: int | None = None, timeout_s: float = 90.0, cache_dir: Path | None = None
) -> RegistryHandle:
    """Start Apicurio on `port` (a free one if None) and wait until its ccompat API answers."""
    home = ensure_registry(cache_dir)
    port = port or free_port()
    work_dir.mkdir(parents=True, exist_ok=True)
    log_file = work_dir / "apicurio.log"
    command = [
        find_java(RegistryStartError),
        *_JVM_OPTS,
        f"-Dquarkus.http.host={HOST}",
        f"-Dquarkus.http.port={port}",
        "-jar",
        str(home / _RUNNER),
    ]
    with log_file.open("ab") as log:
        # The lifeline SIGKILLs the JVM if this process dies, so no registry is left behind.
        child = subprocess.Popen(lifeline_argv(command), cwd=work_dir, stdout=log, stderr=subprocess.STDOUT)
    handle = RegistryHandle(port, child.pid, log_file, child)
    deadline = time.monotonic() + timeout_s
    backoff = Backoff(base_s=0.1, cap_s=1.0)
    while time.monotonic() < deadline:
        if not handle.running():
            raise RegistryStartError(f"Apicurio exited during start-up; {log_tail(log_file)}")
        try:
            if httpx.get(f"{handle.ccompat_url}/subjects", timeout=2.0).status_code == 200:
                return handle
        except httpx.HTTPError:
            pass
        time.sleep(backoff.next_delay())
    handle.stop()
    raise RegistryStartError(f"Apicurio not ready after {timeout_s:g}s; {log_tail(log_file)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.common.schema_registry")
    parser.add_argument("action", choices=["fetch", "run"])
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    args = parser.parse_args(argv)
    if args.action == "fetch":
        print(ensure_registry())
        return 0
    handle = start_registry(TenureSettings().state_dir / "apicurio", args.port)
    print(f"TENURE_SCHEMA_REGISTRY_URL={handle.ccompat_url}", flush=True)
    stopping = False

    def interrupt(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    while not stopping and handle.running():
        time.sleep(0.5)
    handle.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
