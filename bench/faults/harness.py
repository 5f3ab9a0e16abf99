"""The fault-injection scoreboard's harness (DUR-3): pools of runner workers, kills, restarts,
the end-of-run audit, metrics, the table and the plot.

For each configuration: a fresh simulated environment (for Tenure: TenureProcesses, with its own),
W long-lived worker processes (bench/faults/worker.py) and one warm spare, the same trajectory
specs fed one at a time to idle workers. On a worker's "kill-me" the harness SIGKILLs it, notes
the time and hands the trajectory to the spare as a resumed incarnation (faults of the turns
already played are not injected again); on "kill-tenure" it SIGKILLs and restarts that Tenure
process (one at a time, off the event loop). At the end it reads the environment's audit and
classifies every trajectory (outcomes.py): nothing a runner says decides an outcome.

    scoreboard = run_scoreboard(["unmanaged", "saga-memory"], trajectories=40, seed=7, workers=4)
    print(scoreboard.table())

Every process the harness starts is stopped before ``run_scoreboard`` returns or raises.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import queue
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.faults.outcomes import (
    AuditIndex,
    CommitReport,
    ConfigResult,
    FinalReport,
    KillRecord,
    TrajectoryRecord,
    summarize,
)
from bench.faults.plot import LABELS, SEED_COMPLETION, Progress, render_table, say
from bench.faults.runner_api import SimClient
from bench.faults.worker import REPO_ROOT, WorkerHandle, WorkerPool
from bench.faults.workload import AgentPolicy, FaultProfile, TrajectorySpec, fault_counts, generate

__all__ = [
    "CONFIGS",
    "LABELS",
    "SEED_COMPLETION",
    "HarnessError",
    "Scoreboard",
    "SimEnvironment",
    "parse_configs",
    "run_config",
    "run_scoreboard",
]

CONFIGS = ("unmanaged", "log-only", "saga-memory", "tenure")


class HarnessError(RuntimeError):
    """The harness itself could not run (a process would not start, the audit did not answer)."""


def parse_configs(text: str) -> list[str]:
    """ "all" or a comma-separated list of configuration names (also 1-4)."""
    if text.strip() == "all":
        return list(CONFIGS)
    chosen: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name = CONFIGS[int(item) - 1] if item.isdigit() and 1 <= int(item) <= len(CONFIGS) else item
        if name not in CONFIGS:
            raise ValueError(f"unknown configuration {item!r}; known: {', '.join(CONFIGS)} (or 1-4, all)")
        if name not in chosen:
            chosen.append(name)
    if not chosen:
        raise ValueError("no configuration selected")
    return chosen


# --- processes ----------------------------------------------------------------------------------


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _stop(process: subprocess.Popen[Any], grace_s: float = 5.0) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait(10)


def _wait_healthy(url: str, process: subprocess.Popen[Any], timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise HarnessError(f"{url}: the process exited with {process.returncode}; see {log}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise HarnessError(f"{url} did not answer within {timeout_s:g}s; see {log}")


class SimEnvironment:
    """A fresh ``python -m services.sim_environment`` on a free port (configs 1-3)."""

    def __init__(self, workdir: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "sim-environment.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> SimEnvironment:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "services.sim_environment"],
                cwd=REPO_ROOT,
                env=_child_env({"TENURE_SIM_PORT": str(self.port), "TENURE_SIM_TIME_SCALE": "0"}),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            _wait_healthy(f"{self.url}/healthz", self.process, 60.0, self.log)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process)


def run_config(
    config: str,
    specs: Sequence[TrajectorySpec],
    *,
    workers: int,
    sim_url: str,
    workdir: Path,
    api_url: str = "",
    worker_env: dict[str, str] | None = None,
    kill_tenure: Callable[[str], float] | None = None,
    trajectory_timeout_s: float = 300.0,
    effect_timeout_s: float = 1.0,
    spares: int = 1,
    progress: bool = True,
) -> ConfigResult:
    """Run ``specs`` through ``workers`` runner workers of ``config`` against the environment at
    ``sim_url`` (already started), then audit it and return the configuration's metrics."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    logdir = workdir / "workers"
    logdir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "bench.faults.worker",
        "--config",
        config,
        "--sim",
        sim_url,
        "--journal-dir",
        str(workdir / "journal"),
        "--effect-timeout",
        str(effect_timeout_s),
    ]
    if api_url:
        command += ["--api", api_url]
    pool = WorkerPool(command, _child_env(worker_env), logdir)
    records = {spec.trajectory_id: TrajectoryRecord(spec) for spec in specs}
    todo = deque(specs)
    bar = Progress(len(specs), LABELS.get(config, config), progress)
    killer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tenure-kill")
    kills_in_flight: list[Future[None]] = []
    started = time.monotonic()
    ended = 0

    def assign(
        worker: WorkerHandle, spec: TrajectorySpec, *, resume: bool, incarnation: int, from_turn: int
    ) -> None:
        worker.trajectory, worker.incarnation = spec.trajectory_id, incarnation
        record = records[spec.trajectory_id]
        record.incarnations = max(record.incarnations, incarnation + 1)
        if record.started_at is None:
            record.started_at = time.monotonic()
        order = {
            "trajectory": spec.to_json(),
            "resume": resume,
            "incarnation": incarnation,
            "faults_from_turn": from_turn,
        }
        try:
            pool.send(worker, order)
        except OSError:  # the worker died before it got the order: give it to a new one
            say(f"worker {worker.wid} is gone (see {pool.logdir}); starting another")
            pool.workers.pop(worker.wid, None)
            worker.trajectory, worker.retiring = None, True
            fresh = pool.spawn()
            fresh.trajectory, fresh.incarnation = spec.trajectory_id, incarnation
            pool.send(fresh, order)

    def next_job(worker: WorkerHandle) -> None:
        worker.trajectory = None
        if todo:
            assign(worker, todo.popleft(), resume=False, incarnation=0, from_turn=0)

    def end(record: TrajectoryRecord, at: float, note: str) -> None:
        nonlocal ended
        record.ended_at = at
        ended += 1
        bar.update(note)

    def tenure_kill(trajectory: str, turn: int, process: str) -> None:
        assert kill_tenure is not None
        at = time.monotonic()
        try:
            restart_s: float | None = kill_tenure(process)
        except Exception as exc:  # reported; the run goes on without it
            say(f"kill_and_restart({process}) failed: {exc!r}")
            restart_s = None
        pool.events.put(
            (
                -1,
                {
                    "event": "_tenure-killed",
                    "trajectory": trajectory,
                    "turn": turn,
                    "process": process,
                    "at": at,
                    "restart_s": restart_s,
                },
                time.monotonic(),
            )
        )

    try:
        for _ in range(workers):
            next_job(pool.spawn())
        for _ in range(spares):
            pool.spares.append(pool.spawn())
        while ended < len(specs):
            try:
                wid, event, at = pool.events.get(timeout=0.5)
            except queue.Empty:
                wid, event, at = -2, None, time.monotonic()
            if wid == -1 and event is not None:  # a Tenure process was killed and restarted
                record = records[event["trajectory"]]
                record.kills.append(
                    KillRecord(
                        event["at"],
                        int(event["turn"]),
                        str(event["process"]),
                        "in-flight",
                        event["restart_s"],
                    )
                )
            elif wid >= 0:
                worker = pool.workers.get(wid)
                if worker is not None and not worker.killed:
                    _handle(
                        event,
                        at,
                        worker,
                        records,
                        pool,
                        assign,
                        next_job,
                        end,
                        lambda t, turn, p: kills_in_flight.append(killer.submit(tenure_kill, t, turn, p)),
                        kill_tenure is not None,
                    )
            now = time.monotonic()
            for worker in list(pool.workers.values()):
                running = records.get(worker.trajectory or "")
                if running is None or running.started_at is None or running.ended_at is not None:
                    continue
                if now - running.started_at > trajectory_timeout_s:
                    say(
                        f"{running.spec.trajectory_id}: no end after {trajectory_timeout_s:g}s; "
                        "killing its worker"
                    )
                    running.timed_out = True
                    pool.kill(worker)
                    end(running, now, "timeout")
                    next_job(pool.spawn())
        for pending in kills_in_flight:
            pending.result()
        while not pool.events.empty():  # kills that completed after the last trajectory ended
            wid, event, at = pool.events.get_nowait()
            if wid == -1 and event is not None:
                records[event["trajectory"]].kills.append(
                    KillRecord(
                        event["at"],
                        int(event["turn"]),
                        str(event["process"]),
                        "in-flight",
                        event["restart_s"],
                    )
                )
        wall_s = time.monotonic() - started
    finally:
        bar.close()
        killer.shutdown(wait=True, cancel_futures=True)
        pool.close()
    try:
        audit = SimClient(sim_url).audit()
    except Exception as exc:
        raise HarnessError(f"{config}: the environment's audit failed: {exc}") from exc
    (workdir / "audit.json").write_text(json.dumps(audit))
    ordered = [records[spec.trajectory_id] for spec in specs]
    result = summarize(config, ordered, AuditIndex(audit), wall_s)
    with (workdir / "outcomes.jsonl").open("w") as out:  # one line per trajectory, to look into
        for record, outcome in zip(ordered, result.outcomes, strict=True):
            out.write(json.dumps(_outcome_line(record, outcome), default=str) + "\n")
    return result


