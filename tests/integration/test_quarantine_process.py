"""Quarantine and taint on real processes and the real broker (QUA-1, QUA-2).

One Tenure (coordinator, projector, API, effect gateway, fenced ledger, quarantine processor):
* a non-allowlisted egress effect is refused before dispatch and quarantines its run; its next
  effect is refused at the gateway (RUN_QUARANTINED, whatever the epoch) and at the recipient
  (the ledger saw the new epoch: the old holder's direct call is a stale epoch);
* taint follows three levels of derivation, a consumer run that read a tainted artifact becomes
  SUSPECT and so does its output, a peer's read of a tainted artifact is refused; the run's own
  principal may not clear, an operator may, and the artifact is served again;
* a SIGKILL of the lease coordinator and of the quarantine processor during a quarantine: after
  restart every stage is done exactly once, never half done;
* a trajectory's committed steps are artifacts too (the saga orchestrator and the simulated
  environment run here): a quarantine from step k taints the outputs of steps >= k only.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.contracts import LeaseTakenOver
from services.common.contracts.quarantine import QuarantineStageCompleted, QuarantineStarted
from services.common.topics import QUARANTINE_EVENTS, RUNS_EVENTS
from services.saga_orchestrator.step_artifacts import step_artifact_id
from tests.support.quarantine import (
    QuarantineSystem,
    claim_run,
    quarantine_view,
    submit_run,
    upload,
    wait_for_stage,
)
from tests.support.system import decode_all, read_topic, wait_until
from tests.support.tenure import problem_type

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuarantineSystem]:
    tmp: Path = tmp_path_factory.mktemp("quarantine")
    started = QuarantineSystem(tenure_topics, tmp, saga=True).start()
    try:
        yield started
    finally:
        started.stop()


def _effect(
    system: QuarantineSystem, key: str, grant: dict[str, Any], idem: str, **payload: Any
) -> httpx.Response:
    body = {
        "runId": grant["runId"],
        "attemptId": grant["attemptId"],
        "epoch": grant["epoch"],
        "idempotencyKey": idem,
        "tool": "ledger",
        "operation": "credit",
        "payload": {"account": "acme", "amount": 5, **payload},
    }
    return httpx.post(
        f"{system.gateway_url}/effects", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


def _ledger(system: QuarantineSystem, run_id: str, epoch: int, idem: str) -> httpx.Response:
    return httpx.post(
        f"{system.ledger_url}/effects",
        headers={"Idempotency-Key": idem, "X-Work-Id": run_id, "X-Fencing-Epoch": str(epoch)},
        json={"operation": "credit", "payload": {"account": "acme", "amount": 5}},
        timeout=10,
    )


def test_egress_outside_the_allowlist_is_refused_before_dispatch_and_quarantines_QUA_1(
    system: QuarantineSystem,
) -> None:
    run_id = submit_run(system, "egress-1", {"agent": "exfil", "egressAllowlist": ["ledger.internal"]})
    grant = claim_run(system, run_id, "run-a")
    assert _effect(system, "run-a", grant, "ok-1").status_code == 200  # no host named: the tool itself
    refused = _effect(system, "run-a", grant, "leak-1", url="https://attacker.example/leak")
    assert refused.status_code == 403 and problem_type(refused) == "egress-not-allowed", refused.text
    assert refused.json()["host"] == "attacker.example" and refused.json()["quarantineTriggered"] is True
    # Refused BEFORE dispatch: the recipient never heard of it.
    assert httpx.get(f"{system.ledger_url}/effects/leak-1", timeout=10).status_code == 404
    view = wait_for_stage(system, run_id, "revoked")
    assert view["status"] == "quarantined" and view["trigger"]["kind"] == "egress-policy"
    assert view["trigger"]["evidence"]["host"] == "attacker.example" and view["holder"] == "runner-a"
    revoked = view["stages"]["revoked"]
    assert revoked["mechanism"] == "lease-takeover" and revoked["detail"]["epoch"] == 2
    # Every tool of this gateway is a recipient: the ledger, and the saga's simulated world.
    assert revoked["detail"]["recipientsFenced"] == ["env", "ledger"]
    # The next effect: refused at the gateway whatever the epoch ...
    for epoch in (1, 2, 99):
        again = _effect(system, "run-a", {**grant, "epoch": epoch}, f"next-{epoch}")
        assert again.status_code == 409 and problem_type(again) == "run-quarantined", again.text
        assert again.json()["code"] == "RUN_QUARANTINED"
    # ... and at the recipient, reached directly: the epoch was bumped and the ledger saw it.
    direct = _ledger(system, run_id, 1, "direct-1")
    assert direct.status_code == 409 and problem_type(direct) == "stale-epoch", direct.text
    # The run's upload grants are revoked too.
    with system.client("run-a") as client:
        denied = client.post(
            f"/attempts/{grant['attemptId']}/uploads",
            json={"leaseEpoch": 1, "destination": "x", "maxBytes": 10},
        )
    assert denied.status_code in (403, 409), denied.text


def test_taint_three_levels_a_suspect_consumer_a_refused_peer_read_and_clearing_QUA_2(
    system: QuarantineSystem,
) -> None:
    producer, peer, consumer = (submit_run(system, f"taint-{n}") for n in ("r", "p", "q"))
    r = claim_run(system, producer, "run-a")
    p = claim_run(system, peer, "run-b")
    q = claim_run(system, consumer, "run-c")
    a1 = upload(system, "run-a", r, "a1.txt", b"produced by r", step=0)["artifactRef"]
    d1 = upload(system, "run-b", p, "d1.txt", b"from a1", derived_from=[a1])["artifactRef"]
    d2 = upload(system, "run-b", p, "d2.txt", b"from d1", derived_from=[d1])["artifactRef"]
    d3 = upload(system, "run-b", p, "d3.txt", b"from d2", derived_from=[d2])["artifactRef"]
    with system.client("run-c") as client:
        early = client.get(f"/artifacts/{d1}", params={"runId": consumer})
    assert (
        early.status_code == 200
        and early.content == b"from a1"
        and early.headers["x-tenure-taint"] == "UNTAINTED"
    )
    o1 = upload(system, "run-c", q, "o1.txt", b"consumer output")["artifactRef"]

    with system.client("op-key") as client:
        started = client.post(
            f"/runs/{producer}/quarantine",
            headers={"Idempotency-Key": "taint-q-1"},
            json={
                "reason": "prompt injection in ticket 42",
                "evidence": {"verifier": "diff"},
                "taintFrom": None,
            },
        )
    assert started.status_code == 202, started.text
    with system.client("op-key") as client:  # Idempotency-Key: the same request, the same answer
        body = {
            "reason": "prompt injection in ticket 42",
            "evidence": {"verifier": "diff"},
            "taintFrom": None,
        }
        repeat = client.post(
            f"/runs/{producer}/quarantine", headers={"Idempotency-Key": "taint-q-1"}, json=body
        )
        other = client.post(
            f"/runs/{producer}/quarantine",
            headers={"Idempotency-Key": "taint-q-1"},
            json={**body, "reason": "x"},
        )
    assert repeat.status_code == 202 and repeat.json()["version"] >= 1, repeat.text
    assert other.status_code == 409 and problem_type(other) == "idempotency-key-conflict", other.text
    view = wait_for_stage(system, producer, "taintPropagated")
    assert {a["artifactId"] for a in view["taintedArtifacts"]} == {a1, d1, d2, d3}
    assert view["suspectRuns"] == [consumer] and view["suspectArtifacts"] == [o1]

    def taint_of(artifact: str) -> str:
        with system.client("op-key") as client:
            return str(client.get(f"/artifacts/{artifact}/envelope").json()["taint"])

    assert [taint_of(a) for a in (a1, d1, d2, d3, o1)] == ["TAINTED"] * 4 + ["SUSPECT"]
    with system.client("run-b") as client:
        peer_read = client.get(f"/artifacts/{d3}", params={"runId": peer})
        listing = client.get("/artifacts", params={"tenant": "acme", "runId": peer}).json()
    assert peer_read.status_code == 409 and problem_type(peer_read) == "artifact-quarantined"
    assert peer_read.content.find(b"from d2") == -1  # nothing of it was served
    assert listing["items"] == []  # tombstoned: hidden from normal listings
    with system.client("op-key") as client:
        audit = client.get(
            "/artifacts", params={"tenant": "acme", "runId": peer, "includeTombstoned": True}
        ).json()
    assert {i["artifactId"] for i in audit["items"]} == {d1, d2, d3}  # kept for audit

    with system.client("run-a") as client:  # the run's own principal
        own = client.post(
            f"/runs/{producer}/quarantine/clear", json={"reason": "I checked myself", "evidence": None}
        )
        own_artifact = client.post(f"/artifacts/{a1}/clear", json={"reason": "looks fine to me"})
    assert own.status_code == 403 and problem_type(own) == "clearing-forbidden"
    assert own_artifact.status_code == 403 and problem_type(own_artifact) == "clearing-forbidden"
    with system.client("op-key") as client:
        cleared = client.post(
            f"/artifacts/{d3}/clear", json={"reason": "diffed by hand", "evidence": {"ok": 1}}
        )
    assert cleared.status_code == 202 and cleared.json()["taint"] == "CLEARED", cleared.text
    assert cleared.json()["cleared"]["by"] == "olga" and cleared.json()["cleared"]["evidence"] == {"ok": 1}
    with system.client("run-b") as client:
        again = client.get(f"/artifacts/{d3}", params={"runId": peer})
    assert (
        again.status_code == 200
        and again.content == b"from d2"
        and again.headers["x-tenure-taint"] == "CLEARED"
    )
    with system.client("ver-key") as client:  # a verifier lifts the whole quarantine
        lifted = client.post(
            f"/runs/{producer}/quarantine/clear",
            json={"reason": "reviewed", "evidence": None, "artifacts": None},
        )
    assert lifted.status_code == 202 and lifted.json()["status"] == "cleared", lifted.text
    assert {a["taint"] for a in lifted.json()["taintedArtifacts"]} == {"CLEARED"}
    assert lifted.json()["cleared"]["by"] == "vera" and taint_of(a1) == "CLEARED"
    with system.client("op-key") as client:
        assert client.get(f"/artifacts/{a1}/envelope").json()["cleared"]["by"] == "vera"


def test_the_runner_host_contract_suspicion_long_poll_and_stages_QUA_1(system: QuarantineSystem) -> None:
    """What services/runner_host codes against: a verifier's suspicion starts the quarantine, the
    host's long-poll answers the moment it lands, its stage reports are recorded once each."""
    run_id = submit_run(system, "host-1")
    claim_run(system, run_id, "run-a")
    assert quarantine_view(system, run_id, key="run-a")["status"] == "none"
    with system.client("run-a") as host, system.client("ver-key") as verifier:
        waited = time.monotonic()
        with httpx.Client(
            base_url=system.base, headers={"Authorization": "Bearer run-a"}, timeout=30
        ) as poller:
            answer: dict[str, Any] = {}
            thread = threading.Thread(
                target=lambda: answer.update(
                    poller.get(
                        f"/runs/{run_id}/quarantine", params={"afterVersion": 0, "waitMs": 20000}
                    ).json()
                )
            )
            thread.start()
            time.sleep(0.5)
            suspected = verifier.post(
                f"/runs/{run_id}/suspicions",
                json={"reason": "injected instructions", "evidence": {"span": [3, 9]}},
            )
            thread.join(25)
        assert suspected.status_code == 202 and suspected.json()["trigger"]["kind"] == "verifier", (
            suspected.text
        )
        assert answer["status"] == "quarantined" and time.monotonic() - waited < 15
        stage = {
            "stage": "suspended",
            "mechanism": "cgroup-v1-freezer",
            "completedAt": "2026-12-01T13:00:00.001Z",
        }
        intruder = verifier.post(f"/runs/{run_id}/quarantine/stages", json={**stage, "hostId": "h1"})
        assert intruder.status_code == 403, intruder.text
        first = host.post(f"/runs/{run_id}/quarantine/stages", json={**stage, "hostId": "h1"})
        again = host.post(
            f"/runs/{run_id}/quarantine/stages", json={**stage, "mechanism": "sigstop", "hostId": "h1"}
        )
        severed = host.post(
            f"/runs/{run_id}/quarantine/stages",
            json={
                "stage": "severed",
                "mechanism": "netns-link-down",
                "completedAt": "2026-12-01T13:00:00.002Z",
                "hostId": "h1",
            },
        )
    assert first.status_code == again.status_code == severed.status_code == 202, (first.text, again.text)
    view = severed.json()
    assert view["stages"]["suspended"]["mechanism"] == "cgroup-v1-freezer"  # the first report stands
    assert view["stages"]["severed"]["mechanism"] == "netns-link-down"
    assert view["stages"]["suspended"]["completedAt"] == "2026-12-01T13:00:00.001Z"


