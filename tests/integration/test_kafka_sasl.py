"""Production Kafka (issue 16): a broker whose only client listener requires SASL/SCRAM-SHA-512.

Tenure's processes get nothing but environment settings (TENURE_KAFKA_CONFIG with librdkafka
names, TENURE_TOPIC_PREFIX): `tenure topics create` (admin client), the lease coordinator (faust
consumer + transactional confluent producer), the projector, the API (publisher and followers)
and `tenure tail` must all authenticate, on prefixed topics. Wrong credentials fail fast with a
message that says so, and the password appears in no log.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.common.broker_cluster import ClusterHandle, ScramUser, start_cluster
from tests.support.system import free_port, wait_for_ready
from tests.support.tenure import TenureSystem, submit

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

USER = "tenure-app"
PASSWORD = "s3cret-Scram-pw-4471"  # unique, so a grep of the logs finds any leak
PREFIX = "sasltest."


def _client_config(password: str) -> str:
    # The inline form: `;`-separated librdkafka properties.
    return (
        "security.protocol=SASL_PLAINTEXT; sasl.mechanism=SCRAM-SHA-512; "
        f"sasl.username={USER}; sasl.password={password}; client.id=tenure-sasl-test"
    )


@pytest.fixture(scope="module")
def scram_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    broker = start_cluster(
        tmp_path_factory.mktemp("kafka-scram"),
        1,
        scram_users=[ScramUser(USER, PASSWORD, "SCRAM-SHA-512")],
        die_with_parent=True,
    )
    try:
        yield broker
    finally:
        broker.stop()


def _system(broker: ClusterHandle, tmp: Path, password: str = PASSWORD) -> tuple[TenureSystem, int]:
    health = free_port()
    system = TenureSystem(
        broker.bootstrap_servers,
        tmp,
        TENURE_KAFKA_CONFIG=_client_config(password),
        TENURE_TOPIC_PREFIX=PREFIX,
        TENURE_COORDINATOR_HEALTH_PORT=str(health),
        TENURE_PROJECTIONS_HEALTH_PORT=str(free_port()),
    )
    return system, health


def test_tenure_configured_only_by_settings_works_through_sasl_scram(
    scram_broker: ClusterHandle, tmp_path: Path
) -> None:
    system, health = _system(scram_broker, tmp_path)
    created = system.cli("topics", "create")
    assert created.returncode == 0, created.stderr
    assert f"{PREFIX}runs.events: created" in created.stdout

    system.start()
    try:
        wait_for_ready(health, 60, system.processor)
        with system.client() as client:
            run = submit(client, "sasl-1")  # 201: the coordinator decided it, over SASL
        assert run["status"] == "queued", run

        tail = system.cli(
            "tail", "runs.events", "--from-beginning", "--json", "--max", "1", "--idle-exit", "20"
        )
        assert tail.returncode == 0, tail.stderr
        first = json.loads(tail.stdout.splitlines()[0])
        assert first["topic"] == f"{PREFIX}runs.events", first  # `runs.events` resolved to the prefix
        assert (first["type"], first["key"]) == ("RunSubmitted", run["runId"])
    finally:
        system.stop()
    logs = [p.read_text(errors="replace") for p in tmp_path.glob("*.log")]
    assert logs and not any(PASSWORD in text for text in logs), "the SASL password was logged"


def test_wrong_scram_credentials_fail_fast_and_clearly(scram_broker: ClusterHandle, tmp_path: Path) -> None:
    system, _ = _system(scram_broker, tmp_path, password="not-the-password")
    for command in (("topics", "list"), ("tail", "runs.events", "--from-beginning", "--idle-exit", "5")):
        began = time.monotonic()
        result = system.cli(*command)
        took = time.monotonic() - began
        assert result.returncode != 0, (command, result.stdout)
        assert "authentication" in result.stderr.lower(), (command, result.stderr)
        assert "not-the-password" not in result.stderr + result.stdout
        assert took < 20, (command, took)
