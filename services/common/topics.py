"""The topic catalog: every topic Tenure reads or writes, with its settings chosen on purpose.

Nothing relies on broker auto-creation (the bundled broker runs with it switched off). Commands
and events of an aggregate are co-partitioned (same partition count, same key), so the processor
that owns partition N of the commands owns partition N of the events and can rebuild its state
from exactly that partition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from services.common.settings import KafkaSettings

__all__ = [
    "BREAKERS_COMMANDS",
    "BREAKERS_EVENTS",
    "BREAKERS_REJECTIONS",
    "DEADLETTER",
    "INCIDENTS",
    "POLICY",
    "PROGRESS_OBSERVATIONS",
    "QUARANTINE_COMMANDS",
    "QUARANTINE_EVENTS",
    "QUARANTINE_REJECTIONS",
    "RUNS_COMMANDS",
    "RUNS_EVENTS",
    "RUNS_REJECTIONS",
    "RUNS_RENEWALS",
    "RUNS_STATES",
    "SCHEDULES_COMMANDS",
    "SCHEDULES_EVENTS",
    "SCHEDULES_REJECTIONS",
    "TOPICS",
    "TRAJECTORIES_COMMANDS",
    "TRAJECTORIES_EVENTS",
    "TRAJECTORIES_REJECTIONS",
    "WATCHDOG_EVENTS",
    "WATCHDOG_REJECTIONS",
    "TopicSpec",
]

# The deployment's layout, read once: names and partition counts are constants every module uses
# (TENURE_TOPIC_PREFIX, TENURE_TOPIC_PARTITIONS; docs/architecture.md "Production Kafka"). Every
# keyed family (commands, events and rejections of one aggregate) shares the one count, so the
# co-partitioned topics stay equal whatever the operator chooses.
_LAYOUT = KafkaSettings()
_PREFIX = _LAYOUT.topic_prefix
_KEYED_PARTITIONS = _LAYOUT.topic_partitions

_FOREVER = "-1"
_SEVEN_DAYS_MS = str(7 * 24 * 3600 * 1000)
_THIRTY_DAYS_MS = str(30 * 24 * 3600 * 1000)


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: Mapping[str, str] = field(default_factory=dict)
    purpose: str = ""


RUNS_COMMANDS = TopicSpec(
    name=f"{_PREFIX}runs.commands",
    partitions=_KEYED_PARTITIONS,
    # Commands are requests, not the record: once decided, their effect lives in runs.events.
    config={"cleanup.policy": "delete", "retention.ms": _SEVEN_DAYS_MS},
    purpose="Commands for the Run aggregate, keyed by runId.",
)
RUNS_EVENTS = TopicSpec(
    name=f"{_PREFIX}runs.events",
    partitions=RUNS_COMMANDS.partitions,
    # The system of record: never compacted (every version matters), never expired.
    config={"cleanup.policy": "delete", "retention.ms": _FOREVER, "retention.bytes": "-1"},
    purpose="Facts about Runs, keyed by runId, co-partitioned with runs.commands.",
)
RUNS_REJECTIONS = TopicSpec(
    name=f"{_PREFIX}runs.rejections",
    partitions=RUNS_COMMANDS.partitions,
    # A rejection changes no aggregate; it only answers the caller and feeds audits.
    config={"cleanup.policy": "delete", "retention.ms": _THIRTY_DAYS_MS},
    purpose="Commands the Run processor refused, with a specific code, keyed by runId.",
)
RUNS_STATES = TopicSpec(
    name=f"{_PREFIX}runs.states",
    partitions=RUNS_COMMANDS.partitions,
    # A cache of the fold, never the record: the latest state per run is all a restore needs, so
    # compacted; small segments let the cleaner reach the records an active run rewrites often.
    config={
        "cleanup.policy": "compact",
        "retention.ms": _FOREVER,
        "segment.bytes": str(16 * 1024 * 1024),
        "segment.ms": str(3600 * 1000),
        "min.cleanable.dirty.ratio": "0.1",
    },
    purpose="Each Run's latest state, keyed by runId, written with its events: a restore reads it "
    "instead of folding runs.events (services/common/aggregate/changelog.py).",
)
RUNS_RENEWALS = TopicSpec(
    name=f"{_PREFIX}runs.renewals",
    partitions=RUNS_COMMANDS.partitions,
    # LEASE-2's renewal history with a retention of its own (issue 16): the renewals the lease
    # coordinator kept off runs.events (services/common/aggregate/keepalives.py). A restore reads
    # only its tail, from the low-water mark the state changelog names.
    config={"cleanup.policy": "delete", "retention.ms": _THIRTY_DAYS_MS},
    purpose="Lease renewals kept off runs.events (LeaseRenewed), keyed by runId, co-partitioned "
    "with runs.commands: the renewal history (LEASE-2).",
)
DEADLETTER = TopicSpec(
    name=f"{_PREFIX}tenure.deadletter",
    partitions=1,
    # Kept until an operator has looked: an undecodable record is evidence.
    config={"cleanup.policy": "delete", "retention.ms": _FOREVER},
    purpose="Undecodable records with the reason and source topic/partition/offset in headers.",
)

POLICY = TopicSpec(
    name=f"{_PREFIX}tenure.policy",
    partitions=1,
    # The latest block per subject is all that matters: compacted, kept forever.
    config={"cleanup.policy": "compact", "retention.ms": _FOREVER},
    purpose="Block policy (principals, tenants) re-checked when runs are assigned, keyed by subject.",
)

# A run's trajectory lives on its run's partition number (same partition count, same key, same
# tenant-shard routing), so the saga of a run and its lease are owned side by side.
TRAJECTORIES_COMMANDS = TopicSpec(
    name=f"{_PREFIX}trajectories.commands",
    partitions=RUNS_COMMANDS.partitions,
    config={"cleanup.policy": "delete", "retention.ms": _SEVEN_DAYS_MS},
    purpose="Commands for the Trajectory aggregate (the saga of a run), keyed by runId.",
)
TRAJECTORIES_EVENTS = TopicSpec(
    name=f"{_PREFIX}trajectories.events",
    partitions=RUNS_COMMANDS.partitions,
    config={"cleanup.policy": "delete", "retention.ms": _FOREVER, "retention.bytes": "-1"},
    purpose="Facts about trajectories: steps, compensations, recovery decisions; keyed by runId.",
)
TRAJECTORIES_REJECTIONS = TopicSpec(
    name=f"{_PREFIX}trajectories.rejections",
    partitions=RUNS_COMMANDS.partitions,
    config={"cleanup.policy": "delete", "retention.ms": _THIRTY_DAYS_MS},
    purpose="Trajectory commands the saga orchestrator refused (CommandRejected), keyed by runId.",
)
INCIDENTS = TopicSpec(
    name=f"{_PREFIX}tenure.incidents",
    partitions=1,
    # The out-of-band channel operators tail (REC-7): one partition keeps incidents in order.
    config={"cleanup.policy": "delete", "retention.ms": _FOREVER},
    purpose="Structured incidents of frozen trajectories (REC-7), keyed by runId.",
)

# The semantic watchdog of a run (WD-1..WD-6) lives on its run's partition number too: its
# observations, facts and refusals are co-partitioned with the run's trajectory.
PROGRESS_OBSERVATIONS = TopicSpec(
    name=f"{_PREFIX}progress.observations",
    partitions=RUNS_COMMANDS.partitions,
    config={"cleanup.policy": "delete", "retention.ms": _SEVEN_DAYS_MS},
    purpose="Commands for the Watchdog aggregate: step observations (WD-1), rollback acks; keyed by runId.",
)
WATCHDOG_EVENTS = TopicSpec(
    name=f"{_PREFIX}watchdog.events",
    partitions=RUNS_COMMANDS.partitions,
    config={"cleanup.policy": "delete", "retention.ms": _FOREVER, "retention.bytes": "-1"},
    purpose="Facts of the semantic watchdog: observations, detections and interventions; keyed by runId.",
)
WATCHDOG_REJECTIONS = TopicSpec(
    name=f"{_PREFIX}watchdog.rejections",
    partitions=RUNS_COMMANDS.partitions,
    config={"cleanup.policy": "delete", "retention.ms": _THIRTY_DAYS_MS},
    purpose="Watchdog commands the semantic watchdog refused (CommandRejected), keyed by runId.",
)

# One circuit breaker per tool endpoint (BRK-1, BRK-2), keyed by endpoint id and routed by a
# stable hash of it (services.common.routing `partition_for_endpoint`), not by tenant shard:
# a breaker protects the whole fleet, whatever run the calls belong to.
BREAKERS_COMMANDS = TopicSpec(
    name=f"{_PREFIX}breakers.commands",
    partitions=_KEYED_PARTITIONS,
    config={"cleanup.policy": "delete", "retention.ms": _SEVEN_DAYS_MS},
    purpose="Commands for the Breaker aggregate (outcomes, canaries, operator actions), keyed by endpoint.",
)
BREAKERS_EVENTS = TopicSpec(
    name=f"{_PREFIX}breakers.events",
    partitions=BREAKERS_COMMANDS.partitions,
    config={"cleanup.policy": "delete", "retention.ms": _FOREVER, "retention.bytes": "-1"},
    purpose="Facts of the circuit breakers: outcomes, openings, canaries, closings; keyed by endpoint.",
)
BREAKERS_REJECTIONS = TopicSpec(
    name=f"{_PREFIX}breakers.rejections",
    partitions=BREAKERS_COMMANDS.partitions,
    config={"cleanup.policy": "delete", "retention.ms": _THIRTY_DAYS_MS},
    purpose="Breaker commands the breaker processor refused (CommandRejected), keyed by endpoint.",
)

# Blast-radius quarantine (QUA-1..QUA-3): a run's quarantine is keyed by its run id (on its run's
# partition number), a tenant's provenance graph by graph/<tenant> (a stable hash of it); both
# aggregates are the quarantine processor's (services/quarantine).
QUARANTINE_COMMANDS = TopicSpec(
    name=f"{_PREFIX}quarantine.commands",
    partitions=RUNS_COMMANDS.partitions,
    config={"cleanup.policy": "delete", "retention.ms": _SEVEN_DAYS_MS},
    purpose="Commands for quarantines (by runId) and provenance graphs (by graph/<tenant>).",
)
QUARANTINE_EVENTS = TopicSpec(
    name=f"{_PREFIX}quarantine.events",
    partitions=QUARANTINE_COMMANDS.partitions,
    config={"cleanup.policy": "delete", "retention.ms": _FOREVER, "retention.bytes": "-1"},
    purpose="Facts of quarantines (triggers, stages, clearings) and of artifacts' envelopes and taint.",
)
QUARANTINE_REJECTIONS = TopicSpec(
    name=f"{_PREFIX}quarantine.rejections",
    partitions=QUARANTINE_COMMANDS.partitions,
    config={"cleanup.policy": "delete", "retention.ms": _THIRTY_DAYS_MS},
    purpose="Quarantine commands the quarantine processor refused (CommandRejected), keyed by aggregate.",
)

# Schedules (EXE-14), keyed by schedule id and routed by a stable hash of it (services.common.
# routing `partition_for_schedule`); the runs they start go to runs.commands like any other.
SCHEDULES_COMMANDS = TopicSpec(
    name=f"{_PREFIX}schedules.commands",
    partitions=_KEYED_PARTITIONS,
    config={"cleanup.policy": "delete", "retention.ms": _SEVEN_DAYS_MS},
    purpose="Commands for the Schedule aggregate (create, update, pause, resume, trigger, run outcomes).",
)
SCHEDULES_EVENTS = TopicSpec(
    name=f"{_PREFIX}schedules.events",
    partitions=SCHEDULES_COMMANDS.partitions,
    config={"cleanup.policy": "delete", "retention.ms": _FOREVER, "retention.bytes": "-1"},
    purpose="Facts of schedules: definitions, pauses, firings decided, skipped, queued; by schedule id.",
)
SCHEDULES_REJECTIONS = TopicSpec(
    name=f"{_PREFIX}schedules.rejections",
    partitions=SCHEDULES_COMMANDS.partitions,
    config={"cleanup.policy": "delete", "retention.ms": _THIRTY_DAYS_MS},
    purpose="Schedule commands the schedules processor refused (CommandRejected), keyed by schedule id.",
)

TOPICS: tuple[TopicSpec, ...] = (
    RUNS_COMMANDS,
    RUNS_EVENTS,
    RUNS_REJECTIONS,
    RUNS_STATES,
    RUNS_RENEWALS,
    DEADLETTER,
    POLICY,
    TRAJECTORIES_COMMANDS,
    TRAJECTORIES_EVENTS,
    TRAJECTORIES_REJECTIONS,
    INCIDENTS,
    PROGRESS_OBSERVATIONS,
    WATCHDOG_EVENTS,
    WATCHDOG_REJECTIONS,
    BREAKERS_COMMANDS,
    BREAKERS_EVENTS,
    BREAKERS_REJECTIONS,
    QUARANTINE_COMMANDS,
    QUARANTINE_EVENTS,
    QUARANTINE_REJECTIONS,
    SCHEDULES_COMMANDS,
    SCHEDULES_EVENTS,
    SCHEDULES_REJECTIONS,
)
