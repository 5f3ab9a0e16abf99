"""Per-aggregate ordering rules every consumer of an event stream applies.

Versions increase by exactly one per aggregate. A version at or below the one already applied is
a duplicate (a redelivery) and is dropped; a version more than one ahead means events are missing,
and applying it would silently build a wrong state, so it is refused loudly.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Sequencing", "VersionGap", "sequence"]


class Sequencing(Enum):
    APPLY = "apply"
    DUPLICATE = "duplicate"


class VersionGap(Exception):
    def __init__(self, aggregate_id: str, current: int, received: int) -> None:
        super().__init__(
            f"aggregate {aggregate_id} is at version {current} but received version {received}: "
            f"versions {current + 1}..{received - 1} are missing"
        )
        self.aggregate_id = aggregate_id
        self.current = current
        self.received = received


def sequence(aggregate_id: str, current: int, received: int) -> Sequencing:
    if received <= current:
        return Sequencing.DUPLICATE
    if received != current + 1:
        raise VersionGap(aggregate_id, current, received)
    return Sequencing.APPLY
