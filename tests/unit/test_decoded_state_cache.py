"""The aggregate runtime keeps decoded states beside their bytes (issue 16, the coordinator's CPU).

A state the last command wrote is read back by the aggregate's next command without decoding it
again, but only while the store holds exactly the bytes it was kept with: a state the store got
some other way (a restore, a rebuild, another writer) is always decoded from the store."""

from __future__ import annotations

from typing import Any

from services.common.aggregate import StateCodec
from services.common.aggregate.decoded import DecodedStates
from services.common.clock import ManualClock
from services.common.eventlog import MemoryEventLog
from services.common.store import MemoryStore
from services.lease_coordinator.domain import LeasePolicy
from services.lease_coordinator.processor import RunCommandProcessor
from services.lease_coordinator.state_codec import decode_state, encode_state
from tests.support.lease_run import claim_cmd, renew_cmd

from .strategies import submit_command
from .test_run_processor import CODEC, CommandTopic, assert_state_is_fold_of_log_dur_1


def _counting(processor: RunCommandProcessor) -> list[bytes]:
    decoded: list[bytes] = []

    def decode(raw: bytes) -> Any:
        decoded.append(raw)
        return decode_state(raw)

    processor.definition.state_codec = StateCodec(encode_state, decode)  # type: ignore[misc]
    processor.decoded = DecodedStates(
        decode
    )  # the processor's cache decodes with the codec it was built with
    return decoded


def test_a_renewal_reads_back_the_state_the_last_command_wrote_without_decoding_it() -> None:
    log, store, topic = MemoryEventLog(), MemoryStore(), CommandTopic()
    # Every renewal on runs.events (none kept off it): each writes the state the next one reads.
    processor = RunCommandProcessor(log, store, CODEC, ManualClock(), LeasePolicy(keepalive_fraction=0))
    decoded = _counting(processor)
    submit = submit_command("acme", "k1", command_id="s-1")
    processor.handle([topic.record(submit)])
    run_id = next(key.removeprefix("run/") for key, _ in store.scan("run/"))
    processor.handle([topic.record(claim_cmd(run_id, command_id="c-1"))])
    lease = processor.load(run_id).lease  # type: ignore[union-attr]
    assert lease is not None
    for sequence in range(1, 21):
        outcome = processor.handle([topic.record(renew_cmd(run_id, lease.attempt_id, lease.epoch, sequence))])
        assert outcome.events == 1
    assert decoded == [], "every state was the one this processor wrote last"
    assert_state_is_fold_of_log_dur_1(log, store)

    # Another writer's bytes under the key: decoded from the store, never answered from memory.
    kept = processor.load(run_id)
    assert kept is not None
    other = encode_state(kept).replace(b'"tenant":"acme"', b'"tenant":"other"')
    assert other != encode_state(kept)
    store.write({f"run/{run_id}": other})
    assert processor.load(run_id).tenant == "other"  # type: ignore[union-attr]
    assert decoded == [other]
    assert processor.load(run_id).tenant == "other"  # type: ignore[union-attr]
    assert decoded == [other], "kept again, with the bytes it was read from"


def test_at_most_the_bound_is_kept_and_the_oldest_goes_first() -> None:
    processor = RunCommandProcessor(MemoryEventLog(), MemoryStore(), CODEC, ManualClock())
    processor.decoded.bound = 3
    processor.decoded.keep((f"run-{n}", b"x", None) for n in range(5))  # type: ignore[misc]
    processor.decoded.keep([("run-2", b"y", None)])  # type: ignore[list-item]
    assert processor.decoded.ids() == ["run-3", "run-4", "run-2"]
