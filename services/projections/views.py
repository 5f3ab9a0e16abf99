"""The Run view: what an operator or a caller sees of a run, folded from its events (pure).

Besides status and history it carries the lease record of LEASE-2: lease id, work id, holder,
issue time, every renewal, the expiry rule, the certainty state, a takeover's reason and
evidence, the fencing epoch, and the effects attempted under the lease.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from services.common.contracts import (
    AttemptClaimed,
    AttemptReported,
    DeadlineReached,
    EffectIntentRecorded,
    EffectOutcomeRecorded,
    InputProvided,
    InputRequested,
    LeaseAtRisk,
    LeaseExpired,
    LeaseRenewed,
    LeaseTakenOver,
    RunCancelled,
    RunCancelRequested,
    RunEvent,
    RunFailed,
    RunInterrupted,
    RunRequeued,
    RunRetried,
    RunSubmitted,
    UploadGrantIssued,
    to_record,
)
from services.common.sequencing import Sequencing, sequence

__all__ = ["apply_event", "decode_view", "encode_view", "history_entry"]

_HEADER_FIELDS = {"eventId", "runId", "version", "occurredAt", "causationId", "correlationId", "actor"}
_BULKY_FIELDS = {"executionSpec"}


def history_entry(event: RunEvent) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "version": event.version,
        "type": type(event).__name__,
        "eventId": event.event_id,
        "occurredAt": event.occurred_at,
        "actor": event.actor,
        "causationId": event.causation_id,
        "correlationId": event.correlation_id,
    }
    if isinstance(event, RunCancelled):
        entry["reason"] = event.reason
        entry["fromStatus"] = event.previous_status
    elif not isinstance(event, RunSubmitted):
        entry["details"] = {
            k: v for k, v in to_record(event).items() if k not in _HEADER_FIELDS | _BULKY_FIELDS
        }
    return entry


def _new_lease(event: AttemptClaimed | LeaseTakenOver) -> dict[str, Any]:
    return {
        "leaseId": event.lease_id,
        "workId": event.run_id,
        "attemptId": event.attempt_id,
        "holder": event.holder,
        "holderKind": event.holder_kind,
        # Who may speak for the lease: the principal that claimed it, or the holder a takeover named.
        "holderPrincipal": event.actor if isinstance(event, AttemptClaimed) else event.holder,
        "epoch": event.epoch,
        "issuedAt": event.occurred_at,
        "expiresAt": event.expires_at,
        "expiryRule": {
            "leaseSeconds": event.lease_seconds,
            "heartbeatSeconds": event.heartbeat_seconds,
            "atRiskAfterMs": event.at_risk_after_ms,
            "clock": "coordinator",
        },
        "certainty": "active",
        "certaintyChangedAt": event.occurred_at,
        "renewals": [],
        "takeoverReason": None,
        "takeoverEvidence": None,
        "endedAt": None,
        "effects": [],
    }


def _lease_for_epoch(view: dict[str, Any], epoch: int) -> dict[str, Any] | None:
    lease = view.get("lease")
    if lease is not None and lease["epoch"] == epoch:
        return lease  # type: ignore[no-any-return]
    return next((old for old in view["leaseHistory"] if old["epoch"] == epoch), None)


def _set_certainty(lease: dict[str, Any], certainty: str, at: int) -> None:
    lease["certainty"] = certainty
    lease["certaintyChangedAt"] = at
    if certainty in ("expired", "revoked", "released"):
        lease["endedAt"] = at


def _apply_lease_event(view: dict[str, Any], event: RunEvent) -> None:
    lease = view.get("lease")
    at = event.occurred_at
    if isinstance(event, AttemptClaimed):
        if view.get("deadlineAt") is None:
            view["deadlineAt"] = event.deadline_at
        if lease is not None:
            view["leaseHistory"].append(lease)
        view["lease"] = _new_lease(event)
        view["status"], view["statusReason"] = "preparing", f"claimed by {event.holder}"
        view["attempts"].append(
            {
                "attemptId": event.attempt_id,
                "attemptNumber": event.attempt_number,
                "epoch": event.epoch,
                "holder": event.holder,
                "claimedAt": at,
                "outcome": None,
            }
        )
    elif isinstance(event, LeaseRenewed):
        assert lease is not None
        lease["renewals"].append({"sequence": event.sequence, "at": at, "expiresAt": event.expires_at})
        lease["expiresAt"] = event.expires_at
        if lease["certainty"] != "active":
            _set_certainty(lease, "active", at)
        if event.run_started:
            view["status"], view["statusReason"] = "running", None
    elif isinstance(event, LeaseAtRisk):
        assert lease is not None
        _set_certainty(lease, "at_risk", at)
    elif isinstance(event, LeaseExpired):
        assert lease is not None
        _set_certainty(lease, "expired", at)
        view["status"] = "interrupted"
        view["statusReason"] = (
            f"LEASE_EXPIRED: lease {event.lease_id} expired at {event.expires_at}, decided at {at}"
        )
    elif isinstance(event, RunRequeued):
        view["status"] = "queued"
        view["statusReason"] = (
            f"requeued after {event.reason}: {event.attempts_used} attempt(s) used, "
            f"{event.attempts_remaining} left"
        )
    elif isinstance(event, LeaseTakenOver):
        assert lease is not None
        _set_certainty(lease, "revoked", at)
        view["leaseHistory"].append(lease)
        new = _new_lease(event)
        new["takeoverReason"] = event.reason
        new["takeoverEvidence"] = {
            "previousHolder": event.previous_holder,
            "previousEpoch": event.previous_epoch,
            "previousLeaseId": event.previous_lease_id,
            "lastRenewalAt": event.last_renewal_at,
            "lastSequence": event.last_sequence,
            "effectsAttempted": list(event.effects_attempted),
            "by": event.actor,
        }
        view["lease"] = new
        view["attempts"].append(
            {
                "attemptId": event.attempt_id,
                "attemptNumber": None,
                "epoch": event.epoch,
                "holder": event.holder,
                "claimedAt": at,
                "outcome": None,
                "takeover": True,
            }
        )
    elif isinstance(event, AttemptReported):
        assert lease is not None
        _set_certainty(lease, "released", at)
        if view["status"] == "cancelling":
            stop = view.get("stop") or {}
            if stop.get("kind") == "deadline":
                view["status"], view["statusReason"] = (
                    "failed",
                    "DEADLINE_EXCEEDED: the runner confirmed the stop",
                )
            else:
                view["status"] = "cancelled"
                view["statusReason"] = (
                    f"cancelled: the runner confirmed the stop (it reported {event.outcome}; "
                    "a late success after a cancel is recorded, not applied)"
                    if event.outcome == "succeeded"
                    else "cancelled: the runner confirmed the stop"
                )
        elif event.outcome == "preparation_failed":
            view["statusReason"] = f"preparation failed: {event.error_code or event.detail}"
        else:
            view["status"] = event.outcome
            view["statusReason"] = (
                f"{event.error_code}: {event.detail}" if event.error_code else event.detail or None
            )
        if event.manifest:
            view["resultManifest"] = [
                {
                    "artifactId": a.artifact_id,
                    "digest": a.digest,
                    "sizeBytes": a.size_bytes,
                    "mediaType": a.media_type,
                }
                for a in event.manifest
            ]
        for attempt in view["attempts"]:
            if attempt["attemptId"] == event.attempt_id:
                attempt["outcome"] = event.outcome
    elif isinstance(event, EffectIntentRecorded):
        owner = _lease_for_epoch(view, event.epoch)
        assert owner is not None
        owner["effects"].append(
            {
                "effectId": event.effect_id,
                "idempotencyKey": event.idempotency_key,
                "tool": event.tool,
                "operation": event.operation,
                "epoch": event.epoch,
                "status": "intended",
                "recordedAt": at,
            }
        )
    elif isinstance(event, EffectOutcomeRecorded):
        owner = _lease_for_epoch(view, event.epoch)
        assert owner is not None
        for effect in owner["effects"]:
            if effect["effectId"] == event.effect_id:
                effect["status"], effect["detail"], effect["decidedAt"] = event.outcome, event.detail, at


def _apply_stop_event(view: dict[str, Any], event: RunEvent) -> None:
    at = event.occurred_at
    lease = view.get("lease")
    if isinstance(event, RunCancelRequested):
        view["status"], view["statusReason"] = (
            "cancelling",
            f"cancel requested: {event.reason or 'no reason given'}",
        )
        view["stop"] = {
            "kind": "cancel",
            "requestedAt": at,
            "graceUntil": event.grace_until,
            "by": event.actor,
        }
    elif isinstance(event, DeadlineReached):
        if event.stop_requested:
            view["status"], view["statusReason"] = (
                "cancelling",
                "DEADLINE_EXCEEDED: stop requested from the runner",
            )
            view["stop"] = {
                "kind": "deadline",
                "requestedAt": at,
                "graceUntil": event.grace_until,
                "by": event.actor,
            }
        else:
            view["status"], view["statusReason"] = "failed", f"DEADLINE_EXCEEDED at {event.deadline_at}"
    elif isinstance(event, RunInterrupted):
        view["status"], view["statusReason"] = "interrupted", f"{event.reason}: {event.detail}"
        if lease is not None and lease["certainty"] in ("active", "at_risk"):
            _set_certainty(lease, "revoked", at)
    elif isinstance(event, RunFailed):
        view["status"], view["statusReason"] = "failed", f"{event.code}: {event.detail}"
        if lease is not None and lease["certainty"] in ("active", "at_risk"):
            _set_certainty(lease, "revoked", at)
    elif isinstance(event, RunRetried):
        view["status"] = "queued"
        view["statusReason"] = f"retried by {event.actor} (repeated effects acknowledged): {event.reason}"
        view["stop"] = None


def _apply_input_event(view: dict[str, Any], event: RunEvent) -> None:
    at = event.occurred_at
    if isinstance(event, InputRequested):
        lease = view.get("lease")
        if lease is not None:
            _set_certainty(lease, "released", at)
        view["status"], view["statusReason"] = "waiting_input", f"waiting for input: {event.prompt}"
        view["input"] = {
            "requestId": event.request_id,
            "prompt": event.prompt,
            "inputSchema": json.loads(event.input_schema),
            "expiresAt": event.expires_at,
            "checkpointDigest": event.checkpoint_digest,
            "requestedAt": at,
            "attemptId": event.attempt_id,
            "response": None,
        }
    elif isinstance(event, InputProvided):
        view["status"] = "queued"
        view["statusReason"] = f"answer {event.response_id} received; a continuation is queued"
        request = view.get("input") or {}
        request["response"] = {
            "responseId": event.response_id,
            "answer": json.loads(event.answer),
            "at": at,
            "by": event.actor,
        }
        view["input"] = request
    elif isinstance(event, UploadGrantIssued):
        view.setdefault("uploadGrants", []).append(
            {
                "grantId": event.grant_id,
                "attemptId": event.attempt_id,
                "epoch": event.epoch,
                "destination": event.destination,
                "keyPrefix": event.key_prefix,
                "maxBytes": event.max_bytes,
                "mediaType": event.media_type,
                "expiresAt": event.expires_at,
                "issuedAt": at,
            }
        )


def apply_event(
    view: dict[str, Any] | None, event: RunEvent, *, in_place: bool = False
) -> dict[str, Any] | None:
    """The view after `event`, or None when the event is a duplicate (already applied).

    A version gap raises services.common.sequencing.VersionGap: a view built over missing events
    would look plausible and be wrong, which is worse than no view.
    """
    current = int(view["version"]) if view is not None else 0
    if sequence(event.run_id, current, event.version) is Sequencing.DUPLICATE:
        return None
    if isinstance(event, RunSubmitted):
        return {
            "runId": event.run_id,
            "tenant": event.tenant,
            "status": "queued",
            "statusReason": None,
            "version": event.version,
            "idempotencyKey": event.idempotency_key,
            "executionSpec": json.loads(event.execution_spec),
            "specDigest": event.spec_digest,
            "retrySafe": event.retry_safe,
            "timeoutSeconds": event.timeout_seconds,
            "maxAttempts": event.max_attempts,
            "labels": dict(event.labels),
            "parentRunId": event.parent_run_id,
            "deadlineAt": None,
            "stop": None,
            "queueReservationId": event.queue_reservation_id,
            "attempts": [],
            "lease": None,
            "leaseHistory": [],
            "submittedAt": event.occurred_at,
            "updatedAt": event.occurred_at,
            "submittedBy": event.actor,
            "history": [history_entry(event)],
        }
    if view is None:
        raise ValueError(f"{type(event).__name__} {event.event_id} arrived before run {event.run_id} exists")
    new = view if in_place else copy.deepcopy(view)
    new.setdefault("leaseHistory", [])
    new["version"] = event.version
    new["updatedAt"] = event.occurred_at
    new["history"].append(history_entry(event))
    if isinstance(event, RunCancelled):
        new["status"] = "cancelled"
        new["statusReason"] = event.reason or "cancelled by request"
        if event.reservation_released:
            new["queueReservationId"] = None
    elif isinstance(event, (RunCancelRequested, DeadlineReached, RunInterrupted, RunFailed, RunRetried)):
        _apply_stop_event(new, event)
    elif isinstance(event, (InputRequested, InputProvided, UploadGrantIssued)):
        _apply_input_event(new, event)
    else:
        _apply_lease_event(new, event)
    return new


def encode_view(view: dict[str, Any]) -> bytes:
    return json.dumps(view, sort_keys=True, separators=(",", ":")).encode("utf-8")


def decode_view(raw: bytes) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(raw)
    return result
