"""A quarantined run's trajectory freezes without compensation, whatever its pivot state (QUA-1).

services/quarantine sends RecordWatchdogIntervention(level 3, code RUN_QUARANTINED) in the
transaction that records the trigger. Before the pivot a semantic deadlock would unwind the
stack; a quarantine must not: the model is never asked to compensate in that state. The
trajectory freezes, its incident lists the uncompensated effects for an operator, and no
compensator is ever pending.
"""

from __future__ import annotations

import json

from services.common.contracts import RecordWatchdogIntervention, TrajectoryFrozen
from services.saga_orchestrator.domain import RevokeLease, RunCompensator, TrajectoryStatus
from services.saga_orchestrator.domain.interventions import QUARANTINE_CODE
from tests.support.trajectory_saga import Saga, of_type


def _quarantine(saga: Saga) -> tuple[object, ...]:
    return saga.ok(
        RecordWatchdogIntervention,
        intervention_id="itv_q",
        level=3,
        code=QUARANTINE_CODE,
        action_hash="",
        period=0,
        checkpoint_step=-1,
        detector="quarantine",
        detail="quarantine (operator): prompt injection",
        message="[SYSTEM] RUN_QUARANTINED",
    )


def test_before_the_pivot_a_quarantine_freezes_and_runs_no_compensator_QUA_1() -> None:
    saga = Saga()
    saga.deploy_until_pivot()  # four reversible steps committed, their compensators stacked
    stacked = saga.s.stack
    events = _quarantine(saga)
    [frozen] = of_type(events, TrajectoryFrozen)
    assert frozen.failure_mode == "QUARANTINED"
    assert saga.status() is TrajectoryStatus.FROZEN
    uncompensated = json.loads(frozen.uncompensated)
    assert [u["stepIndex"] for u in uncompensated] == list(reversed(stacked))
    assert all(u["compensation"] for u in uncompensated)  # what an operator could run, by hand
    work = saga.work()
    assert not isinstance(work, RunCompensator) and isinstance(work, RevokeLease)
    assert "RecoveryDecided" not in [type(e).__name__ for e in events]


def test_after_the_pivot_a_quarantine_freezes_too_and_a_second_one_changes_nothing_QUA_1() -> None:
    saga = Saga()
    saga.deploy_until_pivot()
    saga.dispatch()  # the pivot (no gate in this catalog's deploy)
    saga.commit()
    assert saga.s.pivot_committed
    [frozen] = of_type(_quarantine(saga), TrajectoryFrozen)
    assert frozen.failure_mode == "QUARANTINED" and saga.status() is TrajectoryStatus.FROZEN
    assert of_type(_quarantine(saga), TrajectoryFrozen) == []
