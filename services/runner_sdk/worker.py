"""A worker: the user writes a function, the SDK claims, renews, reports, confirms cancels and
honours jeopardy (issue 17), in the style of DBOS, Restate and Temporal workers.

    worker = Worker(client, "runner-7", capabilities=["checkpoint-v1"])

    @worker.task("default")
    def summarise(task: Task) -> list[dict] | None:
        spec = task.spec                       # the run's executionSpec
        task.effect("step-1", "ledger", "transfer", {...})   # fenced by the lease (LEASE-3/4)
        if task.stop_requested:                # cancelled (EXE-7) or past its deadline (EXE-10)
            return None                        # the worker confirms the stop for you
        return []                              # the ResultManifest (EXE-1); None means []

    worker.run()                               # or worker.run_once(), worker.stop()

What the worker does for each run:

* **claims** with the server-side claim-next (POST /queues/{queue}/claim, tenant-fair, with the
  runner's capabilities), long-polling `poll_s` seconds per queue, so runners never list or race;
* **renews** the lease from a LeaseKeeper thread for as long as the function runs;
* **reports** the outcome: `succeeded` with the function's manifest, `failed` with
  errorCode TASK_FAILED when it raised (TaskFailed carries a code of the user's choosing);
* **confirms a stop**: once the run was asked to stop, whatever the function then returns or
  raises is reported as `cancelled` (a deadline stop as failed/DEADLINE_EXCEEDED); the function
  sees the request as `task.stop_requested` / `task.wait_for_stop(timeout)`;
* **honours jeopardy** (LEASE-4): while the keeper cannot prove the lease (renewals unanswered)
  effects are refused locally (LeaseInJeopardy) and the terminal report waits for the next
  confirmed renewal; a lease that is lost is never reported on (the coordinator expires it and
  the run goes back to the queue or fails, EXE-5) and `task.lease_lost` tells the function.

Claim-next failures (API unreachable, 5xx) are retried with the one full-jitter backoff.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .backoff import Backoff
from .certainty import Certainty
from .client import EffectResult, Lease, ReportOutcome, TenureClient
from .errors import (
    LeaseInJeopardy,
    LeaseLost,
    LeaseReleased,
    TenureRunnerError,
    TenureUnavailable,
)
from .keeper import LeaseKeeper, StopRequest

__all__ = ["Task", "TaskFailed", "TaskFunction", "TaskOutcome", "Worker", "failure_of"]

log = logging.getLogger("tenure.runner_sdk.worker")

TaskFunction = Callable[["Task"], "Sequence[Mapping[str, Any]] | None"]


def failure_of(exc: Exception, run_id: str) -> tuple[ReportOutcome, str, str, None]:
    """The failed report a task function's exception makes (TaskFailed names its own code)."""
    if isinstance(exc, TaskFailed):
        return "failed", exc.error_code, exc.detail, None
    log.exception("task for run %s raised", run_id, exc_info=exc)
    return "failed", "TASK_FAILED", f"{type(exc).__name__}: {exc}"[:4000], None


class TaskFailed(Exception):
    """Raise from a task to fail the run with your own error code (else TASK_FAILED)."""

    def __init__(self, error_code: str, detail: str = "") -> None:
        super().__init__(f"{error_code}: {detail}" if detail else error_code)
        self.error_code = error_code
        self.detail = detail


@dataclass(frozen=True)
class TaskOutcome:
    """What became of one claimed run: the outcome reported, or `lease-lost` (not reported)."""

    run_id: str
    queue: str
    outcome: str
    error_code: str = ""
    detail: str = ""


