"""The Run aggregate: `decide` turns a command into events or a rejection, `evolve` folds events.

Both are pure. `now_ms` is the coordinator's clock, read once by the adapter and passed in; every
id is derived from the command that caused it, so deciding the same command on the same state
twice gives identical events (the basis of crash-safe redelivery).
"""

from __future__ import annotations

import json
from typing import Iterable

from services.common.contracts import (
    CancelRun,
    ClaimRun,
    CommandRejected,
    LeaseRenewed,
    ProvideInput,
    RecordEffectIntent,
    RecordEffectOutcome,
    RenewLease,
    ReportAttempt,
    RequestInput,
    RequestUploadGrant,
    RetryRun,
    RunCancelled,
    RunCommand,
    RunEvent,
    RunSubmitted,
    SubmitRun,
    TakeOverLease,
)
from services.common.contracts.status import MAX_ATTEMPTS_LIMIT, MAX_TIMEOUT_SECONDS
from services.common.frozen import replace as replace_fields
from services.common.ids import canonical_json, derived_id, run_id_for, sha256_digest
from services.common.sequencing import Sequencing, sequence
from services.lease_coordinator.domain.inputs import (
    decide_provide_input,
    decide_request_input,
    decide_upload_grant,
    evolve_input,
)
from services.lease_coordinator.domain.lease import (
    decide_claim,
    decide_effect_intent,
    decide_effect_outcome,
    decide_renew,
    decide_report,
    decide_takeover,
    evolve_lease,
    fence,
)
from services.lease_coordinator.domain.lifecycle import (
    TERMINAL_STATUSES,
    RunStatus,
    check_transition,
)
from services.lease_coordinator.domain.state import (
    DEFAULT_POLICY,
    Decision,
    LeasePolicy,
    Rejection,
    RejectionCode,
    RunState,
    TenantLoad,
)
from services.lease_coordinator.domain.stops import decide_cancel_held, decide_retry, evolve_stop

__all__ = [
    "MAX_ATTEMPTS_LIMIT",
    "MAX_TIMEOUT_SECONDS",
    "Decision",
    "Rejection",
    "RejectionCode",
    "RunState",
    "decide",
    "evolve",
    "fold",
    "rejection_event",
]


# --- decide -----------------------------------------------------------------------------------


def decide(
    state: RunState | None,
    command: RunCommand,
    now_ms: int,
    policy: LeasePolicy = DEFAULT_POLICY,
    load: TenantLoad | None = None,
    blocked: frozenset[str] = frozenset(),
) -> Decision:
    """`load` is the tenant's current reservations and `blocked` the block policy's subjects
    ("principal:<name>", "tenant:<id>"), as the processor knows them when it decides (EXE-2)."""
    if state is not None and state.handled(command.command_id):
        return ()
    refused = _admission(state, command, policy, load or TenantLoad(), blocked)
    if refused is not None:
        return refused
    if isinstance(command, SubmitRun):
        return _decide_submit(state, command, now_ms)
    if state is None:
        return Rejection(RejectionCode.RUN_NOT_FOUND, f"run {command.run_id} does not exist")
    if isinstance(command, CancelRun):
        return _decide_cancel(state, command, now_ms, policy)
    if isinstance(command, ClaimRun):
        return decide_claim(state, command, now_ms, policy)
    if isinstance(command, RenewLease):
        return decide_renew(state, command, now_ms)
    if isinstance(command, ReportAttempt):
        return decide_report(state, command, now_ms, policy)
    if isinstance(command, RetryRun):
        return decide_retry(state, command, now_ms)
    if isinstance(command, ProvideInput):
        return decide_provide_input(state, command, now_ms)
    if isinstance(command, (RequestInput, RequestUploadGrant)):
        lease = fence(state, command.attempt_id, command.lease_epoch, now_ms)
        if isinstance(lease, Rejection):
            return lease
        if isinstance(command, RequestInput):
            return decide_request_input(state, command, now_ms, lease)
        return decide_upload_grant(state, command, now_ms, policy, lease)
    if isinstance(command, TakeOverLease):
        return decide_takeover(state, command, now_ms, policy)
    if isinstance(command, RecordEffectIntent):
        return decide_effect_intent(state, command, now_ms)
    if isinstance(command, RecordEffectOutcome):
        return decide_effect_outcome(state, command, now_ms)
    raise TypeError(f"not a Run command: {command!r}")


