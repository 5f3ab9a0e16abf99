"""Outcome of every trajectory, from the environment's audit (pure), and the scoreboard's metrics.

No outcome is self-reported. The environment knows every resource and every effect it received;
each resource carries the work id that created it and its parameters, and every planned turn's
payload holds a value unique to (trajectory, turn) in its key field (workload.KEY_FIELDS), so a
resource maps back to the turn that created it. The runners' reports only say what a runner
*believed* (which turns it held committed, the incident it raised) and when things happened.

Per trajectory, in this order:

- corrupted, when any of:
  - ``duplicate-effect``: a turn's effect stands more than once at the end (two VMs, two holds,
    two messages for one turn). A resource compensated and made again by a clean re-run is not a
    duplicate; the environment's own count of semantic duplicates (the same payload applied
    twice under different keys, released or not) is reported beside it;
  - ``orphaned-resource``: a resource left in the world that nobody owns: not part of a completed
    trajectory's reported result, not listed by an escalation's incident (every resource left by
    an aborted or failed trajectory is an orphan, a pivot's DNS record included);
  - ``lost-committed-turn``: a turn a runner reported committed before a kill that the recovered
    trajectory neither holds (its final report or incident) nor compensated (RPO);
  - ``missing-effect``: the runner says completed but a planned turn left nothing in the world;
  - ``incorrect-incident``: an escalation whose incident does not list exactly what is left.
- completed: the runner reported completed and the world holds each planned turn's effect.
- escalated: the runner escalated with a correct incident (it lists every resource left behind,
  and nothing that is gone).
- cleanly aborted: otherwise, when nothing of the trajectory is left in the world (every committed
  effect was compensated, or nothing committed): the environment is semantically back at its start.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.faults.workload import TrajectorySpec

__all__ = [
    "OUTCOMES",
    "AuditIndex",
    "CommitReport",
    "ConfigResult",
    "FinalReport",
    "KillRecord",
    "TrajectoryOutcome",
    "TrajectoryRecord",
    "WorkAudit",
    "classify",
    "incident_resources",
    "percentile",
    "summarize",
]

OUTCOMES = ("completed", "cleanly-aborted", "escalated", "corrupted")


# --- what the harness saw -----------------------------------------------------------------------


@dataclass(frozen=True)
class CommitReport:
    at: float  # harness monotonic seconds
    turn: int
    resources: tuple[str, ...]
    incarnation: int = 0


@dataclass(frozen=True)
class KillRecord:
    at: float  # harness monotonic seconds, when the SIGKILL was sent
    turn: int  # the turn in flight
    target: str  # "runner" or the Tenure process killed
    point: str = ""
    restart_s: float | None = None  # Tenure processes: until the restarted process answered again


@dataclass(frozen=True)
class FinalReport:
    status: str
    committed_turns: tuple[int, ...] = ()
    committed_resources: tuple[str, ...] = ()
    incident: Mapping[str, Any] | None = None
    detail: str = ""
    runner_error: str = ""

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> FinalReport:
        incident = event.get("incident")
        return cls(
            status=str(event.get("status", "failed")),
            committed_turns=tuple(int(t) for t in event.get("committed_turns") or ()),
            committed_resources=tuple(str(r) for r in event.get("committed_resources") or ()),
            incident=incident if isinstance(incident, Mapping) else None,
            detail=str(event.get("detail", "")),
            runner_error=str(event.get("runner_error", "")),
        )


@dataclass
class TrajectoryRecord:
    """Everything the harness saw of one trajectory (mutable while it runs)."""

    spec: TrajectorySpec
    work_ids: list[str] = field(default_factory=list)
    started_at: float | None = None
    ended_at: float | None = None
    incarnations: int = 0
    commits: list[CommitReport] = field(default_factory=list)
    kills: list[KillRecord] = field(default_factory=list)
    final: FinalReport | None = None
    timed_out: bool = False

    def add_work_id(self, work: str) -> None:
        if work and work not in self.work_ids:
            self.work_ids.append(work)


# --- the audit ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditResource:
    resource_id: str
    kind: str
    operation: str
    work_id: str
    params: Mapping[str, Any]
    state: str  # "live", "released" or "permanent"

    @classmethod
    def from_json(cls, body: Mapping[str, Any], state: str) -> AuditResource:
        return cls(
            str(body["id"]),
            str(body.get("kind", "")),
            str(body.get("operation", "")),
            str(body.get("workId", "")),
            dict(body.get("params") or {}),
            state,
        )


@dataclass(frozen=True)
class WorkAudit:
    """The environment's audit limited to one trajectory's work ids."""

    resources: tuple[AuditResource, ...] = ()
    semantic_duplicates: int = 0  # extra applications of the same (work, operation, payload)

    def by_state(self, state: str) -> list[AuditResource]:
        return [r for r in self.resources if r.state == state]


class AuditIndex:
    """``GET /audit`` of the whole environment, indexed by work id."""

    def __init__(self, audit: Mapping[str, Any]) -> None:
        self._resources: dict[str, list[AuditResource]] = {}
        seen: set[str] = set()
        # "permanent" first: a released resource is never permanent, a permanent one never live.
        for state in ("permanent", "live", "released"):
            for body in audit.get(state) or ():
                resource = AuditResource.from_json(body, state)
                if resource.resource_id in seen:
                    continue
                seen.add(resource.resource_id)
                self._resources.setdefault(resource.work_id, []).append(resource)
        self._duplicates: dict[str, int] = {}
        for group in audit.get("semanticDuplicates") or ():
            work = str(group.get("workId", ""))
            self._duplicates[work] = self._duplicates.get(work, 0) + max(0, int(group.get("applied", 0)) - 1)

    def works_of(self, spec: TrajectorySpec) -> list[str]:
        """Every work id that acted for ``spec``, found in the world itself: a trajectory's first
        turn provisions a VM named for it, and no later turn runs before that one committed, so
        each work (run) that left anything behind left that VM."""
        first = spec.steps[0]
        return sorted(
            work
            for work, resources in self._resources.items()
            if any(
                r.operation == first.tool and r.params.get(first.key_field) == first.key_value
                for r in resources
            )
        )

    def for_work(self, work_ids: Iterable[str]) -> WorkAudit:
        works = list(dict.fromkeys(work_ids))
        resources = tuple(r for w in works for r in self._resources.get(w, ()))
        return WorkAudit(resources, sum(self._duplicates.get(w, 0) for w in works))


# --- classification -----------------------------------------------------------------------------


def _ids_in(value: Any) -> set[str]:
    """Every string field ending in "Id" of an output (a dict or its JSON text)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return set()
    if not isinstance(value, Mapping):
        return set()
    return {str(v) for k, v in value.items() if k.endswith("Id") and isinstance(v, str)}


