"""Trajectory views: the pure fold of trajectories.events and its store over a MemoryStore.

Proves the read side of SAGA-1..7 / REC-1 / REC-7 for operators: a view is exactly the fold of
the events before the stored offsets, however the log is cut into batches and whatever the
broker redelivers (version n+1 applied, repeats dropped, gaps refused); its saga state is the
orchestrator's own fold; recovery decisions show their gate and inputs; incidents are indexed
while open.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.contracts import (
    CompensationStackRetired,
    IncidentResolved,
    LeaseRevocationRecorded,
    PivotGateEvaluated,
    RecoveryDecided,
    RunSubmitted,
    StepCommitted,
    StepFailed,
    StepIntentRecorded,
    TrajectoryCompleted,
    TrajectoryEvent,
    TrajectoryFrozen,
    TrajectoryStarted,
)
from services.common.ids import canonical_json, run_id_for
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec
from services.common.sequencing import VersionGap
from services.common.store import MemoryStore
from services.common.topics import RUNS_EVENTS, TRAJECTORIES_EVENTS
from services.projections.store import RunViewStore
from services.projections.trajectory_store import TrajectoryViewStore
from services.projections.trajectory_views import (
    MAX_DECISIONS,
    apply_trajectory_event,
    decode_fold,
    encode_fold,
    fold_trajectory,
    open_incident,
    render_trajectory,
)
from services.saga_orchestrator.domain import fold, step_key

CODEC = MessageCodec()
T0 = 1_767_225_600_000


class History:
    """Hand-built events of one trajectory, versions 1, 2, 3, ... as the orchestrator numbers them."""

    def __init__(self, key: str) -> None:
        self.run_id = run_id_for("acme", key)
        self.attempt_id = f"att_{self.run_id.removeprefix('run_')}_1"
        self.events: list[TrajectoryEvent] = []

    def add(self, kind: type[Any], cause: str, **fields: Any) -> Any:
        version = len(self.events) + 1
        event = kind(
            event_id=f"evt-{self.run_id}-{version}",
            run_id=self.run_id,
            version=version,
            occurred_at=T0 + 10 * version,
            causation_id=cause,
            correlation_id=self.run_id,
            actor="tenure-saga-orchestrator" if cause.startswith("exec") else "rita",
            **fields,
        )
        self.events.append(event)
        return event

    def start(self) -> None:
        self.add(
            TrajectoryStarted,
            "cmd-start",
            attempt_id=self.attempt_id,
            epoch=1,
            plan="",
            pivot_approval="none",
            budget_tokens=1000,
            budget_steps=10,
            budget_money=5.0,
            rerun_cost_ms=0,
            rerun_cost_money=0.0,
        )

    def intent(
        self,
        cause: str,
        index: int,
        tool: str,
        params: dict[str, Any],
        *,
        dispatch: int = 1,
        pivot: bool = False,
    ) -> None:
        self.add(
            StepIntentRecorded,
            cause,
            step_index=index,
            dispatch=dispatch,
            tool=tool,
            gateway_tool="env",
            operation=tool,
            params=canonical_json(params),
            idempotency_key=step_key(self.run_id, index, dispatch),
            reversibility="III" if pivot else "II",
            attempt_id=self.attempt_id,
            epoch=1,
            plan_step_id="",
            repair_of=-1,
            not_before=0,
            status="awaiting-gate" if pivot else "pending",
            tokens_used=100 if dispatch == 1 else 0,
            money_used=0.5 if dispatch == 1 else 0.0,
        )

    def commit(
        self,
        cause: str,
        index: int,
        output: dict[str, Any],
        undo: dict[str, Any] | None,
        *,
        dispatch: int = 1,
    ) -> None:
        compensation = (
            canonical_json({"gatewayTool": "env", **undo, "costMs": 45, "costMoney": 0.0}) if undo else ""
        )
        self.add(
            StepCommitted,
            cause,
            step_index=index,
            dispatch=dispatch,
            output=canonical_json(output),
            compensation=compensation,
            reconciled=False,
            stack_depth=0,
        )

    def fail(self, cause: str, index: int, kind: str, status: int, error_class: str) -> None:
        self.add(
            StepFailed,
            cause,
            step_index=index,
            dispatch=1,
            error_kind=kind,
            error_message=f"{kind} happened",
            error_status=status,
            error_class=error_class,
            signature=f"sig-{kind}",
            partial_output="",
            compensation="",
        )

    def decide(self, cause: str, index: int, action: str, gate: str) -> None:
        self.add(
            RecoveryDecided,
            cause,
            step_index=index,
            action=action,
            gate=gate,
            reason=f"{gate} said {action}",
            error_class="transient",
            signature="sig",
            inputs=canonical_json({"errorKind": "rate-limited", "stepsLeft": "8"}),
        )


def deploy(key: str = "deploy") -> History:
    """vm.provision, ip.reserve (a 429, retried), the dns.publish pivot through its gate, done."""
    h = History(key)
    h.start()
    h.intent("cmd-propose-0", 0, "vm.provision", {"name": "web"})
    h.commit("exec-0", 0, {"vmId": "vm-1"}, {"operation": "vm.terminate", "params": {"vmId": "vm-1"}})
    h.intent("cmd-propose-1", 1, "ip.reserve", {"region": "eu"})
    h.fail("exec-1a", 1, "rate-limited", 429, "transient")
    h.decide("exec-1a", 1, "TRANSIENT_RETRY", "taxonomy")
    h.intent("exec-1a", 1, "ip.reserve", {"region": "eu"}, dispatch=2)
    h.commit(
        "exec-1b",
        1,
        {"ipId": "ip-1", "address": "10.0.0.1"},
        {"operation": "ip.release", "params": {"ipId": "ip-1"}},
        dispatch=2,
    )
    h.intent("cmd-propose-2", 2, "dns.publish", {"name": "web.example", "address": "10.0.0.1"}, pivot=True)
    h.add(
        PivotGateEvaluated,
        "exec-gate",
        step_index=2,
        checks=canonical_json([{"name": "lease-active", "passed": True, "detail": "epoch 1"}]),
        verdict="passed",
        detail="every check passed",
    )
    h.commit("exec-2", 2, {"recordId": "dns-1"}, None)
    h.add(CompensationStackRetired, "exec-2", pivot_step=2, retired_steps=(0, 1))
    h.add(TrajectoryCompleted, "cmd-finish", steps=3)
    return h


def frozen(key: str = "frozen") -> History:
    """A fatal error before the pivot: escalated, frozen, lease revoked, compensated by hand (REC-7)."""
    h = History(key)
    h.start()
    h.intent("cmd-propose-0", 0, "vm.provision", {"name": "db"})
    h.commit("exec-0", 0, {"vmId": "vm-9"}, {"operation": "vm.terminate", "params": {"vmId": "vm-9"}})
    h.intent("cmd-propose-1", 1, "firewall.write", {"vmId": "vm-9", "port": 443})
    h.fail("exec-1", 1, "auth-revoked", 403, "fatal")
    h.decide("exec-1", 1, "OPERATOR_ESCALATE", "taxonomy")
    h.add(
        TrajectoryFrozen,
        "exec-1",
        incident_id="inc-1",
        failure_mode="PRE_PIVOT_STALLED",
        failed_step=1,
        failed_tool="firewall.write",
        error_context=canonical_json({"kind": "auth-revoked", "status": 403}),
        uncompensated=canonical_json([{"stepIndex": 0, "tool": "vm.provision"}]),
        snapshot_ref="tenure://trajectories/x?version=6",
        epoch=1,
    )
    h.add(LeaseRevocationRecorded, "exec-revoke", incident_id="inc-1", revoked_epoch=1)
    h.add(
        IncidentResolved,
        "cmd-resolve",
        incident_id="inc-1",
        resolution="compensated-manually",
        note="terminated vm-9 by hand",
        attempt_id=h.attempt_id,
        epoch=1,
    )
    return h


class Topic:
    """trajectories.events as the projector reads it: offsets increase per partition."""

    def __init__(self) -> None:
        self._next: dict[int, int] = defaultdict(int)

    def records(self, events: list[TrajectoryEvent], partition: int = 0) -> list[InboundRecord]:
        out = []
        for event in events:
            encoded = CODEC.outbound(TRAJECTORIES_EVENTS.name, event.run_id, event, partition)
            offset = self._next[partition]
            self._next[partition] += 1
            out.append(
                InboundRecord(encoded.topic, partition, offset, encoded.key, encoded.value, encoded.headers)
            )
        return out


def replayed(events: list[TrajectoryEvent]) -> dict[str, Any]:
    folded = fold_trajectory(events)
    assert folded is not None
    return render_trajectory(folded)


# --- the pure fold ------------------------------------------------------------------------------


def test_view_state_is_the_orchestrators_own_fold_SAGA_1() -> None:
    for history in (deploy(), frozen()):
        folded = fold_trajectory(history.events)
        assert folded is not None
        assert folded.state == fold(history.events)


def test_deploy_view_shows_steps_stack_and_pivot_SAGA_2_SAGA_6() -> None:
    h = deploy()
    partial = replayed(h.events[:8])  # ip.reserve committed on its second dispatch
    assert partial["status"] == "forward"
    assert partial["stack"] == [0, 1]  # top of the LIFO stack last
    ip = partial["steps"][1]
    assert ip["status"] == "committed" and ip["dispatch"] == 2
    assert ip["idempotencyKey"] == step_key(h.run_id, 1, 2)
    assert ip["output"] == {"ipId": "ip-1", "address": "10.0.0.1"}
    assert ip["compensation"]["params"] == {"ipId": "ip-1"}
    assert ip["error"] is None  # the 429 belonged to dispatch 1
    assert ip["lastError"] == {
        "kind": "rate-limited",
        "message": "rate-limited happened",
        "status": 429,
        "class": "transient",
    }
    assert [d["dispatch"] for d in ip["dispatches"]] == [1, 2]
    assert [d["commandId"] for d in ip["dispatches"]] == ["cmd-propose-1", "exec-1a"]
    assert partial["budget"] == {"tokens": 800, "steps": 7, "money": 4.0}

    view = replayed(h.events)
    assert view["runId"] == h.run_id and view["version"] == len(h.events)
    assert view["status"] == "completed" and view["terminal"] is True
    assert view["pivotStep"] == 2 and view["pivotCommitted"] is True
    assert view["stack"] == []  # retired by the pivot's commit
    dns = view["steps"][2]
    assert dns["pivot"] is True and dns["gateVerdict"] == "passed"
    assert dns["gateChecks"] == [{"name": "lease-active", "passed": True, "detail": "epoch 1"}]
    assert [s["status"] for s in view["steps"]] == ["committed"] * 3
    assert view["openStep"] is None and view["incident"] is None and view["incidents"] == []
    json.dumps(view)  # JSON-able through and through


def test_decisions_show_gate_and_parsed_inputs_and_keep_the_last_ones_REC_1() -> None:
    view = replayed(deploy().events)
    (decision,) = view["decisions"]
    assert decision["stepIndex"] == 1 and decision["action"] == "TRANSIENT_RETRY"
    assert decision["gate"] == "taxonomy"
    assert decision["inputs"] == {"errorKind": "rate-limited", "stepsLeft": "8"}

    h = History("many-decisions")
    h.start()
    h.intent("cmd-p", 0, "vm.provision", {"name": "x"})
    for n in range(MAX_DECISIONS + 5):
        h.decide(f"exec-{n}", 0, "TRANSIENT_RETRY", f"gate-{n}")
    gates = [d["gate"] for d in replayed(h.events)["decisions"]]
    assert gates == [f"gate-{n}" for n in range(5, MAX_DECISIONS + 5)]


def test_incident_is_open_from_freeze_until_resolution_REC_7() -> None:
    h = frozen()
    at_freeze = fold_trajectory(h.events[:7])
    assert at_freeze is not None
    view = render_trajectory(at_freeze)
    assert view["status"] == "frozen"
    incident = view["incident"]
    assert incident["incidentId"] == "inc-1" and incident["failureMode"] == "PRE_PIVOT_STALLED"
    assert incident["failedStep"] == 1 and incident["failedTool"] == "firewall.write"
    assert incident["errorContext"] == {"kind": "auth-revoked", "status": 403}
    assert incident["uncompensated"] == [{"stepIndex": 0, "tool": "vm.provision"}]
    assert incident["revokedEpoch"] is None
    listed = open_incident(at_freeze)
    assert listed is not None and listed["runId"] == h.run_id and listed["incidentId"] == "inc-1"
    assert view["steps"][1]["error"]["class"] == "fatal"

    revoked = fold_trajectory(h.events[:8])
    assert revoked is not None
    assert render_trajectory(revoked)["incident"]["revokedEpoch"] == 1
    assert (open_incident(revoked) or {})["revokedEpoch"] == 1

    resolved = fold_trajectory(h.events)
    assert resolved is not None
    final = render_trajectory(resolved)
    assert final["status"] == "rolled-back" and final["incident"] is None
    assert open_incident(resolved) is None
    (history,) = final["incidents"]
    assert history["resolution"] == "compensated-manually" and history["resolvedBy"] == "rita"
    assert history["resolutionNote"] == "terminated vm-9 by hand"
    assert final["steps"][0]["status"] == "compensated"


def test_repeats_are_dropped_and_gaps_refused() -> None:
    h = deploy()
    folded = fold_trajectory(h.events[:5])
    assert folded is not None
    for old in h.events[:5]:
        assert apply_trajectory_event(folded, old) is None
    with pytest.raises(VersionGap):
        apply_trajectory_event(folded, h.events[6])
    with pytest.raises(VersionGap):
        apply_trajectory_event(None, h.events[1])
    with pytest.raises(ValueError, match="before trajectory"):
        apply_trajectory_event(None, dataclasses.replace(h.events[1], version=1))


def test_fold_survives_its_encoding() -> None:
    h = frozen()
    for cut in range(1, len(h.events) + 1):
        folded = fold_trajectory(h.events[:cut])
        assert folded is not None
        again = decode_fold(encode_fold(folded))
        assert again == folded
        assert render_trajectory(again) == render_trajectory(folded)


def test_recent_commands_name_each_cause_once_with_its_first_version() -> None:
    view = replayed(deploy().events)
    commands = {c["commandId"]: c for c in view["recentCommands"]}
    assert commands["cmd-start"]["version"] == 1
    assert commands["exec-1a"]["version"] == 5 and commands["exec-1a"]["firstEvent"] == "StepFailed"
    assert commands["cmd-finish"]["firstEvent"] == "TrajectoryCompleted"
    assert len(view["recentCommands"]) == len(commands)


# --- the store ----------------------------------------------------------------------------------


def test_store_views_equal_replay_and_incidents_are_indexed_DUR_1() -> None:
    topic, views = Topic(), TrajectoryViewStore(MemoryStore(), CODEC)
    a, b = deploy("a"), frozen("b")
    assert views.apply(topic.records(a.events[:4], 0) + topic.records(b.events[:7], 1)) == 11
    assert views.get(a.run_id) == replayed(a.events[:4])
    assert [i["incidentId"] for i in views.open_incidents()] == ["inc-1"]
    assert views.incident("inc-1") == open_incident(fold_trajectory(b.events[:7]))  # type: ignore[arg-type]
    assert views.apply(topic.records(a.events[4:], 0) + topic.records(b.events[7:], 1)) == (
        len(a.events) - 4 + len(b.events) - 7
    )
    assert views.get(a.run_id) == replayed(a.events)
    assert views.get(b.run_id) == replayed(b.events)
    assert views.open_incidents() == [] and views.incident("inc-1") is None
    assert views.offsets() == {0: len(a.events), 1: len(b.events)}


def test_store_drops_redelivered_events() -> None:
    topic, views = Topic(), TrajectoryViewStore(MemoryStore(), CODEC)
    h = deploy()
    views.apply(topic.records(h.events[:6]))
    before = views.get(h.run_id)
    # The broker redelivers a stretch already applied, then continues.
    assert views.apply(topic.records(h.events[2:6])) == 0
    assert views.get(h.run_id) == before
    assert views.apply(topic.records(h.events[3:])) == len(h.events) - 6
    assert views.get(h.run_id) == replayed(h.events)


@settings(max_examples=40, deadline=None)
@given(
    cuts=st.lists(st.integers(min_value=0, max_value=20), max_size=6),
    repeats=st.lists(st.tuples(st.integers(0, 19), st.integers(1, 4)), max_size=4),
)
def test_any_batching_with_any_redelivery_gives_the_replayed_view(
    cuts: list[int], repeats: list[tuple[int, int]]
) -> None:
    """However the log is cut into batches and whatever stretch is delivered twice, the stored
    view, the incident index and the offsets equal a replay of the distinct events."""
    a, b = deploy("hyp-a"), frozen("hyp-b")
    delivered: list[TrajectoryEvent] = [e for pair in zip(a.events, b.events, strict=False) for e in pair]
    delivered += a.events[len(b.events) :]
    for start, length in sorted(repeats, reverse=True):
        start = min(start, len(delivered))
        delivered[start:start] = delivered[max(0, start - length) : start]
    topic, views = Topic(), TrajectoryViewStore(MemoryStore(), CODEC)
    records = topic.records(delivered)
    edges = sorted({0, len(records), *(min(c, len(records)) for c in cuts)})
    for lo, hi in itertools.pairwise(edges):
        views.apply(records[lo:hi])
    assert views.get(a.run_id) == replayed(a.events)
    assert views.get(b.run_id) == replayed(b.events)
    assert views.open_incidents() == []
    assert views.offsets() == {0: len(records)}


def test_clearing_trajectory_views_leaves_run_views_alone() -> None:
    store = MemoryStore()
    runs, trajectories = RunViewStore(store, CODEC), TrajectoryViewStore(store, CODEC)
    submitted = RunSubmitted(
        event_id="evt-run",
        run_id=run_id_for("acme", "clear"),
        version=1,
        occurred_at=T0,
        causation_id="cmd-submit",
        correlation_id="c",
        actor="rita",
        tenant="acme",
        idempotency_key="clear",
        execution_spec="{}",
        spec_digest="sha256:" + "0" * 64,
        retry_safe=False,
        timeout_seconds=60,
        max_attempts=1,
        queue_reservation_id="",
    )
    encoded = CODEC.outbound(RUNS_EVENTS.name, submitted.run_id, submitted, 0)
    runs.apply([InboundRecord(RUNS_EVENTS.name, 0, 0, encoded.key, encoded.value, encoded.headers)])
    h = frozen()
    trajectories.apply(Topic().records(h.events[:7]))
    assert trajectories.open_incidents()
    trajectories.clear()
    assert trajectories.all_views() == {} and trajectories.offsets() == {}
    assert trajectories.open_incidents() == []
    assert runs.get(submitted.run_id) is not None and runs.offsets() == {0: 1}