def _outcome_line(record: TrajectoryRecord, outcome: Any) -> dict[str, Any]:
    final = record.final
    return {
        "trajectory": record.spec.trajectory_id,
        "outcome": outcome.outcome,
        "reasons": list(outcome.reasons),
        "reported": outcome.reported,
        "detail": final.detail if final else "",
        "runnerError": final.runner_error[-500:] if final else "",
        "duplicates": outcome.duplicates,
        "orphans": outcome.orphans,
        "lostTurns": outcome.lost_turns,
        "workIds": record.work_ids,
        "faults": [None if f is None else f.to_json() for f in record.spec.faults],
        "tools": [step.tool for step in record.spec.steps],
        "kills": [{"turn": k.turn, "target": k.target, "point": k.point} for k in record.kills],
        "commits": [[c.turn, list(c.resources), c.incarnation] for c in record.commits],
        "final": {"turns": list(final.committed_turns), "resources": list(final.committed_resources)}
        if final
        else None,
    }


def _handle(
    event: dict[str, Any] | None,
    at: float,
    worker: WorkerHandle,
    records: dict[str, TrajectoryRecord],
    pool: WorkerPool,
    assign: Callable[..., None],
    next_job: Callable[[WorkerHandle], None],
    end: Callable[[TrajectoryRecord, float, str], None],
    submit_tenure_kill: Callable[[str, int, str], None],
    tenure: bool,
) -> None:
    """One event of a live worker (``None``: its stdout closed)."""
    if event is None:
        if worker.retiring or worker.killed:
            return
        pool.workers.pop(worker.wid, None)
        if worker in pool.spares:
            pool.spares.remove(worker)
            pool.spares.append(pool.spawn())
            return
        say(f"worker {worker.wid} (pid {worker.process.pid}) died unasked; see its log in {pool.logdir}")
        record = records.get(worker.trajectory or "")
        if record is not None and record.ended_at is None:
            record.final = FinalReport("failed", runner_error="the worker process died unasked")
            end(record, at, "worker died")
        next_job(pool.spawn())
        return
    kind = event.get("event")
    record = records.get(str(event.get("trajectory", "")))
    if kind == "ready" or record is None or worker.trajectory != record.spec.trajectory_id:
        return
    if kind == "started":
        record.add_work_id(record.spec.work_id if not tenure else "")
    elif kind == "work":
        record.add_work_id(str(event.get("work_id", "")))
    elif kind == "turn-committed":
        record.commits.append(
            CommitReport(at, int(event["turn"]), tuple(event.get("resources") or ()), worker.incarnation)
        )
    elif kind == "kill-me":
        killed_at = pool.kill(worker)
        turn = int(event["turn"])
        record.kills.append(KillRecord(killed_at, turn, "runner", str(event.get("point", ""))))
        replacement = pool.take_spare()
        assign(replacement, record.spec, resume=True, incarnation=worker.incarnation + 1, from_turn=turn + 1)
        pool.spares.append(pool.spawn())
    elif kind == "kill-tenure":
        if tenure:
            submit_tenure_kill(record.spec.trajectory_id, int(event["turn"]), str(event["process"]))
    elif kind == "finished":
        record.final = FinalReport.from_event(event)
        end(record, at, record.final.status)
        next_job(worker)


