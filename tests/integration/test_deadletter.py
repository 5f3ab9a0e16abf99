"""Bad input never stops a consumer: it goes to the dead-letter topic with the reason and where it
came from, and the records after it are still processed."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from services.common.avro import default_registry
from services.common.contracts import to_record
from services.common.kafka import CommandPublisher, InboundRecord, OutboundRecord
from services.common.kafka._records import header_value
from services.common.messages import MessageCodec
from services.common.routing import command_record
from services.common.store import RocksStore
from services.common.topics import DEADLETTER, RUNS_COMMANDS, RUNS_EVENTS
from services.projections.service import views_path
from services.projections.store import RunViewStore
from tests.support.system import (
    FOREIGN_HEADER,
    ServiceProcess,
    read_topic,
    service_env,
    submit_command,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _dead_letters_from(bootstrap: str, key: bytes) -> list[InboundRecord]:
    return [r for r in read_topic(bootstrap, DEADLETTER.name, DEADLETTER.partitions) if r.key == key]


def test_undecodable_commands_and_events_are_dead_lettered_and_processing_goes_on(
    tenure_topics: str, tmp_path: Path
) -> None:
    bootstrap = tenure_topics
    codec = MessageCodec()
    registry = default_registry()
    env = service_env(bootstrap, tmp_path / "state")
    processor = ServiceProcess("lease-coordinator", "services.lease_coordinator", env, tmp_path).start()
    projector = ServiceProcess("projections", "services.projections", env, tmp_path).start()
    tag = uuid.uuid4().hex[:8]
    publisher = CommandPublisher(bootstrap, client_id="dlq-test")
    try:
        submit = submit_command("dlq", f"{tag}-ok")
        # An unknown fingerprint: right magic bytes, a schema nobody registered.
        unknown = b"\xc3\x01" + b"\x01\x02\x03\x04\x05\x06\x07\x08" + b"\x00"
        # A known fingerprint with a body that is cut short.
        full = registry.encode("tenure.runs.commands.SubmitRun", to_record(submit))
        truncated = full[:14]
        foreign = ((FOREIGN_HEADER, b"1"),)
        for key, value, topic in (
            (f"{tag}-unknown".encode(), unknown, RUNS_COMMANDS.name),
            (f"{tag}-cut".encode(), truncated, RUNS_COMMANDS.name),
            (f"{tag}-event".encode(), b"not avro at all", RUNS_EVENTS.name),
        ):
            publisher.publish(OutboundRecord(topic, key, value, foreign)).result(30)
        publisher.publish(command_record(codec, submit)).result(30)

        views = views_path(tmp_path / "state")
        wait_until(lambda: (views / "CURRENT").exists(), 30, "the projector's store")
        reader = RunViewStore(RocksStore(views, secondary=True), codec)

        def projected() -> bool:
            reader.refresh()
            return reader.get(submit.run_id) is not None

        wait_until(projected, 60, "the valid command after the bad ones to be projected")
        expected = {
            f"{tag}-unknown": (b"UNKNOWN_FINGERPRINT", RUNS_COMMANDS.name),
            f"{tag}-cut": (b"CORRUPT_BODY", RUNS_COMMANDS.name),
            f"{tag}-event": (b"BAD_MAGIC", RUNS_EVENTS.name),
        }
        for key, (reason, source) in expected.items():
            dead = wait_until(
                lambda k=key: _dead_letters_from(bootstrap, k.encode()), 30, f"dead letter {key}"
            )
            assert len(dead) == 1, key
            headers = dead[0].headers
            assert header_value(headers, "tenure-dlq-reason") == reason
            assert header_value(headers, "tenure-dlq-source-topic") == source.encode()
            assert int(header_value(headers, "tenure-dlq-source-offset") or b"-1") >= 0
            assert header_value(headers, "tenure-dlq-detail")
        assert processor.alive() and projector.alive()
    finally:
        publisher.close()
        time.sleep(0.2)
        processor.stop()
        projector.stop()
