"""Running Tenure's services as real OS processes in tests, so they can really be SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx

from services.common.contracts import CancelRun, SubmitRun
from services.common.ids import canonical_json, command_id_for, run_id_for
from services.common.kafka import InboundRecord, PartitionReader
from services.common.lifeline import lifeline_argv
from services.common.messages import MessageCodec

REPO_ROOT = Path(__file__).resolve().parents[2]


class ServiceProcess:
    def __init__(self, name: str, module: str, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.module = module
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> ServiceProcess:
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            log.write(f"\n===== start #{self.starts + 1} =====\n".encode())
            log.flush()
            # A lifeline: a pytest run that is killed (a timeout, Ctrl-C) takes its services
            # with it instead of leaving them running and loading the machine.
            self.process = subprocess.Popen(
                lifeline_argv([sys.executable, "-m", self.module]),
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.starts += 1
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def sigkill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self, grace_s: float = 15.0) -> int | None:
        self.terminate()
        return self.wait_stopped(grace_s)

    def terminate(self) -> None:
        """SIGTERM, once, without waiting (`stop_all` waits for many at once). Once only: a
        second SIGTERM makes uvicorn skip its graceful shutdown."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)

    def wait_stopped(self, grace_s: float) -> int | None:
        """The exit code once the process has exited; SIGKILL if it is still running past `grace_s`."""
        if self.process is None:
            return None
        try:
            return self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait(10)

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def stop_all(services: Iterable[ServiceProcess], grace_s: float = 15.0) -> None:
    """Stop independent processes together: SIGTERM to every one, then wait for each within one
    grace period (SIGKILL past it). One at a time, a system of six or seven took 3-6 s to stop
    (a consumer group member leaves its group in ~1.4 s), in every module's teardown."""
    services = list(services)
    for service in services:
        service.terminate()
    deadline = time.monotonic() + grace_s
    for service in services:
        service.wait_stopped(max(0.0, deadline - time.monotonic()))


def service_env(bootstrap: str, state_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        KAFKA_BOOTSTRAP_SERVERS=bootstrap,
        TENURE_STATE_DIR=str(state_dir),
        PYTHONPATH=str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        TENURE_LOG_LEVEL="INFO",
        # A teardown cuts what is still held (a simulated tool's hung answer) after 3 s, not 10.
        TENURE_HTTP_SHUTDOWN_GRACE_S="3",
    )
    env.update(extra)
    return env


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(poll_s)


def read_topic(bootstrap: str, topic: str, partitions: int) -> list[InboundRecord]:
    """Every committed record of `topic`, partition by partition, up to the end as of now."""
    reader = PartitionReader(bootstrap, client_id="tenure-test-reader")
    try:
        return [r for p in range(partitions) for r in reader.read(topic, p, 0)]
    finally:
        reader.close()


FOREIGN_HEADER = "tenure-test-foreign"


def decode_all(records: Iterator[InboundRecord] | list[InboundRecord]) -> list[Any]:
    """Decode Tenure's records; records a test planted on purpose as garbage are left out."""
    codec = MessageCodec()
    return [codec.decode(r.value) for r in records if not any(k == FOREIGN_HEADER for k, _ in r.headers)]


def submit_command(
    tenant: str, key: str, spec: dict[str, Any] | None = None, actor: str = "tests"
) -> SubmitRun:
    run_id = run_id_for(tenant, key)
    return SubmitRun(
        command_id=command_id_for(run_id, "SubmitRun", key),
        run_id=run_id,
        issued_at=int(time.time() * 1000),
        correlation_id=f"corr-{key}",
        actor=actor,
        tenant=tenant,
        idempotency_key=key,
        execution_spec=canonical_json(spec or {"agent": "test", "key": key}),
        timeout_seconds=600,
    )


def cancel_command(run_id: str, key: str, reason: str = "test cancel") -> CancelRun:
    return CancelRun(
        command_id=command_id_for(run_id, "CancelRun", key),
        run_id=run_id,
        issued_at=int(time.time() * 1000),
        correlation_id=f"corr-{key}",
        actor="tests",
        reason=reason,
    )


def wait_for_http(url: str, timeout_s: float = 30.0) -> None:
    def ready() -> bool:
        try:
            return httpx.get(url, timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(ready, timeout_s, f"{url} to answer")


def free_port() -> int:
    """A TCP port nothing listens on right now (for a child's health or API port), outside the
    ephemeral range that clients' connections take theirs from (services/common/broker.py)."""
    from services.common.broker import free_port as listen_port

    return listen_port()


def wait_for_ready(
    port: int, timeout_s: float = 60.0, process: ServiceProcess | None = None
) -> dict[str, Any]:
    """Wait until a processor's health server answers GET /readyz 200; returns that body."""
    return wait_for_readyz(f"http://127.0.0.1:{port}", timeout_s, process, poll_s=0.2)


def wait_for_readyz(
    base: str, timeout_s: float, process: ServiceProcess | None = None, poll_s: float = 0.2
) -> dict[str, Any]:
    """Wait until `base`/readyz answers 200 (a processor's health server or an API); returns
    that body. Fails at once if `process` dies meanwhile, and otherwise names the last 503's
    failed checks."""
    last: dict[str, Any] = {}

    def ready() -> dict[str, Any] | None:
        nonlocal last
        if process is not None and not process.alive():
            raise AssertionError(f"{process.name} exited while waiting for /readyz:\n{process.log_tail()}")
        try:
            response = httpx.get(f"{base}/readyz", timeout=3.0)
        except httpx.HTTPError as exc:
            last = {"error": str(exc)}
            return None
        last = response.json()
        return last if response.status_code == 200 else None

    try:
        body: dict[str, Any] = wait_until(ready, timeout_s, f"{base}/readyz", poll_s=poll_s)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last answer: {last}") from None
    return body