# --- the scoreboard -----------------------------------------------------------------------------


@dataclass
class Scoreboard:
    seed: int
    trajectories: int
    workers: int
    results: list[ConfigResult]
    faults: dict[str, int]
    command: str
    started_at: dt.datetime
    load: tuple[float, float]
    notes: list[str] = field(default_factory=list)

    def result(self, config: str) -> ConfigResult:
        return next(r for r in self.results if r.config == config)

    def table(self) -> str:
        return render_table(self.results)

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "trajectories": self.trajectories,
            "workers": self.workers,
            "faults": self.faults,
            "command": self.command,
            "results": [r.to_json() for r in self.results],
        }


@contextlib.contextmanager
def _tenure_system(workdir: Path) -> Iterator[Any]:
    """Kafka (``KAFKA_BOOTSTRAP_SERVERS`` when set, else a broker of our own) and TenureProcesses,
    imported only now: configurations 1-3 need neither."""
    from bench.faults.tenure_system import TenureProcesses
    from services.common.broker import start_broker

    broker = start_broker(data_dir=workdir / "kafka" / "data", state_dir=workdir / "kafka")
    system: Any = None
    try:
        created = subprocess.run(
            [sys.executable, "-m", "services.tenure_cli", "topics", "create"],
            cwd=REPO_ROOT,
            env=_child_env(
                {
                    "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
                    "TENURE_STATE_DIR": str(workdir / "cli"),
                }
            ),
            capture_output=True,
            text=True,
        )
        if created.returncode != 0:
            raise HarnessError(f"topics create failed: {created.stdout}{created.stderr}")
        system = TenureProcesses(broker.bootstrap_servers, workdir / "tenure")
        system.start()
        # Run ids come from the trajectory ids: a tenant of this benchmark run alone keeps a second
        # run with the same seed on the same broker from meeting the first one's runs.
        os.environ["TENURE_FAULTS_TENANT"] = f"faults-{os.getpid()}-{int(time.time())}"
        yield system
    finally:
        if system is not None:
            system.stop()
        if broker.owned:
            say(f"stopped broker: {broker.stop()}")


