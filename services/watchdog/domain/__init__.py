"""The semantic watchdog's pure core (WD-1..WD-6): detectors, the intervention ladder, the fold.

No I/O and no clock anywhere below: time comes in as a value and the deployment's thresholds as a
`Thresholds`; `decide` and `evolve` are total functions of them.
"""

from services.watchdog.domain.cost import SEED_LOOP, LoopCost, LoopModel
from services.watchdog.domain.decide import (
    DEADLOCK,
    INTERRUPT,
    ROLLBACK,
    SOURCES,
    Decision,
    Rejection,
    decide,
    validate_observation,
)
from services.watchdog.domain.detectors import (
    APPLICATION,
    TRANSIENT,
    Detection,
    Detector,
    detect,
    find_cycle,
    find_oscillation,
    summary_digest,
)
from services.watchdog.domain.evolve import evolve, fold
from services.watchdog.domain.lifecycle import (
    TRANSITIONS,
    IllegalTransition,
    WatchdogStatus,
    check_transition,
)
from services.watchdog.domain.state import (
    MAX_CONFIGURATIONS,
    MAX_FAILURES,
    MAX_RECENT,
    RUN_START,
    Failure,
    Mark,
    MetricPoint,
    Poll,
    WatchdogState,
)
from services.watchdog.domain.thresholds import (
    BOUNDS,
    DEFAULT_THRESHOLDS,
    KEEP,
    Thresholds,
    out_of_bounds,
    with_overrides,
)

__all__ = [
    "APPLICATION",
    "BOUNDS",
    "DEADLOCK",
    "DEFAULT_THRESHOLDS",
    "INTERRUPT",
    "KEEP",
    "MAX_CONFIGURATIONS",
    "MAX_FAILURES",
    "MAX_RECENT",
    "ROLLBACK",
    "RUN_START",
    "SEED_LOOP",
    "SOURCES",
    "TRANSIENT",
    "TRANSITIONS",
    "Decision",
    "Detection",
    "Detector",
    "Failure",
    "IllegalTransition",
    "LoopCost",
    "LoopModel",
    "Mark",
    "MetricPoint",
    "Poll",
    "Rejection",
    "Thresholds",
    "WatchdogState",
    "WatchdogStatus",
    "check_transition",
    "decide",
    "detect",
    "evolve",
    "find_cycle",
    "find_oscillation",
    "fold",
    "out_of_bounds",
    "summary_digest",
    "validate_observation",
    "with_overrides",
]