@dataclass
class Task:
    """The run a task function works on, and its lease (through the keeper)."""

    queue: str
    keeper: LeaseKeeper
    _stopped: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def lease(self) -> Lease:
        return self.keeper.lease

    @property
    def run_id(self) -> str:
        return self.keeper.lease.run_id

    @property
    def spec(self) -> Mapping[str, Any]:
        """The run's ExecutionSpec, as submitted."""
        spec = self.keeper.lease.assignment.get("executionSpec")
        return spec if isinstance(spec, Mapping) else {}

    @property
    def attempt_context(self) -> Mapping[str, Any] | None:
        """EXE-9: the checkpoint and answer this attempt continues from (None: a fresh start)."""
        return self.keeper.lease.attempt_context

    @property
    def stop_requested(self) -> bool:
        return self.keeper.stop_requested

    def wait_for_stop(self, timeout_s: float | None = None) -> StopRequest | None:
        return self.keeper.wait_for_stop_request(timeout_s)

    @property
    def in_jeopardy(self) -> bool:
        return self.keeper.state is Certainty.JEOPARDY

    @property
    def lease_lost(self) -> bool:
        return self.keeper.state is Certainty.LOST

    def effect(
        self, idempotency_key: str, tool: str, operation: str, payload: Mapping[str, Any]
    ) -> EffectResult:
        """An effect under the lease's epoch; refused locally in jeopardy (LeaseInJeopardy)."""
        return self.keeper.send_effect(idempotency_key, tool, operation, payload)

    def checkpoint(self, digest: str, note: str = "") -> None:
        self.keeper.checkpoint(digest, note)