def incident_resources(incident: Mapping[str, Any] | None) -> set[str]:
    """The resource ids an incident lists as left behind: its "resources", or the outputs of its
    "uncompensated" steps (the orchestrator's TrajectoryFrozen format)."""
    if not incident:
        return set()
    listed = incident.get("resources")
    if isinstance(listed, Sequence) and not isinstance(listed, str):
        return {str(r) for r in listed}
    found: set[str] = set()
    uncompensated = incident.get("uncompensated")
    if isinstance(uncompensated, str):
        try:
            uncompensated = json.loads(uncompensated)
        except ValueError:
            uncompensated = []
    for item in uncompensated or ():
        if isinstance(item, Mapping):
            found |= _ids_in(item.get("output"))
    return found


def _turn_of(spec: TrajectorySpec, resource: AuditResource) -> int | None:
    for step in spec.steps:
        if step.tool != resource.operation:
            continue
        if all(resource.params.get(name) == value for name, value in step.identity.items()):
            return step.turn
    return None


@dataclass(frozen=True)
class TrajectoryOutcome:
    trajectory_id: str
    outcome: str
    reported: str  # what the runner said ("no-report" when it said nothing)
    reasons: tuple[str, ...] = ()
    duplicates: int = 0
    orphans: int = 0
    lost_turns: int = 0
    missing_turns: tuple[int, ...] = ()
    stray_resources: int = 0  # resources of the work matching no planned turn


