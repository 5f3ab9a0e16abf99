"""Recovery for bench/durable_steps.py: in-flight 5-step workflows, step 3 takes 2 s, one SIGKILL.

The peers' scenario (../shared/peers/): R workflows of 5 steps whose step 3 takes 2 s; once all
are inside step 3, one process is SIGKILLed and started again at once; time from the kill until
all R are done, and effects applied more than once. Here:
  - the simulated environment is reset, and one fault is armed: `cache.warm` with the payload of
    step 3 answers 2 s late (kind timeout-after-commit: the effect is applied at once, the answer
    sleeps; a request repeated under the same key is answered at once from the stored success);
  - R workflows run through the public API at once from one connection pool; like DBOS's start
    gate, each waits before proposing step 3 until all R have committed step 2 (the set-up is not
    timed); then all are released together;
  - the mark: every step-3 proposal has been accepted (each workflow is inside step 3: its
    intent is recorded) and the environment has received every step-3 call (all R bodies have
    begun, the peers' trigger), or, when Tenure does not start all R bodies at once, half the
    step's sleep has passed since the first began (the first are still inside it); then the
    scenario's process is SIGKILLed (none: nothing), and the bench's supervisor (the main
    thread) starts it again at once, the broker on the same port and data dir;
  - done: a workflow's success report answered. Duplicates come from the environment's audit:
    `semanticDuplicates` (the same work, operation and payload applied under different keys: a
    step executed twice) and `duplicates` (one key applied twice: never, unless the world is broken).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench._steps_system import KILLABLE, StepsSystem
from bench._steps_workload import Api, Gate, Poll, Workflow, WorkflowError, run_workflow

__all__ = ["RecoveryResult", "recovery"]

SLOW_STEP = 2  # step index 2 = the third step
SLOW_PAYLOAD = {"name": f"step-{SLOW_STEP + 1}"}
# When not all step-3 calls reach the environment together, the kill comes (at the earliest) this
# share of the step's sleep after the first one did: while the first are still inside it.
TRIGGER_SHARE = 0.5


@dataclass
class RecoveryResult:
    scenario: str
    n: int
    sleep_s: float
    setup_s: float = 0.0  # first submit .. all R at the gate
    mark: dict[str, int] = field(default_factory=dict)  # what the clients and the world saw at the mark
    release_to_mark_s: float = 0.0
    kill_to_all_done_s: float | None = None
    mark_to_all_done_s: float | None = None
    release_to_all_done_s: float | None = None
    done: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    restarts: list[str] = field(default_factory=list)  # "name after X.XX s" per restart
    world: dict[str, int] = field(default_factory=dict)
    polls_per_workflow: float = 0.0
    retries: int = 0
    triggered: bool = True  # False: not all step-3 calls had reached the environment at the mark


async def recovery(
    system: StepsSystem,
    scenario: str,
    n: int,
    sleep_s: float,
    poll: Poll,
    tag: str,
    timeout_s: float,
    trigger_timeout_s: float = 30.0,
) -> RecoveryResult:
    result = RecoveryResult(scenario, n, sleep_s)
    sim = Api(system.sim_url, 4)
    api = Api(system.api_url, n + 16)
    restarts_before = len(system.restarts)
    try:
        await sim.call("POST", "/reset", deadline=time.monotonic() + 30)
        fault = {
            "operation": "cache.warm",
            "kind": "timeout-after-commit",
            "delayS": sleep_s,
            "times": n,
            "match": SLOW_PAYLOAD,
        }
        await sim.call("POST", "/faults", fault, accept=(201,), deadline=time.monotonic() + 30)
        gate = Gate(SLOW_STEP)
        accepted: set[str] = set()
        visible: set[str] = set()

        def hook_for(key: str) -> Any:
            def hook(what: str, index: int) -> None:
                if index == SLOW_STEP:
                    (accepted if what == "accepted" else visible).add(key)

            return hook

        keys = [f"{tag}-rec-{scenario}-{i:04d}" for i in range(n)]
        began = time.monotonic()
        tasks = [
            asyncio.create_task(
                run_workflow(api, key, 5, poll, timeout_s=timeout_s, gate=gate, hook=hook_for(key))
            )
            for key in keys
        ]

        async def until(check: Any, limit_s: float) -> bool:
            deadline = time.monotonic() + limit_s
            while not check():
                if all(t.done() for t in tasks) or time.monotonic() > deadline:
                    return False
                await asyncio.sleep(0.005)
            return True

        if not await until(lambda: gate.arrived >= n, timeout_s):
            failed = [t for t in tasks if t.done() and t.exception() is not None]
            cause = repr(failed[0].exception()) if failed else "timed out"
            raise RuntimeError(f"only {gate.arrived}/{n} workflows reached step 3's gate: {cause}")
        released = time.monotonic()
        result.setup_s = released - began
        gate.release()
        reached, first_reached = 0, None
        deadline = released + trigger_timeout_s
        while time.monotonic() < deadline and not all(t.done() for t in tasks):
            _, audit = await sim.call("GET", "/audit", deadline=deadline)
            reached = _reached(audit)
            if reached and first_reached is None:
                first_reached = time.monotonic()
            # Every workflow is inside step 3 once its intent is recorded; if not every body can
            # begin at once, the kill comes while the first bodies are still asleep.
            slept = first_reached is not None and time.monotonic() - first_reached >= TRIGGER_SHARE * sleep_s
            if len(accepted) >= n and (reached >= n or slept):
                break
            await asyncio.sleep(0.02)
        result.triggered = reached >= n
        marked = time.monotonic()
        killed: float | None = None
        if scenario != "none":
            killed = system.kill(KILLABLE[scenario])
        result.release_to_mark_s = marked - released
        result.mark = {
            "proposed": len(accepted),
            "at the environment": reached,
            "seen committed": len(visible),
            "done": sum(1 for t in tasks if t.done()),
        }
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        flows = [o for o in outcomes if isinstance(o, Workflow)]
        for o in outcomes:
            if isinstance(o, WorkflowError):
                result.errors[str(o)[:160]] += 1
            elif isinstance(o, BaseException):
                result.errors[repr(o)[:160]] += 1
        result.done = len(flows)
        if flows:
            last = max(f.ended for f in flows)
            result.mark_to_all_done_s = last - marked if len(flows) == n else None
            result.release_to_all_done_s = last - released if len(flows) == n else None
            if killed is not None and len(flows) == n:
                result.kill_to_all_done_s = last - killed
        result.polls_per_workflow = api.stats.polls / max(1, n)
        result.retries = api.stats.retries
        _, audit = await sim.call("GET", "/audit", deadline=time.monotonic() + 30)
        result.world = _world(audit, n)
        origin = killed if killed is not None else marked
        for r in system.restarts[restarts_before:]:
            after = f"{r.restarted_at - origin:.2f} s" if r.restarted_at is not None else "never"
            result.restarts.append(
                f"{r.name} ({'killed' if r.by_bench else f'exit {r.exit_code}'}, up {after})"
            )
        await sim.call("DELETE", "/faults", deadline=time.monotonic() + 30)
    finally:
        await api.close()
        await sim.close()
    return result


def _reached(audit: dict[str, Any]) -> int:
    """Step-3 calls the environment has received (their bodies began): keys <run>/s2/d<n>."""
    runs = {str(e["key"]).rsplit("/", 2)[0] for e in audit["effects"] if _step_of(e) == SLOW_STEP}
    return len(runs)


def _step_of(effect: dict[str, Any]) -> int:
    parts = str(effect.get("key", "")).split("/")
    return int(parts[-2][1:]) if len(parts) >= 3 and parts[-2][1:].isdigit() else -1


def _world(audit: dict[str, Any], n: int) -> dict[str, int]:
    effects = audit.get("effects", [])
    return {
        "effects applied": sum(int(e.get("applied", 0)) for e in effects),
        "expected": 5 * n,
        "semantic duplicates": len(audit.get("semanticDuplicates", [])),
        "same-key duplicates": len(audit.get("duplicates", [])),
        "keys asked more than once": sum(1 for e in effects if int(e.get("requests", 0)) > 1),
    }
