"""The saga orchestrator's pure core: the Trajectory aggregate, its tools and its recovery policy.

No I/O and no clock reads anywhere below: time, statistics and the tool catalog come in as
values (SagaContext), and `decide`/`evolve` are total functions of them.
"""

from services.saga_orchestrator.domain.codes import BY_STATUS, TrajectoryRejectionCode, code_for_status
from services.saga_orchestrator.domain.decide import Decision, decide
from services.saga_orchestrator.domain.emitter import Rejection, SagaContext
from services.saga_orchestrator.domain.evolve import evolve, fold
from services.saga_orchestrator.domain.lifecycle import (
    STEP_TRANSITIONS,
    TRAJECTORY_TRANSITIONS,
    IllegalTransition,
    StepStatus,
    TrajectoryStatus,
)
from services.saga_orchestrator.domain.plan import CompiledPlan, PlanRejected, PlanStep, compile_plan
from services.saga_orchestrator.domain.policy import (
    DEFERRAL_KINDS,
    Budget,
    ErrorClass,
    FailureContext,
    Gate,
    RecoveryAction,
    RecoveryDecision,
    RecoveryPolicy,
    StepError,
    break_even,
    classify,
    decide_recovery,
    deferral_message,
    error_signature,
    is_deferral,
    retry_after_ms,
)
from services.saga_orchestrator.domain.repair_stats import RepairStats
from services.saga_orchestrator.domain.state import (
    Incident,
    StepState,
    TrajectoryState,
    compensation_key,
    step_key,
)
from services.saga_orchestrator.domain.tools import (
    Cost,
    RegistrationRefused,
    Reversibility,
    ToolCatalog,
    ToolSpec,
    load_catalog,
)
from services.saga_orchestrator.domain.work import (
    DispatchStep,
    EvaluateGate,
    RevokeLease,
    RunCompensator,
    Work,
    pending_work,
)

__all__ = [
    "BY_STATUS",
    "DEFERRAL_KINDS",
    "STEP_TRANSITIONS",
    "TRAJECTORY_TRANSITIONS",
    "Budget",
    "CompiledPlan",
    "Cost",
    "Decision",
    "DispatchStep",
    "ErrorClass",
    "EvaluateGate",
    "FailureContext",
    "Gate",
    "IllegalTransition",
    "Incident",
    "PlanRejected",
    "PlanStep",
    "RecoveryAction",
    "RecoveryDecision",
    "RecoveryPolicy",
    "RegistrationRefused",
    "Rejection",
    "RepairStats",
    "Reversibility",
    "RevokeLease",
    "RunCompensator",
    "SagaContext",
    "StepError",
    "StepState",
    "StepStatus",
    "ToolCatalog",
    "ToolSpec",
    "TrajectoryRejectionCode",
    "TrajectoryState",
    "TrajectoryStatus",
    "Work",
    "break_even",
    "classify",
    "code_for_status",
    "compensation_key",
    "compile_plan",
    "decide",
    "decide_recovery",
    "deferral_message",
    "error_signature",
    "evolve",
    "fold",
    "is_deferral",
    "load_catalog",
    "pending_work",
    "retry_after_ms",
    "step_key",
]
