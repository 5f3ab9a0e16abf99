"""A multi-node Apache Kafka KRaft cluster on this machine: N processes, own ports and data dirs.

Each node is a combined broker+controller; the N controllers form a static quorum
(controller.quorum.voters), so with three nodes the metadata quorum and every partition with
replication factor 3 survive the loss of any one node. Optionally the client listener requires
SASL/SCRAM: the credentials are created when the storage is formatted (`kafka-storage format
--add-scram`), as KRaft keeps them in the metadata log. The jars, the Java and the log set-up are
those of the single-node launcher (services.common.broker), which stays the default for
development; this one is for the integration tests (tests/support/kafka_cluster.py) and drills.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from services.common._broker_config import (
    CLUSTER_JVM_OPTS,
    HOST,
    LOG4J2_CONFIG,
    STARTED_LOG_LINE,
    TOOL_JVM_OPTS,
    cluster_node_properties,
)
from services.common.broker import (
    BrokerHandle,
    BrokerStartError,
    _cluster_id,
    _java,
    _wait_until_ready,
    ensure_jars,
    free_port,
)
from services.common.lifeline import lifeline_argv

__all__ = ["ClusterHandle", "ScramUser", "start_cluster"]


@dataclass(frozen=True)
class ScramUser:
    name: str
    password: str = field(repr=False)
    mechanism: str = "SCRAM-SHA-512"

    def format_argument(self) -> str:
        return f"{self.mechanism}=[name={self.name},password={self.password}]"


@dataclass
class _Node:
    node_id: int
    port: int
    controller_port: int
    home: Path
    handle: BrokerHandle | None = None

    @property
    def config_file(self) -> Path:
        return self.home / "server.properties"

    @property
    def log_file(self) -> Path:
        return self.home / "broker.log"


@dataclass
class ClusterHandle:
    """The running cluster; `bootstrap_servers` lists every node."""

    nodes: list[_Node]
    jars: Path
    jvm_options: tuple[str, ...]
    die_with_parent: bool
    scram: ScramUser | None = None
    tls: bool = False

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{HOST}:{n.port}" for n in self.nodes)

    def running(self, index: int) -> bool:
        handle = self.nodes[index].handle
        return handle is not None and handle.running()

    def kill(self, index: int) -> None:
        """SIGKILL node `index` (a crash: no controlled shutdown, no leader hand-over)."""
        handle = self.nodes[index].handle
        if handle is None or handle.pid is None or handle._child is None:
            return
        os.kill(handle.pid, signal.SIGKILL)
        handle._child.wait(10)
        handle.owned = False

    def restart(self, index: int, timeout: float = 60.0) -> None:
        node = self.nodes[index]
        node.handle = _launch(node, self.jars, self.jvm_options, self.die_with_parent)
        _wait_ready(node, timeout, self.tls)

    def stop(self, grace_seconds: float = 10.0) -> None:
        # All at once: the last node stopped alone waits for a quorum that is gone.
        owned = [n.handle for n in self.nodes if n.handle is not None and n.handle.owned]
        with ThreadPoolExecutor(max_workers=max(1, len(owned))) as pool:
            list(pool.map(lambda h: h.stop(grace_seconds), owned))


def _wait_ready(node: _Node, timeout: float, tls: bool) -> None:
    assert node.handle is not None
    if not tls:
        _wait_until_ready(node.handle, node.log_file, timeout)
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not node.handle.running():
            raise BrokerStartError(f"node {node.node_id} exited during start-up; see {node.log_file}")
        if STARTED_LOG_LINE in node.log_file.read_text(errors="replace"):
            with contextlib.suppress(OSError), socket.create_connection((HOST, node.port), timeout=1.0):
                return
        time.sleep(0.1)
    raise BrokerStartError(f"node {node.node_id} not ready after {timeout:g}s; see {node.log_file}")


def _launch(node: _Node, jars: Path, jvm_options: tuple[str, ...], die_with_parent: bool) -> BrokerHandle:
    log4j = node.home / "log4j2.properties"
    command = [
        _java(),
        *jvm_options,
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        f"{jars}{os.sep}*",
        "kafka.Kafka",
        str(node.config_file),
    ]
    if node.log_file.exists():
        node.log_file.replace(node.home / "broker.log.previous")
    with node.log_file.open("wb") as log_stream:
        child = subprocess.Popen(
            lifeline_argv(command) if die_with_parent else command,
            stdin=subprocess.DEVNULL,
            stdout=log_stream,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return BrokerHandle(f"{HOST}:{node.port}", child.pid, None, owned=True, _child=child)


def _format(jars: Path, node: _Node, cluster_id: str, users: list[ScramUser]) -> None:
    command = [
        _java(),
        *TOOL_JVM_OPTS,
        "-cp",
        f"{jars}{os.sep}*",
        "kafka.tools.StorageTool",
        "format",
        "-t",
        cluster_id,
        "-c",
        str(node.config_file),
    ]
    for user in users:
        command += ["--add-scram", user.format_argument()]
    result = subprocess.run(command, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        # The command line holds passwords: report the tool's output only.
        raise BrokerStartError(f"formatting node {node.node_id} failed:\n{result.stdout}{result.stderr}")


def start_cluster(
    state_dir: Path,
    nodes: int = 3,
    *,
    scram_users: list[ScramUser] | None = None,
    tls: Mapping[str, str] | None = None,
    cache_dir: Path | None = None,
    timeout: float = 90.0,
    jvm_options: tuple[str, ...] = CLUSTER_JVM_OPTS,
    die_with_parent: bool = False,
) -> ClusterHandle:
    """Format and start `nodes` combined nodes under `state_dir`/node-<id>; return when all serve.

    `scram_users` given: the client listener requires SASL/SCRAM (the first user's mechanism);
    the brokers get a credential of their own besides the given users'. `tls` given (the
    listener's ssl.* properties): the client listener speaks TLS, and readiness is the broker's
    start-up line plus an open port (the ApiVersions probe speaks plaintext)."""
    jars = ensure_jars(cache_dir)
    users = list(scram_users or [])
    scram: tuple[str, str, str] | None = None
    if users:
        broker_user = ScramUser("tenure-broker", os.urandom(12).hex(), users[0].mechanism)
        scram = (broker_user.mechanism, broker_user.name, broker_user.password)
        users.append(broker_user)
    ports = set()
    members: list[_Node] = []
    for node_id in range(1, nodes + 1):
        port, controller_port = free_port(), free_port()
        while port in ports or controller_port in ports or port == controller_port:
            port, controller_port = free_port(), free_port()
        ports |= {port, controller_port}
        members.append(_Node(node_id, port, controller_port, Path(state_dir) / f"node-{node_id}"))
    voters = ",".join(f"{n.node_id}@{HOST}:{n.controller_port}" for n in members)
    cluster_id = _cluster_id()
    for node in members:
        node.home.mkdir(parents=True, exist_ok=True)
        (node.home / "log4j2.properties").write_text(LOG4J2_CONFIG)
        node.config_file.write_text(
            cluster_node_properties(
                node.node_id,
                node.port,
                node.controller_port,
                voters,
                node.home / "data",
                nodes,
                scram=scram,
                tls=tls,
            )
        )
        _format(jars, node, cluster_id, users)
    first_user = users[0] if users else None
    cluster = ClusterHandle(members, jars, jvm_options, die_with_parent, first_user, tls is not None)
    try:
        for node in members:  # all at once: none is ready before the quorum has a leader
            node.handle = _launch(node, jars, jvm_options, die_with_parent)
        deadline = time.monotonic() + timeout
        for node in members:
            assert node.handle is not None
            _wait_ready(node, max(1.0, deadline - time.monotonic()), cluster.tls)
    except BaseException:
        cluster.stop(grace_seconds=5.0)
        raise
    return cluster
