"""The peers' workload through Tenure's public HTTP API, for bench/durable_steps.py.

A workflow is what a user's service does for one durable workflow of k trivial steps:
  POST /runs (Idempotency-Key)  ->  POST /runs/{id}/attempts (claim)  ->  POST /runs/{id}/trajectory
  -> k times: POST /runs/{id}/trajectory/steps (cache.warm, class I), then GET /runs/{id}/trajectory
     until that step is no longer in flight (the runner SDK's wait_for_step: fetch, then a
     full-jitter backoff between fetches)
  -> POST /runs/{id}/trajectory/finish  ->  POST /attempts/{attemptId}/report (succeeded, manifest []).
Every call carries an Idempotency-Key (the report its sequence), so a call whose answer was lost
(a 5xx, a 202 "decision pending", a dropped connection: what a SIGKILL anywhere causes) is
repeated as is, after the one full-jitter backoff, and answered with the decision already made.
One aiohttp connection pool per client (aiohttp costs the client ~10x less CPU per request
than httpx, and the client shares the machine with Tenure).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from services.common.backoff import Backoff
from services.common.contracts import EffectIntentRecorded, EffectOutcomeRecorded
from services.common.kafka import TopicFollower
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.topics import RUNS_EVENTS, TRAJECTORIES_EVENTS

__all__ = [
    "Api",
    "CallStats",
    "CaseResult",
    "Gate",
    "LegProbe",
    "Logged",
    "Poll",
    "StepMark",
    "Workflow",
    "WorkflowError",
    "closed_loop",
    "run_workflow",
]

TENANT = "bench-steps"
TOOL = "cache.warm"  # class I, no precondition; answers at once at TENURE_SIM_TIME_SCALE=0
IN_FLIGHT = frozenset({"pending", "dispatched", "preparing", "awaiting-gate"})  # the SDK's
STILL = frozenset({"frozen", "completed", "rolled-back", "abandoned"})
HTTP_TIMEOUT_S = 30.0
RETRY_BASE_S, RETRY_CAP_S = 0.05, 1.0
LONG_POLL_MS = 4000  # within the API's request deadline (TENURE_DECISION_TIMEOUT_S, 5 s)


class WorkflowError(RuntimeError):
    """A workflow could not go on: a refusal (4xx), a failed step, or its deadline passed."""


@dataclass
class Poll:
    """How a client waits for a step: the SDK's wait_for_step backoff from base_s to cap_s."""

    base_s: float
    cap_s: float


@dataclass
class CallStats:
    requests: int = 0
    retries: int = 0  # calls repeated after a 5xx, 202-pending or transport failure
    polls: int = 0  # GET /runs/{id}/trajectory
    answers: Counter[str] = field(default_factory=Counter)  # "POST 202", "transport", ...
    # per kind of call ("POST /runs/{id}/attempts"): the seconds each answer took
    seconds: dict[str, list[float]] = field(default_factory=dict)


class Api:
    """One client's connection pool to the command API (or the simulated environment)."""

    def __init__(self, base_url: str, connections: int, stats: CallStats | None = None) -> None:
        connector = aiohttp.TCPConnector(limit=connections)
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
        self._session = aiohttp.ClientSession(base_url, connector=connector, timeout=timeout)
        self.stats = stats or CallStats()

    async def close(self) -> None:
        await self._session.close()

    async def once(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """One request: (status, parsed JSON or None); (0, reason) when no answer came."""
        self.stats.requests += 1
        began = time.monotonic()
        try:
            async with self._session.request(method, path, json=body, headers=headers) as response:
                raw = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.stats.answers["transport"] += 1
            return 0, type(exc).__name__
        self.stats.answers[f"{method} {status}"] += 1
        self.stats.seconds.setdefault(_kind(method, path), []).append(time.monotonic() - began)
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw[:200].decode(errors="replace")

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        key: str | None = None,
        *,
        accept: tuple[int, ...] = (200, 201),
        done: Callable[[int, Any], bool] = lambda _s, _b: True,
        deadline: float,
    ) -> tuple[int, Any]:
        """Repeat the call (same Idempotency-Key) until an accepted answer for which `done` holds.

        5xx, 429, no answer, or an accepted answer that is not `done` (a 202 whose decision is
        still pending) are repeated after a full-jitter backoff; any other status is a refusal."""
        headers = {"Idempotency-Key": key} if key else None
        backoff = Backoff(RETRY_BASE_S, RETRY_CAP_S)
        while True:
            status, answer = await self.once(method, path, body, headers)
            if status in accept and done(status, answer):
                return status, answer
            if status in accept or status == 0 or status == 429 or status >= 500:
                if time.monotonic() > deadline:
                    raise WorkflowError(f"{method} {path}: still {status} {_short(answer)} at the deadline")
                self.stats.retries += 1
                await asyncio.sleep(backoff.next_delay())
                continue
            raise WorkflowError(f"{method} {path}: {status} {_short(answer)}")


