"""The lifecycles of a run's quarantine and of an artifact's taint, as enums with transition tables.

A run's quarantine (QUA-1):
NONE         no quarantine was ever triggered (the run has no Quarantine state).
QUARANTINED  triggered; the four stages are done (or re-driven) while it stays here.
CLEARED      an operator or an independent verifier lifted it; a new trigger quarantines again,
             a stage reported late (a runner host that was cut off) is still recorded.

An artifact's taint (QUA-2), the seed's tau(a):
UNTAINTED -> SUSPECT (its producer read a tainted artifact) or TAINTED (its producer was
quarantined within t_taint, or it derives from a tainted artifact); SUSPECT -> TAINTED or
CLEARED; TAINTED -> CLEARED (only an operator or an independent verifier); CLEARED -> TAINTED or
SUSPECT again (a later taint). Nothing ever returns to UNTAINTED: a clearing is a recorded fact.

`evolve` moves only along these tables and raises IllegalTransition otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from services.common.contracts.quarantine import ArtifactStatus

__all__ = [
    "ARTIFACT_TRANSITIONS",
    "TRANSITIONS",
    "ArtifactStatus",
    "IllegalTransition",
    "QuarantineStatus",
    "check_artifact_transition",
    "check_transition",
]


class QuarantineStatus(StrEnum):
    NONE = "none"
    QUARANTINED = "quarantined"
    CLEARED = "cleared"


Q = QuarantineStatus
TRANSITIONS: Mapping[QuarantineStatus, frozenset[QuarantineStatus]] = {
    Q.NONE: frozenset({Q.QUARANTINED}),
    # A stage completed stays quarantined; a clearing ends it.
    Q.QUARANTINED: frozenset({Q.QUARANTINED, Q.CLEARED}),
    # A late stage report; a new trigger.
    Q.CLEARED: frozenset({Q.CLEARED, Q.QUARANTINED}),
}

A = ArtifactStatus
ARTIFACT_TRANSITIONS: Mapping[ArtifactStatus, frozenset[ArtifactStatus]] = {
    A.UNTAINTED: frozenset({A.UNTAINTED, A.SUSPECT, A.TAINTED}),
    A.SUSPECT: frozenset({A.SUSPECT, A.TAINTED, A.CLEARED}),
    A.TAINTED: frozenset({A.TAINTED, A.CLEARED}),
    A.CLEARED: frozenset({A.CLEARED, A.TAINTED, A.SUSPECT}),
}


class IllegalTransition(ValueError):
    pass


def check_transition(before: QuarantineStatus, after: QuarantineStatus) -> QuarantineStatus:
    if after not in TRANSITIONS[before]:
        raise IllegalTransition(f"quarantine: {before.value} -> {after.value} is not allowed")
    return after


def check_artifact_transition(before: ArtifactStatus, after: ArtifactStatus) -> ArtifactStatus:
    if after not in ARTIFACT_TRANSITIONS[before]:
        raise IllegalTransition(f"artifact: {before.value} -> {after.value} is not allowed")
    return after
