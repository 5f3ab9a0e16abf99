"""Other Kafka tools can read Tenure's topics (issue 17, interoperability): with
TENURE_WIRE_FORMAT=confluent the real lease coordinator, on the real broker and a real Apicurio
Registry, decides a command (itself sent in the single-object encoding, as older producers do)
and writes its events to runs.events in the Confluent wire format under a registered schema id.
A plain confluent-kafka consumer (read_committed) with fastavro and the registry's REST API
decodes them knowing nothing of Tenure, and `tenure tail` still does.
A registry that is down while the coordinator encodes is retried, never a dead letter and never
the other format."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import httpx
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from services.common.broker import start_broker
from services.common.kafka import CommandPublisher, create_topics
from services.common.messages import MessageCodec
from services.common.routing import command_record
from services.common.schema_registry import start_registry
from services.common.topics import DEADLETTER, RUNS_EVENTS, TOPICS
from tests.support.system import (
    REPO_ROOT,
    ServiceProcess,
    free_port,
    read_topic,
    service_env,
    submit_command,
    wait_until,
)

# 600 s: the first run on a machine fetches Apicurio (~140 MB) with Maven inside the fixture.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A broker of this module's own: the events it writes in the Confluent wire format must not
    reach the session broker's runs.events, where every later coordinator restores them (and,
    configured single-object with no registry, dead-letters them)."""
    state = tmp_path_factory.mktemp("interop-kafka")
    handle = start_broker(port=free_port(), state_dir=state, data_dir=state / "data", timeout=90.0)
    try:
        create_topics(handle.bootstrap_servers, TOPICS)
        yield handle.bootstrap_servers
    finally:
        handle.stop()


def _committed_records_of(bootstrap: str, run_id: str, want: int, timeout_s: float) -> list[Any]:
    """runs.events records keyed by `run_id`, read the way any Kafka tool would: a plain
    consumer that must see only committed transactions (isolation.level=read_committed)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"interop-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    partitions = range(RUNS_EVENTS.partitions)
    consumer.assign([TopicPartition(RUNS_EVENTS.name, p, OFFSET_BEGINNING) for p in partitions])
    found: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(found) < want and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            if message.key() == run_id.encode():
                found.append(message)
    finally:
        consumer.close()
    return found


def test_events_in_the_confluent_wire_format_are_read_by_plain_kafka_tools_and_tenure_tail(
    own_broker: str, schema_registry: str, tmp_path: Path
) -> None:
    bootstrap = own_broker
    env = service_env(
        bootstrap,
        tmp_path / "state",
        TENURE_WIRE_FORMAT="confluent",
        TENURE_SCHEMA_REGISTRY_URL=schema_registry,
        TENURE_COORDINATOR_HEALTH_PORT="0",
    )
    coordinator = ServiceProcess("lease-coordinator", "services.lease_coordinator", env, tmp_path).start()
    submit = submit_command("interop", uuid.uuid4().hex[:12])
    publisher = CommandPublisher(bootstrap, client_id="interop-test")
    try:
        command = command_record(MessageCodec(), submit)  # this test's codec: single-object
        assert command.value[:2] == b"\xc3\x01"
        publisher.publish(command).result(30)
        [record] = _committed_records_of(bootstrap, submit.run_id, 1, 90)
    finally:
        publisher.close()
        coordinator.stop()

    value = record.value()
    assert value[0] == 0, f"magic byte 0, got {value[:5].hex()}"
    schema_id = int.from_bytes(value[1:5], "big")
    # The schema is in the registry under its record name (RecordNameStrategy), with that id.
    subject = "tenure.runs.events.RunSubmitted"
    registered = httpx.get(f"{schema_registry}/subjects/{subject}/versions/latest", timeout=10).json()
    assert registered["id"] == schema_id

    # What any Confluent-compatible reader does, given only the registry's URL: the schema by its
    # id from the registry's REST API, then the Avro body after the 5-byte header.
    writer = httpx.get(f"{schema_registry}/schemas/ids/{schema_id}", timeout=10).json()["schema"]
    decoded = fastavro.schemaless_reader(io.BytesIO(value[5:]), fastavro.parse_schema(json.loads(writer)))
    assert isinstance(decoded, dict)
    assert decoded["runId"] == submit.run_id
    assert decoded["causationId"] == submit.command_id
    assert decoded["tenant"] == "interop"
    assert json.loads(decoded["executionSpec"]) == json.loads(submit.execution_spec)

    # And Tenure's own tools still read it: `tenure tail`, pointed at the same registry.
    argv = ["tail", "runs.events", "-e", "-J", "-o", "beginning", "--run", submit.run_id]
    tail = subprocess.run(
        [sys.executable, "-m", "services.tenure_cli", *argv],
        env={**env, "TENURE_WIRE_FORMAT": "single-object"},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert tail.returncode == 0, tail.stderr[-2000:]
    [line] = [json.loads(text) for text in tail.stdout.splitlines()]
    assert (line["type"], line["key"]) == ("RunSubmitted", submit.run_id)
    assert line["fields"]["causationId"] == submit.command_id


def _retries(port: int) -> float:
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("tenure_stream_retries_total{") and 'work="batch"' in line
    )


def test_a_registry_down_at_encode_is_retried_until_it_is_back_never_dead_lettered(
    own_broker: str, tmp_path: Path
) -> None:
    """The coordinator cannot register RunSubmitted's schema: its batch fails transiently and is
    retried with backoff (the command is neither dead-lettered nor refused, nothing is written);
    once a registry answers on that address, the same command is decided, in the Confluent wire
    format."""
    bootstrap = own_broker
    registry_port, health_port = free_port(), free_port()
    url = f"http://127.0.0.1:{registry_port}/apis/ccompat/v7"  # nothing listens there yet
    env = service_env(
        bootstrap,
        tmp_path / "state",
        TENURE_WIRE_FORMAT="confluent",
        TENURE_SCHEMA_REGISTRY_URL=url,
        TENURE_SCHEMA_REGISTRY_TIMEOUT_S="1",
        TENURE_COORDINATOR_HEALTH_PORT=str(health_port),
    )
    coordinator = ServiceProcess("lease-coordinator", "services.lease_coordinator", env, tmp_path).start()
    submit = submit_command("interop", uuid.uuid4().hex[:12])
    publisher = CommandPublisher(bootstrap, client_id="interop-outage-test")
    registry = None
    try:
        publisher.publish(command_record(MessageCodec(), submit)).result(30)
        wait_until(lambda: _safe(lambda: _retries(health_port) >= 2), 60, "the batch to be retried")
        assert coordinator.alive(), coordinator.log_tail()
        assert _committed_records_of(bootstrap, submit.run_id, 1, 2) == []
        registry = start_registry(tmp_path / "apicurio", port=registry_port)
        [record] = _committed_records_of(bootstrap, submit.run_id, 1, 90)
        assert record.value()[0] == 0
        letters = read_topic(bootstrap, DEADLETTER.name, DEADLETTER.partitions)
        assert [r for r in letters if r.key == submit.run_id.encode()] == []
        assert coordinator.alive()
    finally:
        publisher.close()
        coordinator.stop()
        if registry is not None:
            registry.stop()


def _safe(probe: Any) -> Any:
    try:
        return probe()
    except httpx.HTTPError:
        return None
