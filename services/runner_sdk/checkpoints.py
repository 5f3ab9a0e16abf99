"""Checkpoints of a runner's state, and the level-2 rollback they serve (WD-5).

A level-2 intervention (ROLLBACK_REQUESTED) names the checkpoint before the cycle: the step
whose state the run should go back to (`checkpoint_step`, -1 for the run's start) and, when
known, that state's hash. The runner can only go back to a state it kept, so the SDK keeps one
per step:

inbox = InterventionInbox(tell_the_model)            # one memory for all the run's clients
watchdog = WatchdogClient(api_url, api_key, on_intervention=inbox)
runs = TenureClient(api_url, gateway_url, api_key, on_intervention=inbox)  # heartbeats
guard = LoopGuard(watchdog, lease, Checkpoints(), workdir=Path("workspace"))  # listens on inbox
guard.start()                                        # the run's start: checkpoint -1
guard.step("fs.edit", {"path": "a.py", "patch": p}, summary="edited a.py", metrics=[4, -2])
# a rollback the watchdog asks for (on any answer the inbox hears) restores the checkpoint
# before the cycle and is acknowledged; level 1's message and level 3 go to tell_the_model

A checkpoint is a copy of a directory (file contents, symlinks as links; mode and times are not
state) or of a JSON document. A rollback restores the directory in place (everything under it
not ignored is replaced) or hands the JSON document back (`guard.restored`). Checkpoints are
kept for the last `keep` steps (and always the start), so memory and disk stay bounded.
"""

from __future__ import annotations

import copy
import fnmatch
import logging
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .canonical import (
    DEFAULT_IGNORED,
    DEFAULT_VOLATILE_KEYS,
    json_state_hash,
    tree_state_hash,
)
from .errors import TenureRunnerError
from .interventions import Intervention
from .trajectory import LeaseLike
from .watchdog import ObservationReceipt, WatchdogClient

__all__ = ["RUN_START", "Checkpoint", "CheckpointMissing", "Checkpoints", "LoopGuard", "Restored"]

log = logging.getLogger("tenure.runner_sdk.watchdog")

RUN_START = -1  # the step number of the checkpoint taken before the first step


class CheckpointMissing(TenureRunnerError):
    """The checkpoint a rollback names was never recorded (or was dropped as too old)."""


@dataclass(frozen=True)
class Checkpoint:
    step_seq: int
    state_hash: str
    document: Any = None  # a JSON state: a private deep copy
    tree: Path | None = None  # a directory state: where its copy is kept


@dataclass(frozen=True)
class Restored:
    """What a rollback did: the checkpoint it went back to and the state it restored."""

    intervention: Intervention
    checkpoint: Checkpoint
    document: Any = None


class Checkpoints:
    """Per-step snapshots of a directory or a JSON document (thread-safe)."""

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        keep: int = 64,
        ignore: Iterable[str] = DEFAULT_IGNORED,
        volatile_keys: Iterable[str] = DEFAULT_VOLATILE_KEYS,
    ) -> None:
        if keep < 1:
            raise ValueError("keep at least one checkpoint")
        self._root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="tenure-checkpoints-"))
        self._keep = keep
        self._ignore = tuple(ignore)
        self._volatile = frozenset(volatile_keys)
        self._lock = threading.Lock()
        self._by_step: OrderedDict[int, Checkpoint] = OrderedDict()

    def record(self, step_seq: int, state: Any) -> Checkpoint:
        """Keep the state after step `step_seq` (RUN_START: before the first); a directory is
        given as a Path, anything else is a JSON document. Returns it, with its state hash."""
        if isinstance(state, Path):
            digest = tree_state_hash(state, ignore=self._ignore, volatile_keys=self._volatile)
            where = self._root / f"step-{step_seq}"
            if where.exists():
                shutil.rmtree(where)
            shutil.copytree(state, where, symlinks=True, ignore=shutil.ignore_patterns(*self._ignore))
            checkpoint = Checkpoint(step_seq, digest, tree=where)
        else:
            digest = json_state_hash(state, self._volatile)
            checkpoint = Checkpoint(step_seq, digest, document=copy.deepcopy(state))
        with self._lock:
            self._by_step.pop(step_seq, None)
            self._by_step[step_seq] = checkpoint
            dropped = self._trim()
        for old in dropped:
            if old.tree is not None:
                shutil.rmtree(old.tree, ignore_errors=True)
        return checkpoint

    def _trim(self) -> list[Checkpoint]:
        dropped = []
        while len(self._by_step) > self._keep + (1 if RUN_START in self._by_step else 0):
            oldest = next(step for step in self._by_step if step != RUN_START)
            dropped.append(self._by_step.pop(oldest))
        return dropped

    def steps(self) -> list[int]:
        with self._lock:
            return sorted(self._by_step)

    def get(self, step_seq: int) -> Checkpoint | None:
        with self._lock:
            return self._by_step.get(step_seq)

    def find(self, step_seq: int, state_hash: str = "") -> Checkpoint | None:
        """The checkpoint a rollback names: at `step_seq`; else, when the watchdog knows the
        state's hash, the latest one recorded at or before that step with that hash."""
        with self._lock:
            exact = self._by_step.get(step_seq)
            if exact is not None:
                return exact
            if not state_hash:
                return None
            same = [c for s, c in self._by_step.items() if s <= step_seq and c.state_hash == state_hash]
        return max(same, key=lambda c: c.step_seq) if same else None

    def restore(self, checkpoint: Checkpoint, workdir: Path | None = None) -> Any:
        """Put a checkpoint back: a directory into `workdir` (its contents replaced, ignored
        names left alone); a JSON document is returned as a fresh copy."""
        if checkpoint.tree is None:
            return copy.deepcopy(checkpoint.document)
        if workdir is None:
            raise ValueError("restoring a directory checkpoint needs the directory to restore into")
        workdir.mkdir(parents=True, exist_ok=True)
        for entry in list(workdir.iterdir()):
            if any(fnmatch.fnmatchcase(entry.name, p) for p in self._ignore):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        shutil.copytree(checkpoint.tree, workdir, symlinks=True, dirs_exist_ok=True)
        return None

    def close(self) -> None:
        """Remove every directory copy (the JSON ones are only in memory)."""
        with self._lock:
            self._by_step.clear()
        shutil.rmtree(self._root, ignore_errors=True)


