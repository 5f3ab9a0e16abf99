"""The bundled broker's configuration: server properties, JVM flags and logging.

Split from services.common.broker (which re-exports these names) so the launcher stays readable.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "DEFAULT_JVM_OPTS",
    "FAST_RESTART_PROPERTIES",
    "HOST",
    "KAFKA_DEFAULT_SESSION_PROPERTIES",
    "LOG4J2_CONFIG",
    "STARTED_LOG_LINE",
    "TOOL_JVM_OPTS",
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