def _kind(method: str, path: str) -> str:
    """The call's route: ids and the query left out ("POST /runs/{id}/trajectory/steps")."""
    parts = path.split("?", 1)[0].split("/")
    words = ("", "runs", "attempts", "trajectory", "steps", "finish", "report")
    named = [p if p in words else "{id}" for p in parts]
    return f"{method} {'/'.join(named)}"


def _short(answer: Any) -> str:
    if isinstance(answer, dict):
        return str(answer.get("detail") or answer.get("title") or answer)[:300]
    return str(answer)[:300]


@dataclass
class StepMark:
    """One step as the client saw it; wall-clock ms (time.time()) so they compare to occurredAt."""

    index: int
    proposed_ms: float
    accepted_ms: float = 0.0
    visible_ms: float = 0.0
    polls: int = 0


@dataclass
class Workflow:
    key: str
    run_id: str = ""
    began: float = 0.0  # time.monotonic() before the submit call
    ended: float = 0.0  # ... after the report's answer
    began_ms: float = 0.0
    ended_ms: float = 0.0
    steps: list[StepMark] = field(default_factory=list)

    @property
    def latency_s(self) -> float:
        return self.ended - self.began


class Gate:
    """Holds workflows before one step until `release()` (the peers' start gate)."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.arrived = 0
        self._open = asyncio.Event()

    async def wait(self) -> None:
        self.arrived += 1
        await self._open.wait()

    def release(self) -> None:
        self._open.set()


Hook = Callable[[str, int], None]  # (what happened, step index): "accepted" / "visible"


async def run_workflow(
    api: Api,
    key: str,
    steps: int,
    poll: Poll,
    *,
    timeout_s: float,
    gate: Gate | None = None,
    hook: Hook | None = None,
) -> Workflow:
    flow = Workflow(key)
    flow.began, flow.began_ms = time.monotonic(), time.time() * 1000
    deadline = flow.began + timeout_s
    spec = {"tenant": TENANT, "executionSpec": {"agent": "bench-steps", "key": key}, "timeoutSeconds": 3600}
    _, run = await api.call("POST", "/runs", spec, key, deadline=deadline)
    flow.run_id = run_id = str(run["runId"])
    claim = {"runnerId": "bench-runner", "leaseSeconds": 3600, "heartbeatSeconds": 1800}
    _, grant = await api.call("POST", f"/runs/{run_id}/attempts", claim, f"{key}/claim", deadline=deadline)
    lease = {"attemptId": grant["attemptId"], "leaseEpoch": grant["epoch"]}
    path = f"/runs/{run_id}/trajectory"
    await api.call("POST", path, lease, f"{key}/trajectory", deadline=deadline)
    for index in range(steps):
        if gate is not None and index == gate.step:
            await gate.wait()
        mark = StepMark(index, time.time() * 1000)
        flow.steps.append(mark)
        body = {**lease, "tool": TOOL, "params": {"name": f"step-{index + 1}"}}
        _, ticket = await api.call(
            "POST",
            f"{path}/steps",
            body,
            f"{key}/s{index}",
            accept=(202,),
            done=lambda _s, b: isinstance(b, dict) and "stepIndex" in b,  # else: decision pending
            deadline=deadline,
        )
        mark.accepted_ms = time.time() * 1000
        if int(ticket["stepIndex"]) != index:
            raise WorkflowError(f"{run_id}: step {index} was recorded as step {ticket['stepIndex']}")
        if hook is not None:
            hook("accepted", index)
        await wait_for_step(
            api, path, index, int(ticket["dispatch"]), poll, mark, deadline, int(ticket.get("version", 0))
        )
        mark.visible_ms = time.time() * 1000
        if hook is not None:
            hook("visible", index)
    await api.call("POST", f"{path}/finish", lease, f"{key}/finish", accept=(200,), deadline=deadline)
    report = {"leaseEpoch": lease["leaseEpoch"], "sequence": 1, "outcome": "succeeded", "manifest": []}
    await api.call("POST", f"/attempts/{lease['attemptId']}/report", report, accept=(200,), deadline=deadline)
    flow.ended, flow.ended_ms = time.monotonic(), time.time() * 1000
    return flow


async def wait_for_step(
    api: Api, path: str, index: int, dispatch: int, poll: Poll, mark: StepMark, deadline: float, version: int
) -> None:
    """The SDK's wait_for_step: long-poll the view past the last version seen until the step
    settles (GET ?afterVersion=v&waitMs=...: answered the moment a newer version is visible).
    Only a failed fetch backs off before the next one."""
    backoff = Backoff(poll.base_s, max(poll.base_s, poll.cap_s))
    seen = version
    while True:
        mark.polls += 1
        api.stats.polls += 1
        status, view = await api.once("GET", f"{path}?afterVersion={seen}&waitMs={LONG_POLL_MS}")
        if status == 200 and isinstance(view, dict):
            seen = max(seen, int(view.get("version", seen)))
            listed = view.get("steps") or []
            step = listed[index] if index < len(listed) else None
            if step is not None and int(step.get("dispatch", 0)) >= dispatch:
                if step.get("status") == "committed":
                    return
                if step.get("status") not in IN_FLIGHT:
                    raise WorkflowError(f"{path}: step {index} is {step.get('status')}: {step.get('error')}")
            if view.get("status") in STILL:
                raise WorkflowError(f"{path}: the trajectory is {view.get('status')} at step {index}")
            if time.monotonic() > deadline:
                raise WorkflowError(f"{path}: step {index} still in flight at the deadline")
            continue
        if status not in (0, 404) and status < 500:
            raise WorkflowError(f"GET {path}: {status} {_short(view)}")
        if time.monotonic() > deadline:
            raise WorkflowError(f"{path}: step {index} still in flight at the deadline")
        await asyncio.sleep(backoff.next_delay())


@dataclass
class CaseResult:
    steps: int
    clients: int
    requested: int
    flows: list[Workflow]
    errors: Counter[str]
    wall_s: float
    stats: CallStats

    @property
    def latencies_s(self) -> list[float]:
        return [f.latency_s for f in self.flows]

    @property
    def workflows_per_s(self) -> float:
        return len(self.flows) / self.wall_s if self.wall_s > 0 else float("nan")


async def closed_loop(
    base_url: str, steps: int, n: int, clients: int, poll: Poll, tag: str, timeout_s: float, deadline_s: float
) -> CaseResult:
    """`clients` clients, each running workflows back to back until `n` were started."""
    keys = iter(f"{tag}-{i:05d}" for i in range(n))
    flows: list[Workflow] = []
    errors: Counter[str] = Counter()
    stats = CallStats()
    stop_at = time.monotonic() + deadline_s

    async def client() -> None:
        api = Api(base_url, 4, stats)
        try:
            for key in keys:  # one shared iterator: each key goes to exactly one client
                if time.monotonic() > stop_at:
                    errors["case deadline passed"] += 1
                    return
                try:
                    flows.append(await run_workflow(api, key, steps, poll, timeout_s=timeout_s))
                except WorkflowError as exc:
                    errors[str(exc)[:160]] += 1
                except Exception as exc:  # an answer the workflow could not read: counted, not fatal
                    errors[repr(exc)[:160]] += 1
        finally:
            await api.close()

    began = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    return CaseResult(steps, clients, n, flows, errors, time.monotonic() - began, stats)


# --- the per-leg timing at one client: the step's records on the log ----------------------------


@dataclass
class Logged:
    topic: str
    partition: int
    offset: int
    kind: str
    occurred_at: int
    step: int  # -1 when the record is not about a step


class LegProbe:
    """Follows trajectories.events and runs.events from their end; keeps every run's records."""

    def __init__(self, bootstrap: str) -> None:
        self._codec = MessageCodec()
        topics = [TRAJECTORIES_EVENTS.name, RUNS_EVENTS.name]
        self._follower = TopicFollower(bootstrap, topics, "end", client_id="tenure-bench-steps-legs")
        self._lock = threading.Lock()
        self.records: dict[str, list[Logged]] = {}
        self._effects: dict[str, int] = {}  # effect id -> step index (follower thread only)
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._follow, name="leg-probe", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            while not self._stop.is_set():
                for record in self._follower.poll(max_records=1000, timeout_s=0.1):
                    try:
                        message = self._codec.decode(record.value)
                    except UndecodableRecord:
                        continue
                    run_id = getattr(message, "run_id", None)
                    if run_id is None:
                        continue
                    step = getattr(message, "step_index", -1)
                    if isinstance(message, EffectIntentRecorded):
                        step = _step_of_key(message.idempotency_key)
                        self._effects[message.effect_id] = step
                    elif isinstance(message, EffectOutcomeRecorded):
                        step = self._effects.get(message.effect_id, -1)
                    logged = Logged(
                        record.topic,
                        record.partition,
                        record.offset,
                        type(message).__name__,
                        int(getattr(message, "occurred_at", 0)),
                        step,
                    )
                    with self._lock:
                        self.records.setdefault(run_id, []).append(logged)
        except BaseException as exc:  # reported with the figures: a dead probe only loses the legs
            self.error = exc
        finally:
            self._follower.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10.0)

    def of_run(self, run_id: str) -> list[Logged]:
        with self._lock:
            return list(self.records.get(run_id, []))


def _step_of_key(key: str) -> int:
    """The step index in the saga's idempotency key <runId>/s<index>/d<dispatch>, else -1."""
    tail = key.rsplit("/s", 1)
    head = tail[1].split("/", 1)[0] if len(tail) == 2 else ""
    return int(head) if head.isdigit() else -1