def _admission(
    state: RunState | None,
    command: RunCommand,
    policy: LeasePolicy,
    load: TenantLoad,
    blocked: frozenset[str],
) -> Rejection | None:
    """EXE-2: a submission needs a queue place, a claim an active slot; over the limit, nothing
    is recorded at all (the refusal changes no state)."""
    if isinstance(command, SubmitRun) and state is None:
        max_queued, _ = policy.limits_for(command.tenant)
        if max_queued and load.queued >= max_queued:
            return Rejection(
                RejectionCode.ADMISSION_QUEUE_FULL,
                f"tenant {command.tenant} already has {load.queued} queued runs (limit {max_queued})",
            )
    if isinstance(command, ClaimRun) and state is not None and state.status is RunStatus.QUEUED:
        # Assignment re-checks the block policy: permissions may have been revoked since submit.
        if f"principal:{state.submitted_by}" in blocked:
            return Rejection(
                RejectionCode.PRINCIPAL_BLOCKED,
                f"run {state.run_id} was submitted by {state.submitted_by}, who is blocked: not assigned",
            )
        if f"tenant:{state.tenant}" in blocked:
            return Rejection(
                RejectionCode.TENANT_BLOCKED, f"tenant {state.tenant} is blocked; run {state.run_id} waits"
            )
        _, max_active = policy.limits_for(state.tenant)
        if max_active and load.active >= max_active:
            return Rejection(
                RejectionCode.ADMISSION_ACTIVE_FULL,
                f"tenant {state.tenant} already has {load.active} active runs (limit {max_active})",
            )
    return None


def _submit_problem(command: SubmitRun) -> Rejection | None:
    if not command.tenant.strip():
        return Rejection(RejectionCode.INVALID_COMMAND, "tenant must not be empty")
    if not command.idempotency_key.strip():
        return Rejection(RejectionCode.INVALID_COMMAND, "idempotencyKey must not be empty")
    if command.run_id != run_id_for(command.tenant, command.idempotency_key):
        return Rejection(
            RejectionCode.RUN_ID_MISMATCH,
            "runId must be derived from tenant and idempotencyKey "
            f"(expected {run_id_for(command.tenant, command.idempotency_key)})",
        )
    if not 1 <= command.timeout_seconds <= MAX_TIMEOUT_SECONDS:
        return Rejection(
            RejectionCode.INVALID_COMMAND,
            f"timeoutSeconds must be between 1 and {MAX_TIMEOUT_SECONDS}, got {command.timeout_seconds}",
        )
    if not 1 <= command.max_attempts <= MAX_ATTEMPTS_LIMIT:
        return Rejection(
            RejectionCode.INVALID_COMMAND,
            f"maxAttempts must be between 1 and {MAX_ATTEMPTS_LIMIT}, got {command.max_attempts}",
        )
    try:
        spec = json.loads(command.execution_spec, parse_constant=_refuse_non_json_number)
    except ValueError as exc:
        return Rejection(RejectionCode.INVALID_COMMAND, f"executionSpec is not JSON: {exc}")
    if not isinstance(spec, dict):
        return Rejection(RejectionCode.INVALID_COMMAND, "executionSpec must be a JSON object")
    return None


