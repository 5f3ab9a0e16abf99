"""The saga's rejection codes, and the one a trajectory's status gives a command it does not allow.

TrajectoryRejectionCode itself lives in the contracts package, so that the API can map its members
to problem types without importing this domain; it is re-exported here for the domain's use.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.common.contracts import TrajectoryRejectionCode
from services.saga_orchestrator.domain.lifecycle import TrajectoryStatus

__all__ = ["BY_STATUS", "TrajectoryRejectionCode", "code_for_status"]

_C = TrajectoryRejectionCode
_T = TrajectoryStatus
# Spelled out, not built as f"TRAJECTORY_{status.name}", so that every code can be found by name.
BY_STATUS: Mapping[TrajectoryStatus, TrajectoryRejectionCode] = {
    _T.FORWARD: _C.TRAJECTORY_FORWARD,
    _T.AWAITING_REPAIR: _C.TRAJECTORY_AWAITING_REPAIR,
    _T.AWAITING_APPROVAL: _C.TRAJECTORY_AWAITING_APPROVAL,
    _T.POST_PIVOT: _C.TRAJECTORY_POST_PIVOT,
    _T.UNWINDING: _C.TRAJECTORY_UNWINDING,
    _T.COMPLETED: _C.TRAJECTORY_COMPLETED,
    _T.ROLLED_BACK: _C.TRAJECTORY_ROLLED_BACK,
    _T.FROZEN: _C.TRAJECTORY_FROZEN,
    _T.ABANDONED: _C.TRAJECTORY_ABANDONED,
}


def code_for_status(status: TrajectoryStatus) -> TrajectoryRejectionCode:
    """The code refusing a command that the trajectory's `status` does not allow."""
    return BY_STATUS[status]
