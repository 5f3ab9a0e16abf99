"""The quarantine's and the artifact's lifecycles: every pair of the transition tables (QUA-1, QUA-2)."""

from __future__ import annotations

import itertools

import pytest

from services.quarantine.domain import (
    ARTIFACT_TRANSITIONS,
    TRANSITIONS,
    ArtifactStatus,
    IllegalTransition,
    QuarantineStatus,
    check_artifact_transition,
    check_transition,
)

ALLOWED_QUARANTINE = {
    ("none", "quarantined"),
    ("quarantined", "quarantined"),
    ("quarantined", "cleared"),
    ("cleared", "cleared"),
    ("cleared", "quarantined"),
}
ALLOWED_ARTIFACT = {
    ("UNTAINTED", "UNTAINTED"),
    ("UNTAINTED", "SUSPECT"),
    ("UNTAINTED", "TAINTED"),
    ("SUSPECT", "SUSPECT"),
    ("SUSPECT", "TAINTED"),
    ("SUSPECT", "CLEARED"),
    ("TAINTED", "TAINTED"),
    ("TAINTED", "CLEARED"),
    ("CLEARED", "CLEARED"),
    ("CLEARED", "TAINTED"),
    ("CLEARED", "SUSPECT"),
}


@pytest.mark.parametrize(("before", "after"), list(itertools.product(QuarantineStatus, QuarantineStatus)))
def test_every_quarantine_transition_is_allowed_or_refused_by_the_table_QUA_1(
    before: QuarantineStatus, after: QuarantineStatus
) -> None:
    if (before.value, after.value) in ALLOWED_QUARANTINE:
        assert check_transition(before, after) is after
    else:
        with pytest.raises(IllegalTransition):
            check_transition(before, after)


@pytest.mark.parametrize(("before", "after"), list(itertools.product(ArtifactStatus, ArtifactStatus)))
def test_every_artifact_taint_transition_is_allowed_or_refused_by_the_table_QUA_2(
    before: ArtifactStatus, after: ArtifactStatus
) -> None:
    if (before.value, after.value) in ALLOWED_ARTIFACT:
        assert check_artifact_transition(before, after) is after
    else:
        with pytest.raises(IllegalTransition):
            check_artifact_transition(before, after)


def test_the_tables_cover_every_status_and_nothing_returns_to_untainted() -> None:
    assert set(TRANSITIONS) == set(QuarantineStatus)
    assert set(ARTIFACT_TRANSITIONS) == set(ArtifactStatus)
    assert all(
        ArtifactStatus.UNTAINTED not in targets
        for status, targets in ARTIFACT_TRANSITIONS.items()
        if status is not ArtifactStatus.UNTAINTED
    )
    assert QuarantineStatus.NONE not in set().union(*TRANSITIONS.values())
