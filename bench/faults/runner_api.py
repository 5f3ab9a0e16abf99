"""What every configuration's runner shares: the Reporter, the ConfigRunner protocol and a small
client of the simulated environment.

A runner runs one trajectory at a time inside a worker process (bench/faults/worker.py) and tells
the harness what happened through its Reporter, one JSON line per event on the worker's stdout:

    {"event": "started", "trajectory": id, "pid": ..., "incarnation": n}
    {"event": "turn-committed", "trajectory": id, "turn": t, "ts": wall time, "resources": [...]}
    {"event": "kill-me", "trajectory": id, "turn": t, "point": "after-effect"}   (then it blocks)
    {"event": "kill-tenure", "trajectory": id, "turn": t, "process": "saga-orchestrator"}
    {"event": "finished", "trajectory": id, "status": "completed|aborted|escalated|failed",
     "committed_turns": [...], "committed_resources": [...], "incident": {...} | null, "detail": ...}

Nothing a runner reports decides an outcome: the harness classifies every trajectory from the
environment's audit (outcomes.py). The reports give the timings (RTO, MTTR) and say which turns a
runner believed committed before a kill (RPO).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, Protocol

import httpx

from bench.faults.workload import TrajectorySpec, TurnFault, resource_ids

__all__ = [
    "FINISHED_STATUSES",
    "ConfigRunner",
    "EffectResult",
    "Reporter",
    "SimClient",
    "SimUnavailable",
]

FINISHED_STATUSES = ("completed", "aborted", "escalated", "failed")
Emit = Callable[[dict[str, Any]], None]


class Reporter:
    """A runner's voice to the harness for one incarnation of one trajectory.

    ``faults_from_turn``: planned faults of earlier turns already happened in an earlier
    incarnation (a kill fires at most once per turn, and a fault is injected at most once per
    trajectory), so ``fault()`` hides them from a resumed run."""

    def __init__(
        self, trajectory_id: str, emit: Emit, *, incarnation: int = 0, faults_from_turn: int = 0
    ) -> None:
        self.trajectory_id = trajectory_id
        self.incarnation = incarnation
        self.faults_from_turn = faults_from_turn
        self._emit = emit
        self.done = False

    def fault(self, spec: TrajectorySpec, turn: int) -> TurnFault | None:
        """The fault this incarnation must inject on ``turn`` (None: none, or already injected)."""
        return None if turn < self.faults_from_turn else spec.fault(turn)

    def _send(self, event: str, **fields: Any) -> None:
        self._emit({"event": event, "trajectory": self.trajectory_id, **fields})

    def started(self) -> None:
        self._send("started", pid=os.getpid(), incarnation=self.incarnation)

    def committed(self, turn: int, output: Mapping[str, Any] | None) -> None:
        """``turn`` is committed as far as this runner knows (journaled first, where it journals)."""
        self._send("turn-committed", turn=turn, ts=time.time(), resources=resource_ids(output))

    def kill_me(self, turn: int, point: str) -> NoReturn:
        """Ask the harness for a SIGKILL now, and wait for it (nothing after this line runs)."""
        self._send("kill-me", turn=turn, point=point)
        while True:
            time.sleep(3600)

    def kill_tenure(self, turn: int, process: str) -> None:
        """Ask the harness to SIGKILL (and restart) one of Tenure's processes; the runner goes on."""
        self._send("kill-tenure", turn=turn, process=process)

    def finished(
        self,
        status: str,
        committed: Mapping[int, Mapping[str, Any] | None] | Iterable[tuple[int, Mapping[str, Any] | None]],
        *,
        incident: Mapping[str, Any] | None = None,
        detail: str = "",
        runner_error: str = "",
    ) -> None:
        """The runner's last word on the trajectory: its status, the turns it holds committed
        (with their outputs) and, when it escalated, the incident it raised."""
        if status not in FINISHED_STATUSES:
            raise ValueError(f"status must be one of {FINISHED_STATUSES}, got {status!r}")
        pairs = list(committed.items() if isinstance(committed, Mapping) else committed)
        self.done = True
        self._send(
            "finished",
            status=status,
            committed_turns=sorted(turn for turn, _ in pairs),
            committed_resources=sorted(r for _, output in pairs for r in resource_ids(output)),
            incident=dict(incident) if incident is not None else None,
            detail=detail[:2000],
            runner_error=runner_error[:4000],
        )

    def work(self, work_id: str) -> None:
        """The X-Work-Id this trajectory's effects carry, once the runner knows it (Tenure: the
        run id). The harness audits the environment by it; the ablations use ``spec.work_id``."""
        self._send("work", work_id=work_id)


