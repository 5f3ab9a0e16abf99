"""The semantic watchdog of a run (WD-1..WD-6): what it is told, and what it decides.

One watchdog per Run: the aggregate id is the runId, and its commands (progress.observations)
and events (watchdog.events) are co-partitioned with the run's, so the watchdog of a run lives
on its run's partition number, like its saga. Hashes travel as lowercase hex: a state snapshot
as 64 digits of SHA-256 (WD-1), an action as 16 digits of xxHash64 of tool id + canonical JSON
arguments (WD-4, services/common/ids.py `action_hash`). Step numbers (`step_seq`) are the
reporter's own: the saga uses the trajectory version of a step's outcome event, a runner its
own strictly increasing turn counter.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, Union

from services.common.contracts._headers import CommandHeader, EventHeader

__all__ = [
    "MAX_METRICS",
    "MAX_SUMMARY_CHARS",
    "WATCHDOG_COMMAND_TYPES",
    "WATCHDOG_EVENT_TYPES",
    "AcknowledgeRollback",
    "ConfigureWatchdog",
    "InterventionIssued",
    "LoopDetected",
    "ObserveStep",
    "RollbackAcknowledged",
    "StepObserved",
    "WatchdogCommand",
    "WatchdogConfigured",
    "WatchdogEvent",
]

# Bounds of one observation: the watchdog keeps a window of them per run, so each must be small.
MAX_SUMMARY_CHARS = 2048
MAX_METRICS = 32

# --- commands (progress.observations) ---------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ObserveStep(CommandHeader):
    """WD-1: one step of a run as the environment saw it, reported after the step.

    `source`: "saga" (a step the orchestrator dispatched) or "runner" (a step the runner did
    itself, e.g. a model turn that only read). `error_kind`: "none", "application" (the tool
    answered with an error: not found, forbidden, a failing test) or "transient" (429, 5xx, a
    timeout: the breakers' business, never counted by the watchdog). `polling`: the action was
    declared as polling (a repeated poll whose observation changes is progress). `mutating`: the
    step may change the environment (only mutating steps feed the cycle and stagnation epochs).
    `metrics`: the verifier metric vector, every component higher-is-better (report an error
    count negated)."""

    source: str
    step_seq: int
    tool: str
    action_hash: str
    state_hash: str = ""
    summary: str = ""
    metrics: tuple[float, ...] = ()
    error_kind: str = "none"
    polling: bool = False
    mutating: bool = True


@dataclass(frozen=True, kw_only=True)
class AcknowledgeRollback(CommandHeader):
    """WD-5 level 2: the runner restored the checkpoint the watchdog asked for."""

    intervention_id: str
    checkpoint_step: int
    restored_state_hash: str = ""


@dataclass(frozen=True, kw_only=True)
class ConfigureWatchdog(CommandHeader):
    """Per-run thresholds within the deployment's bounds; -1 keeps the deployment's value."""

    max_period: int = -1
    window: int = -1
    epoch_steps: int = -1
    repeat_count: int = -1
    rollback_budget: int = -1
    ladder_epoch: int = -1
    poll_patience: int = -1


# --- events (watchdog.events) -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class WatchdogConfigured(EventHeader):
    """The thresholds in force for the run from here on (the first event of every watchdog)."""

    max_period: int
    window: int
    epoch_steps: int
    repeat_count: int
    rollback_budget: int
    ladder_epoch: int
    poll_patience: int
    origin: str


@dataclass(frozen=True, kw_only=True)
class StepObserved(EventHeader):
    """An observation taken in; `turn` counts the run's counted observations (transient errors
    are recorded but not counted)."""

    turn: int
    source: str
    step_seq: int
    tool: str
    action_hash: str
    state_hash: str
    summary: str
    metrics: tuple[float, ...]
    error_kind: str
    polling: bool
    mutating: bool


@dataclass(frozen=True, kw_only=True)
class LoopDetected(EventHeader):
    """WD-2..WD-4: a violation of a progress invariant, with its evidence.

    `detector`: "cycle", "stagnation", "oscillation" or "repeated-bad-action". `period`: the
    orbit's period k (cycle, oscillation; 0 otherwise). `returned_to_step`: the step whose state
    (or metric vector, or failing action) this one repeats; -1 when none. `repeated_hashes`: the
    orbit's state hashes, or the repeated action hash. `window_steps`/`window_hashes`: the ring
    buffer the detector looked at, aligned. `metric_history`: canonical JSON list of the metric
    vectors of the epoch."""

    detection_id: str
    turn: int
    step_seq: int
    detector: str
    period: int
    returned_to_step: int
    action_hash: str
    repeated_hashes: tuple[str, ...]
    window_steps: tuple[int, ...]
    window_hashes: tuple[str, ...]
    metric_history: str
    detail: str


@dataclass(frozen=True, kw_only=True)
class InterventionIssued(EventHeader):
    """WD-5: one rung of the ladder, answering one detection.

    level 1 STATE_OSCILLATION_DETECTED: `message` is the synthetic observation for the runner,
    and its next proposal of `action_hash` is refused. level 2 ROLLBACK_REQUESTED: restore the
    checkpoint taken at `checkpoint_step` (state `checkpoint_state_hash`; -1/"" = the run's
    start; `checkpoint_turn` is the watchdog turn of it, 0 for the start), the `truncated_steps`
    are marked truncated, `action_hash` is tombstoned. level 3
    ERR_SEMANTIC_DEADLOCK: the rollback budget is spent; the trajectory unwinds (before the
    pivot) or freezes with an incident (after it)."""

    intervention_id: str
    detection_id: str
    turn: int
    level: int
    code: str
    detector: str
    action_hash: str
    period: int
    returned_to_step: int
    checkpoint_step: int
    checkpoint_turn: int
    checkpoint_state_hash: str
    truncated_steps: tuple[int, ...]
    rollbacks_used: int
    rollback_budget: int
    message: str


@dataclass(frozen=True, kw_only=True)
class RollbackAcknowledged(EventHeader):
    intervention_id: str
    checkpoint_step: int
    restored_state_hash: str


WatchdogCommand = Union[ObserveStep, AcknowledgeRollback, ConfigureWatchdog]
WatchdogEvent = Union[
    WatchdogConfigured, StepObserved, LoopDetected, InterventionIssued, RollbackAcknowledged
]
WATCHDOG_COMMAND_TYPES: tuple[type[Any], ...] = typing.get_args(WatchdogCommand)
WATCHDOG_EVENT_TYPES: tuple[type[Any], ...] = typing.get_args(WatchdogEvent)
