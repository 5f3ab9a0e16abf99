"""The runner SDK's side of the semantic watchdog (WD-1, WD-5), against the real API in-process.

The SDK's clients talk to the real app over tests/support/api_harness.py (the real routes, views
and pure cores of the coordinator, saga and watchdog; no broker) through the TestClient's
transport. A runner that loops through two states is told (`on_intervention`, once per rung, on
its proposal and heartbeat answers), and its LoopGuard restores the checkpoint before the cycle
when the watchdog asks for a rollback, then acknowledges it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.contracts import AcknowledgeRollback, ObserveStep
from services.runner_sdk import (
    ActionTombstoned,
    Checkpoints,
    Intervention,
    InterventionInbox,
    Lease,
    LoopGuard,
    TenureClient,
    TrajectoryClient,
    TrajectoryRejected,
    WatchdogClient,
    action_hash,
    effect_action_hash,
    tree_state_hash,
)
from services.runner_sdk.checkpoints import RUN_START, CheckpointMissing
from tests.support.api_harness import InMemoryTenure, api_client

pytestmark = pytest.mark.timeout(60)

KEYS = "rita-key=rita:submitter"
RITA = {"Authorization": "Bearer rita-key"}


class Sdk:
    """A claimed run with an open trajectory, and the SDK's three clients sharing one inbox."""

    def __init__(self, http: Any, tenure: InMemoryTenure) -> None:
        self.tenure = tenure
        self.heard: list[Intervention] = []
        self.inbox = InterventionInbox(self.heard.append)
        transport = http._transport
        base = str(http.base_url)
        self.runs = TenureClient(
            base, "http://gateway", "rita-key", transport=transport, on_intervention=self.inbox
        )
        self.trajectories = TrajectoryClient(
            base, "rita-key", transport=transport, on_intervention=self.inbox
        )
        self.watchdog = WatchdogClient(base, "rita-key", transport=transport, on_intervention=self.inbox)
        created = http.post(
            "/runs",
            headers={**RITA, "Idempotency-Key": "sdk-1"},
            json={"tenant": "acme", "executionSpec": {}, "timeoutSeconds": 600},
        )
        assert created.status_code == 201, created.text
        self.lease: Lease = self.runs.claim(created.json()["runId"], "runner-1", [])
        self.trajectories.start_trajectory(self.lease)


@pytest.fixture()
def sdk(tmp_path: Path) -> Iterator[Sdk]:
    with api_client(tmp_path, api_keys=KEYS, decision_timeout_s=5.0) as (http, tenure):
        yield Sdk(http, tenure)


def loop_step(sdk: Sdk, seq: int, name: str) -> None:
    sdk.watchdog.report_observation(
        sdk.lease, seq, "vm.provision", {"name": name}, state={"vm": name}, summary=f"vm {name}"
    )


# --- interventions --------------------------------------------------------------------------------


def test_an_intervention_is_parsed_from_any_answer_and_delivered_once() -> None:
    heard: list[Intervention] = []
    inbox = InterventionInbox(heard.append)
    body = {
        "watchdog": {
            "interventionId": "itv-1",
            "level": 2,
            "code": "ROLLBACK_REQUESTED",
            "actionHash": "0" * 16,
            "period": 2,
            "returnedToStep": 3,
            "checkpointStep": 1,
            "checkpointStateHash": "a" * 64,
            "truncatedSteps": [2, 3, 4],
            "message": "roll back",
        }
    }
    first = inbox.notice(body)
    assert first is not None and first.is_rollback and first.truncated_steps == (2, 3, 4)
    assert first.returned_to_step == 3 and first.checkpoint_state_hash == "a" * 64
    assert inbox.notice(body) == first and heard == [first], "delivered once"
    assert inbox.notice({"watchdog": None}) is None and inbox.notice({}) is None
    assert Intervention.from_json({"level": 1}) is None

    def broken(_: Intervention) -> None:
        raise RuntimeError("the runner's callback failed")

    assert InterventionInbox(broken).deliver(first) is True, "a failing callback never breaks the call"


def test_wd_5_level_1_reaches_the_runner_through_on_intervention_on_proposal_and_heartbeat(sdk: Sdk) -> None:
    for seq, name in enumerate("aba", start=1):
        loop_step(sdk, seq, name)
    with pytest.raises(TrajectoryRejected) as refused:
        sdk.trajectories.propose_step(sdk.lease, "vm.provision", {"name": "a"})
    assert refused.value.code == "STATE_OSCILLATION_DETECTED"
    interrupt = refused.value.watchdog
    assert interrupt is not None and interrupt.is_interrupt and interrupt.period == 2
    assert interrupt.returned_to_step == 1 and interrupt.action_hash == action_hash(
        "vm.provision", {"name": "a"}
    )
    assert "SEMANTIC_WATCHDOG_INTERRUPT" in interrupt.message
    assert sdk.heard == [interrupt], "the callback heard it before the refusal was raised"
    ticket = sdk.trajectories.propose_step(sdk.lease, "vm.provision", {"name": "c"})
    assert ticket.watchdog == interrupt
    renewal = sdk.runs.heartbeat(sdk.lease, 1)
    assert renewal.watchdog == interrupt and sdk.heard == [interrupt], "once, however many answers carry it"


