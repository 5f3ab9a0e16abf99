"""What both aggregates' decisions share: the rejection value and the event header."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from services.common.contracts.quarantine import QuarantineCommand, QuarantineRejectionCode
from services.common.ids import derived_id

__all__ = ["Rejection", "header", "remember"]

T = TypeVar("T")


@dataclass(frozen=True)
class Rejection:
    code: QuarantineRejectionCode
    detail: str


def header(command: QuarantineCommand, version: int, kind: type[Any], now_ms: int) -> dict[str, Any]:
    """The header of the event of `command` that makes `version` (its id is a pure function of
    the command and the version, so a replayed decision yields the same event)."""
    return {
        "event_id": derived_id("qev", command.command_id, kind.__name__, str(version)),
        "run_id": command.run_id,
        "version": version,
        "occurred_at": now_ms,
        "causation_id": command.command_id,
        "correlation_id": command.correlation_id,
        "actor": command.actor,
    }


def remember(recent: tuple[str, ...], command_id: str, keep: int) -> tuple[str, ...]:
    if command_id in recent:
        return recent
    return (*recent, command_id)[-keep:]
