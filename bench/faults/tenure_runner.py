"""Config 4 of the scoreboard: the runner of a user's service on Tenure, through the command API.

The runner keeps nothing it cannot read back: the run, its lease and its trajectory live in
Tenure, so a runner started after a SIGKILL finds the run by its idempotency key, takes its lease
over (LEASE-6), adopts the trajectory (AdoptLease) and carries on from the trajectory view. The
saga orchestrator does the rest: intent before action, reconciliation probes, compensation,
the pivot gate and the recovery policy. A trajectory rolled back cleanly is run again as a new
run (its retry), up to MAX_RERUNS times: the world is back at its start, so that is safe.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import httpx

from bench.faults.runner_api import Reporter, SimClient
from bench.faults.tenure_system import API_KEY, PRINCIPAL
from bench.faults.workload import (
    RERUN_COST_MONEY,
    RERUN_COST_MS,
    FaultKind,
    TrajectorySpec,
    env_fault,
    plan_step_id,
    propose,
    turn_of_plan_step,
)
from services.common.ids import run_id_for

__all__ = ["MAX_RERUNS", "TENANT", "TenureRunner"]

TENANT = os.environ.get("TENURE_FAULTS_TENANT", "faults")
# A clean rollback is run again as a new run (the retry), at most this often; the saga-in-memory
# ablation (ablations.MAX_RERUNS) gets the same allowance.
MAX_RERUNS = 2
_POLL_S = 0.1
_OPEN = ("awaiting-gate", "preparing", "pending", "dispatched")
_LEASE_SECONDS = 1800


class _Retry(Exception):
    """Tenure did not answer (a process of it is restarting): ask again."""


class TenureRunner:
    def __init__(self, api_url: str, sim_url: str, *, request_timeout_s: float = 15.0) -> None:
        self._api = api_url.rstrip("/")
        self._sim = SimClient(sim_url)
        self._http = httpx.Client(timeout=request_timeout_s, headers={"Authorization": f"Bearer {API_KEY}"})
        self._armed: set[tuple[str, int]] = set()  # a planned fault is armed once per run and turn

    def close(self) -> None:
        self._http.close()
        self._sim.close()

    # --- HTTP with patience: any of Tenure's processes may be restarting ------------------------

    def _call(self, method: str, path: str, body: Any = None, key: str | None = None) -> httpx.Response:
        deadline = time.monotonic() + 120
        while True:
            try:
                headers = {"Idempotency-Key": key} if key else {}
                response = self._http.request(method, f"{self._api}{path}", json=body, headers=headers)
                if response.status_code not in (202, 500, 502, 503, 504):
                    return response
                proposed = response.status_code == 202 and path.endswith("/steps")
                if proposed and "stepIndex" in response.json():
                    return response
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{method} {path}: Tenure did not answer for 120 s")
            time.sleep(0.2)

    def _view(self, run_id: str) -> dict[str, Any] | None:
        response = self._call("GET", f"/runs/{run_id}/trajectory")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        view: dict[str, Any] = response.json()
        return view

    # --- one trajectory -------------------------------------------------------------------------

    def run(self, spec: TrajectorySpec, resume: bool, reporter: Reporter) -> None:
        committed: dict[int, dict[str, Any] | None] = {}
        first = self._current_rerun(spec) if resume else 0
        for rerun in range(first, MAX_RERUNS + 1):
            run_id = run_id_for(TENANT, f"{spec.trajectory_id}-r{rerun}")
            lease = self._own(run_id, spec, rerun, resume and rerun == first)
            view = self._trajectory(run_id, lease, spec, rerun)
            outcome, view = self._drive(spec, run_id, lease, view, reporter, committed, rerun)
            if outcome == "completed":
                reporter.finished("completed", committed, detail=f"run {run_id}, rerun {rerun}")
                return
            if outcome == "escalated":
                incident = view.get("incident") or {}
                reporter.finished(
                    "escalated",
                    committed,
                    incident={**incident, "runId": run_id, "workId": run_id},
                    detail=f"run {run_id} frozen",
                )
                return
            committed = {}  # rolled back: nothing of this run stands; the next run starts over
        reporter.finished("aborted", committed, detail=f"rolled back {MAX_RERUNS + 1} times")

    def _current_rerun(self, spec: TrajectorySpec) -> int:
        """The rerun a killed runner was at: the last one whose run exists."""
        current = 0
        for rerun in range(MAX_RERUNS + 1):
            run_id = run_id_for(TENANT, f"{spec.trajectory_id}-r{rerun}")
            if self._call("GET", f"/runs/{run_id}").status_code == 200:
                current = rerun
        return current

    def _own(self, run_id: str, spec: TrajectorySpec, rerun: int, resume: bool) -> dict[str, Any]:
        key = f"{spec.trajectory_id}-r{rerun}"
        submitted = self._call(
            "POST",
            "/runs",
            {
                "tenant": TENANT,
                "executionSpec": {"trajectory": spec.trajectory_id, "rerun": rerun},
                "timeoutSeconds": 3600,
            },
            key=key,
        )
        if submitted.status_code not in (200, 201):
            raise RuntimeError(f"submit {key}: {submitted.status_code} {submitted.text[:300]}")
        claim = self._call(
            "POST",
            f"/runs/{run_id}/attempts",
            {"runnerId": PRINCIPAL, "leaseSeconds": _LEASE_SECONDS},
            key=f"{key}-claim",
        )
        if claim.status_code in (200, 201):
            grant: dict[str, Any] = claim.json()
            return grant
        if not resume:
            raise RuntimeError(f"claim {run_id}: {claim.status_code} {claim.text[:300]}")
        # A killed runner held it: take the lease over (LEASE-6); its epoch fences the dead one.
        takeover = self._call(
            "POST",
            f"/runs/{run_id}/lease/takeover",
            {
                "reason": "the runner process was killed",
                "newHolder": PRINCIPAL,
                "holderKind": "runner",
                "leaseSeconds": _LEASE_SECONDS,
            },
            key=f"{key}-takeover-{time.time_ns()}",
        )
        if takeover.status_code not in (200, 201):
            raise RuntimeError(f"takeover {run_id}: {takeover.status_code} {takeover.text[:300]}")
        grant = takeover.json()
        return grant

    def _trajectory(
        self, run_id: str, lease: dict[str, Any], spec: TrajectorySpec, rerun: int
    ) -> dict[str, Any]:
        fields = {"attemptId": lease["attemptId"], "leaseEpoch": lease["epoch"]}
        view = self._view(run_id)
        if view is None:
            started = self._call(
                "POST",
                f"/runs/{run_id}/trajectory",
                {
                    **fields,
                    # The plan lets the compiler stage a post-pivot message in the outbox (SAGA-7).
                    "plan": spec.plan(),
                    "rerunCost": {"durationMs": RERUN_COST_MS, "money": RERUN_COST_MONEY},
                },
                key=f"{spec.trajectory_id}-r{rerun}-start",
            )
            if started.status_code not in (200, 201):
                raise RuntimeError(f"start trajectory {run_id}: {started.status_code} {started.text[:300]}")
        elif view["epoch"] != lease["epoch"] and not view["terminal"]:
            adopted = self._call("POST", f"/runs/{run_id}/trajectory/lease", fields)
            if adopted.status_code not in (200, 409):
                raise RuntimeError(f"adopt {run_id}: {adopted.status_code} {adopted.text[:300]}")
        return self._wait_view(run_id, lambda v: v["epoch"] == lease["epoch"] or v["terminal"])

    def _wait_view(self, run_id: str, ready: Any, timeout_s: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            view = self._view(run_id)
            if view is not None and ready(view):
                return view
            if time.monotonic() > deadline:
                raise TimeoutError(f"trajectory of {run_id} not ready in {timeout_s} s")
            time.sleep(_POLL_S)

    def _drive(
        self,
        spec: TrajectorySpec,
        run_id: str,
        lease: dict[str, Any],
        view: dict[str, Any],
        reporter: Reporter,
        committed: dict[int, dict[str, Any] | None],
        rerun: int,
    ) -> tuple[str, dict[str, Any]]:
        fields = {"attemptId": lease["attemptId"], "leaseEpoch": lease["epoch"]}
        outbox = {str(s["stepId"]) for s in (view.get("plan") or {}).get("outbox", [])}
        while True:
            done: set[int] = set()
            for step in view["steps"]:
                turn_of = turn_of_plan_step(step["planStepId"] or "")
                if turn_of is None:
                    continue
                done.add(turn_of)
                if step["status"] == "committed" and turn_of not in committed:
                    committed[turn_of] = step["output"]
                    reporter.committed(turn_of, step["output"])
            status = view["status"]
            if status == "completed":
                return "completed", view
            if status == "rolled-back":
                return "rolled-back", view
            if status in ("frozen", "abandoned"):
                return "escalated", view
            if view["openStep"] is not None or status == "unwinding":
                view = self._wait_view(run_id, lambda v, old=view["version"]: v["version"] != old)
                continue
            vm_id = _vm_id(view)
            remaining = [
                s.turn for s in spec.steps if s.turn not in done and plan_step_id(s.turn) not in outbox
            ]
            if status == "awaiting-repair":
                failed = next(s for s in reversed(view["steps"]) if s["status"] == "failed")
                turn = turn_of_plan_step(failed["planStepId"] or "") or 0
                proposal = propose(spec, turn, int(failed["consecutiveRepairs"]) + 1, vm_id, rerun=rerun)
                self._arm(proposal.faults, run_id)
                answer = self._propose(
                    run_id, fields, turn, proposal.tool, proposal.params_text, repair_of=int(failed["index"])
                )
            elif not remaining:
                answer = self._call("POST", f"/runs/{run_id}/trajectory/finish", fields)
            else:
                turn = remaining[0]
                if spec.steps[turn].tool == "dns.publish":
                    # The outbox turns are released with the pivot: their planned faults are armed now.
                    for staged in spec.steps[turn + 1 :]:
                        if plan_step_id(staged.turn) in outbox:
                            self._arm_planned(spec, run_id, staged.turn, reporter)
                answer = self._turn(spec, run_id, fields, turn, vm_id, reporter, rerun)
            if answer.is_success:
                view = self._wait_view(run_id, lambda v, old=view["version"]: v["version"] != old)
            else:
                # Refused (the view we acted on was a moment old): look again before acting.
                time.sleep(_POLL_S)
                view = self._wait_view(run_id, lambda v: True)

    def _turn(
        self,
        spec: TrajectorySpec,
        run_id: str,
        fields: dict[str, Any],
        turn: int,
        vm_id: str | None,
        reporter: Reporter,
        rerun: int,
    ) -> httpx.Response:
        fault = reporter.fault(spec, turn)
        kind = fault.kind if fault is not None else None
        runner_kill = kind is FaultKind.KILL and fault is not None and not fault.tenure_process
        if runner_kill and fault is not None and fault.point == "before-dispatch":
            reporter.kill_me(turn, "before-dispatch")
        if kind is FaultKind.MALFORMED_PROPOSAL and fault is not None:
            bad = propose(spec, turn, 0, vm_id, malformed=fault.malformed, rerun=rerun)
            refused = self._propose(run_id, fields, turn, bad.tool, bad.params_text)
            assert refused.status_code in (400, 409, 422), refused.text  # the orchestrator refused it
        self._arm_planned(spec, run_id, turn, reporter)
        proposal = propose(spec, turn, 0, vm_id, rerun=rerun)
        self._arm(proposal.faults, run_id)
        answer = self._propose(run_id, fields, turn, proposal.tool, proposal.params_text)
        if kind is FaultKind.KILL and fault is not None and answer.is_success:
            if fault.tenure_process:
                reporter.kill_tenure(turn, fault.tenure_process)
            elif fault.point == "after-effect":
                self._wait_for_effect(run_id, turn)
                reporter.kill_me(turn, "after-effect")
        return answer

    def _arm_planned(self, spec: TrajectorySpec, run_id: str, turn: int, reporter: Reporter) -> None:
        planned = env_fault(spec, turn, run_id) if reporter.fault(spec, turn) is not None else None
        # Once per trajectory: a re-run after a clean rollback does not meet the same fault again.
        if planned is not None and (spec.trajectory_id, turn) not in self._armed:
            self._armed.add((spec.trajectory_id, turn))
            self._sim.arm(planned)

    def _arm(self, faults: tuple[dict[str, Any], ...], run_id: str) -> None:
        for fault in faults:
            self._sim.arm({**fault, "workId": run_id})

    def _propose(
        self,
        run_id: str,
        fields: dict[str, Any],
        turn: int,
        tool: str,
        params_text: str,
        repair_of: int | None = None,
    ) -> httpx.Response:
        try:
            params: Any = json.loads(params_text)
        except ValueError:
            params = params_text  # malformed on purpose: the API must refuse it
        body = {**fields, "tool": tool, "params": params, "planStepId": plan_step_id(turn)}
        if repair_of is not None:
            body["repairOf"] = repair_of
        return self._call("POST", f"/runs/{run_id}/trajectory/steps", body, key=f"{run_id}-{time.time_ns()}")

    def _wait_for_effect(self, run_id: str, turn: int, timeout_s: float = 10) -> None:
        """Until the environment applied turn's effect (the "after-effect" kill point)."""
        deadline = time.monotonic() + timeout_s
        prefix = f"{run_id}/s{turn}/"  # a turn is its step index: proposals and the outbox come in turn order
        while time.monotonic() < deadline:
            effects = self._sim.audit(run_id).get("effects", [])
            if any(str(e.get("key", "")).startswith(prefix) and e.get("applied") for e in effects):
                return
            time.sleep(0.05)


def _vm_id(view: dict[str, Any]) -> str | None:
    steps = view["steps"]
    if steps and steps[0]["tool"] == "vm.provision" and isinstance(steps[0]["output"], dict):
        value = steps[0]["output"].get("vmId")
        return str(value) if value else None
    return None
