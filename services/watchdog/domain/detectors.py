"""The detectors (WD-2..WD-4): pure functions of the state before an observation and the observation.

Each answers a Detection with its evidence, or None. What they deliberately do not call a loop:
  * a transient error (error kind "transient": 429, 5xx, a timeout) is the breakers' business and
    never reaches a detector;
  * a declared poll whose observation changes is progress; only a poll that keeps observing the
    same thing more than `poll_patience` times in a row is a violation;
  * a revert is backtracking, not yet a loop: a state returned to is a cycle only when the same
    action produced it again (H_t == H_{t-k} and a_t == a_{t-k}), or when the orbit repeats
    (H_t == H_{t-k} and H_{t-1} == H_{t-k-1}). The seed's "edit line 42, revert, edit again" is
    caught at the re-edit; "edit, revert, a different edit" never is;
  * a metric that drops and recovers once is a repair; oscillation is a transition the metric
    vector makes again (4 -> 3 -> 4 -> 3: caught at the second drop) without a new best;
  * a failing action re-issued after the environment changed is a retry that may work (running
    the failing tests again after an edit): only a repeat that fails again in the same state is
    re-issuing a known-bad request (WD-4).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from services.common.contracts import ObserveStep
from services.watchdog.domain.state import Mark, MetricPoint, WatchdogState
from services.watchdog.domain.thresholds import Thresholds

__all__ = [
    "APPLICATION",
    "TRANSIENT",
    "Detection",
    "Detector",
    "current_state",
    "detect",
    "find_cycle",
    "find_oscillation",
    "summary_digest",
]

TRANSIENT = "transient"
APPLICATION = "application"


class Detector(StrEnum):
    CYCLE = "cycle"
    STAGNATION = "stagnation"
    OSCILLATION = "oscillation"
    REPEATED_BAD_ACTION = "repeated-bad-action"


@dataclass(frozen=True)
class Detection:
    """A violation and its evidence.

    `returned_to_step`/`returned_to_turn`: the step this observation repeats (the state, metric
    vector, failing action or poll it is equal to); `since_turn`: the first turn of the
    unproductive stretch, so the state before it is the checkpoint a rollback restores."""

    detector: Detector
    period: int
    returned_to_step: int
    returned_to_turn: int
    since_turn: int
    repeated_hashes: tuple[str, ...]
    window: tuple[Mark, ...]
    metric_history: tuple[tuple[float, ...], ...]
    detail: str


def current_state(state: WatchdogState, obs: ObserveStep) -> str:
    """The state `obs` was taken in: the hash it reports, else the latest one known."""
    return obs.state_hash or state.last_state_hash


def summary_digest(summary: str) -> str:
    return hashlib.sha256(summary.encode("utf-8")).hexdigest()[:16]


def detect(state: WatchdogState, obs: ObserveStep, turn: int) -> Detection | None:
    """The first violation `obs` reveals against `state` (the state before it), or None."""
    if obs.error_kind == TRANSIENT:
        return None
    th = state.thresholds
    if obs.polling:
        return _idle_poll(state, obs, th)
    # A failing request repeated in the same state is WD-4's case before it is a period-1 orbit.
    return _repeated_bad_action(state, obs, th) or _cycle(state, obs, th) or _metrics(state, obs, th)


# --- WD-2: period-k cycles over the state hashes ------------------------------------------------


def find_cycle(
    marks: Sequence[Mark], state_hash: str, action_hash: str, max_period: int
) -> tuple[int, int] | None:
    """(period k, index in `marks` where the orbit was entered) for the state `state_hash` reached
    by `action_hash` after `marks`, or None. The smallest k wins."""
    for k in range(1, min(max_period, len(marks)) + 1):
        earlier = marks[-k]
        if earlier.state_hash != state_hash:
            continue
        same_action = earlier.action_hash == action_hash
        orbit_again = k < len(marks) and marks[-1].state_hash == marks[-k - 1].state_hash
        if same_action or orbit_again:
            steps = [(m.state_hash, m.action_hash) for m in marks] + [(state_hash, action_hash)]
            return k, _orbit_entry(steps, k)
    return None


def _orbit_entry(steps: list[tuple[str, str]], k: int) -> int:
    """The earliest index from which the (state, action) steps repeat with period k up to the
    end: where the loop's first step is. A state equal to a later one but reached by another
    action (the setup that first made it) is where the loop started from, not part of it."""
    entry = len(steps) - 1 - k
    while entry > 0 and steps[entry - 1] == steps[entry - 1 + k]:
        entry -= 1
    return entry


def _cycle(state: WatchdogState, obs: ObserveStep, th: Thresholds) -> Detection | None:
    if not obs.mutating or not obs.state_hash or obs.error_kind == APPLICATION:
        return None
    marks = state.marks
    found = find_cycle(marks, obs.state_hash, obs.action_hash, th.max_period)
    if found is None:
        return None
    k, entry = found
    earlier = marks[-k]
    return Detection(
        detector=Detector.CYCLE,
        period=k,
        returned_to_step=earlier.step_seq,
        returned_to_turn=earlier.turn,
        since_turn=marks[entry].turn,
        repeated_hashes=tuple(m.state_hash for m in marks[-k:]),
        window=marks,
        metric_history=(),
        detail=(
            f"period-{k} orbit: the state after step {obs.step_seq} ({obs.state_hash[:12]}) is the state "
            f"after step {earlier.step_seq}, {k} mutating step(s) earlier, with zero net change"
        ),
    )


# --- WD-4: re-issuing a known-bad request --------------------------------------------------------


def _repeated_bad_action(state: WatchdogState, obs: ObserveStep, th: Thresholds) -> Detection | None:
    if obs.error_kind != APPLICATION:
        return None
    failed = state.failure(obs.action_hash)
    if failed is None or not failed.same_state(current_state(state, obs), state.mutations):
        return None  # never failed, or failed in another state: the retry may well work now
    if failed.repeats + 1 < th.repeat_count:
        return None
    return Detection(
        detector=Detector.REPEATED_BAD_ACTION,
        period=0,
        returned_to_step=failed.step_seq,
        returned_to_turn=failed.turn,
        since_turn=failed.turn,
        repeated_hashes=(obs.action_hash,),
        window=state.marks,
        metric_history=(),
        detail=(
            f"{obs.tool} ({obs.action_hash}) failed again at step {obs.step_seq}: the same request "
            f"failed at step {failed.step_seq} and has now failed {failed.repeats + 2} times"
        ),
    )


# --- WD-3: metric stagnation and oscillation -----------------------------------------------------


def find_oscillation(
    trail: Sequence[MetricPoint], values: tuple[float, ...], max_period: int
) -> tuple[int, int] | None:
    """(period, index i in `trail`) when the move trail[-1] -> values repeats the earlier move
    trail[i-1] -> trail[i] within `max_period` points, else None."""
    if len(trail) < 2 or trail[-1].values == values:
        return None
    last = trail[-1].values
    for i in range(len(trail) - 1, 0, -1):
        period = len(trail) - i
        if period > max_period:
            return None
        if trail[i - 1].values == last and trail[i].values == values:
            return period, i
    return None


def _metrics(state: WatchdogState, obs: ObserveStep, th: Thresholds) -> Detection | None:
    values = tuple(obs.metrics)
    best = state.best
    if not values or len(values) != len(best):
        return None  # nothing measured, or a new metric set: a new epoch starts
    if any(v > b for v, b in zip(values, best, strict=True)):
        return None  # a positive gain in some component: progress
    trail = state.trail
    history = (*(p.values for p in trail), values)
    oscillation = find_oscillation(trail, values, th.max_period)
    if oscillation is not None:
        period, i = oscillation
        return Detection(
            detector=Detector.OSCILLATION,
            period=period,
            returned_to_step=trail[i].step_seq,
            returned_to_turn=trail[i].turn,
            since_turn=trail[i - 1].turn + 1,
            repeated_hashes=(),
            window=state.marks,
            metric_history=history,
            detail=(
                f"the metrics moved {_show(trail[-1].values)} -> {_show(values)} at step {obs.step_seq}, "
                f"the move they made at step {trail[i].step_seq}, without a new best {_show(best)}"
            ),
        )
    since = state.since_gain + (1 if obs.mutating else 0)
    if since < th.epoch_steps:
        return None
    gain = next((p for p in trail if p.turn == state.gain_turn), None)
    return Detection(
        detector=Detector.STAGNATION,
        period=0,
        returned_to_step=gain.step_seq if gain is not None else -1,
        returned_to_turn=state.gain_turn,
        since_turn=state.gain_turn + 1,
        repeated_hashes=(),
        window=state.marks,
        metric_history=history,
        detail=(
            f"{since} mutating steps without a gain in any metric (epoch E={th.epoch_steps}): "
            f"{_show(values)} at step {obs.step_seq}, best {_show(best)}"
        ),
    )


def _show(values: tuple[float, ...]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


# --- declared polling ----------------------------------------------------------------------------


def _idle_poll(state: WatchdogState, obs: ObserveStep, th: Thresholds) -> Detection | None:
    poll = state.poll
    if (
        poll is None
        or poll.action_hash != obs.action_hash
        or poll.summary_digest != summary_digest(obs.summary)
    ):
        return None  # a poll whose observation changed: progress
    idle = poll.idle + 1
    if idle <= th.poll_patience:
        return None
    return Detection(
        detector=Detector.STAGNATION,
        period=1,
        returned_to_step=poll.step_seq,
        returned_to_turn=poll.turn,
        since_turn=poll.turn + 1,
        repeated_hashes=(obs.action_hash,),
        window=state.marks,
        metric_history=(),
        detail=(
            f"the poll {obs.tool} ({obs.action_hash}) observed the same thing {idle + 1} times in a row "
            f"since step {poll.step_seq} (patience {th.poll_patience})"
        ),
    )
