"""The runner's side of the semantic watchdog (WD-1, WD-5), over the command API.

client = WatchdogClient(api_url, api_key="...", on_intervention=inbox)
client.report_observation(lease, step_seq=7, tool="fs.edit", arguments={"path": "a.py", ...},
                          state=Path("workspace"), metrics=[tests_passing, -compiler_errors])
client.acknowledge_rollback(lease, intervention.intervention_id, checkpoint.step_seq, digest)
client.configure(run_id, max_period=4)          # per-run thresholds (submitter or operator)
client.view(run_id)                             # the ladder, with its evidence

The saga reports the steps it dispatches itself; a runner reports the steps it does on its own
(a model turn that only read, an edit outside the saga), with the hash of its state after the
step (services.runner_sdk.canonical) and its verifier metrics (each higher-is-better). The
watchdog judges asynchronously: its interventions come on the runner's next answers (proposal,
heartbeat, observation) and through `on_intervention`; `wait_for_intervention` long-polls.
Checkpoints and the level-2 rollback are in checkpoints.py (LoopGuard).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from .canonical import state_hash
from .client import api_http_client
from .errors import TenureUnavailable
from .hashing import action_hash as _action_hash
from .interventions import Intervention, as_inbox
from .trajectory import LeaseLike, TrajectoryRejected, _answer, _json

__all__ = ["ERROR_KINDS", "ObservationReceipt", "WatchdogClient", "action_hash", "effect_action_hash"]

ERROR_KINDS = ("none", "application", "transient")
_LONG_POLL_MS = 4_000


def action_hash(tool: str, arguments: Any) -> str:
    """WD-4: the 64-bit xxHash of a tool and its canonical JSON arguments (16 hex digits), as
    the saga and the gateway compute it: a saga step's is action_hash(tool, params)."""
    return _action_hash(tool, arguments)


def effect_action_hash(tool: str, operation: str, payload: Any) -> str:
    """The gateway's own name for an effect a runner sends itself (POST /effects): report an
    observation of it under this hash and a tombstone of it is enforced at the gateway too."""
    return _action_hash(f"{tool}/{operation}", payload)


@dataclass(frozen=True)
class ObservationReceipt:
    """The observation is durable on progress.observations; the watchdog judges it next."""

    run_id: str
    command_id: str
    step_seq: int
    action_hash: str
    replayed: bool
    watchdog: Intervention | None  # the intervention in force when it was taken, if any


