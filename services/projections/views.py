"""The Run view: what an operator or a caller sees of a run, folded from its events (pure)."""

from __future__ import annotations

import json
from typing import Any

from services.common.contracts import RunCancelled, RunEvent, RunSubmitted
from services.common.sequencing import Sequencing, sequence

__all__ = ["apply_event", "decode_view", "encode_view", "history_entry"]


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
    return entry


def apply_event(view: dict[str, Any] | None, event: RunEvent) -> dict[str, Any] | None:
    """The view after `event`, or None when the event is a duplicate (already applied).

    A version gap raises services.common.sequencing.VersionGap: a view built over missing events
    would look plausible and be wrong, which is worse than no view.
    """
    current = int(view["version"]) if view is not None else 0
    if sequence(event.run_id, current, event.version) is Sequencing.DUPLICATE:
        return None
    if isinstance(event, RunSubmitted):
        new: dict[str, Any] = {
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
            "queueReservationId": event.queue_reservation_id,
            "attempts": [],
            "lease": None,
            "submittedAt": event.occurred_at,
            "updatedAt": event.occurred_at,
            "submittedBy": event.actor,
            "history": [history_entry(event)],
        }
        return new
    if view is None:
        raise ValueError(f"{type(event).__name__} {event.event_id} arrived before run {event.run_id} exists")
    new = dict(view)
    new["version"] = event.version
    new["updatedAt"] = event.occurred_at
    new["history"] = [*view["history"], history_entry(event)]
    if isinstance(event, RunCancelled):
        new["status"] = "cancelled"
        new["statusReason"] = event.reason or "cancelled by request"
        if event.reservation_released:
            new["queueReservationId"] = None
    return new


def encode_view(view: dict[str, Any]) -> bytes:
    return json.dumps(view, sort_keys=True, separators=(",", ":")).encode("utf-8")


def decode_view(raw: bytes) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(raw)
    return result