def classify(record: TrajectoryRecord, audit: WorkAudit) -> TrajectoryOutcome:
    """See the module docstring."""
    spec = record.spec
    final = record.final
    reported = final.status if final is not None else ("timeout" if record.timed_out else "no-report")
    per_turn: dict[int, list[AuditResource]] = {}
    stray = 0
    for resource in audit.resources:
        turn = _turn_of(spec, resource)
        if turn is None:
            stray += 1
        else:
            per_turn.setdefault(turn, []).append(resource)
    # A turn's effect standing more than once (a resource rolled back and made again by a clean
    # re-run is not a duplicate; one left standing twice is).
    standing = {turn: [r for r in found if r.state != "released"] for turn, found in per_turn.items()}
    duplicates = sum(len(found) - 1 for found in standing.values() if len(found) > 1)
    left = [r for r in audit.resources if r.state in ("live", "permanent")]
    released = {r.resource_id for r in audit.resources if r.state == "released"}

    listed = incident_resources(final.incident) if final is not None else set()
    if reported == "completed":
        owned = set(final.committed_resources) if final is not None else set()
    elif reported == "escalated":
        owned = listed
    else:
        owned = set()
    orphans = sum(1 for r in left if r.resource_id not in owned)

    # RPO: turns reported committed before a kill that the recovered run neither holds nor undid.
    known = released | listed | (set(final.committed_resources) if final is not None else set())
    last_kill = max((k.at for k in record.kills), default=-math.inf)
    lost_turns = sum(
        1 for commit in record.commits if commit.at < last_kill and not (set(commit.resources) & known)
    )

    reasons: list[str] = []
    if duplicates:
        reasons.append("duplicate-effect")
    if orphans:
        reasons.append("orphaned-resource")
    if lost_turns:
        reasons.append("lost-committed-turn")
    missing: tuple[int, ...] = ()
    if reported == "completed":
        present = {t for t, found in per_turn.items() if any(r.state != "released" for r in found)}
        missing = tuple(step.turn for step in spec.steps if step.turn not in present)
        if missing:
            reasons.append("missing-effect")
        outcome = "completed"
    elif reported == "escalated":
        left_ids = {r.resource_id for r in left}
        if final is None or final.incident is None or not listed <= left_ids or not left_ids <= listed:
            reasons.append("incorrect-incident")
        outcome = "escalated"
    else:
        outcome = "cleanly-aborted"  # only if nothing is left: anything left is an orphan above
    if reasons:
        outcome = "corrupted"
    return TrajectoryOutcome(
        spec.trajectory_id,
        outcome,
        reported,
        tuple(reasons),
        duplicates,
        orphans,
        lost_turns,
        missing,
        stray,
    )


# --- metrics ------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, q in 0..100; NaN when there are no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def recovery_times(record: TrajectoryRecord) -> tuple[list[float], list[float]]:
    """(RTO samples, MTTR samples) of one trajectory's kills.

    RTO: from a kill to the first commit of a turn at or after the turn in flight at the kill (the
    trajectory is back where it was and moving). MTTR: from a kill to that commit or, if none
    comes, to the trajectory's end (it finished, was aborted or timed out)."""
    rto: list[float] = []
    mttr: list[float] = []
    for kill in record.kills:
        progress = min((c.at for c in record.commits if c.at > kill.at and c.turn >= kill.turn), default=None)
        if progress is not None:
            rto.append(progress - kill.at)
            mttr.append(progress - kill.at)
        elif record.ended_at is not None:
            mttr.append(max(0.0, record.ended_at - kill.at))
    return rto, mttr


