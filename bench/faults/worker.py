"""A long-lived runner worker process of the fault-injection scoreboard (all configurations).

    python -m bench.faults.worker --config {unmanaged,log-only,saga-memory,tenure} --sim URL
        [--api URL] [--journal-dir DIR] [--effect-timeout S]

Reads one JSON order per line on stdin and runs one trajectory at a time:
    {"trajectory": <TrajectorySpec json>, "resume": bool, "incarnation": n, "faults_from_turn": t}
    {"stop": true}                      (or end of input: exit)
and writes the events of runner_api.Reporter as JSON lines on stdout (after {"event": "ready"}).
Anything else the process prints goes to stderr, so stdout carries nothing but events. Python's
start-up is paid once per worker, never per trajectory. ``WorkerPool`` is the harness's side of
this protocol: it starts workers, reads their events into one queue, sends orders and kills.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

from bench.faults.runner_api import ConfigRunner, Reporter, SimClient
from bench.faults.workload import TrajectorySpec

__all__ = ["CONFIGS", "REPO_ROOT", "Event", "WorkerHandle", "WorkerPool", "main", "make_runner"]

CONFIGS = ("unmanaged", "log-only", "saga-memory", "tenure")
REPO_ROOT = Path(__file__).resolve().parents[2]


def make_runner(
    config: str, sim_url: str, api_url: str, journal_dir: Path, effect_timeout_s: float
) -> ConfigRunner:
    """The runner of ``config``; Tenure's is imported only when asked for."""
    if config == "unmanaged":
        from bench.faults.ablations import UnmanagedRunner

        return UnmanagedRunner(SimClient(sim_url, effect_timeout_s))
    if config == "log-only":
        from bench.faults.ablations import LogOnlyRunner

        return LogOnlyRunner(SimClient(sim_url, effect_timeout_s), journal_dir)
    if config == "saga-memory":
        from bench.faults.ablations import SagaMemoryRunner

        return SagaMemoryRunner(SimClient(sim_url, effect_timeout_s))
    if config == "tenure":
        if not api_url:
            raise SystemExit("--api is required for --config tenure")
        from bench.faults.tenure_runner import TenureRunner

        runner: ConfigRunner = TenureRunner(api_url=api_url, sim_url=sim_url)
        return runner
    raise SystemExit(f"unknown config {config!r}; known: {', '.join(CONFIGS)}")


def _emitter(out: TextIO) -> Any:
    lock = threading.Lock()

    def emit(event: dict[str, Any]) -> None:
        line = json.dumps(event, separators=(",", ":"), default=str)
        with lock:
            out.write(line + "\n")
            out.flush()

    return emit


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.faults.worker", description=__doc__)
    parser.add_argument("--config", required=True, choices=CONFIGS)
    parser.add_argument("--sim", required=True, help="the simulated environment's base URL")
    parser.add_argument("--api", default="", help="Tenure's command API (config tenure)")
    parser.add_argument("--journal-dir", default="", help="log-only: one journal file per trajectory here")
    parser.add_argument(
        "--effect-timeout",
        type=float,
        default=1.0,
        help="seconds an ablation runner waits for a tool's answer",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    events = sys.stdout
    sys.stdout = sys.stderr  # stray prints must not corrupt the event stream
    emit = _emitter(events)
    journal_dir = Path(args.journal_dir or f"/tmp/tenure-faults-journal-{os.getpid()}")
    runner = make_runner(args.config, args.sim, args.api, journal_dir, args.effect_timeout)
    emit({"event": "ready", "pid": os.getpid(), "config": args.config})
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            order = json.loads(line)
            if order.get("stop"):
                break
            spec = TrajectorySpec.from_json(order["trajectory"])
            reporter = Reporter(
                spec.trajectory_id,
                emit,
                incarnation=int(order.get("incarnation", 0)),
                faults_from_turn=int(order.get("faults_from_turn", 0)),
            )
            reporter.started()
            try:
                runner.run(spec, bool(order.get("resume")), reporter)
            except Exception as exc:  # a bug, not a fault: reported as such, never as an outcome
                trace = traceback.format_exc()
                print(trace, file=sys.stderr, flush=True)
                if not reporter.done:
                    reporter.finished("failed", {}, detail=f"runner error: {exc!r}", runner_error=trace)
                continue
            if not reporter.done:
                reporter.finished("failed", {}, runner_error="the runner returned without a final report")
    finally:
        runner.close()
    return 0


# --- the harness's side -------------------------------------------------------------------------


@dataclass
class WorkerHandle:
    wid: int
    process: subprocess.Popen[str]
    stderr: IO[bytes]
    trajectory: str | None = None
    incarnation: int = 0
    killed: bool = False
    retiring: bool = False


Event = tuple[int, dict[str, Any] | None, float]


class WorkerPool:
    """Worker processes of one configuration, their event queue and a warm spare."""

    def __init__(self, command: list[str], env: dict[str, str], logdir: Path) -> None:
        self.command = command
        self.env = env
        self.logdir = logdir
        self.events: queue.Queue[Event] = queue.Queue()
        self.workers: dict[int, WorkerHandle] = {}
        self.spares: deque[WorkerHandle] = deque()
        self._next_id = 0

    def spawn(self) -> WorkerHandle:
        wid = self._next_id
        self._next_id += 1
        stderr = (self.logdir / f"worker-{wid}.log").open("wb")
        process = subprocess.Popen(
            self.command,
            cwd=REPO_ROOT,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            bufsize=1,
        )
        worker = WorkerHandle(wid, process, stderr)
        self.workers[wid] = worker
        threading.Thread(target=self._read, args=(worker,), daemon=True, name=f"worker-{wid}").start()
        return worker

    def _read(self, worker: WorkerHandle) -> None:
        assert worker.process.stdout is not None
        for line in worker.process.stdout:
            at = time.monotonic()
            try:
                event = json.loads(line)
            except ValueError:
                continue  # not an event: the worker's stdout carries nothing else, but never mind
            if isinstance(event, dict):
                self.events.put((worker.wid, event, at))
        self.events.put((worker.wid, None, time.monotonic()))

    def take_spare(self) -> WorkerHandle:
        while self.spares:
            spare = self.spares.popleft()
            if spare.process.poll() is None:
                return spare
        return self.spawn()

    def send(self, worker: WorkerHandle, order: dict[str, Any]) -> None:
        assert worker.process.stdin is not None
        worker.process.stdin.write(json.dumps(order) + "\n")
        worker.process.stdin.flush()

    def kill(self, worker: WorkerHandle) -> float:
        worker.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.process.pid, signal.SIGKILL)
        at = time.monotonic()
        worker.process.wait(10)
        worker.stderr.close()
        self.workers.pop(worker.wid, None)
        return at

    def close(self) -> None:
        everyone = list(self.workers.values())
        for worker in everyone:
            worker.retiring = True
            with contextlib.suppress(OSError, ValueError):
                if worker.process.stdin is not None:
                    worker.process.stdin.close()
        deadline = time.monotonic() + 5.0
        for worker in everyone:
            try:
                worker.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.kill()
                worker.process.wait(10)
            worker.stderr.close()
        self.workers.clear()
        self.spares.clear()


# --- one configuration --------------------------------------------------------------------------


if __name__ == "__main__":
    sys.exit(main())