def run_scoreboard(
    configs: Sequence[str],
    trajectories: int,
    seed: int,
    workers: int,
    *,
    profile: FaultProfile | None = None,
    policy: AgentPolicy | None = None,
    trajectory_timeout_s: float = 300.0,
    effect_timeout_s: float = 1.0,
    spares: int = 1,
    progress: bool = True,
    workdir: Path | None = None,
    keep_temp: bool = False,
) -> Scoreboard:
    """Run the scoreboard: the same ``trajectories`` specs (from ``seed``) through each of
    ``configs``, one configuration after another, each with its own fresh environment."""
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise ValueError(f"unknown configurations {unknown}; known: {', '.join(CONFIGS)}")
    specs = generate(seed, trajectories, profile, policy)
    board = Scoreboard(
        seed=seed,
        trajectories=trajectories,
        workers=workers,
        results=[],
        faults=fault_counts(specs),
        command=shlex.join(sys.orig_argv),
        started_at=dt.datetime.now(dt.UTC),
        load=(os.getloadavg()[0], float("nan")),
    )
    root = workdir or Path(tempfile.mkdtemp(prefix="tenure-faults-"))
    ok = False
    try:
        for config in configs:
            here = root / config
            here.mkdir(parents=True, exist_ok=True)
            say(f"{LABELS[config]}: {trajectories} trajectories, {workers} workers (logs in {here})")
            common: dict[str, Any] = {
                "workers": workers,
                "workdir": here,
                "trajectory_timeout_s": trajectory_timeout_s,
                "effect_timeout_s": effect_timeout_s,
                "spares": spares,
                "progress": progress,
            }
            if config == "tenure":
                with _tenure_system(here) as system:
                    result = run_config(
                        config,
                        specs,
                        sim_url=system.sim_url,
                        api_url=system.api_url,
                        worker_env=dict(getattr(system, "worker_env", None) or {}),
                        kill_tenure=system.kill_and_restart,
                        **common,
                    )
            else:
                sim = SimEnvironment(here).start()
                try:
                    result = run_config(config, specs, sim_url=sim.url, **common)
                finally:
                    sim.stop()
            board.results.append(result)
            say(
                f"{LABELS[config]}: completed {result.completion_rate:.1f}%, clean {result.clean_rate:.1f}%, "
                f"corrupted {result.counts.get('corrupted', 0)} in {result.wall_s:.1f}s"
            )
        board.load = (board.load[0], os.getloadavg()[0])
        ok = True
        return board
    finally:
        if workdir is None and ok and not keep_temp:
            shutil.rmtree(root, ignore_errors=True)
        elif not ok or keep_temp:
            say(f"work dir kept: {root}")
