"""One fold per aggregate: the Run view is rendered from the Run aggregate's own `evolve`.

The projector folds each run with services.lease_coordinator.domain.evolve and renders the view
from that RunState plus the run's history; nothing in the projection decides an outcome again.
Proved over random walks of the pure aggregate (tests/unit/run_walks.py: every event is one the
coordinator can write, and every Run event type occurs):
- after every event the view's status, version, deadline, queue reservation, epoch, current lease
  (ids, holder, terms, expiry, certainty, held or ended), stop, input wait and every effect's
  status are the RunState's, and the fold's state is the aggregate's own fold (DUR-1);
- LEASE-2/LEASE-6: one lease record per epoch ever issued; every older one has ended;
- rebuilding from offset 0 into a fresh store equals the incremental fold, whatever the batching
  and with a redelivered prefix, byte for byte, folds included (DUR-1, the read side);
- a store written before folds were stored refolds itself from offset 0, and a fold another
  writer changed is read back, never taken from memory;
- the state codec's record is byte-identical to the asdict encoding it replaced, so every state
  already stored decodes as before.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.contracts import RunEvent
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec
from services.common.sequencing import VersionGap
from services.common.store import MemoryStore
from services.lease_coordinator.domain import (
    LeaseCertainty,
    RunState,
    evolve,
    fold,
    superseded_lease,
)
from services.lease_coordinator.state_codec import decode_state, encode_state, state_record
from services.projections.fold_codec import brief_of, decode_fold, encode_fold, encode_view
from services.projections.store import RunViewStore
from services.projections.views import (
    RunFold,
    apply_event,
    apply_run_event,
    fold_run,
    history_entry,
    render_run,
)

from .run_walks import Step, steps, walk
from .test_run_views import EventTopic

CODEC = MessageCodec()
_ENDED = {"expired", "revoked", "released"}
_WALK = {
    "walk_steps": steps(max_size=40),
    "retry_safe": st.booleans(),
    "max_attempts": st.integers(1, 3),
    "timeout_seconds": st.sampled_from((20, 120, 600)),
}
# A run that meets most of the lease protocol: renewals, an effect, a takeover, an expiry and
# requeue, a second claim, an input request, an answer and a continuation that succeeds.
_STORY: list[Step] = [
    ("claim", 0, 1_000),
    ("renew", 1, 1_000),
    ("intent", 1, 0),
    ("takeover", 1, 1_000),
    ("outcome", 0, 0),
    ("renew", 1, 1_000),
    ("tick", 0, 100_000),
    ("claim", 0, 1_000),
    ("renew", 1, 1_000),
    ("grant", 1, 0),
    ("input", 2, 0),
    ("answer", 0, 1_000),
    ("claim", 2, 1_000),
    ("renew", 1, 1_000),
    ("report", 4, 1_000),
]


def assert_rendered_from(view: dict[str, Any], state: RunState) -> None:
    """What the view says about the run is what the aggregate's state says."""
    assert (view["runId"], view["status"], view["version"]) == (
        state.run_id,
        state.status.value,
        state.version,
    )
    assert (view["deadlineAt"], view["queueReservationId"]) == (state.deadline_at, state.queue_reservation_id)
    assert (view["specDigest"], view["executionSpec"]) == (
        state.spec_digest,
        json.loads(state.execution_spec),
    )
    assert (view["submittedAt"], view["submittedBy"]) == (state.submitted_at, state.submitted_by)
    assert (view["retrySafe"], view["maxAttempts"]) == (state.retry_safe, state.max_attempts)
    leases = [*view["leaseHistory"], *([view["lease"]] if view["lease"] else [])]
    assert [lease["epoch"] for lease in leases] == list(range(1, state.epoch + 1)), "one record per epoch"
    assert all(old["endedAt"] is not None and old["certainty"] in _ENDED for old in view["leaseHistory"])
    assert len(view["attempts"]) == state.epoch
    assert len([a for a in view["attempts"] if a["attemptNumber"] is not None]) == state.attempts_started
    own = state.lease
    if own is None:
        assert view["lease"] is None
    else:
        lease = view["lease"]
        assert (lease["leaseId"], lease["attemptId"], lease["epoch"]) == (
            own.lease_id,
            own.attempt_id,
            own.epoch,
        )
        assert (lease["holder"], lease["holderKind"]) == (own.holder, own.holder_kind)
        assert (lease["issuedAt"], lease["expiresAt"]) == (own.issued_at, own.expires_at)
        assert lease["certainty"] == own.certainty.value
        rule = lease["expiryRule"]
        assert (rule["leaseSeconds"] * 1000, rule["heartbeatSeconds"] * 1000, rule["atRiskAfterMs"]) == (
            own.lease_ms,
            own.heartbeat_ms,
            own.at_risk_after_ms,
        )
        assert (lease["endedAt"] is None) == own.held
    effects = {
        e["effectId"]: (e["status"], e["epoch"], old["epoch"]) for old in leases for e in old["effects"]
    }
    assert effects == {e.effect_id: (e.outcome, e.epoch, e.epoch) for e in state.effects}
    if state.stop is not None:
        stop = view["stop"]
        assert (stop["kind"], stop["requestedAt"], stop["graceUntil"]) == (
            state.stop.kind.value,
            state.stop.requested_at,
            state.stop.grace_until,
        )
    if state.input_wait is not None:
        wait = view["input"]
        assert (wait["requestId"], wait["expiresAt"], wait["checkpointDigest"]) == (
            state.input_wait.request_id,
            state.input_wait.expires_at,
            state.input_wait.checkpoint_digest,
        )


