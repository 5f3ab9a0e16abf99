"""N instances of one consumer-group processor as real processes (issue 16: scale-out tests).

Each instance gets its own TENURE_INSTANCE_ID (so its own `group.instance.id`, transactional id
and state folder <state>/<name>-<id>) and its own health port; `coverage` reads who owns which
partition from each instance's /readyz, the way an operator would."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.system import ServiceProcess, service_env, stop_all, wait_until
from tests.support.tenure import free_port

__all__ = ["Instance", "ProcessorFleet"]

EXIT_FENCED = 75  # services/common/streams/_runtime.py: a supervisor restarts it
_PARTITIONS = re.compile(r"partitions \[([0-9, ]*)\]")


@dataclass
class Instance:
    instance_id: str
    process: ServiceProcess
    health_port: int

    def readiness(self) -> tuple[bool, frozenset[int] | None]:
        """(ready, the partitions it says it owns) from /readyz; (False, None) if it does not answer."""
        try:
            response = httpx.get(f"http://127.0.0.1:{self.health_port}/readyz", timeout=1.0)
        except httpx.HTTPError:
            return False, None
        try:
            detail = str(response.json()["checks"]["assignment"]["detail"])
        except (KeyError, ValueError, TypeError):
            return False, None
        found = _PARTITIONS.search(detail)
        if response.status_code != 200 or found is None:
            return False, None
        return True, frozenset(int(p) for p in found.group(1).split(",") if p.strip())


class ProcessorFleet:
    """Instances of `module` in one consumer group, started, SIGKILLed and stopped one by one."""

    def __init__(
        self,
        name: str,
        module: str,
        health_port_variable: str,
        bootstrap: str,
        tmp: Path,
        partitions: int,
        *,
        restart_fenced: bool = False,
        **env: str,
    ) -> None:
        self.name = name
        # As `tenure up` does: an instance that exits fenced (75, EX_TEMPFAIL: the group moved
        # on from its generation) is started again under the same id and rejoins. Off by default,
        # so that a test of the fence itself sees the exit.
        self.restart_fenced = restart_fenced
        self.fenced_restarts: list[str] = []
        self.module = module
        self.partitions = partitions
        self.tmp = tmp
        self.state_dir = tmp / "state"
        self._port_variable = health_port_variable
        # Ports are chosen free here, not derived from the id (the stride is for `tenure up`).
        # The generation fence is what keeps a handed-over partition from being decided twice
        # (tenure up --instances and compose turn it on; said here so these tests never run without it).
        env = {"TENURE_GROUP_FENCE": "true", **env}
        self._env = service_env(bootstrap, self.state_dir, TENURE_INSTANCE_PORT_STRIDE="0", **env)
        self.instances: dict[str, Instance] = {}

    def add(self, instance_id: str) -> Instance:
        port = free_port()
        env = {**self._env, "TENURE_INSTANCE_ID": instance_id, self._port_variable: str(port)}
        process = ServiceProcess(f"{self.name}-{instance_id}", self.module, env, self.tmp).start()
        instance = Instance(instance_id, process, port)
        self.instances[instance_id] = instance
        return instance

    def alive(self) -> list[Instance]:
        self._supervise()
        return [i for i in self.instances.values() if i.process.alive()]

    def _supervise(self) -> None:
        if not self.restart_fenced:
            return
        for instance in self.instances.values():
            process = instance.process.process
            if process is not None and process.poll() == EXIT_FENCED:
                self.fenced_restarts.append(instance.instance_id)
                instance.process.start()

    def coverage(self) -> dict[str, frozenset[int]] | None:
        """Each live instance's partitions, if every one is ready and together they own every
        partition exactly once; else None."""
        owned: dict[str, frozenset[int]] = {}
        for instance in self.alive():
            ready, partitions = instance.readiness()
            if not ready or partitions is None:
                return None
            owned[instance.instance_id] = partitions
        every = [p for partitions in owned.values() for p in partitions]
        return owned if sorted(every) == list(range(self.partitions)) else None

    def wait_covered(
        self, timeout_s: float, members: int | None = None
    ) -> tuple[dict[str, frozenset[int]], float]:
        """Wait until the live instances (all `members` of them, if given, each with partitions
        when there are enough) own every partition once; returns that map and the seconds it took."""
        began = time.monotonic()

        def covered() -> dict[str, frozenset[int]] | None:
            self._supervise()
            for instance in self.instances.values():
                process = instance.process.process
                if process is not None and process.poll() not in (None, -9):  # -9: our SIGKILL
                    raise AssertionError(f"{instance.process.name} exited:\n{instance.process.log_tail()}")
            owned = self.coverage()
            if owned is None or (members is not None and len(owned) != members):
                return None
            if members is not None and members <= self.partitions and not all(owned.values()):
                return None
            return owned

        owned: dict[str, frozenset[int]] = wait_until(
            covered, timeout_s, f"{self.name} to cover its partitions", 0.2
        )
        return owned, time.monotonic() - began

    def store_path(self, instance_id: str, store_folder: str) -> Path:
        return self.state_dir / f"{store_folder}-{instance_id}"

    def stop_all(self) -> None:
        stop_all(instance.process for instance in self.instances.values())

    def log_tails(self) -> str:
        return "\n".join(f"--- {i.process.name}\n{i.process.log_tail(30)}" for i in self.instances.values())