def _refuse_non_json_number(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _decide_submit(state: RunState | None, command: SubmitRun, now_ms: int) -> Decision:
    problem = _submit_problem(command)
    if problem is not None:
        return problem
    spec_text = canonical_json(json.loads(command.execution_spec))
    digest = sha256_digest(spec_text)
    if state is not None:
        if state.spec_digest == digest and state.tenant == command.tenant:
            return ()  # the same submission again: same run, nothing new happens
        return Rejection(
            RejectionCode.IDEMPOTENCY_KEY_CONFLICT,
            f"idempotency key {command.idempotency_key!r} already submitted run {state.run_id} "
            f"with spec {state.spec_digest}; this request has spec {digest}",
        )
    return (
        RunSubmitted(
            event_id=derived_id("evt", command.command_id, "RunSubmitted"),
            run_id=command.run_id,
            version=1,
            occurred_at=now_ms,
            causation_id=command.command_id,
            correlation_id=command.correlation_id,
            actor=command.actor,
            tenant=command.tenant,
            idempotency_key=command.idempotency_key,
            execution_spec=spec_text,
            spec_digest=digest,
            retry_safe=command.retry_safe,
            timeout_seconds=command.timeout_seconds,
            max_attempts=command.max_attempts,
            queue_reservation_id=derived_id("rsv", command.run_id, "queue"),
            parent_run_id=command.parent_run_id,
            # EXE-14: what a scheduled (or pinned) run runs, and its labels, as submitted.
            labels=command.labels,
            agent_revision_id=command.agent_revision_id,
        ),
    )


def _decide_cancel(state: RunState, command: CancelRun, now_ms: int, policy: LeasePolicy) -> Decision:
    if state.status in (RunStatus.PREPARING, RunStatus.RUNNING, RunStatus.CANCELLING):
        return decide_cancel_held(state, command, now_ms, policy)
    if state.status in TERMINAL_STATUSES:
        return Rejection(
            RejectionCode.RUN_ALREADY_TERMINAL,
            f"run {state.run_id} already ended as {state.status.value}",
        )
    # EXE-7: a queued, interrupted or waiting run has no runner to confirm: it ends at once.
    return (
        RunCancelled(
            event_id=derived_id("evt", command.command_id, "RunCancelled"),
            run_id=state.run_id,
            version=state.version + 1,
            occurred_at=now_ms,
            causation_id=command.command_id,
            correlation_id=command.correlation_id,
            actor=command.actor,
            reason=command.reason,
            previous_status=state.status.value,
            reservation_released=state.queue_reservation_id is not None,
        ),
    )


def rejection_event(
    state: RunState | None, command: RunCommand, rejection: Rejection, now_ms: int
) -> CommandRejected:
    """The fact that a command was refused, addressed to whoever sent it."""
    status = state.status.value if state is not None else None
    return CommandRejected.of(
        command, rejection.code.value, rejection.detail, status, state.version if state else 0, now_ms
    )


# --- evolve -----------------------------------------------------------------------------------


def evolve(state: RunState | None, event: RunEvent) -> RunState:
    """The state after `event`. Duplicates are the caller's to drop; a gap raises VersionGap."""
    current = state.version if state is not None else 0
    if sequence(event.run_id, current, event.version) is Sequencing.DUPLICATE:
        raise ValueError(
            f"event {event.event_id} (version {event.version}) is already applied to run "
            f"{event.run_id} at version {current}"
        )
    if isinstance(event, RunSubmitted):
        if state is not None:
            raise ValueError(f"run {event.run_id} was already submitted")
        return RunState(
            run_id=event.run_id,
            version=event.version,
            status=RunStatus.QUEUED,
            tenant=event.tenant,
            idempotency_key=event.idempotency_key,
            execution_spec=event.execution_spec,
            spec_digest=event.spec_digest,
            retry_safe=event.retry_safe,
            timeout_seconds=event.timeout_seconds,
            max_attempts=event.max_attempts,
            submitted_at=event.occurred_at,
            queue_reservation_id=event.queue_reservation_id,
            handled_commands=(event.causation_id,),
            parent_run_id=event.parent_run_id,
            submitted_by=event.actor,
            agent_revision_id=event.agent_revision_id,
        )
    if state is None:
        raise ValueError(f"event {event.event_id} refers to run {event.run_id} before it exists")
    if event.run_id != state.run_id:
        raise ValueError(f"event {event.event_id} of run {event.run_id} applied to run {state.run_id}")
    if isinstance(event, RunCancelled):
        after = replace_fields(
            state,
            status=check_transition(state.status, RunStatus.CANCELLED),
            queue_reservation_id=None if event.reservation_released else state.queue_reservation_id,
        )
    else:
        changed = evolve_lease(state, event)
        if changed is None:
            changed = evolve_stop(state, event)
        if changed is None:
            changed = evolve_input(state, event)
        if changed is None:
            raise TypeError(f"not a Run event: {event!r}")
        after = changed
    if isinstance(event, LeaseRenewed):
        # A long run renews thousands of times: its renewals get a short window of their own
        # rather than pushing every other command out of handled_commands (issue 16).
        return replace_fields(
            after, version=event.version, handled_renewals=after.remember_renewal(event.causation_id)
        )
    return replace_fields(after, version=event.version, handled_commands=_remembered(after, event))


def _remembered(state: RunState, event: RunEvent) -> tuple[str, ...]:
    # Timer events have no command to be redelivered: keeping their causes would only grow the
    # state of a long run.
    if event.causation_id.startswith("timer/"):
        return state.handled_commands
    return state.remember(event.causation_id)


def fold(events: Iterable[RunEvent], state: RunState | None = None) -> RunState | None:
    """Replay: the state that a sequence of one run's events produces."""
    for event in events:
        state = evolve(state, event)
    return state
