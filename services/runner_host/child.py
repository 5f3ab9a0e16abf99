"""One managed child: its process group, its freezer, its network, and how it is stopped.

`Containment` is what the host probed (which freezer, which network) and makes one child's
pair from it. `ManagedChild.start` prepares both, launches the command through spawn.py (so it
is inside them before it runs) in a session of its own, and `contain()` carries out QUA-1's
local stages in their order: freeze first (nothing more happens), then sever (nothing leaves),
each timed from the instruction's receipt. `terminate` / `force_stop` are EXE-7's two steps.
`close` removes the cgroup and the namespace once the tree is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.runner_host.freezer import Freezer, FreezerFactory, probe_freezers, remove_stale_cgroups
from services.runner_host.network import Network, probe_network, remove_stale_networks
from services.runner_host.spawn import spawn_argv

__all__ = ["Containment", "ContainmentTimes", "ManagedChild"]

log = logging.getLogger("tenure.runner_host")


@dataclass(frozen=True)
class ContainmentTimes:
    """One containment, measured on the host's monotonic clock from the instruction's receipt."""

    freezer: str
    network: str
    to_frozen_s: float
    to_severed_s: float
    frozen_at_wall: float  # time.time() at each stage's completion: the stage report's completedAt
    severed_at_wall: float
    # time.monotonic() at each completion: CLOCK_MONOTONIC is machine-wide on Linux, so another
    # process (the benchmark) can time its own trigger against these.
    frozen_at: float = 0.0
    severed_at: float = 0.0
    error: str = ""


class Containment:
    """The mechanisms this host uses, chosen once by probing, and the names it gives each child.

    Every cgroup and namespace is named `<prefix><n>`, prefix = "tenure-<host id>-", so that
    `remove_stale` can find what a SIGKILLed predecessor with the same host id left behind."""

    def __init__(
        self,
        host_id: str,
        *,
        freezer: str = "auto",
        network: str = "auto",
        freezer_probe: Callable[[str], tuple[str, FreezerFactory]] = probe_freezers,
        network_probe: Callable[[str], tuple[str, Callable[[str, str], Network]]] = probe_network,
    ) -> None:
        if not host_id or not all(c.isalnum() or c in "-_" for c in host_id) or len(host_id) > 40:
            raise ValueError(f"host id must be 1-40 letters, digits, - or _; got {host_id!r}")
        self.host_id = host_id
        self.prefix = f"tenure-{host_id}-"
        self.freezer_mechanism, self._freezer = freezer_probe(freezer)
        self.network_mechanism, self._network = network_probe(network)
        self._count = 0
        self._lock = threading.Lock()

    def remove_stale(self) -> list[str]:
        """Clean up cgroups, namespaces and veths of this host id (a predecessor's leftovers)."""
        removed = [str(p) for p in remove_stale_cgroups(self.prefix)]
        removed += remove_stale_networks(self.prefix)
        for item in removed:
            log.warning("removed stale containment %s of host %s", item, self.host_id)
        return removed

    def new_pair(self) -> tuple[str, Freezer, Network]:
        with self._lock:
            self._count += 1
            name = f"{self.prefix}{os.getpid()}-{self._count}"
        return name, self._freezer(name), self._network(name, self.prefix)


class ManagedChild:
    """A command run inside its own freezer and network, in a process group of its own."""

    def __init__(self, containment: Containment) -> None:
        self.name, self.freezer, self.network = containment.new_pair()
        self.process: subprocess.Popen[bytes] | None = None
        self.contained: ContainmentTimes | None = None
        self._lock = threading.Lock()  # containment and stopping never interleave
        self._closed = False
        self._prepared = False

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def prepare(self) -> ManagedChild:
        """Create the cgroup and the namespace (once); `network.host_address` is known after it."""
        if self._prepared:
            return self
        self.freezer.prepare()
        try:
            self.network.prepare()
        except Exception:
            self.freezer.close()
            raise
        self._prepared = True
        return self

    def start(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        *,
        cwd: Path | None = None,
        stdout: int | None = None,
        stderr: int | None = None,
    ) -> ManagedChild:
        """Prepare the freezer and the network, then launch `command` inside them.

        Launch from a thread that lives as long as the child should (the main thread): the
        child's SIGKILL-on-host-death is tied to the thread that forked it."""
        if not command:
            raise ValueError("no agent command to run")
        self.prepare()
        try:
            argv = spawn_argv(
                command,
                procs_files=self.freezer.procs_files(),
                netns=self.network.netns_path(),
                parent_pid=os.getpid(),
            )
            self.process = subprocess.Popen(
                argv, env=dict(env), cwd=cwd, stdout=stdout, stderr=stderr, start_new_session=True
            )
        except Exception:
            self.close()
            raise
        self.freezer.attach(self.process.pid)  # start_new_session: its pgid is its pid
        return self

    def poll(self) -> int | None:
        assert self.process is not None, "not started"
        return self.process.poll()

    def wait(self, timeout_s: float | None = None) -> int | None:
        assert self.process is not None, "not started"
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    # --- QUA-1: suspend, then sever -----------------------------------------------------------

    def contain(self, received_at: float | None = None, freeze_timeout_s: float = 2.0) -> ContainmentTimes:
        """Freeze the tree FIRST, then sever its network; each stage timed from `received_at`
        (time.monotonic() when the instruction arrived; now by default). Idempotent: a second
        call returns the first containment's figures."""
        began = time.monotonic() if received_at is None else received_at
        with self._lock:
            if self.contained is not None:
                return self.contained
            errors: list[str] = []
            try:
                self.freezer.freeze(freeze_timeout_s)
            except Exception as exc:  # still sever: a half-frozen tree must not talk either
                errors.append(f"freeze: {exc}")
                log.exception("freezing %s by %s failed", self.name, self.freezer.mechanism)
            frozen, frozen_wall = time.monotonic(), time.time()
            try:
                self.network.sever()
            except Exception as exc:
                errors.append(f"sever: {exc}")
                log.exception("severing %s by %s failed", self.name, self.network.mechanism)
            severed, severed_wall = time.monotonic(), time.time()
            self.contained = ContainmentTimes(
                freezer=self.freezer.mechanism,
                network=self.network.mechanism,
                to_frozen_s=frozen - began,
                to_severed_s=severed - began,
                frozen_at_wall=frozen_wall,
                severed_at_wall=severed_wall,
                frozen_at=frozen,
                severed_at=severed,
                error="; ".join(errors),
            )
            return self.contained

    # --- EXE-7: SIGTERM, grace, SIGKILL ---------------------------------------------------------

    def terminate(self) -> None:
        """SIGTERM the child's group (and cgroup); a frozen tree is left frozen (see force_stop)."""
        with self._lock:
            if self.poll() is None and not self.freezer.frozen:
                self.freezer.signal(signal.SIGTERM)

    def force_stop(self, timeout_s: float = 5.0) -> int | None:
        """SIGKILL the whole tree (a frozen one is thawed after the kill is queued), reap it."""
        with self._lock:
            self.freezer.kill()
        code = self.wait(timeout_s)
        with contextlib.suppress(Exception):
            # Stragglers that left the group (only a cgroup sees them).
            for pid in self.freezer.members():
                os.kill(pid, signal.SIGKILL)
        return code

    def close(self) -> None:
        """Kill whatever is left of the tree and remove its cgroup and namespace."""
        if self._closed:
            return
        self._closed = True
        if self.process is not None and self.process.poll() is None:
            self.force_stop()
        with contextlib.suppress(Exception):
            for pid in self.freezer.members():
                os.kill(pid, signal.SIGKILL)
        try:
            self.freezer.close()
        finally:
            self.network.close()
