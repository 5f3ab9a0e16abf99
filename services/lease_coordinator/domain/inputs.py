"""Waiting for input (EXE-8, EXE-9) and upload grants (EXE-15): pure decisions.

A runner that declared `checkpoint-v1` may save a checkpoint, ask a question and release its
lease: the run waits, holding nobody's lease, until the answer arrives (then a continuation is
queued, pinned to the same immutable ExecutionSpec) or the request expires (failed).
"""

from __future__ import annotations

from services.common.contracts import (
    InputProvided,
    InputRequested,
    ProvideInput,
    RequestInput,
    RequestUploadGrant,
    RunEvent,
    UploadGrantIssued,
)
from services.common.contracts.ids import grant_id_for, run_id_of_grant
from services.common.frozen import replace as replace_fields
from services.common.ids import derived_id
from services.lease_coordinator.domain.lifecycle import (
    LeaseCertainty,
    RunStatus,
    check_lease_transition,
    check_transition,
)
from services.lease_coordinator.domain.state import (
    Decision,
    InputWait,
    LeasePolicy,
    LeaseState,
    Rejection,
    RejectionCode,
    RunState,
    command_event_header,
)

__all__ = [
    "CHECKPOINT_CAPABILITY",
    "decide_provide_input",
    "decide_request_input",
    "decide_upload_grant",
    "evolve_input",
    "grant_id_for",
    "run_id_of_grant",
]

CHECKPOINT_CAPABILITY = "checkpoint-v1"


def decide_request_input(state: RunState, command: RequestInput, now_ms: int, lease: LeaseState) -> Decision:
    """EXE-8: only with capability checkpoint-v1, only while running, acknowledged by the event."""
    if CHECKPOINT_CAPABILITY not in lease.capabilities:
        return Rejection(
            RejectionCode.CAPABILITY_MISSING,
            f"attempt {lease.attempt_id} did not declare {CHECKPOINT_CAPABILITY}; it cannot wait for input",
        )
    if state.status is not RunStatus.RUNNING:
        return Rejection(
            RejectionCode.INVALID_TRANSITION, f"run {state.run_id} is {state.status.value}, not running"
        )
    if command.sequence <= lease.last_sequence:
        return Rejection(
            RejectionCode.SEQUENCE_NOT_INCREASING,
            f"sequence {command.sequence} is not above the last renewal's {lease.last_sequence}",
        )
    if command.expires_at <= now_ms:
        return Rejection(RejectionCode.INVALID_COMMAND, "the input request's expiresAt is already past")
    if not command.checkpoint_digest.strip():
        return Rejection(RejectionCode.INVALID_COMMAND, "a checkpoint digest is required before waiting")
    return (
        InputRequested(
            **command_event_header(state, command, "InputRequested", now_ms),
            attempt_id=lease.attempt_id,
            epoch=lease.epoch,
            request_id=derived_id("inp", state.run_id, str(lease.epoch), str(command.sequence)),
            checkpoint_digest=command.checkpoint_digest,
            input_schema=command.input_schema,
            prompt=command.prompt,
            expires_at=command.expires_at,
        ),
    )


def decide_provide_input(state: RunState, command: ProvideInput, now_ms: int) -> Decision:
    if command.response_id in state.input_responses:
        return ()  # EXE-8: a repeated responseId creates no further attempt
    wait = state.input_wait
    if state.status is not RunStatus.WAITING_INPUT or wait is None:
        return Rejection(
            RejectionCode.INVALID_TRANSITION, f"run {state.run_id} is {state.status.value}, not waiting"
        )
    if now_ms >= wait.expires_at:
        return Rejection(RejectionCode.INPUT_EXPIRED, f"the input request expired at {wait.expires_at}")
    return (
        InputProvided(
            **command_event_header(state, command, "InputProvided", now_ms),
            request_id=wait.request_id,
            response_id=command.response_id,
            answer=command.answer,
            checkpoint_digest=wait.checkpoint_digest,
        ),
    )


def decide_upload_grant(
    state: RunState, command: RequestUploadGrant, now_ms: int, policy: LeasePolicy, lease: LeaseState
) -> Decision:
    """EXE-15: a grant for one attempt and one destination, bounded in size, lifetime, prefix."""
    destination = command.destination
    parts = destination.split("/")
    if (
        not destination
        or destination.startswith("/")
        or any(p in ("", ".", "..") for p in parts)
        or len(destination) > 256
    ):
        return Rejection(
            RejectionCode.INVALID_COMMAND, f"destination {destination!r} must be a plain relative path"
        )
    if not 0 < command.max_bytes <= policy.max_upload_bytes:
        return Rejection(
            RejectionCode.INVALID_COMMAND, f"maxBytes must be between 1 and {policy.max_upload_bytes}"
        )
    if state.status not in (RunStatus.PREPARING, RunStatus.RUNNING):
        return Rejection(RejectionCode.INVALID_TRANSITION, f"run {state.run_id} is {state.status.value}")
    return (
        UploadGrantIssued(
            **command_event_header(state, command, "UploadGrantIssued", now_ms),
            grant_id=grant_id_for(state.run_id, command.command_id),
            attempt_id=lease.attempt_id,
            epoch=lease.epoch,
            destination=destination,
            key_prefix=f"runs/{state.run_id}/{lease.attempt_id}/",
            max_bytes=command.max_bytes,
            media_type=command.media_type,
            expires_at=now_ms + policy.upload_grant_ms,
        ),
    )


def evolve_input(state: RunState, event: RunEvent) -> RunState | None:
    replace = replace_fields
    if isinstance(event, InputRequested):
        lease = state.lease
        assert lease is not None
        released = replace(lease, certainty=check_lease_transition(lease.certainty, LeaseCertainty.RELEASED))
        wait = InputWait(event.request_id, event.checkpoint_digest, event.expires_at)
        return replace(
            state,
            status=check_transition(state.status, RunStatus.WAITING_INPUT),
            lease=released,
            input_wait=wait,
        )
    if isinstance(event, InputProvided):
        return replace(
            state,
            status=check_transition(state.status, RunStatus.QUEUED),
            input_wait=None,
            input_responses=(*state.input_responses, event.response_id)[-64:],
            continuation_of=event.response_id,
        )
    if isinstance(event, UploadGrantIssued):
        return state
    return None