def test_wd_5_a_loop_guard_rolls_a_directory_back_and_acknowledges_it(sdk: Sdk, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "README").write_text("start")
    guard = LoopGuard(sdk.watchdog, sdk.lease, Checkpoints(tmp_path / "checkpoints"), workdir=work)
    start = guard.start()
    assert start.step_seq == RUN_START and start.state_hash == tree_state_hash(work)
    for name in "abab":  # two states, back and forth: level 1, then level 2
        (work / "config").write_text(name)
        guard.step("fs.write", {"path": "config", "text": name}, summary=f"wrote {name}")
    [done] = guard.rollbacks
    assert done.intervention.code == "ROLLBACK_REQUESTED" and done.checkpoint.step_seq == RUN_START
    assert sorted(p.name for p in work.iterdir()) == ["README"], "back to the run's start"
    assert tree_state_hash(work) == start.state_hash
    [ack] = sdk.tenure.commands_of(AcknowledgeRollback)
    assert (
        ack.intervention_id == done.intervention.intervention_id
        and ack.restored_state_hash == start.state_hash
    )
    view = sdk.watchdog.view(sdk.lease.run_id)
    assert (
        view["status"] == "rolled-back" and view["interventions"][-1]["restoredCheckpointStep"] == RUN_START
    )
    # Back at the checkpoint, on probation: a different step is progress, nothing is pending.
    receipt = guard.step("fs.write", {"path": "config", "text": "c"}, summary="something new")
    assert receipt.step_seq == 4 and receipt.watchdog is None


def test_a_loop_guard_hands_a_json_state_back(sdk: Sdk) -> None:
    state: dict[str, Any] = {"vm": None}
    guard = LoopGuard(sdk.watchdog, sdk.lease, state=lambda: state)
    guard.start()
    for name in "abab":
        state = {"vm": name}
        guard.step("vm.provision", {"name": name})
    assert guard.take_restored() == {"vm": None} and guard.take_restored() is None


def test_a_rollback_without_its_checkpoint_is_an_error(tmp_path: Path) -> None:
    checkpoints = Checkpoints(tmp_path / "c", keep=2)
    for step in range(5):
        checkpoints.record(step, {"n": step})
    assert checkpoints.steps() == [3, 4]
    found = checkpoints.find(9, checkpoints.get(3).state_hash)  # type: ignore[union-attr]
    assert found is not None and found.step_seq == 3, "found by the state's hash"
    guard = LoopGuard(WatchdogClient("http://api"), _Lease(), checkpoints)
    itv = Intervention("itv", 2, "ROLLBACK_REQUESTED", "0" * 16, 2, "", checkpoint_step=1)
    with pytest.raises(CheckpointMissing):
        guard.roll_back(itv)


class _Lease:
    run_id = "run_" + "0" * 32
    attempt_id = "att_" + "0" * 32 + "_1"
    epoch = 1


# --- observations and thresholds ------------------------------------------------------------------


def test_report_observation_hashes_the_state_and_names_the_action(sdk: Sdk, tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    receipt = sdk.watchdog.report_observation(
        sdk.lease, 0, "fs.read", {"path": "x"}, state=tmp_path / "ws", metrics=[1, 2], mutating=False
    )
    [sent] = sdk.tenure.commands_of(ObserveStep)
    assert sent.state_hash == tree_state_hash(tmp_path / "ws") and not sent.mutating
    assert receipt.action_hash == sent.action_hash == action_hash("fs.read", {"path": "x"})
    with pytest.raises(ValueError):
        sdk.watchdog.report_observation(sdk.lease, 1, "t")
    with pytest.raises(ValueError):
        sdk.watchdog.report_observation(sdk.lease, 1, "t", {}, error_kind="fatal")


def test_configure_and_wait_for_an_intervention(sdk: Sdk) -> None:
    run_id = sdk.lease.run_id
    assert sdk.watchdog.wait_for_intervention(run_id, timeout_s=0.2) is None
    view = sdk.watchdog.configure(run_id, max_period=2, ladder_epoch=4)
    assert view["thresholds"]["maxPeriod"] == 2 and view["thresholds"]["ladderEpoch"] == 4
    for seq, name in enumerate("aba", start=1):
        loop_step(sdk, seq, name)
    found = sdk.watchdog.wait_for_intervention(run_id, after_version=view["version"], timeout_s=2)
    assert found is not None and found.code == "STATE_OSCILLATION_DETECTED" and sdk.heard == [found]


def test_a_tombstoned_effect_is_not_a_lost_lease() -> None:
    def gateway(request: httpx.Request) -> httpx.Response:
        body = {"type": "/problems/action-tombstoned", "code": "ACTION_TOMBSTONED", "actionHash": "f" * 16}
        return httpx.Response(409, json=body, headers={"content-type": "application/problem+json"})

    client = TenureClient("http://api", "http://gw", transport=httpx.MockTransport(gateway))
    lease = Lease(_Lease.run_id, _Lease.attempt_id, 1, "l", 1, 0, 30, 10, 0, {})
    with pytest.raises(ActionTombstoned) as refused:
        client.effect(lease, "k", "ledger", "credit", {"amount": 1}, action_hash="f" * 16)
    assert refused.value.action_hash == "f" * 16
    assert effect_action_hash("ledger", "credit", {"amount": 1}) == action_hash(
        "ledger/credit", {"amount": 1}
    )