class ConfigRunner(Protocol):
    """One configuration's runner logic. ``run`` drives one trajectory to its end (or until the
    harness kills the process) and reports through ``reporter``; ``resume`` is True when a new
    process takes over a trajectory whose runner was killed."""

    def run(self, spec: TrajectorySpec, resume: bool, reporter: Reporter) -> None: ...

    def close(self) -> None: ...


# --- the simulated environment ------------------------------------------------------------------


class SimUnavailable(RuntimeError):
    """The environment's control routes (faults, audit, verifiers) did not answer."""


@dataclass(frozen=True)
class EffectResult:
    """What one ``POST /effects`` came to, as a client without reconciliation sees it.

    ``kind``: "ok" (200, output parsed), "problem" (an error answer), "timeout" (no answer in
    time), "transport" (no connection), "malformed" (a 2xx whose body is not the expected JSON)."""

    kind: Literal["ok", "problem", "timeout", "transport", "malformed"]
    status: int = 0
    output: dict[str, Any] | None = None
    problem: str = ""
    detail: str = ""
    partial_output: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.kind == "ok"

    @property
    def naive_retryable(self) -> bool:
        """What a naive script retries: timeouts, lost connections, 5xx and 429."""
        return self.kind in ("timeout", "transport") or self.status >= 500 or self.status == 429

    def describe(self) -> str:
        if self.kind == "problem":
            return f"HTTP {self.status} {self.problem}: {self.detail}"
        return f"{self.kind}{f' (HTTP {self.status})' if self.status else ''}: {self.detail}"


class SimClient:
    """The simulated environment over HTTP. ``timeout_s`` bounds each effect call: the runner's
    patience, shorter than the delay of a dropped request or a lost answer."""

    def __init__(self, base_url: str, timeout_s: float = 1.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._http = httpx.Client(timeout=httpx.Timeout(10.0))

    def close(self) -> None:
        self._http.close()

    def perform(
        self, operation: str, payload: Mapping[str, Any], *, key: str, work: str, epoch: int = 1
    ) -> EffectResult:
        headers = {"Idempotency-Key": key, "X-Work-Id": work, "X-Fencing-Epoch": str(epoch)}
        body = {"operation": operation, "payload": dict(payload)}
        try:
            response = self._http.post(
                f"{self.base_url}/effects", json=body, headers=headers, timeout=self.timeout_s
            )
        except httpx.TimeoutException as exc:
            waited = f"no answer within {self.timeout_s:g}s ({type(exc).__name__})"
            return EffectResult("timeout", detail=waited)
        except httpx.TransportError as exc:
            return EffectResult("transport", detail=f"{type(exc).__name__}: {exc}")
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if response.is_success:
            output = answer.get("output") if isinstance(answer, dict) else None
            if not isinstance(output, dict):
                return EffectResult("malformed", response.status_code, detail=response.text[:200])
            return EffectResult("ok", response.status_code, output=output)
        problem = answer if isinstance(answer, dict) else {}
        slug = str(problem.get("type") or "").rstrip("/").rsplit("/", 1)[-1] or f"http-{response.status_code}"
        partial = problem.get("partialOutput")
        return EffectResult(
            "problem",
            response.status_code,
            problem=slug,
            detail=str(problem.get("detail") or response.text[:200]),
            partial_output=partial if isinstance(partial, dict) else None,
        )

    def _control(self, method: str, path: str, **kwargs: Any) -> Any:
        last = ""
        for attempt in range(5):
            try:
                response = self._http.request(method, f"{self.base_url}{path}", **kwargs)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                time.sleep(0.2 * (attempt + 1))
                continue
            if response.status_code >= 500:
                last = f"HTTP {response.status_code}"
                time.sleep(0.2 * (attempt + 1))
                continue
            if not response.is_success:
                raise SimUnavailable(f"{method} {path}: HTTP {response.status_code} {response.text[:300]}")
            return response.json()
        raise SimUnavailable(f"{method} {path}: {last}")

    def arm(self, fault: Mapping[str, Any]) -> dict[str, Any]:
        """Arm one fault (``POST /faults``); the body must already name its ``workId``."""
        answer: dict[str, Any] = self._control("POST", "/faults", json=dict(fault))
        return answer

    def verify(self, name: str, payload: Mapping[str, Any], work: str) -> tuple[bool, str]:
        answer = self._control("POST", f"/verifiers/{name}", json={"payload": dict(payload), "workId": work})
        return bool(answer.get("ok")), str(answer.get("detail", ""))

    def audit(self, work: str | None = None) -> dict[str, Any]:
        params = {"workId": work} if work is not None else None
        answer: dict[str, Any] = self._control("GET", "/audit", params=params, timeout=120.0)
        return answer