# --- the view is the state's --------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_WALK)
def test_after_every_event_the_view_says_what_the_aggregates_state_says_dur_1_lease_2(
    walk_steps: list[Step], retry_safe: bool, max_attempts: int, timeout_seconds: int
) -> None:
    run = walk(walk_steps, retry_safe=retry_safe, max_attempts=max_attempts, timeout_seconds=timeout_seconds)
    state: RunState | None = None
    current: RunFold | None = None
    for event in run.events:
        state = evolve(state, event)
        current = apply_run_event(current, event)
        assert current is not None and current.state == state, "the fold's state is the aggregate's"
        assert_rendered_from(render_run(current), state)
    assert current is not None and current.state == fold(run.events) == run.state
    view = render_run(current)
    assert view["history"] == [history_entry(e) for e in run.events]
    assert view["updatedAt"] == run.events[-1].occurred_at
    assert view == render_run(fold_run(run.events) or current), "replay renders the same view"
    assert decode_fold(encode_fold(current), current.history) == current


def test_the_story_meets_every_kind_of_lease_record_and_each_agrees_with_the_state() -> None:
    run = walk(_STORY)
    kinds = {type(e).__name__ for e in run.events}
    assert {"LeaseTakenOver", "LeaseExpired", "RunRequeued", "InputProvided", "UploadGrantIssued"} <= kinds
    assert run.state.status.value == "succeeded" and run.state.epoch == 4
    view = render_run(fold_run(run.events))  # type: ignore[arg-type]
    assert_rendered_from(view, run.state)
    assert [old["certainty"] for old in view["leaseHistory"]] == ["revoked", "expired", "released"]
    assert view["leaseHistory"][0]["effects"][0]["status"] == "committed"
    assert view["input"]["response"]["answer"] == {"branch": "main"}
    assert [g["destination"] for g in view["uploadGrants"]] == ["out/result-1.json"]
    assert view["resultManifest"][0]["artifactId"] == "out/result.json"


def test_a_newer_epoch_revokes_a_lease_still_held_and_leaves_an_ended_one_lease_6() -> None:
    run = walk([("claim", 0, 1_000), ("renew", 1, 1_000)])
    held = run.state.lease
    assert held is not None and held.held
    assert superseded_lease(held).certainty is LeaseCertainty.REVOKED
    ended = dataclasses.replace(held, certainty=LeaseCertainty.EXPIRED)
    assert superseded_lease(ended) == ended


def test_apply_event_continues_only_from_a_view_it_returned() -> None:
    run = walk(_STORY[:2])
    first = apply_event(None, run.events[0])
    assert first is not None
    with pytest.raises(TypeError):
        apply_event(dict(first), run.events[1])
    second = apply_event(first, run.events[1])
    assert second is not None and second["version"] == 2 and first["version"] == 1


# --- the store ----------------------------------------------------------------------------------


def _interleaved(runs: list[list[RunEvent]], order: list[int]) -> list[RunEvent]:
    """The runs' events on one log, each run's in its own order, runs picked by `order`."""
    pending = [list(reversed(events)) for events in runs]
    log: list[RunEvent] = []
    for pick in order:
        live = [p for p in pending if p]
        if not live:
            break
        log.append(live[pick % len(live)].pop())
    for rest in pending:
        log.extend(reversed(rest))
    return log


