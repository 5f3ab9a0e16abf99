"""The saga's moving parts as subprocesses, and a runner that speaks Kafka, for benchmarks.

`SagaProcesses` runs the lease coordinator, the effect gateway, the simulated environment and the
saga orchestrator on temp state dirs (bench.foundation's `spawn`); the environment can be
restarted with another TENURE_SIM_TIME_SCALE. `SagaDriver` is a user's service that publishes
Avro commands on the command topics itself and keeps every record of its runs that lands on
trajectories.events and runs.events, with the monotonic time the driver saw it, so a benchmark
can count log writes and time phases from the log itself. Nothing here imports from tests/.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

import httpx

from bench.foundation import Service, say, service_env, spawn, submit_command
from services.common.broker import free_port, stop_process
from services.common.contracts import (
    AttemptClaimed,
    ClaimRun,
    CommandRejected,
    ProposeStep,
    StartTrajectory,
    TrajectoryCommand,
)
from services.common.ids import derived_id
from services.common.kafka import CommandPublisher, OutboundRecord, TopicFollower
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.routing import command_record, trajectory_command_record
from services.common.topics import (
    RUNS_EVENTS,
    RUNS_REJECTIONS,
    TRAJECTORIES_EVENTS,
    TRAJECTORIES_REJECTIONS,
)

__all__ = ["Lease", "Logged", "SagaDriver", "SagaProcesses", "WaitFailed"]

T = TypeVar("T")
TENANT = "bench-saga"
# Tool answers take their nominal time at TENURE_SIM_TIME_SCALE=1 (a 4.2 s compile): the gateway's
# tool timeout must be well above it, or the compile would be reconciled by probe, not answered.
TOOL_TIMEOUT_S = "15"


class WaitFailed(RuntimeError):
    """A run did not reach the awaited state (timeout, rejection, or an unexpected outcome)."""


class SagaProcesses:
    """Coordinator, gateway, simulated environment and orchestrator; one shared state dir."""

    def __init__(self, bootstrap: str, workdir: Path, tag: str, time_scale: float = 0.0) -> None:
        self.workdir = workdir
        self.gateway_url = f"http://127.0.0.1:{free_port()}"
        self.sim_port = free_port()
        self.sim_url = f"http://127.0.0.1:{self.sim_port}"
        self.time_scale = time_scale
        self._env = service_env(
            bootstrap,
            workdir / "state",
            TENURE_INSTANCE_ID=f"bench-{tag}",
            TENURE_GATEWAY_PORT=self.gateway_url.rsplit(":", 1)[1],
            TENURE_SIM_PORT=str(self.sim_port),
            TENURE_TOOLS=f"env={self.sim_url}",
            TENURE_GATEWAY_URL=self.gateway_url,
            TENURE_DECISION_TIMEOUT_S="10",
            TENURE_TOOL_TIMEOUT_S=TOOL_TIMEOUT_S,
        )
        self.services: dict[str, Service] = {}
        self._http = httpx.Client(timeout=10.0)

    def _spawn(self, name: str, module: str, **extra: str) -> None:
        self.services[name] = spawn(name, module, self.workdir / name, {**self._env, **extra})

    def _spawn_environment(self) -> None:
        self._spawn(
            "sim_environment", "services.sim_environment", TENURE_SIM_TIME_SCALE=f"{self.time_scale:g}"
        )

    def start(self) -> SagaProcesses:
        self._spawn("lease_coordinator", "services.lease_coordinator")
        self._spawn_environment()
        self._spawn("effect_gateway", "services.effect_gateway")
        self._spawn("saga_orchestrator", "services.saga_orchestrator")
        self.wait_healthy(f"{self.sim_url}/healthz", "sim_environment")
        # The gateway is ready (/readyz 200) only once it has read runs.events to the end.
        self.wait_healthy(f"{self.gateway_url}/readyz", "effect_gateway", timeout_s=90)
        return self

    def restart_environment(self, time_scale: float) -> None:
        """A fresh simulated world answering with its nominal durations times `time_scale`."""
        service = self.services.pop("sim_environment")
        stop_process(service.process.pid, 10.0, service.process)
        self.time_scale = time_scale
        self._spawn_environment()
        self.wait_healthy(f"{self.sim_url}/healthz", "sim_environment")
        health = self._http.get(f"{self.sim_url}/healthz").json()
        if float(health.get("timeScale", -1)) != time_scale:
            raise RuntimeError(f"the environment runs at time scale {health}, not {time_scale:g}")

    def wait_healthy(self, url: str, name: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.services[name].check_alive()
            try:
                if self._http.get(url, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{name} at {url} was not healthy after {timeout_s:.0f}s")

    def check_alive(self) -> None:
        for service in self.services.values():
            service.check_alive()

    def pids(self) -> dict[str, int]:
        return {name: s.process.pid for name, s in self.services.items()}

    def stop(self) -> None:
        for name in ("saga_orchestrator", "effect_gateway", "sim_environment", "lease_coordinator"):
            service = self.services.pop(name, None)
            if service is not None:
                outcome = stop_process(service.process.pid, 15.0, service.process)
                say(f"stopped {name}: {outcome} (exit code {service.process.returncode})")
        self._http.close()

    # --- the simulated environment ------------------------------------------------------------

    def arm(self, operation: str, kind: str = "error", **fault: Any) -> None:
        response = self._http.post(
            f"{self.sim_url}/faults", json={"operation": operation, "kind": kind, **fault}
        )
        if response.status_code != 201:
            raise RuntimeError(f"arming {operation} failed: {response.status_code} {response.text[:300]}")

    def clear_faults(self) -> None:
        self._http.delete(f"{self.sim_url}/faults").raise_for_status()

    def audit(self) -> dict[str, Any]:
        response = self._http.get(f"{self.sim_url}/audit")
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body


@dataclass(frozen=True)
class Lease:
    run_id: str
    attempt_id: str
    epoch: int


@dataclass(frozen=True)
class Logged:
    """One record of a run on an event topic, decoded, with when this driver saw it."""

    topic: str
    partition: int
    offset: int
    message: Any
    seen: float  # time.monotonic() when the follower returned it

    @property
    def type_name(self) -> str:
        return type(self.message).__name__


class SagaDriver:
    """Publishes run and trajectory commands; follows the event topics from their end as of now."""

    def __init__(self, bootstrap: str, name: str = "bench-runner") -> None:
        self.name = name
        self._codec = MessageCodec()
        self._publisher = CommandPublisher(bootstrap, client_id=f"tenure-{name}")
        topics = [
            TRAJECTORIES_EVENTS.name,
            TRAJECTORIES_REJECTIONS.name,
            RUNS_EVENTS.name,
            RUNS_REJECTIONS.name,
        ]
        self._follower = TopicFollower(bootstrap, topics, "end", client_id=f"tenure-{name}-follower")
        self._lock = threading.Lock()
        self._records: dict[str, list[Logged]] = {}
        self._rejections: dict[str, CommandRejected] = {}
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._seq = 0
        self._thread = threading.Thread(target=self._follow, name="saga-driver", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            while not self._stop.is_set():
                for record in self._follower.poll(max_records=1000, timeout_s=0.05):
                    seen = time.monotonic()
                    try:
                        message = self._codec.decode(record.value)
                    except UndecodableRecord:
                        continue
                    with self._lock:
                        if isinstance(message, CommandRejected):
                            self._rejections[message.causation_id] = message
                        else:
                            logged = Logged(record.topic, record.partition, record.offset, message, seen)
                            self._records.setdefault(message.run_id, []).append(logged)
        except BaseException as exc:  # reported by the next wait: a dead follower would hang the bench
            self._error = exc
        finally:
            self._follower.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10.0)
        self._publisher.close()

    def records(self, run_id: str) -> list[Logged]:
        with self._lock:
            return list(self._records.get(run_id, []))

    def wait_for(
        self,
        run_id: str,
        find: Callable[[list[Logged]], T | None],
        what: str,
        timeout_s: float,
        command_id: str | None = None,
        on_tick: Callable[[], None] = lambda: None,
    ) -> T:
        deadline = time.monotonic() + timeout_s
        while True:
            if self._error is not None:
                raise RuntimeError(f"the event follower failed: {self._error!r}") from self._error
            with self._lock:
                rejection = self._rejections.get(command_id) if command_id else None
            if rejection is not None:
                raise WaitFailed(
                    f"{what}: {rejection.command_type} rejected {rejection.code}: {rejection.detail}"
                )
            found = find(self.records(run_id))
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise WaitFailed(f"timed out after {timeout_s:.0f}s waiting for {what} of {run_id}")
            on_tick()
            time.sleep(0.001)

    # --- commands ----------------------------------------------------------------------------

    def _send_run_command(self, record: OutboundRecord) -> None:
        self._publisher.publish(record).result(10)

    def send(self, command: TrajectoryCommand) -> str:
        self._publisher.publish(trajectory_command_record(self._codec, command)).result(10)
        return command.command_id

    def header(self, run_id: str) -> dict[str, Any]:
        self._seq += 1
        return {
            "command_id": derived_id("cmd", self.name, run_id, str(self._seq), str(time.time_ns())),
            "run_id": run_id,
            "issued_at": int(time.time() * 1000),
            "correlation_id": run_id,
            "actor": self.name,
        }

    def claim_new_run(self, key: str, timeout_s: float, on_tick: Callable[[], None] = lambda: None) -> Lease:
        """SubmitRun + ClaimRun on runs.commands; the lease once AttemptClaimed is on runs.events."""
        run_id, submit = submit_command(self._codec, TENANT, key)
        self._send_run_command(submit)
        claim = ClaimRun(
            command_id=derived_id("cmd", run_id, "claim", key),
            run_id=run_id,
            issued_at=int(time.time() * 1000),
            correlation_id=key,
            actor=self.name,
            runner_id=self.name,
            lease_seconds=600,
            heartbeat_seconds=60,
        )
        self._send_run_command(command_record(self._codec, claim))

        def claimed(records: list[Logged]) -> Lease | None:
            for r in records:
                if isinstance(r.message, AttemptClaimed):
                    return Lease(run_id, r.message.attempt_id, r.message.epoch)
            return None

        return self.wait_for(run_id, claimed, "the claim", timeout_s, claim.command_id, on_tick)

    def start_trajectory(self, lease: Lease, timeout_s: float, **fields: Any) -> None:
        command_id = self.send(
            StartTrajectory(
                **self.header(lease.run_id), attempt_id=lease.attempt_id, lease_epoch=lease.epoch, **fields
            )
        )
        self.wait_for(
            lease.run_id,
            lambda rs: next((r for r in rs if r.type_name == "TrajectoryStarted"), None),
            "TrajectoryStarted",
            timeout_s,
            command_id,
        )

    def propose(self, lease: Lease, tool: str, params: dict[str, Any]) -> ProposeStep:
        command = ProposeStep(
            **self.header(lease.run_id),
            attempt_id=lease.attempt_id,
            lease_epoch=lease.epoch,
            tool=tool,
            params=json.dumps(params),
        )
        self.send(command)
        return command
