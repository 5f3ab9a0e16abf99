"""The Run lifecycle: every status and the only transitions between them.

The table is the whole truth: `evolve` refuses any event whose status change is not listed, so a
bug elsewhere cannot move a Run along an edge the spec does not have.
"""

from __future__ import annotations

from enum import StrEnum
from types import MappingProxyType
from typing import Mapping

from services.common.contracts.status import RunStatus

__all__ = [
    "LEASE_TRANSITIONS",
    "TERMINAL_STATUSES",
    "TRANSITIONS",
    "IllegalTransition",
    "LeaseCertainty",
    "RunStatus",
    "check_lease_transition",
    "check_transition",
    "is_allowed",
]


_S = RunStatus

TRANSITIONS: Mapping[RunStatus, frozenset[RunStatus]] = MappingProxyType(
    {
        # EXE-2: a queued run is claimed into preparing; EXE-7: cancel of a queued run ends it at
        # once; EXE-10: the deadline also runs while a continuation waits in the queue.
        _S.QUEUED: frozenset({_S.PREPARING, _S.CANCELLED, _S.FAILED}),
        # EXE-11: preparation errors retry inside preparing, then fail; EXE-5: lease loss interrupts.
        # EXE-11: a preparation error without external effects sends the run back to the queue.
        _S.PREPARING: frozenset({_S.RUNNING, _S.FAILED, _S.CANCELLING, _S.INTERRUPTED, _S.QUEUED}),
        _S.RUNNING: frozenset({_S.SUCCEEDED, _S.FAILED, _S.CANCELLING, _S.WAITING_INPUT, _S.INTERRUPTED}),
        # EXE-7: only the runner's confirmation makes cancelled; without it the run is interrupted.
        # EXE-10: a stop at the deadline, confirmed by the runner, fails the run.
        _S.CANCELLING: frozenset({_S.CANCELLED, _S.INTERRUPTED, _S.FAILED}),
        # EXE-8/EXE-10: an answer queues a continuation; expiry or the deadline fails the run;
        # no runner holds a lease while waiting, so a cancel ends it at once.
        _S.WAITING_INPUT: frozenset({_S.QUEUED, _S.FAILED, _S.CANCELLED}),
        # EXE-5: an interrupted run may be retried as a new Attempt of the same Run, or cancelled.
        # EXE-10: the deadline keeps running while a run waits to be retried.
        _S.INTERRUPTED: frozenset({_S.QUEUED, _S.CANCELLED, _S.FAILED}),
        _S.SUCCEEDED: frozenset(),
        _S.FAILED: frozenset(),
        _S.CANCELLED: frozenset(),
    }
)

TERMINAL_STATUSES: frozenset[RunStatus] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)


class IllegalTransition(Exception):
    def __init__(self, source: RunStatus, target: RunStatus) -> None:
        super().__init__(f"a run cannot go from {source.value} to {target.value}")
        self.source = source
        self.target = target


def is_allowed(source: RunStatus, target: RunStatus) -> bool:
    return target in TRANSITIONS[source]


def check_transition(source: RunStatus, target: RunStatus) -> RunStatus:
    if not is_allowed(source, target):
        raise IllegalTransition(source, target)
    return target


class LeaseCertainty(StrEnum):
    """How sure the coordinator is that the holder still holds its lease (LEASE-2, LEASE-5)."""

    ACTIVE = "active"
    AT_RISK = "at_risk"
    EXPIRED = "expired"
    REVOKED = "revoked"
    RELEASED = "released"


_C = LeaseCertainty

LEASE_TRANSITIONS: Mapping[LeaseCertainty, frozenset[LeaseCertainty]] = MappingProxyType(
    {
        # Missed renewals past a fraction of the TTL make a lease at risk; a renewal restores it.
        _C.ACTIVE: frozenset({_C.AT_RISK, _C.EXPIRED, _C.REVOKED, _C.RELEASED}),
        _C.AT_RISK: frozenset({_C.ACTIVE, _C.EXPIRED, _C.REVOKED, _C.RELEASED}),
        # An ended lease never comes back: a new holder gets a new lease with a higher epoch.
        _C.EXPIRED: frozenset(),
        _C.REVOKED: frozenset(),
        _C.RELEASED: frozenset(),
    }
)


def check_lease_transition(source: LeaseCertainty, target: LeaseCertainty) -> LeaseCertainty:
    if target is not source and target not in LEASE_TRANSITIONS[source]:
        raise ValueError(f"a lease cannot go from {source.value} to {target.value}")
    return target
