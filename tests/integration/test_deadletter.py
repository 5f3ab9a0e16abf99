"""Bad input never stops a consumer: it goes to the dead-letter topic with the reason and where it
came from, and the records after it are still processed. That holds for a record that cannot be
decoded and for a decodable command whose handling fails (issue 10: it used to crash-loop its
partition), on the real broker and the real coordinator process, whose /readyz and /metrics say so."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from pathlib import Path

import httpx
import pytest

from services.common.avro import default_registry
from services.common.contracts import to_record
from services.common.kafka import CommandPublisher, InboundRecord, OutboundRecord
from services.common.kafka._records import header_value
from services.common.messages import MessageCodec
from services.common.routing import command_record, partition_for_run
from services.common.store import RocksStore
from services.common.topics import DEADLETTER, RUNS_COMMANDS, RUNS_EVENTS, RUNS_REJECTIONS
from services.projections.service import views_path
from services.projections.store import RunViewStore
from tests.support.system import (
    FOREIGN_HEADER,
    ServiceProcess,
    decode_all,
    free_port,
    read_topic,
    service_env,
    submit_command,
    wait_for_ready,
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
    projector_port = free_port()
    env = service_env(bootstrap, tmp_path / "state", TENURE_PROJECTIONS_HEALTH_PORT=str(projector_port))
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
        ready = wait_for_ready(projector_port, 30, projector)
        assert ready["checks"]["runs.events"] == {"ok": True, "detail": "caught up"}
        metrics = httpx.get(f"http://127.0.0.1:{projector_port}/metrics", timeout=5).text
        assert 'tenure_deadletters_total{reason="BAD_MAGIC"} 1.0' in metrics
        assert 'tenure_projection_caught_up{topic="runs.events"} 1.0' in metrics
    finally:
        publisher.close()
        time.sleep(0.2)
        processor.stop()
        projector.stop()


def _decided(bootstrap: str, topic: str, run_ids: set[str]) -> dict[str, list[object]]:
    found: dict[str, list[object]] = {}
    for message in decode_all(read_topic(bootstrap, topic, RUNS_EVENTS.partitions)):
        run_id = getattr(message, "run_id", None)
        if run_id in run_ids:
            found.setdefault(run_id, []).append(message)
    return found


def test_a_command_whose_handling_fails_is_set_aside_and_its_partition_goes_on(
    tenure_topics: str, tmp_path: Path
) -> None:
    """Two real defect classes, sent straight to runs.commands between valid commands of the same
    partition: an executionSpec nested 100,000 deep (decide raises RecursionError) and one whose
    canonical form outgrows a Kafka record (the producer would refuse its RunSubmitted with
    MSG_SIZE_TOO_LARGE on every attempt). Before, either one crash-looped the coordinator; now
    each is dead-lettered and refused in the batch's transaction, the commands after it are
    decided, a redelivery is not tried again, and the process stays up and ready."""
    bootstrap = tenure_topics
    port = free_port()
    env = service_env(bootstrap, tmp_path / "state", TENURE_COORDINATOR_HEALTH_PORT=str(port))
    coordinator = ServiceProcess("lease-coordinator", "services.lease_coordinator", env, tmp_path).start()
    codec = MessageCodec()
    tag = uuid.uuid4().hex[:8]
    publisher = CommandPublisher(bootstrap, client_id="poison-test")
    try:
        ready = wait_for_ready(port, 90, coordinator)
        assert ready["checks"]["restore"]["ok"] and ready["checks"]["assignment"]["ok"], ready
        first, last, again = (submit_command("poison", f"{tag}-{n}") for n in ("first", "last", "again"))
        deep = dataclasses.replace(
            submit_command("poison", f"{tag}-deep"), execution_spec="[" * 100_000 + "]" * 100_000
        )
        spec = json.dumps({"n": [1e15] * 60_000}, separators=(",", ":")).replace("1000000000000000.0", "1e15")
        big = dataclasses.replace(submit_command("poison", f"{tag}-big"), execution_spec=spec)
        commands = (first, deep, big, last, again)
        assert len({partition_for_run(c.run_id) for c in commands}) == 1, "one tenant: one partition"
        for command in (first, deep, big, last):
            publisher.publish(command_record(codec, command)).result(30)

        wanted = {c.run_id for c in commands}
        wait_until(
            lambda: {first.run_id, last.run_id} <= set(_decided(bootstrap, RUNS_EVENTS.name, wanted)),
            60,
            "the commands after the failing ones to be decided",
        )
        reasons = {deep.run_id: b"COMMAND_FAILED", big.run_id: b"RECORD_TOO_LARGE"}
        for run_id, reason in reasons.items():
            [letter] = wait_until(lambda r=run_id: _dead_letters_from(bootstrap, r.encode()), 30, run_id)
            assert header_value(letter.headers, "tenure-dlq-reason") == reason
            assert header_value(letter.headers, "tenure-dlq-source-topic") == RUNS_COMMANDS.name.encode()
            assert header_value(letter.headers, "tenure-dlq-command-type") == b"SubmitRun"
            assert header_value(letter.headers, "tenure-dlq-traceback")
        refused = _decided(bootstrap, RUNS_REJECTIONS.name, wanted)
        assert {r.code for rs in refused.values() for r in rs} == {"COMMAND_FAILED", "RECORD_TOO_LARGE"}  # type: ignore[attr-defined]
        assert set(refused) == set(reasons)

        # A redelivery of the failed command is dropped, not tried again; what follows is decided.
        publisher.publish(command_record(codec, deep)).result(30)
        publisher.publish(command_record(codec, again)).result(30)
        wait_until(
            lambda: again.run_id in _decided(bootstrap, RUNS_EVENTS.name, wanted), 60, "the command after it"
        )
        assert len(_dead_letters_from(bootstrap, deep.run_id.encode())) == 1
        assert deep.run_id not in _decided(bootstrap, RUNS_EVENTS.name, wanted)

        assert coordinator.alive() and coordinator.starts == 1, coordinator.log_tail()
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert 'tenure_deadletters_total{reason="COMMAND_FAILED"} 1.0' in metrics
        assert 'tenure_deadletters_total{reason="RECORD_TOO_LARGE"} 1.0' in metrics
        assert 'tenure_processor_commands_total{aggregate="run",outcome="duplicate"}' in metrics
        assert "process_cpu_seconds_total" in metrics
    finally:
        publisher.close()
        coordinator.stop()