def _events(system: QuarantineSystem, topic: str, partitions: int, run_id: str) -> list[Any]:
    return [e for e in decode_all(read_topic(system.bootstrap, topic, partitions)) if e.run_id == run_id]


def test_a_sigkill_of_the_coordinator_and_the_quarantine_processor_leaves_no_stage_half_done_QUA_1(
    system: QuarantineSystem,
) -> None:
    run_id = submit_run(system, "kill-1")
    claim_run(system, run_id, "run-a")
    system.processor.sigkill()  # the lease coordinator: the takeover cannot be decided now
    with system.client("op-key") as client:
        started = client.post(f"/runs/{run_id}/quarantine", json={"reason": "kill test", "evidence": None})
    assert started.status_code == 202, started.text
    time.sleep(0.3)
    system.quarantine.sigkill()  # mid-stage: the revocation is owed, not recorded
    assert quarantine_view(system, run_id)["stages"]["revoked"] is None
    system.processor.start()
    system.quarantine.start()
    view = wait_for_stage(system, run_id, "revoked", timeout_s=90)
    view = wait_for_stage(system, run_id, "taintPropagated", timeout_s=30)
    assert view["stages"]["revoked"]["detail"]["epoch"] == 2

    def settled() -> list[Any] | None:
        events = _events(system, QUARANTINE_EVENTS.name, QUARANTINE_EVENTS.partitions, run_id)
        stages = [e.stage for e in events if isinstance(e, QuarantineStageCompleted)]
        return events if sorted(stages) == ["revoked", "taint-propagated"] else None

    events = wait_until(settled, 30, "both control-plane stages on the log")
    assert sum(isinstance(e, QuarantineStarted) for e in events) == 1
    takeovers = [
        e
        for e in _events(system, RUNS_EVENTS.name, RUNS_EVENTS.partitions, run_id)
        if isinstance(e, LeaseTakenOver) and e.holder == "tenure-quarantine"
    ]
    assert len(takeovers) == 1 and takeovers[0].epoch == 2  # re-driven, never doubled


