"""The saga's moving parts as real processes, and a runner that speaks Kafka directly.

`SagaSystem` runs the lease coordinator, the effect gateway, the simulated environment and the
saga orchestrator as OS processes (so they can be SIGKILLed). `SagaRunner` is a user's service
that publishes Avro commands on the command topics itself (no HTTP API in between) and folds
trajectories.events with the pure `evolve`, as any consumer of the log would.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx

from services.common.contracts import (
    TRAJECTORY_EVENT_TYPES,
    AttemptClaimed,
    ClaimRun,
    CommandRejected,
    LeaseTakenOver,
    ProposeStep,
    StartTrajectory,
    TrajectoryCommand,
)
from services.common.ids import canonical_json, derived_id
from services.common.kafka import CommandPublisher, TopicFollower
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.routing import command_record, trajectory_command_record
from services.common.topics import RUNS_EVENTS, TRAJECTORIES_EVENTS, TRAJECTORIES_REJECTIONS
from services.saga_orchestrator.domain import TrajectoryState, evolve
from tests.support.system import (
    ServiceProcess,
    service_env,
    stop_all,
    submit_command,
    wait_for_http,
    wait_until,
)
from tests.support.tenure import free_port


class SagaSystem:
    def __init__(self, bootstrap: str, tmp: Path, **env: str) -> None:
        self.tmp = tmp
        self.gateway_port = free_port()
        self.sim_port = free_port()
        self.gateway_url = f"http://127.0.0.1:{self.gateway_port}"
        self.sim_url = f"http://127.0.0.1:{self.sim_port}"
        self.env = service_env(
            bootstrap,
            tmp / "state",
            TENURE_GATEWAY_PORT=str(self.gateway_port),
            TENURE_SIM_PORT=str(self.sim_port),
            TENURE_TOOLS=f"env={self.sim_url}",
            TENURE_GATEWAY_URL=self.gateway_url,
            TENURE_DECISION_TIMEOUT_S="10",
            TENURE_TOOL_TIMEOUT_S="2",
            **env,
        )
        self.coordinator = ServiceProcess("lease-coordinator", "services.lease_coordinator", self.env, tmp)
        self.gateway = ServiceProcess("effect-gateway", "services.effect_gateway", self.env, tmp)
        self.sim = ServiceProcess("sim-environment", "services.sim_environment", self.env, tmp)
        self.orchestrator = ServiceProcess("saga-orchestrator", "services.saga_orchestrator", self.env, tmp)

    def start(self) -> SagaSystem:
        for service in (self.coordinator, self.sim, self.gateway, self.orchestrator):
            service.start()
        wait_for_http(f"{self.sim_url}/healthz")
        wait_for_http(f"{self.gateway_url}/readyz", timeout_s=60)
        return self

    def stop(self) -> None:
        stop_all((self.orchestrator, self.gateway, self.sim, self.coordinator))

    # --- the simulated environment --------------------------------------------------------------

    def arm(self, operation: str, kind: str = "error", **fault: Any) -> None:
        response = httpx.post(f"{self.sim_url}/faults", json={"operation": operation, "kind": kind, **fault})
        assert response.status_code == 201, response.text

    def clear_faults(self) -> None:
        httpx.delete(f"{self.sim_url}/faults").raise_for_status()

    def audit(self) -> dict[str, Any]:
        response = httpx.get(f"{self.sim_url}/audit")
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body


def of_run(
    entries: list[dict[str, Any]], run_id: str, key_field: str = "createdByKey"
) -> list[dict[str, Any]]:
    """Audit entries caused by one run (every idempotency key starts with its run id)."""
    return [e for e in entries if str(e.get(key_field, "")).startswith(run_id + "/")]


@dataclass(frozen=True)
class Lease:
    run_id: str
    attempt_id: str
    epoch: int


class SagaRunner:
    def __init__(self, bootstrap: str, name: str = "runner-a") -> None:
        self.name = name
        self._codec = MessageCodec()
        self._publisher = CommandPublisher(bootstrap, client_id=f"test-{name}")
        self._follower = TopicFollower(
            bootstrap,
            [TRAJECTORIES_EVENTS.name, TRAJECTORIES_REJECTIONS.name, RUNS_EVENTS.name],
            "beginning",
            client_id=f"test-{name}-follower",
        )
        self._lock = threading.Lock()
        self.states: dict[str, TrajectoryState] = {}
        self.events: dict[str, list[Any]] = {}
        self.rejections: dict[str, CommandRejected] = {}
        self.leases: dict[str, Lease] = {}
        self._stop = threading.Event()
        self._seq = 0
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._stop.is_set():
            for record in self._follower.poll(max_records=1000, timeout_s=0.1):
                try:
                    message = self._codec.decode(record.value)
                except UndecodableRecord:
                    continue
                with self._lock:
                    if isinstance(message, CommandRejected) and record.topic == TRAJECTORIES_REJECTIONS.name:
                        self.rejections[message.causation_id] = message
                    elif isinstance(message, TRAJECTORY_EVENT_TYPES):
                        state = self.states.get(message.run_id)
                        if state is None or message.version == state.version + 1:
                            self.states[message.run_id] = evolve(state, message)
                            self.events.setdefault(message.run_id, []).append(message)
                    elif isinstance(message, (AttemptClaimed, LeaseTakenOver)):
                        self.leases[message.run_id] = Lease(message.run_id, message.attempt_id, message.epoch)
        self._follower.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._publisher.close()

    # --- runs and leases ------------------------------------------------------------------------

    def claim_new_run(self, key: str, lease_seconds: int = 600, tenant: str = "acme") -> Lease:
        submit = submit_command(tenant, key)
        self._publisher.publish(command_record(self._codec, submit)).result(10)
        claim = ClaimRun(
            command_id=derived_id("cmd", submit.run_id, "claim", key),
            run_id=submit.run_id,
            issued_at=int(time.time() * 1000),
            correlation_id=key,
            actor=self.name,
            runner_id=self.name,
            lease_seconds=lease_seconds,
            heartbeat_seconds=min(lease_seconds, 60),
        )
        self._publisher.publish(command_record(self._codec, claim)).result(10)
        lease: Lease = wait_until(lambda: self.leases.get(submit.run_id), 30, f"a lease on {submit.run_id}")
        return lease

    # --- trajectory commands --------------------------------------------------------------------

    def publish_run_command(self, command: Any) -> str:
        self._publisher.publish(command_record(self._codec, command)).result(10)
        return str(command.command_id)

    def send(self, command: TrajectoryCommand) -> str:
        self._publisher.publish(trajectory_command_record(self._codec, command)).result(10)
        return command.command_id

    def header(self, run_id: str) -> dict[str, Any]:
        self._seq += 1
        return {
            "command_id": derived_id("cmd", self.name, run_id, str(self._seq), str(time.time())),
            "run_id": run_id,
            "issued_at": int(time.time() * 1000),
            "correlation_id": run_id,
            "actor": self.name,
        }

    def start(self, lease: Lease, **fields: Any) -> TrajectoryState:
        plan = fields.pop("plan", None)
        command_id = self.send(
            StartTrajectory(
                **self.header(lease.run_id),
                attempt_id=lease.attempt_id,
                lease_epoch=lease.epoch,
                plan=canonical_json(plan) if plan is not None else "",
                **fields,
            )
        )
        return self.wait(
            lease.run_id, lambda s: command_id in s.causes, f"trajectory of {lease.run_id}", command_id
        )

    def propose(self, lease: Lease, tool: str, params: dict[str, Any], **fields: Any) -> str:
        return self.send(
            ProposeStep(
                **self.header(lease.run_id),
                attempt_id=lease.attempt_id,
                lease_epoch=lease.epoch,
                tool=tool,
                params=json.dumps(params),
                **fields,
            )
        )

    def state(self, run_id: str) -> TrajectoryState | None:
        with self._lock:
            return self.states.get(run_id)

    def wait(
        self,
        run_id: str,
        predicate: Callable[[TrajectoryState], bool],
        what: str,
        command_id: str | None = None,
        timeout_s: float = 45,
    ) -> TrajectoryState:
        def check() -> TrajectoryState | None:
            if command_id is not None and command_id in self.rejections:
                rejection = self.rejections[command_id]
                raise AssertionError(f"{what}: rejected {rejection.code}: {rejection.detail}")
            state = self.state(run_id)
            return state if state is not None and predicate(state) else None

        result: TrajectoryState = wait_until(check, timeout_s, what)
        return result

    def rejection(self, command_id: str, timeout_s: float = 30) -> CommandRejected:
        found: CommandRejected = wait_until(lambda: self.rejections.get(command_id), timeout_s, "a rejection")
        return found

    def history(self, run_id: str) -> list[Any]:
        with self._lock:
            return list(self.events.get(run_id, []))

    def step_settled(self, lease: Lease, index: int, timeout_s: float = 45) -> TrajectoryState:
        """Wait until step `index` exists and is no longer in flight."""
        return self.wait(
            lease.run_id,
            lambda s: s.step(index) is not None and not s.steps[index].is_open,
            f"step {index} of {lease.run_id} to settle",
            timeout_s=timeout_s,
        )