class WatchdogClient:
    """HTTP client for the watchdog routes of the command API (`api_url`)."""

    def __init__(
        self,
        api_url: str,
        api_key: str | None = None,
        timeout_s: float = 15.0,
        *,
        transport: httpx.BaseTransport | None = None,
        on_intervention: Callable[[Intervention], None] | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self._api_url = api_url.rstrip("/")
        self._http = api_http_client(api_key, timeout_s, transport)
        self.interventions = as_inbox(on_intervention)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> WatchdogClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- calls -------------------------------------------------------------------------------

    def report_observation(
        self,
        lease: LeaseLike,
        step_seq: int,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        action_hash: str | None = None,
        state: Any = None,
        state_hash: str = "",
        summary: str = "",
        metrics: Sequence[float] = (),
        error_kind: str = "none",
        polling: bool = False,
        mutating: bool = True,
        idempotency_key: str | None = None,
    ) -> ObservationReceipt:
        """POST /runs/{runId}/observations: one step of the runner's own (WD-1).

        `step_seq` strictly increases per run (a repeat is dropped). Name the action by its
        `arguments` (hashed with `tool`) or its `action_hash`; give the state after the step as
        `state` (a JSON document, or a directory as a Path: hashed by services.runner_sdk.canonical)
        or as `state_hash`. `error_kind`: "application" for a tool's own error (a failing test,
        not found), "transient" for 429/5xx/timeouts (the breakers' business, never a loop)."""
        if error_kind not in ERROR_KINDS:
            raise ValueError(f"error_kind must be one of {', '.join(ERROR_KINDS)}")
        if arguments is None and action_hash is None:
            raise ValueError("name the action by its arguments or its action_hash")
        body: dict[str, Any] = {
            "attemptId": lease.attempt_id,
            "leaseEpoch": lease.epoch,
            "stepSeq": step_seq,
            "tool": tool,
            "stateHash": state_hash or (_state_hash(state) if state is not None else ""),
            "summary": summary,
            "metrics": [float(m) for m in metrics],
            "errorKind": error_kind,
            "polling": polling,
            "mutating": mutating,
        }
        if arguments is not None:
            body["arguments"] = dict(arguments)
        if action_hash is not None:
            body["actionHash"] = action_hash
        answer = self._send(
            "observe", "POST", f"{self._run(lease.run_id)}/observations", body, idempotency_key
        )
        return ObservationReceipt(
            run_id=str(answer.get("runId", lease.run_id)),
            command_id=str(answer.get("commandId", "")),
            step_seq=step_seq,
            action_hash=str(answer.get("actionHash", "")),
            replayed=bool(answer.get("replayed")),
            watchdog=self.interventions.notice(answer),
        )

    def acknowledge_rollback(
        self,
        lease: LeaseLike,
        intervention_id: str,
        checkpoint_step: int,
        restored_state_hash: str = "",
        *,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """POST /runs/{runId}/watchdog/rollback: the checkpoint a level-2 intervention asked for
        is restored (WD-5). Returns the watchdog view (status rolled-back)."""
        body = {
            "attemptId": lease.attempt_id,
            "leaseEpoch": lease.epoch,
            "interventionId": intervention_id,
            "checkpointStep": checkpoint_step,
            "restoredStateHash": restored_state_hash,
        }
        return self._send(
            "acknowledge", "POST", f"{self._run(lease.run_id)}/watchdog/rollback", body, idempotency_key
        )

    def configure(
        self, run_id: str, *, idempotency_key: str | None = None, **thresholds: int
    ) -> dict[str, Any]:
        """PUT /runs/{runId}/watchdog: per-run thresholds (max_period, window, epoch_steps,
        repeat_count, rollback_budget, ladder_epoch, poll_patience); the others are kept."""
        body = {_camel(name): value for name, value in thresholds.items()}
        return self._send("configure", "PUT", f"{self._run(run_id)}/watchdog", body, idempotency_key)

    def view(self, run_id: str, *, after_version: int | None = None, wait_ms: int = 0) -> dict[str, Any]:
        """GET /runs/{runId}/watchdog; with `after_version` a long-poll past that version."""
        params = {} if after_version is None else {"afterVersion": after_version, "waitMs": wait_ms}
        try:
            response = self._http.get(f"{self._run(run_id)}/watchdog", params=params)
        except httpx.TransportError as exc:
            raise TenureUnavailable("watchdog", f"{type(exc).__name__}: {exc}") from exc
        return _answer("watchdog", response)

    def wait_for_intervention(
        self, run_id: str, *, after_version: int = 0, timeout_s: float = 10.0
    ) -> Intervention | None:
        """The first intervention recorded past `after_version` of the watchdog view (delivered
        to on_intervention too), or None when none came within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        seen = after_version
        while True:
            left_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
            try:
                view = self.view(run_id, after_version=seen, wait_ms=min(_LONG_POLL_MS, left_ms))
            except TrajectoryRejected as exc:  # 404: no watchdog yet, nothing observed so far
                if exc.status != 404:
                    raise
                view = {}
            for rung in view.get("interventions", []):
                if int(rung.get("version", 0)) > after_version:
                    found = Intervention.from_json(rung)
                    if found is not None:
                        self.interventions.deliver(found)
                        return found
            version = view.get("version")
            if isinstance(version, int) and not isinstance(version, bool):
                seen = max(seen, version)
            if time.monotonic() >= deadline:
                return None
            if not view:
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    # --- plumbing ----------------------------------------------------------------------------

    def _run(self, run_id: str) -> str:
        return f"{self._api_url}/runs/{quote(run_id, safe='')}"

    def _send(
        self, operation: str, method: str, url: str, body: Mapping[str, Any], idempotency_key: str | None
    ) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key or uuid.uuid4().hex}
        try:
            response = self._http.request(method, url, json=dict(body), headers=headers)
        except httpx.TransportError as exc:
            # The request may have reached the API and been recorded: unknown, not refused.
            raise TenureUnavailable(operation, f"{type(exc).__name__}: {exc}") from exc
        if response.status_code == 202:
            answer = _json(operation, response)
            if operation == "observe" and "commandId" in answer:
                return answer  # durable: the watchdog judges it next
            raise TenureUnavailable(operation, "HTTP 202: accepted, decision still pending", 202)
        return _answer(operation, response)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _state_hash(state: Any) -> str:
    return state_hash(state)