def _keys(store: MemoryStore) -> dict[str, bytes]:
    return dict(store.scan(""))


def _apply_in(views: RunViewStore, records: list[InboundRecord], batch: int) -> None:
    for start in range(0, len(records), batch):
        views.apply(records[start : start + batch])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    walks=st.lists(steps(max_size=25), min_size=1, max_size=4),
    order=st.lists(st.integers(0, 3), max_size=80),
    split_a=st.integers(1, 9),
    split_b=st.integers(1, 9),
    redelivered=st.integers(0, 200),
)
def test_rebuild_from_offset_zero_equals_the_incremental_fold_byte_for_byte_dur_1(
    walks: list[list[Step]], order: list[int], split_a: int, split_b: int, redelivered: int
) -> None:
    runs = [walk(s, key=f"rb-{i}") for i, s in enumerate(walks)]
    topic = EventTopic()
    partition = {run.run_id: i % 2 for i, run in enumerate(runs)}  # a run's events share one
    log = _interleaved([r.events for r in runs], order)
    records = [r for e in log for r in topic.records([e], partition=partition[e.run_id])]
    live_store, rebuilt_store = MemoryStore(), MemoryStore()
    live, rebuilt = RunViewStore(live_store, CODEC), RunViewStore(rebuilt_store, CODEC)
    _apply_in(live, records, split_a)
    # Kafka redelivers what follows the last committed offset: here, a tail folded already.
    assert live.apply(records[redelivered % (len(records) + 1) :]) == 0, "a redelivery changes nothing"
    _apply_in(rebuilt, records, split_b)
    assert _keys(rebuilt_store) == _keys(live_store)
    for run in runs:
        expected = fold_run(run.events)
        assert expected is not None
        assert live.fold(run.run_id) == expected, "the stored fold decodes to the fold"
        assert live.get(run.run_id) == render_run(expected)
        assert live.brief(run.run_id)["version"] == run.state.version  # type: ignore[index]


