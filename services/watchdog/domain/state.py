"""The immutable state of one run's watchdog, folded from its events by `evolve`.

Everything the detectors look at is a bounded ring: the state hashes of the last W mutating
steps (WD-2), the metric vectors of the epoch (WD-3), the actions whose observation was an
error (WD-4) and the last poll. So a watchdog's state stays small however long its run is.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.watchdog.domain.lifecycle import WatchdogStatus
from services.watchdog.domain.thresholds import Thresholds

__all__ = [
    "MAX_CONFIGURATIONS",
    "MAX_FAILURES",
    "MAX_RECENT",
    "RUN_START",
    "Failure",
    "Mark",
    "MetricPoint",
    "Poll",
    "WatchdogState",
]

MAX_CONFIGURATIONS = 8  # ConfigureWatchdog commands a run may send (their ids are kept)
MAX_FAILURES = 64  # failing actions remembered per run (oldest forgotten first)
MAX_RECENT = 64  # counted observations remembered, to name the turns a rollback truncates


@dataclass(frozen=True)
class Mark:
    """One counted step in the rings: its watchdog turn, the reporter's step number, and what
    it left (the state hash; "" when unknown) by which action."""

    turn: int
    step_seq: int
    state_hash: str
    action_hash: str


# The checkpoint before anything was observed: turn 0, step -1 (the runner's first checkpoint).
RUN_START = Mark(turn=0, step_seq=-1, state_hash="", action_hash="")


@dataclass(frozen=True)
class MetricPoint:
    turn: int
    step_seq: int
    values: tuple[float, ...]


@dataclass(frozen=True)
class Failure:
    """An action whose observation was an application error: when it failed, in which state
    (its hash, "" when unknown, and how many changes the run had made by then), and how often it
    failed again in that same state since."""

    action_hash: str
    turn: int
    step_seq: int
    state_hash: str
    mutations: int
    repeats: int = 0

    def same_state(self, state_hash: str, mutations: int) -> bool:
        """The environment is where it was when the action failed: re-issuing it is re-issuing a
        known-bad request (WD-4). Compared by hash when both are known, else by whether anything
        changed the environment since (a successful mutating step)."""
        if self.state_hash and state_hash:
            return self.state_hash == state_hash
        return self.mutations == mutations


@dataclass(frozen=True)
class Poll:
    """The last declared poll: its action, a digest of what it observed, and how many polls in a
    row observed exactly that."""

    action_hash: str
    summary_digest: str
    turn: int
    step_seq: int
    idle: int = 0


@dataclass(frozen=True)
class WatchdogState:
    run_id: str
    version: int
    status: WatchdogStatus
    thresholds: Thresholds
    configured_by: tuple[str, ...] = ()  # ConfigureWatchdog command ids, to drop redeliveries
    turn: int = 0  # counted observations so far (transient errors are not counted)
    last_saga_seq: int = -1  # the highest step number each reporter has sent
    last_runner_seq: int = -1
    marks: tuple[Mark, ...] = ()  # WD-2's ring buffer: mutating steps with a state hash, oldest first
    recent: tuple[Mark, ...] = ()  # every counted step (bounded), to name truncated turns
    last_mutation: str = ""  # the action of the last mutating step: what stagnation blames
    mutations: int = 0  # successful mutating steps so far: has the environment changed since?
    last_state_hash: str = ""  # the latest state hash any counted step reported
    # WD-3: the componentwise best metric vector, when it last improved, mutating steps since.
    best: tuple[float, ...] = ()
    gain_turn: int = 0
    since_gain: int = 0
    trail: tuple[MetricPoint, ...] = ()  # the metric vectors of the epoch, oldest first
    failures: tuple[Failure, ...] = ()  # WD-4, oldest first
    poll: Poll | None = None
    # WD-5: the ladder.
    probation_from: int = 0  # the turn of the last intervention (or of the acknowledged rollback)
    rollbacks: int = 0
    pending_rollback: str = ""  # the level-2 intervention whose acknowledgement is awaited
    acknowledged: tuple[str, ...] = ()
    checkpoint: Mark | None = None  # where the current streak of violations began
    tombstones: tuple[str, ...] = ()
    interventions: int = 0

    def last_seq(self, source: str) -> int:
        return self.last_saga_seq if source == "saga" else self.last_runner_seq

    def failure(self, action_hash: str) -> Failure | None:
        return next((f for f in self.failures if f.action_hash == action_hash), None)

    def checkpoint_before(self, turn: int) -> Mark:
        """The latest state known before `turn`: what a rollback to before that turn restores
        (RUN_START when none is known)."""
        for ring in (self.recent, self.marks):  # recent holds every step; marks reach further back
            found = next((m for m in reversed(ring) if m.turn < turn), None)
            if found is not None:
                return found
        return RUN_START
