"""The bundled broker's configuration: server properties, JVM flags and logging.

Split from services.common.broker (which re-exports these names) so the launcher stays readable.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "CLUSTER_JVM_OPTS",
    "DEFAULT_JVM_OPTS",
    "FAST_RESTART_PROPERTIES",
    "HOST",
    "KAFKA_DEFAULT_SESSION_PROPERTIES",
    "LOG4J2_CONFIG",
    "SCRAM_LOGIN_MODULE",
    "STARTED_LOG_LINE",
    "TOOL_JVM_OPTS",
    "cluster_node_properties",
    "server_properties",
]

HOST = "127.0.0.1"
STARTED_LOG_LINE = "Kafka Server started"
# Measured on a 2-core box: C1-only JIT (TieredStopAtLevel=1) cuts a restart from ~2.1 s to
# ~1.6 s and peak throughput is irrelevant for a dev/test broker; 1 GiB heap leaves room for the
# services next to it.
DEFAULT_JVM_OPTS = (
    "-Xms256m",
    "-Xmx1g",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
# StorageTool runs for under a second: skip the JIT's C2 tier and G1's set-up entirely.
TOOL_JVM_OPTS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xshare:auto")

# Why a SIGKILLed broker took ~11 s to answer again (bench/broker_restart.py, docs/benchmarks.md):
# a killed broker never deregisters, so the metadata log still holds its registration, unfenced.
# The restarted controller, on activation, gives that registration a fresh session, and refuses
# the new incarnation (DUPLICATE_BROKER_REGISTRATION) until the session expires:
# broker.session.timeout.ms (9 s), plus up to one broker.heartbeat.interval.ms (2 s) until the
# broker's next registration attempt. Log recovery and JVM start are well under a second each.
# On one node the heartbeat goes from the broker to the controller in the same JVM over loopback,
# so short values cost nothing, and a broker fenced by a long stall unfences at its next
# heartbeat. With these, kill -9 to "all partitions have a leader" is ~3.4 s on a quiet 2-core box.
FAST_RESTART_PROPERTIES: Mapping[str, str] = {
    "broker.session.timeout.ms": "2000",
    "broker.heartbeat.interval.ms": "250",
}
# Kafka's own defaults for the same keys: bench/broker_restart.py --baseline measures "before".
KAFKA_DEFAULT_SESSION_PROPERTIES: Mapping[str, str] = {
    "broker.session.timeout.ms": "9000",
    "broker.heartbeat.interval.ms": "2000",
}

LOG4J2_CONFIG = """\
status = warn
# The JVM shutdown hook of log4j races Kafka's own hook and prints noise on SIGTERM.
shutdownHook = disable
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.console.ref = STDOUT
# Readiness detection waits for this logger's "Kafka Server started" line.
logger.raftserver.name = kafka.server.KafkaRaftServer
logger.raftserver.level = INFO
"""


def server_properties(
    port: int, controller_port: int, data_dir: Path, overrides: Mapping[str, str] | None = None
) -> str:
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "controller.quorum.bootstrap.servers": f"{HOST}:{controller_port}",
        "log.dirs": str(data_dir),
        "auto.create.topics.enable": "false",  # Tenure creates every topic explicitly
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        # One node gains nothing from 50 coordinator partitions; fewer logs start faster.
        "offsets.topic.num.partitions": "5",
        "transaction.state.log.num.partitions": "5",
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        **FAST_RESTART_PROPERTIES,
        **(overrides or {}),
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


# A cluster node's JVM: three of them share the machine with Tenure's processes, so a smaller heap.
CLUSTER_JVM_OPTS = ("-Xms128m", "-Xmx512m", *DEFAULT_JVM_OPTS[2:])
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"


def cluster_node_properties(
    node_id: int,
    port: int,
    controller_port: int,
    voters: str,
    data_dir: Path,
    nodes: int,
    *,
    scram: tuple[str, str, str] | None = None,
    tls: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> str:
    """One combined broker+controller of an N-voter KRaft cluster (static quorum `voters`).

    `scram` = (mechanism, broker user, broker password): the client listener then requires
    SASL/SCRAM and brokers replicate over it with their own credential (created at format time,
    `kafka-storage format --add-scram`, since KRaft keeps SCRAM credentials in the metadata log).
    `tls` = the listener's ssl.* properties (keystore, truststore, client auth): it speaks TLS
    (SSL, or SASL_SSL with `scram`)."""
    replicas = str(min(3, nodes))
    min_isr = str(min(2, nodes))
    listener = "CLIENT"
    protocol = ("SASL_" if scram else "") + ("SSL" if tls else "PLAINTEXT")
    security: dict[str, str] = dict(tls or {})
    if scram is not None:
        mechanism, user, password = scram
        security |= {
            "sasl.enabled.mechanisms": mechanism,
            "sasl.mechanism.inter.broker.protocol": mechanism,
            f"listener.name.client.{mechanism.lower()}.sasl.jaas.config": (
                f'{SCRAM_LOGIN_MODULE} required username="{user}" password="{password}";'
            ),
        }
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "listeners": f"{listener}://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"{listener}://{HOST}:{port}",
        "listener.security.protocol.map": f"{listener}:{protocol},CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": listener,
        "controller.listener.names": "CONTROLLER",
        "controller.quorum.voters": voters,
        "log.dirs": str(data_dir),
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
        "default.replication.factor": replicas,
        "min.insync.replicas": "1",
        # Kafka's own topics as durable as Tenure's: transactions and offsets survive a node.
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        "offsets.topic.num.partitions": "5",
        "transaction.state.log.num.partitions": "5",
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "num.replica.fetchers": "1",
        # A SIGKILLed node is fenced (its partitions get new leaders) after this long; followers
        # drop out of the ISR after replica.lag.time.max.ms. Short, for tests on loopback.
        "broker.session.timeout.ms": "3000",
        "broker.heartbeat.interval.ms": "500",
        "replica.lag.time.max.ms": "5000",
        **security,
        **(overrides or {}),
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())
