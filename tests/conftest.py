"""Shared pytest configuration: the ``integration``/``e2e`` markers and the Kafka broker fixture.

``kafka_bootstrap`` (session scope) yields a bootstrap address of a real Apache Kafka 4.x broker,
chosen in this order:

1. env ``KAFKA_BOOTSTRAP_SERVERS`` is set: that broker is used as is; nothing starts or stops.
2. a Docker engine answers a ping: ``testcontainers`` runs the ``apache/kafka:4.1.1`` image
   (KRaft, single node, auto topic creation off) and removes it at session end.
3. otherwise the project launcher (``services.common.broker``) starts a broker on a free
   127.0.0.1 port with a fresh data dir under pytest's temporary directory, and stops it at
   session end. It needs Java 17+ and, once, Maven (the jars are cached in ``.cache/kafka``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

KAFKA_IMAGE = "apache/kafka:4.1.1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: needs a real Kafka broker (kafka_bootstrap)")
    config.addinivalue_line("markers", "e2e: runs several Tenure services against a real broker")
    _ports_of_this_worker()


def _ports_of_this_worker() -> None:
    """Each pytest-xdist worker picks listen ports (`free_port`) from a slice of the range of
    its own. A port is free when picked and bound a moment later by the process given it; with
    both workers picking from one range, the other worker's service could bind it in between,
    and a test then talked to another test's health server (a CI run failed so: an API's port
    answered /healthz but not /openapi.json)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or workers < 2:
        return
    from services.common import broker

    ports = broker._LISTEN_PORTS
    span = len(ports) // workers
    first = ports.start + int(worker.removeprefix("gw")) * span
    broker._LISTEN_PORTS = range(first, first + span)


def _docker_engine_reachable() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # no SDK, no socket, no permission: all mean "no Docker here"
        return False


def _apache_kafka_container() -> Any:
    """A testcontainers KafkaContainer that boots the apache/kafka image instead of cp-kafka.

    KafkaContainer's start script is written for confluentinc/cp-kafka (/etc/confluent/docker);
    apache/kafka starts from /etc/kafka/docker/run and reads the same KAFKA_* variables, so only
    the script differs. The advertised host port is known only after the container started,
    which is why the script is injected then (the same trick the base class uses).
    """
    from testcontainers.community.kafka import KafkaContainer

    class ApacheKafkaContainer(KafkaContainer):
        def __init__(self) -> None:
            super().__init__(image=KAFKA_IMAGE)
            # with_kraft() would reject "4.1.1" against Confluent's 7.0.0 minimum.
            self.kraft_enabled = True
            for name, value in {
                "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
                "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
                "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
                "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
                "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
            }.items():
                self.with_env(name, value)

        def tc_start(self) -> None:
            host = self.get_container_host_ip()
            port = self.get_exposed_port(self.port)
            script = (
                "#!/bin/bash\n"
                f"export KAFKA_ADVERTISED_LISTENERS=PLAINTEXT://{host}:{port},"
                "BROKER://$(hostname -i | cut -d' ' -f1):9092\n"
                "exec /etc/kafka/docker/run\n"
            )
            self.create_file(script.encode(), self.TC_START_SCRIPT)

    return ApacheKafkaContainer()


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of a real Kafka broker; see the module docstring for the precedence."""
    configured = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if configured:
        yield configured
        return
    if _docker_engine_reachable():
        with _apache_kafka_container() as container:
            yield str(container.get_bootstrap_server())
        return
    from services.common.broker import free_port, start_broker

    state_dir = tmp_path_factory.mktemp("kafka")
    handle = start_broker(
        port=free_port(), state_dir=state_dir, data_dir=state_dir / "data", timeout=90.0, die_with_parent=True
    )
    try:
        yield handle.bootstrap_servers
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A three-node KRaft cluster of the project launcher (services.common.broker_cluster), one per
    test module (starting three JVMs is the costly part); yields its ClusterHandle."""
    from services.common.broker_cluster import start_cluster

    cluster = start_cluster(tmp_path_factory.mktemp("kafka-cluster"), 3, die_with_parent=True)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Apicurio Registry (in-memory storage) from Maven Central on a free port
    (services.common.schema_registry); yields its Confluent-compatible API base URL, the value of
    TENURE_SCHEMA_REGISTRY_URL. Env TENURE_TEST_SCHEMA_REGISTRY_URL uses a running one instead."""
    configured = os.environ.get("TENURE_TEST_SCHEMA_REGISTRY_URL")
    if configured:
        yield configured
        return
    from services.common.schema_registry import start_registry

    handle = start_registry(tmp_path_factory.mktemp("apicurio"))
    try:
        yield handle.ccompat_url
    finally:
        handle.stop()