@dataclass(frozen=True)
class ConfigResult:
    config: str
    trajectories: int
    counts: Mapping[str, int]  # per outcome
    reported: Mapping[str, int]  # per runner-reported status
    reasons: Mapping[str, int]  # per corruption reason (a trajectory may have several)
    duplicates: int
    semantic_duplicates: int
    orphans: int
    rpo_turns: int
    rto: tuple[float, ...]
    mttr: tuple[float, ...]
    runner_kills: int
    tenure_kills: int
    tenure_restart_s: tuple[float, ...]
    turns: int
    wall_s: float
    runner_errors: int
    timeouts: int
    stray_resources: int
    outcomes: tuple[TrajectoryOutcome, ...] = ()

    def rate(self, outcome: str) -> float:
        return 100.0 * self.counts.get(outcome, 0) / self.trajectories if self.trajectories else float("nan")

    @property
    def completion_rate(self) -> float:
        return self.rate("completed")

    @property
    def clean_rate(self) -> float:
        return self.rate("completed") + self.rate("cleanly-aborted")

    @property
    def rto_median(self) -> float:
        return percentile(self.rto, 50)

    @property
    def rto_p99(self) -> float:
        return percentile(self.rto, 99)

    @property
    def mttr_mean(self) -> float:
        return sum(self.mttr) / len(self.mttr) if self.mttr else float("nan")

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "trajectories": self.trajectories,
            "counts": dict(self.counts),
            "reported": dict(self.reported),
            "reasons": dict(self.reasons),
            "completionRate": self.completion_rate,
            "cleanRate": self.clean_rate,
            "duplicates": self.duplicates,
            "semanticDuplicates": self.semantic_duplicates,
            "orphans": self.orphans,
            "rpoTurns": self.rpo_turns,
            "rtoMedianS": self.rto_median,
            "rtoP99S": self.rto_p99,
            "mttrMeanS": self.mttr_mean,
            "runnerKills": self.runner_kills,
            "tenureKills": self.tenure_kills,
            "turns": self.turns,
            "wallS": self.wall_s,
            "runnerErrors": self.runner_errors,
            "timeouts": self.timeouts,
            "strayResources": self.stray_resources,
        }


def summarize(
    config: str, records: Sequence[TrajectoryRecord], audit: AuditIndex, wall_s: float
) -> ConfigResult:
    """Classify every trajectory of one configuration and aggregate the scoreboard's metrics."""
    outcomes: list[TrajectoryOutcome] = []
    counts = dict.fromkeys(OUTCOMES, 0)
    reported: dict[str, int] = {}
    reasons: dict[str, int] = {}
    rto: list[float] = []
    mttr: list[float] = []
    semantic = 0
    for record in records:
        # The runner's reported work ids, the ablations' own, and every one the world knows of.
        works = [*record.work_ids, record.spec.work_id, *audit.works_of(record.spec)]
        work = audit.for_work(works)
        outcome = classify(record, work)
        outcomes.append(outcome)
        counts[outcome.outcome] += 1
        reported[outcome.reported] = reported.get(outcome.reported, 0) + 1
        for reason in outcome.reasons:
            reasons[reason] = reasons.get(reason, 0) + 1
        semantic += work.semantic_duplicates
        samples = recovery_times(record)
        rto.extend(samples[0])
        mttr.extend(samples[1])
    kills = [k for r in records for k in r.kills]
    return ConfigResult(
        config=config,
        trajectories=len(records),
        counts=counts,
        reported=reported,
        reasons=reasons,
        duplicates=sum(o.duplicates for o in outcomes),
        semantic_duplicates=semantic,
        orphans=sum(o.orphans for o in outcomes),
        rpo_turns=sum(o.lost_turns for o in outcomes),
        rto=tuple(rto),
        mttr=tuple(mttr),
        runner_kills=sum(1 for k in kills if k.target == "runner"),
        tenure_kills=sum(1 for k in kills if k.target != "runner"),
        tenure_restart_s=tuple(k.restart_s for k in kills if k.restart_s is not None),
        turns=sum(len(r.commits) for r in records),
        wall_s=wall_s,
        runner_errors=sum(1 for r in records if r.final is not None and r.final.runner_error),
        timeouts=sum(1 for r in records if r.timed_out),
        stray_resources=sum(o.stray_resources for o in outcomes),
        outcomes=tuple(outcomes),
    )
