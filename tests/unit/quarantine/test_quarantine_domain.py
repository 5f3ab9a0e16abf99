"""The quarantine processor's pure core: a run's quarantine and a tenant's taint graph (QUA-1, QUA-2)."""

from __future__ import annotations

from services.common.contracts.quarantine import (
    ArtifactRead,
    QuarantineRejectionCode,
    QuarantineStarted,
    TaintPropagated,
)
from services.quarantine.domain import (
    ArtifactStatus,
    GraphState,
    QuarantineState,
    QuarantineStatus,
    Rejection,
)
from services.quarantine.state_codec import decode_state, encode_state

from .helpers import GRAPH, Aggregates, clear, clear_run, read, register, stage, start, taint

RUN, PEER, OTHER = "run_" + "a" * 32, "run_" + "b" * 32, "run_" + "c" * 32
C = QuarantineRejectionCode


def _status(agg: Aggregates, artifact: str) -> ArtifactStatus:
    graph = agg.states[GRAPH]
    assert isinstance(graph, GraphState)
    return graph.artifacts[artifact].status


def test_a_trigger_records_who_why_and_when_and_every_stage_once_QUA_1() -> None:
    agg = Aggregates()
    events = agg.ok(start(RUN))
    assert isinstance(events[0], QuarantineStarted) and events[0].occurred_at == agg.now
    assert events[0].version == 1 and events[0].trigger == "operator" and events[0].actor == "olga"
    agg.ok(stage(RUN, "suspended", "cgroup-v1-freezer"))
    repeat = agg.send(stage(RUN, "suspended", "sigstop"))  # idempotent on (run, stage)
    assert isinstance(repeat, Rejection) and repeat.code is C.NOTHING_TO_DO
    state = agg.states[RUN]
    assert isinstance(state, QuarantineState) and state.version == 2
    assert [s.mechanism for s in state.stages] == ["cgroup-v1-freezer"] and state.owes_revocation
    agg.ok(stage(RUN, "revoked", "lease-takeover"))
    assert not agg.states[RUN].owes_revocation  # type: ignore[union-attr]


def test_a_second_trigger_is_refused_until_cleared_and_then_quarantines_again() -> None:
    agg = Aggregates()
    agg.ok(start(RUN))
    refused = agg.send(start(RUN))
    assert isinstance(refused, Rejection) and refused.code is C.ALREADY_QUARANTINED
    agg.ok(clear_run(RUN))
    assert agg.states[RUN].status is QuarantineStatus.CLEARED  # type: ignore[union-attr]
    agg.ok(start(RUN))
    again = agg.states[RUN]
    assert isinstance(again, QuarantineState) and again.episodes == 2 and again.stages == ()


def test_the_runs_own_principal_and_a_plain_role_may_not_clear_QUA_2() -> None:
    agg = Aggregates()
    agg.ok(start(RUN, holder="runner-a"))
    own = agg.send(clear_run(RUN, actor="runner-a"))
    assert isinstance(own, Rejection) and own.code is C.CLEARING_FORBIDDEN
    submitter = agg.send(clear_run(RUN, actor="dana", role="submitter"))
    assert isinstance(submitter, Rejection) and submitter.code is C.CLEARING_FORBIDDEN
    agg.ok(clear_run(RUN, actor="vera", role="verifier"))


def test_invalid_commands_and_stages_of_an_unknown_quarantine_are_refused() -> None:
    agg = Aggregates()
    unknown = agg.send(stage(RUN, "suspended"))
    assert isinstance(unknown, Rejection) and unknown.code is C.NOT_QUARANTINED
    both = agg.send(start(RUN, step=2, at=5))
    assert isinstance(both, Rejection) and both.code is C.INVALID_COMMAND
    wrong_aggregate = agg.send(start(GRAPH))
    assert isinstance(wrong_aggregate, Rejection) and wrong_aggregate.code is C.INVALID_COMMAND


