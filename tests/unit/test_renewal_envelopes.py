"""RenewLeases envelopes (issue 16): a batch renewal's commands, one record per partition.

The envelope changes only how many records carry the renewals. These tests prove that it
changes nothing else: the coordinator decides an envelope's commands exactly as it decides the
same commands sent one by one (LEASE-3 fencing, LEASE-5 renewal, EXE-4 sequences: the same
events, ids and refusals), a redelivered envelope is dropped (DUR-1), an envelope that carries
another partition's run is set aside whole, and the API side builds one record per partition
carrying every command once, in order. The API's one wake-up per batch (DecisionGroup) is
tested here too.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common import routing
from services.common.clock import ManualClock
from services.common.contracts import (
    AttemptClaimed,
    BatchedRenewal,
    CommandRejected,
    LeaseRenewed,
    RenewLease,
    RenewLeases,
    RunCommand,
)
from services.common.decisions import Decided, DecisionBook, Rejected
from services.common.eventlog import MemoryEventLog
from services.common.ids import run_id_for
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec
from services.common.routing import partition_for_run, renewal_batch_records
from services.common.store import MemoryStore
from services.common.topics import DEADLETTER, RUNS_COMMANDS, RUNS_EVENTS, RUNS_REJECTIONS
from services.lease_coordinator.domain import fold
from services.lease_coordinator.processor import RunCommandProcessor, state_key
from services.lease_coordinator.state_codec import decode_state
from tests.support.lease_run import T0, claim_cmd, renew_cmd

from .strategies import submit_command
from .test_run_processor import CRASH_POINTS, CrashableLog, CrashableStore, SimulatedCrash

pytestmark = pytest.mark.timeout(120)

CODEC = MessageCodec()
TENANTS = ("acme", "globex", "initech", "umbrella", "hooli")


class Coordinator:
    """One lease coordinator on the in-memory twins, fed records as runs.commands holds them."""

    def __init__(self) -> None:
        self.log = MemoryEventLog(RUNS_COMMANDS.partitions)
        self.store = MemoryStore()
        self.processor = RunCommandProcessor(self.log, self.store, CODEC, ManualClock(T0))
        self._offsets: dict[int, int] = defaultdict(int)

    def record(self, message: Any, partition: int | None = None) -> InboundRecord:
        partition = partition_for_run(message.run_id) if partition is None else partition
        out = CODEC.outbound(RUNS_COMMANDS.name, message.run_id, message, partition)
        offset = self._offsets[partition]
        self._offsets[partition] += 1
        return InboundRecord(out.topic, partition, offset, out.key, out.value, out.headers)

    def send(self, *messages: Any) -> Any:
        return self.processor.handle([self.record(m) for m in messages])

    def decoded(self, topic: str) -> list[Any]:
        return [
            CODEC.decode(r.value)
            for (t, _), records in sorted(self.log.topics.items())
            if t == topic
            for r in records
        ]

    def raw(self, topic: str) -> list[InboundRecord]:
        return [r for (t, _), records in sorted(self.log.topics.items()) if t == topic for r in records]


def _claimed_runs(coordinator: Coordinator, count: int) -> list[AttemptClaimed]:
    """`count` runs over several tenants (so several partitions), each claimed once."""
    submits = [submit_command(TENANTS[i % len(TENANTS)], f"k{i}", command_id=f"s-{i}") for i in range(count)]
    coordinator.send(*submits)
    coordinator.send(*(claim_cmd(s.run_id, command_id=f"c-{i}") for i, s in enumerate(submits)))
    claims = [e for e in coordinator.decoded(RUNS_EVENTS.name) if isinstance(e, AttemptClaimed)]
    assert len(claims) == count
    return claims


def _renewals(claims: list[AttemptClaimed], batch: int) -> list[RenewLease]:
    """One renewal per run, plus the three an API batch can carry that must be refused: a stale
    epoch (LEASE-3), a repeated sequence (EXE-4: a replay) and an attempt the run never had."""
    renewals = [
        renew_cmd(c.run_id, c.attempt_id, c.epoch, 2, command_id=f"r{batch}-{i}")
        for i, c in enumerate(claims)
    ]
    first, second = claims[0], claims[1]
    return [
        *renewals,
        renew_cmd(first.run_id, first.attempt_id, first.epoch + 1, 3, command_id=f"r{batch}-stale"),
        renew_cmd(second.run_id, second.attempt_id, second.epoch, 2, command_id=f"r{batch}-again"),
        renew_cmd(first.run_id, "att_never_1", 1, 4, command_id=f"r{batch}-unknown"),
    ]


def _envelopes(commands: list[RenewLease]) -> list[RenewLeases]:
    return [CODEC.decode(record.value) for record, _ in renewal_batch_records(CODEC, commands, "req-1")]


def test_an_envelope_is_decided_exactly_as_its_commands_one_by_one_lease_3_lease_5() -> None:
    alone, enveloped = Coordinator(), Coordinator()
    claims = _claimed_runs(alone, 12)
    assert _claimed_runs(enveloped, 12) == claims
    commands = _renewals(claims, 1)
    envelopes = _envelopes(commands)
    assert 1 < len(envelopes) < len(commands), "several partitions, fewer records than commands"

    one_by_one = alone.send(*commands)
    batched = enveloped.send(*envelopes)

    assert alone.decoded(RUNS_EVENTS.name) == enveloped.decoded(RUNS_EVENTS.name)
    assert alone.decoded(RUNS_REJECTIONS.name) == enveloped.decoded(RUNS_REJECTIONS.name)
    assert dict(alone.store.scan("run/")) == dict(enveloped.store.scan("run/"))
    counts = ("commands", "events", "accepted", "rejections", "duplicates", "deadlettered", "failed")
    assert [getattr(batched, c) for c in counts] == [getattr(one_by_one, c) for c in counts]
    renewed = [e for e in enveloped.decoded(RUNS_EVENTS.name) if isinstance(e, LeaseRenewed)]
    assert {e.causation_id for e in renewed} == {f"r1-{i}" for i in range(12)}
    refused = {r.causation_id: r.code for r in enveloped.decoded(RUNS_REJECTIONS.name)}
    assert set(refused) == {"r1-stale", "r1-again", "r1-unknown"}
    assert refused["r1-stale"] != refused["r1-again"], "a stale epoch is not a replay"


def test_a_redelivered_envelope_writes_nothing_new_and_the_state_is_the_fold_dur_1() -> None:
    coordinator = Coordinator()
    claims = _claimed_runs(coordinator, 6)
    envelopes = _envelopes(_renewals(claims, 1))
    coordinator.send(*envelopes)
    events, rejections = coordinator.decoded(RUNS_EVENTS.name), coordinator.decoded(RUNS_REJECTIONS.name)
    again = coordinator.send(*envelopes)  # the batch was not acknowledged: Kafka delivers it again
    assert again.events == 0 and again.rejections == 0 and again.duplicates == again.commands
    assert coordinator.decoded(RUNS_EVENTS.name) == events
    assert coordinator.decoded(RUNS_REJECTIONS.name) == rejections
    for claim in claims:
        raw = coordinator.store.get(state_key(claim.run_id))
        assert raw is not None
        assert decode_state(raw) == fold([e for e in events if e.run_id == claim.run_id])


def _stray_envelope(claims: list[AttemptClaimed]) -> RenewLeases:
    here = partition_for_run(claims[0].run_id)
    there = next(c for c in claims if partition_for_run(c.run_id) != here)
    return RenewLeases.of(
        "batch-stray",
        "req-stray",
        (
            renew_cmd(claims[0].run_id, claims[0].attempt_id, claims[0].epoch, 2, command_id="stray-1"),
            renew_cmd(there.run_id, there.attempt_id, there.epoch, 2, command_id="stray-2"),
        ),
    )


def test_an_envelope_carrying_another_partitions_run_is_dead_lettered_whole_and_the_batch_goes_on() -> None:
    coordinator = Coordinator()
    claims = _claimed_runs(coordinator, 8)
    before = {e.event_id for e in coordinator.decoded(RUNS_EVENTS.name)}
    stray = _stray_envelope(claims)
    empty = RenewLeases(
        command_id="batch-empty",
        run_id=claims[0].run_id,
        issued_at=T0,
        correlation_id="r",
        actor="x",
        renewals=(),
    )
    good = renew_cmd(claims[2].run_id, claims[2].attempt_id, claims[2].epoch, 2, command_id="good-1")
    outcome = coordinator.send(stray, empty, good)
    assert outcome.deadlettered == 2 and outcome.accepted == 1
    events = [e for e in coordinator.decoded(RUNS_EVENTS.name) if e.event_id not in before]
    assert [e.causation_id for e in events] == ["good-1"], "nothing of the stray envelope was decided"
    letters = coordinator.raw(DEADLETTER.name)
    reasons = [dict(r.headers)["tenure-dlq-reason"].decode() for r in letters]
    assert reasons == ["MISROUTED_BATCH", "EMPTY_BATCH"]
    assert dict(letters[0].headers)["tenure-dlq-command-id"] == b"batch-stray"
    assert CODEC.decode(letters[0].value) == stray, "the dead letter keeps the record's bytes"


def test_an_envelope_opens_to_exactly_the_commands_it_was_built_from() -> None:
    commands = tuple(renew_cmd(run_id_for("acme", f"k{i}"), f"att_{i}_1", 1, i + 1) for i in range(3))
    envelope = RenewLeases.of("batch-1", "req-1", commands)
    assert envelope.run_id == commands[0].run_id
    assert envelope.commands() == commands
    assert CODEC.decode(CODEC.outbound(RUNS_COMMANDS.name, envelope.run_id, envelope).value) == envelope
    assert envelope.renewals[1] == BatchedRenewal(
        command_id=commands[1].command_id,
        run_id=commands[1].run_id,
        correlation_id=commands[1].correlation_id,
        attempt_id="att_1_1",
        lease_epoch=1,
        sequence=2,
    )
    mixed = (*commands, renew_cmd(run_id_for("acme", "k9"), "att_9_1", 1, 1, issued_at=T0 + 1))
    with pytest.raises(ValueError, match="one issuedAt"):
        RenewLeases.of("batch-2", "req-2", mixed)


_RENEWALS = st.lists(
    st.tuples(st.sampled_from(TENANTS), st.integers(0, 10_000), st.integers(1, 2**63 - 1)),
    min_size=1,
    max_size=60,
    unique_by=lambda t: (t[0], t[1]),
)


@settings(max_examples=60, deadline=None)
@given(renewals=_RENEWALS)
def test_the_api_sends_one_record_per_partition_carrying_every_command_once_in_order(
    renewals: list[tuple[str, int, int]],
) -> None:
    commands = [
        renew_cmd(run_id_for(tenant, f"k{key}"), f"att_{tenant}_{key}", 1, sequence, command_id=f"r-{i}")
        for i, (tenant, key, sequence) in enumerate(renewals)
    ]
    records = renewal_batch_records(CODEC, commands, "req-1")
    partitions = [record.partition for record, _ in records]
    assert partitions == sorted(set(partitions)), "one record per partition"
    carried: list[RunCommand] = []
    for record, batch in records:
        envelope = CODEC.decode(record.value)
        assert envelope.commands() == batch
        assert record.key == envelope.run_id.encode() == batch[0].run_id.encode()
        assert {partition_for_run(c.run_id) for c in batch} == {record.partition}
        carried.extend(batch)
    assert sorted(carried, key=commands.index) == commands
    for partition in set(partitions):
        assert [c for c in carried if partition_for_run(c.run_id) == partition] == [
            c for c in commands if partition_for_run(c.run_id) == partition
        ], "order within a partition is kept"


def test_a_batch_too_large_for_one_record_is_split_and_still_carries_every_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    commands = [
        renew_cmd(run_id_for("acme", f"k{i}"), f"att_{i}_1", 1, 1, command_id=f"r-{i}") for i in range(40)
    ]
    whole = renewal_batch_records(CODEC, commands, "req-1")
    assert len(whole) == 1
    monkeypatch.setattr(routing, "MAX_RECORD_BYTES", len(whole[0][0].value) // 3)
    split = renewal_batch_records(CODEC, commands, "req-1")
    assert len(split) > 2
    assert [c for _, batch in split for c in batch] == commands
    assert all(len(record.value) <= len(whole[0][0].value) // 3 for record, _ in split)


# --- crashes (DUR-1) ----------------------------------------------------------------------------


def _records_of(messages: list[Any]) -> list[InboundRecord]:
    offsets: dict[int, int] = defaultdict(int)
    records = []
    for message in messages:
        partition = partition_for_run(message.run_id)
        out = CODEC.outbound(RUNS_COMMANDS.name, message.run_id, message, partition)
        records.append(
            InboundRecord(out.topic, partition, offsets[partition], out.key, out.value, out.headers)
        )
        offsets[partition] += 1
    return records


def _decoded(log: MemoryEventLog, topic: str) -> list[Any]:
    return [CODEC.decode(r.value) for (t, _), rs in sorted(log.topics.items()) if t == topic for r in rs]


@pytest.mark.parametrize("crash", CRASH_POINTS)
def test_a_crash_at_any_step_of_an_envelopes_batch_then_redelivery_writes_what_a_calm_run_writes_dur_1(
    crash: str,
) -> None:
    """SIGKILL before the commit, after it, or after the store write: the envelope is delivered
    again to a new processor on the same disk and log, and the log ends exactly as without the
    crash (no renewal lost or decided twice), with the state on disk the fold of the log."""
    submits = [submit_command(TENANTS[i % 3], f"k{i}", command_id=f"s-{i}") for i in range(9)]
    claims = [claim_cmd(s.run_id, command_id=f"c-{i}") for i, s in enumerate(submits)]
    calm = Coordinator()
    calm.send(*submits)
    calm.send(*claims)
    granted = [e for e in calm.decoded(RUNS_EVENTS.name) if isinstance(e, AttemptClaimed)]
    envelopes = _envelopes(_renewals(granted, 1))
    calm.send(*envelopes)

    disk, log, clock = MemoryStore(), MemoryEventLog(RUNS_COMMANDS.partitions), ManualClock(T0)
    store = CrashableStore(disk)
    crashed_log = CrashableLog(log, store)
    processor = RunCommandProcessor(crashed_log, store, CODEC, clock)
    processor.handle(_records_of(submits))
    processor.handle(_records_of(claims))
    batch = _records_of(envelopes)
    log.fail_next_commit = crash == "before_commit"
    crashed_log.crash_after_next_commit = crash == "after_commit"
    died = False
    try:
        processor.handle(batch)
    except (ConnectionError, SimulatedCrash):
        died = True
    assert died is (crash != "after_store_write"), "after_store_write: handled, killed before the ack"
    log.fail_next_commit = False
    RunCommandProcessor(crashed_log, store, CODEC, clock).handle(batch)  # a new process, redelivered

    assert _decoded(log, RUNS_EVENTS.name) == calm.decoded(RUNS_EVENTS.name)
    assert _decoded(log, RUNS_REJECTIONS.name) == calm.decoded(RUNS_REJECTIONS.name)
    for claim in granted:
        raw = disk.get(state_key(claim.run_id))
        assert raw is not None
        events = [e for e in _decoded(log, RUNS_EVENTS.name) if e.run_id == claim.run_id]
        assert decode_state(raw) == fold(events)


# --- one wake-up per batch (services/common/decisions.py) ----------------------------------------


def _decision(command_id: str, code: str = "STALE_EPOCH") -> Rejected:
    return Rejected(
        CommandRejected(
            event_id=f"rej-{command_id}",
            run_id=run_id_for("acme", "k1"),
            occurred_at=T0,
            causation_id=command_id,
            correlation_id="c",
            actor="a",
            command_type="RenewLease",
            code=code,
            detail="d",
            current_status="running",
            current_version=3,
        )
    )


def test_a_group_resolves_once_when_its_last_decision_arrives_from_another_thread() -> None:
    async def scenario() -> None:
        book = DecisionBook()
        book.deliver("known", _decision("known"))  # decided before the request registered
        group = book.register_many(["known", "a", "b"])
        assert book.decided(group) == {"known": _decision("known")}
        threading.Thread(target=book.deliver, args=("a", _decision("a"))).start()
        await asyncio.sleep(0.05)
        assert not group.done.done(), "b is still pending"
        assert set(book.decided(group)) == {"known", "a"}
        threading.Thread(target=book.deliver, args=("b", _decision("b"))).start()
        await asyncio.wait_for(group.done, 5)
        assert book.decided(group) == {c: _decision(c) for c in ("known", "a", "b")}

    asyncio.run(scenario())


def test_a_released_command_is_no_longer_awaited_and_a_late_decision_of_it_is_ignored() -> None:
    async def scenario() -> None:
        book = DecisionBook()
        group = book.register_many(["sent", "not-sent"])
        book.release(group, ["not-sent"])  # Kafka never took it: it can never be decided
        assert not group.done.done()
        book.deliver("sent", _decision("sent"))
        await asyncio.wait_for(group.done, 5)
        book.release(group, ["sent", "not-sent"])  # the request is done with the group
        book.deliver("not-sent", _decision("not-sent"))
        assert book.decided(group) == {"sent": _decision("sent")}
        solo = book.register("not-sent")  # an ordinary waiter still learns the remembered answer
        assert solo.done() and isinstance(solo.result(), (Decided, Rejected))

    asyncio.run(scenario())