def _commit_steps(system: QuarantineSystem, run_id: str, grant: dict[str, Any]) -> list[dict[str, Any]]:
    """Three steps of a trajectory, each proposed once the one before committed."""
    lease = {"attemptId": grant["attemptId"], "leaseEpoch": grant["epoch"]}
    steps = [
        ("vm.provision", {"name": f"web-{run_id[-8:]}"}),
        ("ip.reserve", {"region": "eu-west"}),
        ("cache.warm", {"name": f"web-{run_id[-8:]}"}),
    ]
    with system.client("run-a") as client:
        started = client.post(f"/runs/{run_id}/trajectory", json=lease)
        assert started.status_code == 201, started.text
        for index, (tool, params) in enumerate(steps):
            proposed = client.post(
                f"/runs/{run_id}/trajectory/steps", json={**lease, "tool": tool, "params": params}
            )
            assert proposed.status_code in (201, 202), proposed.text

            def committed(i: int = index) -> dict[str, Any] | None:
                view = client.get(f"/runs/{run_id}/trajectory").json()
                done = len(view["steps"]) > i and view["steps"][i]["status"] == "committed"
                return view if done else None

            view = wait_until(committed, 60, f"step {index} of {run_id} committed")
    return list(view["steps"])


def test_saga_step_outputs_are_artifacts_a_quarantine_from_step_k_taints_steps_k_on_QUA_2(
    system: QuarantineSystem,
) -> None:
    run_id = submit_run(system, "saga-steps-1")
    grant = claim_run(system, run_id, "run-a")
    steps = _commit_steps(system, run_id, grant)
    ids = [step_artifact_id(run_id, i, grant["attemptId"]) for i in range(3)]

    def listed() -> list[dict[str, Any]] | None:
        with system.client("run-a") as client:
            items = client.get("/artifacts", params={"tenant": "acme", "runId": run_id}).json()["items"]
        return items if len(items) == 3 else None

    items = {i["artifactId"]: i for i in wait_until(listed, 30, "the three step outputs listed")}
    assert set(items) == set(ids)
    for index, artifact_id in enumerate(ids):
        envelope = items[artifact_id]["envelope"]
        assert envelope["source"] == "saga-step" and envelope["step"] == index
        assert envelope["producerRunId"] == run_id and envelope["attemptId"] == grant["attemptId"]
        assert envelope["contentHash"].startswith("sha256:") and items[artifact_id]["taint"] == "UNTAINTED"
    with system.client("run-a") as client:
        before = client.get(f"/artifacts/{ids[2]}", params={"runId": run_id})
    assert before.status_code == 200 and before.headers["x-tenure-taint"] == "UNTAINTED", before.text
    assert json.loads(before.content) == steps[2]["output"]

    with system.client("op-key") as client:  # t_taint: the second step (index 1) on
        started = client.post(
            f"/runs/{run_id}/quarantine",
            json={"reason": "poisoned tool output", "evidence": None, "taintFrom": {"step": 1}},
        )
    assert started.status_code == 202, started.text
    view = wait_for_stage(system, run_id, "taintPropagated")
    assert {a["artifactId"] for a in view["taintedArtifacts"]} == set(ids[1:])
    with system.client("op-key") as client:
        taints = [client.get(f"/artifacts/{i}/envelope").json()["taint"] for i in ids]
    assert taints == ["UNTAINTED", "TAINTED", "TAINTED"]
    with system.client("op-key") as client:  # the mediated read: refused, and served
        refused = [client.get(f"/artifacts/{i}") for i in ids[1:]]
        served = client.get(f"/artifacts/{ids[0]}")
    for answer in refused:
        assert answer.status_code == 409 and problem_type(answer) == "artifact-quarantined", answer.text
        assert answer.json()["code"] == "ARTIFACT_QUARANTINED"
    assert served.status_code == 200 and served.headers["x-tenure-taint"] == "UNTAINTED", served.text
    assert json.loads(served.content) == steps[0]["output"]
    assert served.headers["x-tenure-content-hash"] == items[ids[0]]["envelope"]["contentHash"]
