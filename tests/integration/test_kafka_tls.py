"""Production Kafka (issue 16): a broker whose only client listener is mutual TLS.

Tenure's processes get a librdkafka properties file (TENURE_KAFKA_CONFIG_FILE: CA, client
certificate and key, PEM) and nothing else: the admin client (`tenure topics create`), the lease
coordinator (faust's SSLContext mapped from the same file, and the transactional writer), the
projector, the API and `tenure tail` all connect over TLS. A client without a certificate is
refused, as is a broker certificate from another CA, and both say so within seconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.common.broker_cluster import ClusterHandle, start_cluster
from tests.support.system import free_port, wait_for_ready
from tests.support.tenure import TenureSystem, submit
from tests.support.tls import Pki, make_pki

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ClusterHandle]:
    broker = start_cluster(
        tmp_path_factory.mktemp("kafka-tls"), 1, tls=pki.broker_properties(), die_with_parent=True
    )
    try:
        yield broker
    finally:
        broker.stop()


def _system(broker: ClusterHandle, tmp: Path, properties: str) -> tuple[TenureSystem, int]:
    tmp.mkdir(parents=True, exist_ok=True)
    file = tmp / "kafka-client.properties"
    file.write_text(properties)
    health = free_port()
    system = TenureSystem(
        broker.bootstrap_servers,
        tmp,
        TENURE_KAFKA_CONFIG_FILE=str(file),
        TENURE_COORDINATOR_HEALTH_PORT=str(health),
        TENURE_PROJECTIONS_HEALTH_PORT=str(free_port()),
    )
    return system, health


def test_tenure_configured_by_a_properties_file_works_over_mutual_tls(
    tls_broker: ClusterHandle, pki: Pki, tmp_path: Path
) -> None:
    system, health = _system(
        tls_broker,
        tmp_path,
        "# mutual TLS to the managed cluster\n"
        "security.protocol=SSL\n"
        f"ssl.ca.location={pki.ca}\n"
        f"ssl.certificate.location={pki.client_cert}\n"
        f"ssl.key.location={pki.client_key}\n",
    )
    created = system.cli("topics", "create")
    assert created.returncode == 0, created.stderr
    system.start()
    try:
        wait_for_ready(health, 60, system.processor)
        with system.client() as client:
            run = submit(client, "tls-1")  # 201: decided by the coordinator, over TLS
        tail = system.cli(
            "tail", "runs.events", "--from-beginning", "--json", "--max", "1", "--idle-exit", "20"
        )
        assert tail.returncode == 0, tail.stderr
        first = json.loads(tail.stdout.splitlines()[0])
        assert (first["type"], first["key"]) == ("RunSubmitted", run["runId"])
    finally:
        system.stop()


def test_a_client_without_a_certificate_or_trusting_another_ca_is_refused_clearly(
    tls_broker: ClusterHandle, pki: Pki, tmp_path: Path
) -> None:
    other = make_pki(tmp_path / "other-ca")
    cases = {
        "no client certificate": f"security.protocol=SSL\nssl.ca.location={pki.ca}\n",
        "another CA": (
            f"security.protocol=SSL\nssl.ca.location={other.ca}\n"
            f"ssl.certificate.location={other.client_cert}\nssl.key.location={other.client_key}\n"
        ),
    }
    for case, properties in cases.items():
        system, _ = _system(tls_broker, tmp_path / case.replace(" ", "-"), properties)
        for command in (("topics", "list"), ("tail", "runs.events", "--idle-exit", "5")):
            began = time.monotonic()
            result = system.cli(*command)
            took = time.monotonic() - began
            assert result.returncode != 0, (case, command, result.stdout)
            assert "refused the connection" in result.stderr and "SSL" in result.stderr, (case, result.stderr)
            assert took < 20, (case, command, took)
