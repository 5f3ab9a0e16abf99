"""The header fields every command and every event starts with, and the wire namespaces.

Kept apart from the themed contract modules so each of them can build on the headers while
runs.py, which holds the one wire mapping table, imports them all without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "COMMANDS_NS",
    "EVENTS_NS",
    "INCIDENTS_NS",
    "POLICY_EVENTS_NS",
    "REJECTIONS_NS",
    "TRAJECTORY_COMMANDS_NS",
    "TRAJECTORY_EVENTS_NS",
    "WATCHDOG_COMMANDS_NS",
    "WATCHDOG_EVENTS_NS",
    "CommandHeader",
    "EventHeader",
]

COMMANDS_NS = "tenure.runs.commands"
EVENTS_NS = "tenure.runs.events"
REJECTIONS_NS = "tenure.runs.rejections"
POLICY_EVENTS_NS = "tenure.policy.events"
TRAJECTORY_COMMANDS_NS = "tenure.trajectories.commands"
TRAJECTORY_EVENTS_NS = "tenure.trajectories.events"
INCIDENTS_NS = "tenure.incidents.events"
WATCHDOG_COMMANDS_NS = "tenure.watchdog.commands"
WATCHDOG_EVENTS_NS = "tenure.watchdog.events"


@dataclass(frozen=True, kw_only=True)
class CommandHeader:
    """Fields every command carries first, in this order, as its schema lists them."""

    command_id: str
    run_id: str
    issued_at: int
    correlation_id: str
    actor: str


@dataclass(frozen=True, kw_only=True)
class EventHeader:
    """Fields every event carries first, in this order, as its schema lists them."""

    event_id: str
    run_id: str
    version: int
    occurred_at: int
    causation_id: str
    correlation_id: str
    actor: str
