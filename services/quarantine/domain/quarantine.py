"""A run's quarantine (QUA-1): decide and evolve, pure.

The trigger (`StartQuarantine`) is the recorded intent of every control-plane stage: the
processor sends, in the transaction that records QuarantineStarted, the lease takeover (stage 2,
an epoch bump through the lease coordinator), the trajectory's freeze without compensation, and
the taint of the run's artifacts (stage 4, to the tenant's provenance graph). Stages are then
recorded once each (idempotent on run and stage): a repeat changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

from services.common.contracts.quarantine import (
    MAX_EVIDENCE_CHARS,
    MAX_REASON_CHARS,
    MECHANISMS,
    STAGES,
    TRIGGERS,
    ClearQuarantine,
    QuarantineCleared,
    QuarantineRejectionCode,
    QuarantineStageCompleted,
    QuarantineStarted,
    RecordQuarantineStage,
    StartQuarantine,
)
from services.quarantine.domain.common import Rejection, header, remember
from services.quarantine.domain.lifecycle import QuarantineStatus, check_transition
from services.quarantine.domain.state import MAX_RECENT, QuarantineState, Stage

__all__ = ["CLEARING_ROLES", "RunCommand", "RunEvent", "decide_run", "evolve_run"]

C = QuarantineRejectionCode
Q = QuarantineStatus
RunCommand = StartQuarantine | RecordQuarantineStage | ClearQuarantine
RunEvent = QuarantineStarted | QuarantineStageCompleted | QuarantineCleared
CLEARING_ROLES = ("operator", "verifier")


def _json_or_empty(text: str) -> bool:
    if not text:
        return True
    try:
        json.loads(text)
    except ValueError:
        return False
    return len(text) <= MAX_EVIDENCE_CHARS


def _invalid(command: RunCommand) -> str:
    if isinstance(command, StartQuarantine):
        if command.trigger not in TRIGGERS:
            return f"trigger must be one of {', '.join(TRIGGERS)}"
        if not 1 <= len(command.reason) <= MAX_REASON_CHARS:
            return f"reason must be 1..{MAX_REASON_CHARS} characters"
        if not command.tenant:
            return "tenant is required"
        if command.taint_from_step < -1 or command.taint_from_at < 0:
            return "taintFromStep must be >= -1 and taintFromAt >= 0"
        if command.taint_from_step >= 0 and command.taint_from_at > 0:
            return "t_taint is a step or a time, not both"
        if not _json_or_empty(command.evidence):
            return "evidence must be canonical JSON of at most 64000 characters"
    elif isinstance(command, RecordQuarantineStage):
        if command.stage not in STAGES:
            return f"stage must be one of {', '.join(STAGES)}"
        if command.mechanism not in MECHANISMS:
            return f"mechanism must be one of {', '.join(MECHANISMS)}"
        if not _json_or_empty(command.detail):
            return "detail must be canonical JSON"
    else:
        if not 1 <= len(command.reason) <= MAX_REASON_CHARS:
            return f"reason must be 1..{MAX_REASON_CHARS} characters"
        if not _json_or_empty(command.evidence):
            return "evidence must be canonical JSON of at most 64000 characters"
    return ""


def decide_run(
    state: QuarantineState | None, command: RunCommand, now_ms: int
) -> Sequence[RunEvent] | Rejection:
    if state is not None and command.command_id in state.recent:
        return ()  # a redelivery of a command already decided
    invalid = _invalid(command)
    if invalid:
        return Rejection(C.INVALID_COMMAND, invalid)
    version = (state.version if state is not None else 0) + 1
    status = state.status if state is not None else Q.NONE
    if isinstance(command, StartQuarantine):
        if status is Q.QUARANTINED:
            assert state is not None
            return Rejection(
                C.ALREADY_QUARANTINED,
                f"run {command.run_id} is quarantined already (trigger {state.trigger}, by "
                f"{state.triggered_by}): its stages run; clear it first to quarantine it again",
            )
        return (
            QuarantineStarted(
                **header(command, version, QuarantineStarted, now_ms),
                trigger=command.trigger,
                reason=command.reason,
                evidence=command.evidence,
                tenant=command.tenant,
                holder=command.holder,
                lease_epoch=command.lease_epoch,
                attempt_id=command.attempt_id,
                taint_from_step=command.taint_from_step,
                taint_from_at=command.taint_from_at,
            ),
        )
    if state is None:
        return Rejection(C.NOT_QUARANTINED, f"run {command.run_id} was never quarantined")
    if isinstance(command, RecordQuarantineStage):
        if state.stage(command.stage) is not None:  # idempotent on (run, stage): the first stands
            return Rejection(C.NOTHING_TO_DO, f"stage {command.stage} of run {command.run_id} is recorded")
        return (
            QuarantineStageCompleted(
                **header(command, version, QuarantineStageCompleted, now_ms),
                stage=command.stage,
                mechanism=command.mechanism,
                completed_at=command.completed_at,
                host_id=command.host_id,
                detail=command.detail,
            ),
        )
    if status is not Q.QUARANTINED:
        return Rejection(C.NOT_QUARANTINED, f"run {command.run_id} is not quarantined (it is {status.value})")
    if command.role not in CLEARING_ROLES:
        return Rejection(C.CLEARING_FORBIDDEN, "only an operator or an independent verifier may clear")
    if command.actor and command.actor == state.holder:
        # The seed's common mistake: clearing taint on the model's own self-check.
        return Rejection(
            C.CLEARING_FORBIDDEN,
            f"{command.actor} is the quarantined run's own principal: it may not clear it",
        )
    return (
        QuarantineCleared(
            **header(command, version, QuarantineCleared, now_ms),
            reason=command.reason,
            evidence=command.evidence,
            role=command.role,
            artifact_ids=command.artifact_ids,
        ),
    )


def evolve_run(state: QuarantineState | None, event: RunEvent) -> QuarantineState:
    before = state.status if state is not None else Q.NONE
    expected = (state.version if state is not None else 0) + 1
    if event.version != expected:
        raise ValueError(f"quarantine {event.run_id}: version {event.version} after {expected - 1}")
    recent = remember(state.recent if state is not None else (), event.causation_id, MAX_RECENT)
    if isinstance(event, QuarantineStarted):
        check_transition(before, Q.QUARANTINED)
        return QuarantineState(
            run_id=event.run_id,
            version=event.version,
            status=Q.QUARANTINED,
            tenant=event.tenant,
            trigger=event.trigger,
            reason=event.reason,
            evidence=event.evidence,
            triggered_by=event.actor,
            triggered_at=event.occurred_at,
            quarantine_event_id=event.event_id,
            holder=event.holder,
            lease_epoch=event.lease_epoch,
            attempt_id=event.attempt_id,
            taint_from_step=event.taint_from_step,
            taint_from_at=event.taint_from_at,
            episodes=(state.episodes if state is not None else 0) + 1,
            recent=recent,
        )
    if state is None:
        raise ValueError(f"quarantine {event.run_id}: {type(event).__name__} before any trigger")
    if isinstance(event, QuarantineStageCompleted):
        check_transition(before, before)
        stage = Stage(
            event.stage,
            event.mechanism,
            event.completed_at,
            event.occurred_at,
            event.host_id,
            event.detail,
            event.actor,
        )
        return replace(state, version=event.version, stages=(*state.stages, stage), recent=recent)
    check_transition(before, Q.CLEARED)
    return replace(
        state,
        version=event.version,
        status=Q.CLEARED,
        cleared_by=event.actor,
        cleared_role=event.role,
        cleared_reason=event.reason,
        cleared_evidence=event.evidence,
        cleared_at=event.occurred_at,
        recent=recent,
    )