def test_taint_follows_three_levels_of_derivation_and_marks_a_reader_suspect_QUA_2() -> None:
    agg = Aggregates()
    agg.ok(register("a0", RUN, step=0))
    agg.ok(register("a1", RUN, step=3))
    agg.ok(register("d1", PEER, parents=("a1",)))
    agg.ok(register("d2", PEER, parents=("d1",)))
    agg.ok(register("d3", OTHER, parents=("d2",)))
    agg.ok(read("a1", OTHER))
    agg.ok(register("o1", OTHER, step=0))
    [event] = agg.ok(taint(RUN, step=2))
    assert isinstance(event, TaintPropagated)
    assert event.tainted == ("a1", "d1", "d2", "d3")
    assert event.suspect_runs == (OTHER,) and event.suspect == ("o1",)
    assert _status(agg, "a0") is ArtifactStatus.UNTAINTED  # before t_taint
    assert {_status(agg, i) for i in ("a1", "d1", "d2", "d3")} == {ArtifactStatus.TAINTED}
    refused = agg.send(read("d3", PEER))
    assert isinstance(refused, Rejection) and refused.code is C.ARTIFACT_QUARANTINED
    # Born after the taint: the quarantined run's output and derivations are tainted at birth.
    agg.ok(register("late", RUN, step=9))
    agg.ok(register("d4", PEER, parents=("o1",)))
    assert _status(agg, "late") is ArtifactStatus.TAINTED
    assert _status(agg, "d4") is ArtifactStatus.SUSPECT


def test_clearing_makes_an_artifact_readable_again_and_lifting_ends_birth_taint_QUA_2() -> None:
    agg = Aggregates()
    agg.ok(register("a1", RUN))
    agg.ok(taint(RUN))
    assert isinstance(agg.send(read("a1", PEER)), Rejection)
    forbidden = agg.send(clear(("a1",), role="runner"))
    assert isinstance(forbidden, Rejection) and forbidden.code is C.CLEARING_FORBIDDEN
    agg.ok(clear(("a1",)))
    assert _status(agg, "a1") is ArtifactStatus.CLEARED
    [served] = agg.ok(read("a1", PEER))
    assert isinstance(served, ArtifactRead) and served.status == "CLEARED"
    agg.ok(register("a2", RUN))
    assert _status(agg, "a2") is ArtifactStatus.TAINTED  # still quarantined
    agg.ok(clear(run=RUN))
    assert _status(agg, "a2") is ArtifactStatus.CLEARED
    agg.ok(register("a3", RUN))
    assert _status(agg, "a3") is ArtifactStatus.UNTAINTED  # the quarantine was lifted


def test_an_envelope_is_immutable_and_derivations_must_name_known_artifacts() -> None:
    agg = Aggregates()
    agg.ok(register("a1", RUN, step=1))
    again = agg.send(register("a1", RUN, step=1))  # the same envelope again: nothing new
    assert isinstance(again, Rejection) and again.code is C.NOTHING_TO_DO
    changed = agg.send(register("a1", RUN, step=2))
    assert isinstance(changed, Rejection) and changed.code is C.ARTIFACT_EXISTS
    unknown = agg.send(register("a2", RUN, parents=("nope",)))
    assert isinstance(unknown, Rejection) and unknown.code is C.ARTIFACT_NOT_FOUND


def test_a_taint_window_by_time_taints_what_was_registered_since() -> None:
    agg = Aggregates()
    agg.ok(register("old", RUN))
    since = agg.now + 1
    agg.ok(register("new", RUN))
    agg.ok(taint(RUN, at=since))
    assert _status(agg, "old") is ArtifactStatus.UNTAINTED
    assert _status(agg, "new") is ArtifactStatus.TAINTED


def test_states_survive_the_store_codec_exactly() -> None:
    agg = Aggregates()
    agg.ok(start(RUN, step=1))
    agg.ok(stage(RUN, "severed", "netns-link-down"))
    agg.ok(register("a1", RUN, step=2))
    agg.ok(register("d1", PEER, parents=("a1",)))
    agg.ok(read("a1", PEER))
    agg.ok(taint(RUN, step=1))
    for state in agg.states.values():
        assert decode_state(encode_state(state)) == state
