"""A scene for the web console's tests and screenshots: runs in several states over the
in-process harness (tests/support/api_harness.py), driven through the real API where it can be.

* a queued run whose labels hold markup (`team=<script>...`), submitted as a schedule submits
  (labels are not a field of POST /runs);
* a running run (acme) with a trajectory: a committed step, a fatal failure decided by a gate
  (BACKWARD_ROLLBACK), a compensator that fails fatally, so the trajectory freezes and opens an
  incident (REC-7); its lease has renewals;
* a cancelled run whose reason holds markup;
* a running run of another tenant (globex) whose runner loops (the watchdog's ladder);
* two breakers: one Open after eight transport failures in ten calls, one Closed.

The executor's reports (RecordStepOutcome, RecordCompensationOutcome), which come from the saga
executor in the real system, are decided by the harness's saga core directly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from services.common.contracts import (
    SUCCESS,
    TRANSPORT_FAILURE,
    RecordCompensationOutcome,
    RecordEffectIntent,
    RecordEffectOutcome,
    RecordStepOutcome,
    SubmitRun,
)
from services.common.ids import canonical_json, command_id_for, derived_id, run_id_for
from services.common.routing import command_record, trajectory_command_record
from tests.support.api_harness import InMemoryTenure

__all__ = ["KEYS", "OLGA", "RITA", "SCRIPT", "Scene", "build_scene"]

KEYS = "rita-key=rita:submitter,olga-key=olga:operator"
RITA = {"Authorization": "Bearer rita-key"}
OLGA = {"Authorization": "Bearer olga-key"}
SCRIPT = '<script>alert("tenure")</script>'


@dataclass
class Scene:
    queued: str
    frozen: str
    cancelled: str
    looping: str
    incident_id: str
    lease: dict[str, Any]  # the frozen run's attemptId / leaseEpoch
    open_endpoint: str = "ledger/transfer"


def _ok(response: httpx.Response, *status: int) -> dict[str, Any]:
    assert response.status_code in (status or (200, 201, 202)), response.text
    body: dict[str, Any] = response.json()
    return body


def _submit(client: httpx.Client, key: str, tenant: str = "acme") -> str:
    body = {"tenant": tenant, "executionSpec": {"task": key}, "timeoutSeconds": 3600}
    return str(_ok(client.post("/runs", headers={**RITA, "Idempotency-Key": key}, json=body), 201)["runId"])


def _claim(client: httpx.Client, run_id: str, runner: str = "runner-1") -> dict[str, Any]:
    grant = _ok(client.post(f"/runs/{run_id}/attempts", headers=RITA, json={"runnerId": runner}), 201)
    return {"attemptId": grant["attemptId"], "leaseEpoch": grant["epoch"]}


def heartbeat(client: httpx.Client, lease: dict[str, Any], sequence: int) -> None:
    body = {"leaseEpoch": lease["leaseEpoch"], "sequence": sequence}
    _ok(client.post(f"/attempts/{lease['attemptId']}/heartbeat", headers=RITA, json=body), 200)


def _executor(tenure: InMemoryTenure, kind: type[Any], run_id: str, n: int, **fields: Any) -> None:
    command = kind(
        command_id=derived_id("cmd", run_id, "executor", str(n)),
        run_id=run_id,
        issued_at=tenure.clock.now_ms(),
        correlation_id=run_id,
        actor="tenure-saga-executor",
        **fields,
    )
    # Through the harness's publisher (its lock): the API may be serving from another thread.
    tenure.publish(trajectory_command_record(tenure.codec, command))


def _labelled(tenure: InMemoryTenure, key: str, labels: dict[str, str]) -> str:
    run_id = run_id_for("acme", key)
    command = SubmitRun(
        command_id=command_id_for(run_id, "SubmitRun", key),
        run_id=run_id,
        issued_at=tenure.clock.now_ms(),
        correlation_id=run_id,
        actor="tenure-scheduler",
        tenant="acme",
        idempotency_key=key,
        execution_spec=canonical_json({"task": "nightly report"}),
        timeout_seconds=3600,
        agent_revision_id="agent-rev-7",
        labels=labels,
    )
    tenure.publish(command_record(tenure.codec, command))
    return run_id


def _effect(
    tenure: InMemoryTenure, run_id: str, lease: dict[str, Any], n: int, tool: str, outcome: str
) -> None:
    """An effect the gateway announced under the lease and its outcome (the lease record's effects)."""
    effect_id = derived_id("eff", run_id, str(n))
    base = {
        "run_id": run_id,
        "issued_at": tenure.clock.now_ms(),
        "correlation_id": run_id,
        "actor": "tenure-gateway",
        "attempt_id": lease["attemptId"],
        "lease_epoch": lease["leaseEpoch"],
        "effect_id": effect_id,
    }
    intent = RecordEffectIntent(
        command_id=derived_id("cmd", effect_id, "intent"),
        **base,
        idempotency_key=f"{run_id}/s{n}/d1",
        tool="env",
        operation=tool,
    )
    tenure.publish(command_record(tenure.codec, intent))
    done = RecordEffectOutcome(
        command_id=derived_id("cmd", effect_id, "outcome"),
        **base,
        outcome=outcome,
        detail="" if outcome == "committed" else "403 from the provider",
    )
    tenure.publish(command_record(tenure.codec, done))


def build_scene(client: httpx.Client, tenure: InMemoryTenure) -> Scene:
    queued = _labelled(tenure, "nightly-1", {"team": SCRIPT, "schedule": "nightly"})

    frozen = _submit(client, "provision-eu")
    lease = _claim(client, frozen)
    for sequence in (1, 2, 3):
        heartbeat(client, lease, sequence)
    _ok(client.post(f"/runs/{frozen}/trajectory", headers=RITA, json=lease), 201)
    step = {**lease, "tool": "vm.provision", "params": {"name": "web-1"}}
    _ok(client.post(f"/runs/{frozen}/trajectory/steps", headers=RITA, json=step), 202)
    _executor(
        tenure,
        RecordStepOutcome,
        frozen,
        1,
        step_index=0,
        dispatch=1,
        outcome="committed",
        output=json.dumps({"vmId": "vm-7f3a"}),
    )
    step = {**lease, "tool": "ip.reserve", "params": {"region": "eu-west"}}
    _ok(client.post(f"/runs/{frozen}/trajectory/steps", headers=RITA, json=step), 202)
    _executor(
        tenure,
        RecordStepOutcome,
        frozen,
        2,
        step_index=1,
        dispatch=1,
        outcome="failed",
        error_kind="permission-denied",
        error_message=f"no quota in eu-west {SCRIPT}",
        error_status=403,
    )
    _executor(
        tenure,
        RecordCompensationOutcome,
        frozen,
        3,
        step_index=0,
        attempt=1,
        outcome="fatal",
        error_kind="internal",
        error_message="vm.terminate: the VM is locked",
    )
    _effect(tenure, frozen, lease, 0, "vm.provision", "committed")
    _effect(tenure, frozen, lease, 1, "ip.reserve", "failed")
    incidents = _ok(client.get("/incidents", headers=OLGA), 200)["items"]
    incident_id = next(i["incidentId"] for i in incidents if i["runId"] == frozen)

    cancelled = _submit(client, "cancel-me")
    _ok(client.post(f"/runs/{cancelled}/cancel", headers=RITA, json={"reason": f"wrong input {SCRIPT}"}), 200)

    looping = _submit(client, "loop-1", tenant="globex")
    loop_lease = _claim(client, looping, runner="runner-2")
    heartbeat(client, loop_lease, 1)
    _ok(client.post(f"/runs/{looping}/trajectory", headers=RITA, json=loop_lease), 201)
    for seq, name in enumerate("abababa", start=1):
        observation = {
            **loop_lease,
            "stepSeq": seq,
            "tool": "vm.provision",
            "arguments": {"name": name},
            "stateHash": name * 64,
            "summary": f"provisioned {name}",
        }
        _ok(client.post(f"/runs/{looping}/observations", headers=RITA, json=observation), 202)

    tenure.report_outcomes("ledger/transfer", [SUCCESS] * 2 + [TRANSPORT_FAILURE] * 8)
    tenure.report_outcomes("env", [SUCCESS] * 5)
    return Scene(queued, frozen, cancelled, looping, incident_id, lease)


# --- the boards the harness leaves out: schedules and quarantine --------------------------------


class StaticScheduleBoard:
    """The ScheduleBoard's read side over schedules folded here (the real one follows Kafka)."""

    failure: str | None = None

    def __init__(self, states: list[Any]) -> None:
        self._states = {s.schedule_id: s for s in states}

    def wait_current(self, timeout_s: float) -> bool:
        return True

    def get(self, schedule_id: str) -> Any:
        return self._states.get(schedule_id)

    def states(self) -> list[Any]:
        return list(self._states.values())

    def health(self) -> Any:
        from services.common.decisions import FollowerHealth

        return FollowerHealth(True, f"{len(self._states)} schedules")

    def close(self) -> None:
        """Nothing to stop."""


def _schedule(tenure: InMemoryTenure, schedule_id: str, cron: str, zone: str, labels: dict[str, str]) -> Any:
    from services.common.contracts.schedules import CreateSchedule
    from services.schedules.domain import decide, evolve

    command = CreateSchedule(
        command_id=derived_id("cmd", schedule_id, "create"),
        run_id=schedule_id,
        issued_at=tenure.clock.now_ms(),
        correlation_id=schedule_id,
        actor="rita",
        tenant="acme",
        agent_revision_id="agent-rev-7",
        execution_spec=canonical_json({"task": "nightly report"}),
        retry_safe=False,
        timeout_seconds=600,
        max_attempts=1,
        time_zone=zone,
        cron=cron,
        overlap_policy="skip",
        misfire_policy="coalesce",
        nonexistent_policy="skip",
        repeated_policy="first",
        labels=labels,
    )
    state = None
    events = decide(None, command, tenure.clock.now_ms())
    assert isinstance(events, tuple | list), events
    for event in events:
        state = evolve(state, event)
    return state


class ConsoleTenure(InMemoryTenure):
    """The harness with a schedules board and a quarantine fold, so every console page has data."""

    def __init__(self) -> None:
        from services.quarantine.view import QuarantineFold

        super().__init__()
        self.quarantines = QuarantineFold()
        self.schedule_board = StaticScheduleBoard(
            [
                _schedule(self, "sch_0000000000000001", "0 2 * * *", "Europe/Berlin", {"team": SCRIPT}),
                _schedule(self, "sch_0000000000000002", "*/15 * * * *", "UTC", {}),
            ]
        )
        self._quarantine_states: dict[str, Any] = {}

    def dependencies(self, tmp: Any, api_keys: str = "", decision_timeout_s: float = 1.0) -> Any:
        from services.command_api.quarantine_deps import QuarantineDeps
        from services.common.decisions import DecisionBook

        deps = super().dependencies(tmp, api_keys, decision_timeout_s)
        deps.schedules = self.schedule_board  # type: ignore[assignment]
        deps.quarantine = QuarantineDeps(board=self.quarantines, decisions=DecisionBook())
        return deps

    def quarantine(self, command: Any) -> None:
        """Decide a quarantine command with the processor's core and fold it into the board."""
        from services.quarantine.domain import Rejection, decide, evolve

        state = self._quarantine_states.get(command.run_id)
        events = decide(state, command, self.clock.now_ms())
        assert not isinstance(events, Rejection), events
        for event in events:
            state = evolve(state, event)
            self.quarantines.apply(event)
        self._quarantine_states[command.run_id] = state


def quarantine_scene(tenure: ConsoleTenure, scene: Scene) -> None:
    """The frozen run quarantined by an operator; two artifacts, the second derived from the
    first by the looping run, so the taint reaches another run through the graph."""
    from services.common.contracts.quarantine import RegisterArtifact, StartQuarantine, TaintRun, graph_id

    graph = graph_id("acme")
    n = iter(range(1, 100))

    def header(aggregate: str, actor: str) -> dict[str, Any]:
        return {
            "command_id": derived_id("cmd", aggregate, "quarantine", str(next(n))),
            "run_id": aggregate,
            "issued_at": tenure.clock.now_ms(),
            "correlation_id": aggregate,
            "actor": actor,
        }

    for artifact, run_id, parents in (
        ("art_0000000000000001", scene.frozen, ()),
        ("art_0000000000000002", scene.looping, ("art_0000000000000001",)),
    ):
        tenure.quarantine(
            RegisterArtifact(
                **header(graph, "tenure-saga"),
                artifact_id=artifact,
                producer_run_id=run_id,
                attempt_id="",
                step=0,
                content_hash=f"sha256:{artifact}",
                size_bytes=42,
                media_type="application/json",
                source="saga-step",
                location=f"artifacts/{artifact}",
                derived_from=parents,
            )
        )
    tenure.quarantine(
        StartQuarantine(
            **header(scene.frozen, "olga"),
            trigger="operator",
            reason=f"prompt injection suspected {SCRIPT}",
            evidence='{"ticket": "SEC-42"}',
            tenant="acme",
            holder="rita",
            lease_epoch=int(scene.lease["leaseEpoch"]),
            attempt_id=str(scene.lease["attemptId"]),
            taint_from_step=-1,
            taint_from_at=0,
        )
    )
    tenure.quarantine(
        TaintRun(
            **header(graph, "tenure-quarantine"),
            tainted_run_id=scene.frozen,
            since_step=-1,
            since_at=0,
            quarantine_event_id="q-1",
        )
    )
