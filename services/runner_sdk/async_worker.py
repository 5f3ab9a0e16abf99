"""An asyncio worker: the user writes an `async def`, the SDK does the rest (issue 17).

    worker = AsyncWorker(client, "runner-7", concurrency=4)

    @worker.task("default")
    async def summarise(task: AsyncTask) -> list[dict] | None:
        await task.effect_async("step-1", "ledger", "transfer", {...})
        return []

    await worker.run()

It is Worker (worker.py) with async task functions, not a second implementation: the claim (the
same claim-next, key kept while an outcome is unknown), the report (the stop that decides it, the
wait while the lease is in jeopardy) and the lease keeping are Worker's and LeaseKeeper's own,
run off the event loop (asyncio.to_thread; the keeper renews from its own thread), so the
retry, idempotency and jeopardy rules are written once for both. `concurrency` runs that many
runs at a time, each slot a Worker of its own (one backoff and one key memory per loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from .client import EffectResult, TenureClient
from .keeper import LeaseKeeper, StopRequest
from .protocol import ReportOutcome
from .worker import Task, TaskOutcome, Worker, failure_of

__all__ = ["AsyncTask", "AsyncTaskFunction", "AsyncWorker"]


class AsyncTask(Task):
    """Task, with the calls that wait on the network or on a stop as coroutines."""

    async def effect_async(
        self, idempotency_key: str, tool: str, operation: str, payload: Mapping[str, Any]
    ) -> EffectResult:
        """An effect under the lease's epoch; refused locally in jeopardy (LeaseInJeopardy)."""
        return await asyncio.to_thread(self.keeper.send_effect, idempotency_key, tool, operation, payload)

    async def wait_for_stop_async(self, timeout_s: float | None = None) -> StopRequest | None:
        return await asyncio.to_thread(self.keeper.wait_for_stop_request, timeout_s)


AsyncTaskFunction = Callable[[AsyncTask], Awaitable["Sequence[Mapping[str, Any]] | None"]]


class AsyncWorker:
    """Claims runs of its queues and awaits the task function registered for each run's queue."""

    def __init__(self, client: TenureClient, runner_id: str, *, concurrency: int = 1, **options: Any) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self._slots = [Worker(client, runner_id, **options) for _ in range(concurrency)]
        self._tasks: dict[str, AsyncTaskFunction] = {}
        self.outcomes: list[TaskOutcome] = []

    def task(self, queue: str = "default") -> Callable[[AsyncTaskFunction], AsyncTaskFunction]:
        def register(fn: AsyncTaskFunction) -> AsyncTaskFunction:
            if queue in self._tasks:
                raise ValueError(f"queue {queue!r} already has a task function")
            self._tasks[queue] = fn
            return fn

        return register

    def stop(self) -> None:
        for slot in self._slots:
            slot.stop()

    async def run(
        self, *, max_runs: int | None = None, idle_exit_s: float | None = None
    ) -> list[TaskOutcome]:
        """Work in every slot until stop(), `max_runs` runs in all, or `idle_exit_s` without work."""
        if not self._tasks:
            raise ValueError("no task function registered (use @worker.task(queue))")
        loop = asyncio.get_running_loop()
        started = len(self.outcomes)
        claimed = 0  # runs taken by the slots, so that max_runs is not overshot

        async def slot_loop(slot: Worker) -> None:
            nonlocal claimed
            idle_since = loop.time()
            while not slot._stopping.is_set() and (max_runs is None or claimed < max_runs):
                claimed += 1
                outcome = await self._run_once(slot)
                if outcome is not None:
                    idle_since = loop.time()
                    continue
                claimed -= 1
                if idle_exit_s is not None and loop.time() - idle_since >= idle_exit_s:
                    return

        await asyncio.gather(*(slot_loop(slot) for slot in self._slots))
        return self.outcomes[started:]

    async def run_once(self) -> TaskOutcome | None:
        return await self._run_once(self._slots[0])

    async def _run_once(self, slot: Worker) -> TaskOutcome | None:
        for queue, fn in self._tasks.items():
            if slot._stopping.is_set():
                return None
            claimed = await asyncio.to_thread(slot._claim, queue)
            if claimed is None:
                continue
            lease, sent_at = claimed
            keeper = LeaseKeeper(slot.client, lease, claim_sent_at=sent_at, **slot.keeper_options)
            task = AsyncTask(queue, keeper)
            keeper.start()
            try:
                result = await self._call(fn, task)
                outcome = await asyncio.to_thread(slot._finish, task, *result)
            finally:
                keeper.stop()
            self.outcomes.append(outcome)
            return outcome
        return None

    async def _call(
        self, fn: AsyncTaskFunction, task: AsyncTask
    ) -> tuple[ReportOutcome, str, str, Sequence[Mapping[str, Any]] | None]:
        try:
            manifest = await fn(task)
        except Exception as exc:  # the user's function failed: the run fails, the worker goes on
            return failure_of(exc, task.run_id)
        return "succeeded", "", "", list(manifest or [])