@pytest.mark.parametrize("layout", [None, b"4"], ids=["before-folds", "layout-4"])
def test_a_store_of_an_older_layout_refolds_itself_from_offset_zero(layout: bytes | None) -> None:
    """Views an older layout wrote (rendered view/ keys; before layout 2 without folds, before
    layout 5 without history entries) cannot be continued: the projector starts over."""
    runs = [walk(_STORY, key=f"old-{i}") for i in range(3)]
    topic = EventTopic()
    records = topic.records(_interleaved([r.events for r in runs], [0, 1, 2] * 20))
    old_store = MemoryStore()
    RunViewStore(old_store, CODEC).apply(records[: len(records) // 2])
    # What the projector of the older layout left: rendered views, briefs, index, offsets, no
    # history entries (and no folds before layout 2).
    old_views = {
        f"view/{run_id}": encode_view(v) for run_id, v in RunViewStore(old_store, CODEC).all_views().items()
    }
    stale_index = f"idx/running/{0:013d}/run_gone"
    gone = [k for k, _ in old_store.scan("hist/")] + [k for k, _ in old_store.scan("meta/")]
    if layout is None:
        gone += [k for k, _ in old_store.scan("fold/")]
    old_store.write(
        {**old_views, stale_index: b"", **({"meta/run-views-layout": layout} if layout else {})}, tuple(gone)
    )
    upgraded = RunViewStore(old_store, CODEC)
    assert upgraded.offsets() == {}, "fold runs.events again from the start"
    upgraded.apply(records[:5])
    assert not list(old_store.scan("view/")), "the old layout's views are gone"
    assert old_store.get(stale_index) is None and upgraded.offsets() == {0: 5}
    upgraded.apply(records[5:])
    fresh_store = MemoryStore()
    RunViewStore(fresh_store, CODEC).apply(records)
    assert _keys(old_store) == _keys(fresh_store)


def test_a_fold_another_writer_changed_is_read_back_not_taken_from_memory() -> None:
    run = walk(_STORY)
    records = EventTopic().records(run.events)
    store = MemoryStore()
    first, second = RunViewStore(store, CODEC), RunViewStore(store, CODEC)
    first.apply(records[:3])
    second.apply(records[3:4])
    first.apply(records[4:])  # from version 5 on: it must see the version 4 the other wrote
    assert first.get(run.run_id) == render_run(fold_run(run.events))  # type: ignore[arg-type]
    store.clear()
    with pytest.raises(VersionGap):
        first.apply(records[5:6])  # its memory of the run is gone with the store
    first.apply(records)
    assert first.get(run.run_id)["version"] == run.state.version  # type: ignore[index]


# --- the state codec ----------------------------------------------------------------------------


def _asdict_encoding(state: RunState) -> bytes:
    """encode_state as it was written before it built the record field by field."""
    data: dict[str, Any] = dataclasses.asdict(state)
    data["status"] = state.status.value
    data["handled_commands"] = list(state.handled_commands)
    if state.lease is not None:
        data["lease"]["certainty"] = state.lease.certainty.value
    if state.stop is not None:
        data["stop"]["kind"] = state.stop.kind.value
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode("utf-8")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(walk_steps=steps(max_size=40))
def test_the_state_codec_writes_the_document_it_always_wrote_and_reads_old_bytes_back_dur_1(
    walk_steps: list[Step],
) -> None:
    """The state is encoded as the dataclass itself now (keys in field order, not sorted): the
    same JSON document as before, and what earlier versions wrote still decodes to the state."""
    state: RunState | None = None
    for event in walk(_STORY[:3] + walk_steps).events:
        state = evolve(state, event)
        assert json.loads(encode_state(state)) == json.loads(_asdict_encoding(state)) == state_record(state)
        assert decode_state(_asdict_encoding(state)) == state
        assert decode_state(encode_state(state)) == state


def test_a_state_stored_before_the_later_fields_existed_still_decodes() -> None:
    state = walk(_STORY[:3]).state
    assert state.lease is not None
    record = state_record(state)
    for later in ("effects", "input_wait", "input_responses", "continuation_of", "attempts_started"):
        record.pop(later)
    record["lease"].pop("capabilities")
    decoded = decode_state(json.dumps(record).encode())
    assert decoded == dataclasses.replace(
        state,
        effects=(),
        input_responses=(),
        attempts_started=0,
        lease=dataclasses.replace(state.lease, capabilities=()),
    )


# --- the brief's lease is the view's ------------------------------------------------------------

_CHECKED = ("attemptId", "epoch", "leaseId", "certainty", "holderPrincipal")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_WALK)
def test_the_briefs_lease_is_the_views_current_lease_for_the_holder_check_lease_1_lease_3(
    walk_steps: list[Step], retry_safe: bool, max_attempts: int, timeout_seconds: int
) -> None:
    """A holder check reads the brief (services/command_api/holder_commands.current_lease): after
    every event its lease says what the whole view's current lease says, field by field."""
    run = walk(walk_steps, retry_safe=retry_safe, max_attempts=max_attempts, timeout_seconds=timeout_seconds)
    current: RunFold | None = None
    for event in run.events:
        current = apply_run_event(current, event)
        assert current is not None
        view, brief = render_run(current), brief_of(current)
        held = current.state.lease
        if not current.leases:
            assert brief["lease"] is None and view["lease"] is None
        elif held is not None and held.epoch == current.leases[-1].epoch:
            assert brief["lease"] == {key: view["lease"][key] for key in _CHECKED}
        else:  # the state holds no lease of that epoch: the check reads the whole view
            assert "lease" not in brief
        assert brief["tenant"] == view["tenant"]


def test_a_fold_whose_marks_do_not_name_their_grant_leaves_the_check_to_the_view() -> None:
    run = walk(_STORY)
    current = fold_run(run.events)
    assert current is not None and current.leases
    unnamed = dataclasses.replace(
        current, leases=(*current.leases[:-1], dataclasses.replace(current.leases[-1], attempt_id=""))
    )
    assert "lease" not in brief_of(unnamed)


def test_a_seeded_marks_placeholder_certainty_is_never_the_briefs() -> None:
    """A seeded rebuild's marks say ACTIVE whatever became of the lease; the brief takes the
    certainty from the state, or leaves the check to the whole view."""
    run = walk([("claim", 0, 1_000), ("renew", 1, 1_000), ("report", 4, 1_000)])
    current = fold_run(run.events)
    assert current is not None and current.leases
    placeholder = dataclasses.replace(current.leases[-1], certainty=LeaseCertainty.ACTIVE)
    seeded = dataclasses.replace(current, leases=(*current.leases[:-1], placeholder))
    brief = brief_of(seeded)
    held = current.state.lease
    if held is not None and held.epoch == placeholder.epoch:
        view_certainty = render_run(current)["lease"]["certainty"]
        assert brief["lease"]["certainty"] == held.certainty.value == view_certainty
    else:
        assert "lease" not in brief