class LoopGuard:
    """One run's side of the ladder: checkpoint and report each step, roll back when told.

    It listens on the watchdog client's InterventionInbox (share that inbox with the run's
    TenureClient and TrajectoryClient, `on_intervention=watchdog.interventions`, so heartbeat and
    proposal answers reach it too), and can be called with an intervention directly. Level 2
    restores the checkpoint the watchdog names and acknowledges it, once; every rung is then
    passed to the guard's own `on_intervention` (for level 1, put `intervention.message` in the
    model's context; for level 3, stop). A rollback heard on a heartbeat runs on the keeper's
    thread: a runner that must not be restored under its feet gives its work and the guard one
    lock. A JSON state restored by a rollback waits in `restored` (`take_restored`)."""

    def __init__(
        self,
        watchdog: WatchdogClient,
        lease: LeaseLike,
        checkpoints: Checkpoints | None = None,
        *,
        workdir: Path | None = None,
        state: Callable[[], Any] | None = None,
        on_intervention: Callable[[Intervention], None] | None = None,
    ) -> None:
        self.watchdog = watchdog
        self.lease = lease
        self.checkpoints = checkpoints or Checkpoints()
        self.workdir = workdir
        self._state = state
        self._on_intervention = on_intervention
        self._lock = threading.Lock()
        self._step = RUN_START
        self.restored: Any = None
        self.rollbacks: list[Restored] = []
        watchdog.interventions.listen(self)

    @property
    def step_seq(self) -> int:
        """The step number of the last step reported (RUN_START before any)."""
        return self._step

    def _current(self, state: Any) -> Any:
        if state is not None:
            return state
        if self.workdir is not None:
            return self.workdir
        if self._state is not None:
            return self._state()
        raise ValueError("give the state, or a workdir or state callable to the guard")

    def start(self, state: Any = None) -> Checkpoint:
        """The checkpoint of the run's start (step RUN_START), before the first step."""
        return self.checkpoints.record(RUN_START, self._current(state))

    def step(
        self,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        state: Any = None,
        summary: str = "",
        metrics: Sequence[float] = (),
        error_kind: str = "none",
        polling: bool = False,
        mutating: bool = True,
        action_hash: str | None = None,
    ) -> ObservationReceipt:
        """After a step: checkpoint the state it left and report it (the next step number)."""
        with self._lock:
            self._step = 0 if self._step < 0 else self._step + 1
            step_seq = self._step
        checkpoint = self.checkpoints.record(step_seq, self._current(state))
        receipt = self.watchdog.report_observation(
            self.lease,
            step_seq,
            tool,
            arguments,
            action_hash=action_hash,
            state_hash=checkpoint.state_hash,
            summary=summary,
            metrics=metrics,
            error_kind=error_kind,
            polling=polling,
            mutating=mutating,
        )
        return receipt  # an intervention its answer carried reached the guard through the inbox

    def __call__(self, intervention: Intervention) -> None:
        self.handle(intervention)

    def handle(self, intervention: Intervention) -> Restored | None:
        """Act on one rung (see the class doc); a rollback already done is not done again."""
        restored = None
        with self._lock:
            done = any(r.intervention.intervention_id == intervention.intervention_id for r in self.rollbacks)
        if intervention.is_rollback and not done:
            restored = self.roll_back(intervention)
        if self._on_intervention is not None:
            try:
                self._on_intervention(intervention)
            except Exception:
                log.exception("on_intervention failed for %s", intervention.intervention_id)
        return restored

    def roll_back(self, intervention: Intervention) -> Restored:
        """Restore the checkpoint before the cycle and acknowledge it (WD-5 level 2)."""
        checkpoint = self.checkpoints.find(intervention.checkpoint_step, intervention.checkpoint_state_hash)
        if checkpoint is None:
            raise CheckpointMissing(
                f"no checkpoint of step {intervention.checkpoint_step} to restore for "
                f"{intervention.intervention_id} (kept: {self.checkpoints.steps()})"
            )
        document = self.checkpoints.restore(checkpoint, self.workdir)
        self.watchdog.acknowledge_rollback(
            self.lease, intervention.intervention_id, checkpoint.step_seq, checkpoint.state_hash
        )
        done = Restored(intervention, checkpoint, document)
        with self._lock:
            self.rollbacks.append(done)
            if checkpoint.tree is None:
                self.restored = document
        return done

    def take_restored(self) -> Any:
        """The JSON state the last rollback restored, once (None when there is none)."""
        with self._lock:
            restored, self.restored = self.restored, None
        return restored