class Worker:
    """Claims runs of its queues and runs each with the task function registered for its queue.

    `lease_seconds`/`heartbeat_seconds` ask for lease terms (None: the coordinator's);
    `poll_s` is the server-side long-poll per claim-next; `keeper_options` go to each LeaseKeeper
    (safety margin, timeouts; tests use them to make jeopardy quick)."""

    def __init__(
        self,
        client: TenureClient,
        runner_id: str,
        *,
        capabilities: Sequence[str] = (),
        lease_seconds: int | None = None,
        heartbeat_seconds: int | None = None,
        poll_s: int = 5,
        report_retries: int = 5,
        keeper_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.client = client
        self.runner_id = runner_id
        self.capabilities = tuple(capabilities)
        self.lease_seconds = lease_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.poll_s = poll_s
        self.report_retries = report_retries
        self.keeper_options = dict(keeper_options or {})
        self.outcomes: list[TaskOutcome] = []
        self._tasks: dict[str, TaskFunction] = {}
        self._stopping = threading.Event()
        self._backoff = Backoff(0.2, 5.0)
        # queue -> (key, first send) of a claim whose outcome is unknown
        self._unanswered: dict[str, tuple[str, float]] = {}

    def task(self, queue: str = "default") -> Callable[[TaskFunction], TaskFunction]:
        """Decorator: run `fn(task)` for each run claimed from `queue`."""

        def register(fn: TaskFunction) -> TaskFunction:
            self.register(queue, fn)
            return fn

        return register

    def register(self, queue: str, fn: TaskFunction) -> None:
        if queue in self._tasks:
            raise ValueError(f"queue {queue!r} already has a task function")
        self._tasks[queue] = fn

    def stop(self) -> None:
        """Claim nothing more; the run in hand is finished and reported first."""
        self._stopping.set()

    def run(self, *, max_runs: int | None = None, idle_exit_s: float | None = None) -> list[TaskOutcome]:
        """Work until stop(), `max_runs` runs, or `idle_exit_s` seconds without any claimable run."""
        if not self._tasks:
            raise ValueError("no task function registered (use @worker.task(queue))")
        done = 0
        idle_since = time.monotonic()
        while not self._stopping.is_set() and (max_runs is None or done < max_runs):
            outcome = self.run_once()
            if outcome is not None:
                done += 1
                idle_since = time.monotonic()
            elif idle_exit_s is not None and time.monotonic() - idle_since >= idle_exit_s:
                break
        return self.outcomes[-done:] if done else []

    def run_once(self) -> TaskOutcome | None:
        """Claim one run from any queue (in registration order) and run it; None if none came."""
        for queue, fn in self._tasks.items():
            if self._stopping.is_set():
                return None
            claimed = self._claim(queue)
            if claimed is not None:
                outcome = self._work(queue, fn, *claimed)
                self.outcomes.append(outcome)
                return outcome
        return None

    # --- one run ------------------------------------------------------------------------------

    def _claim(self, queue: str) -> tuple[Lease, float] | None:
        # One key per claim, kept while its outcome is unknown: the retry of a claim whose
        # answer was lost answers the same grant instead of leaving that lease to expire.
        # The lease's validity is counted from the FIRST send under the key: a replayed grant was
        # made after that send, never before it, so the keeper cannot overestimate it (LEASE-4).
        key, sent_at = self._unanswered.get(queue) or (uuid.uuid4().hex, time.monotonic())
        try:
            lease = self.client.claim_next(
                queue,
                self.runner_id,
                self.capabilities,
                self.lease_seconds,
                self.heartbeat_seconds,
                wait_s=self.poll_s,
                idempotency_key=key,
            )
        except TenureUnavailable as exc:
            self._unanswered[queue] = (key, sent_at)
            delay = self._backoff.next_delay()
            log.warning("claim-next on %s: %s; retrying in %.2fs", queue, exc, delay)
            self._stopping.wait(delay)
            return None
        self._unanswered.pop(queue, None)
        self._backoff.reset()
        # The claim was sent after the server's long-poll: sent_at + waited is still before it.
        return None if lease is None else (lease, sent_at + lease.waited_ms / 1000.0)

    def _work(self, queue: str, fn: TaskFunction, lease: Lease, sent_at: float) -> TaskOutcome:
        keeper = LeaseKeeper(self.client, lease, claim_sent_at=sent_at, **self.keeper_options)
        task = Task(queue, keeper)
        keeper.start()
        try:
            outcome, code, detail, manifest = self._call(fn, task)
            return self._finish(task, outcome, code, detail, manifest)
        finally:
            keeper.stop()

    def _call(
        self, fn: TaskFunction, task: Task
    ) -> tuple[ReportOutcome, str, str, Sequence[Mapping[str, Any]] | None]:
        try:
            manifest = fn(task)
        except Exception as exc:  # the user's function failed: the run fails, the worker goes on
            return failure_of(exc, task.run_id)
        return "succeeded", "", "", list(manifest or [])

    def _finish(
        self,
        task: Task,
        outcome: ReportOutcome,
        code: str,
        detail: str,
        manifest: Sequence[Mapping[str, Any]] | None,
    ) -> TaskOutcome:
        stop = task.keeper.stop_request
        if stop is not None:  # the stop decides what is reported, whatever the function did
            if stop.kind == "deadline":
                outcome, code, detail = "failed", "DEADLINE_EXCEEDED", "stopped at the run's deadline"
            else:
                outcome, code, detail = "cancelled", "", "stopped on request"
            manifest = None
        waiting = Backoff(base_s=0.05, cap_s=1.0)  # full jitter while the lease is in jeopardy
        while True:
            try:
                task.keeper.finish(outcome, code, detail, manifest, retries=self.report_retries)
                return TaskOutcome(task.run_id, task.queue, outcome, code, detail)
            except LeaseInJeopardy:
                # LEASE-4: nothing may be reported on a lease not proven; the keeper goes on
                # renewing, and either a renewal restores it or the lease is lost.
                time.sleep(waiting.next_delay())
            except (LeaseLost, LeaseReleased) as exc:
                log.warning("run %s: lease lost before its report: %s", task.run_id, exc)
                return TaskOutcome(task.run_id, task.queue, "lease-lost", "", str(exc))
            except TenureRunnerError as exc:
                if task.keeper.stop_request is not None and task.keeper.stop_request is not stop:
                    return self._finish(task, outcome, code, detail, manifest)  # a stop arrived
                log.warning("run %s: report %s failed: %s", task.run_id, outcome, exc)
                return TaskOutcome(task.run_id, task.queue, "unreported", code, str(exc))
