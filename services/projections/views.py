"""The Run view: what an operator or a caller sees of a run, rendered from the aggregate's state.

The run's state is folded by the Run aggregate's own `evolve`, so the view can never disagree
with the decisions the coordinator makes: status, version, the current lease and its certainty,
the deadline, effect outcomes and the queue reservation are the RunState's. Beside the state the
fold keeps only what the aggregate forgets but a reader needs: the history (one decoded entry per
event, in order), the status reason as worded for people, the submission's labels, and for every
lease it ever issued who may speak for it and when its certainty last changed or it ended.

The rest of the view is rendered from the state plus the history, which lists the facts as they
were recorded: the LEASE-2 lease record of every lease (issue, renewals, expiry rule, takeover
reason and evidence, the effects attempted under it), the attempts, upload grants, the input
request and its answer, the result manifest and the last stop requested.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from services.common import jsonbytes
from services.common.contracts import (
    AttemptClaimed,
    AttemptReported,
    DeadlineReached,
    InputProvided,
    InputRequested,
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
    holder_principal,
    to_record,
)
from services.common.frozen import replace
from services.common.sequencing import Sequencing, sequence
from services.lease_coordinator.domain import (
    LeaseCertainty,
    LeaseState,
    RunState,
    RunStatus,
    evolve,
    superseded_lease,
)

__all__ = [
    "LeaseMark",
    "RunFold",
    "RunView",
    "apply_event",
    "apply_run_event",
    "fold_run",
    "history_entry",
    "render_run",
    "step_fold",
    "step_run",
    "stop_after",
]

_HEADER_FIELDS = {"eventId", "runId", "version", "occurredAt", "causationId", "correlationId", "actor"}
_BULKY_FIELDS = {"executionSpec"}
# What a history entry's details leave out, as one set: it is tested for every field of every event.
_NOT_DETAILS = frozenset(_HEADER_FIELDS | _BULKY_FIELDS)
_GRANTS = ("AttemptClaimed", "LeaseTakenOver")
_UPLOAD_GRANT_FIELDS = (
    "grantId",
    "attemptId",
    "epoch",
    "destination",
    "keyPrefix",
    "maxBytes",
    "mediaType",
    "expiresAt",
)


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
        entry["details"] = {k: v for k, v in to_record(event).items() if k not in _NOT_DETAILS}
    return entry


# --- the fold -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseMark:
    """One lease the run issued, as the view shows it beyond what its grant recorded: who may
    speak for it, its certainty (the final one once a newer lease replaced it), when that last
    changed and when the lease ended."""

    epoch: int
    holder_principal: str
    certainty: LeaseCertainty
    changed_at: int
    ended_at: int | None = None
    attempt_id: str = ""  # of the grant (AttemptClaimed or LeaseTakenOver) that issued the lease
    lease_id: str = ""


@dataclass(frozen=True)
class RunFold:
    """The aggregate's state of one run plus what the view keeps beside it (never mutated)."""

    state: RunState
    history: tuple[dict[str, Any], ...]  # one history_entry per event, in version order
    status_reason: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    leases: tuple[LeaseMark, ...] = ()  # one per lease ever issued, in epoch order
    # The last stop asked for (cancel or deadline), kept once confirmed (the state forgets it
    # then) until a retry starts the run over; None: none asked for.
    stop: Mapping[str, Any] | None = None


def apply_run_event(fold: RunFold | None, event: RunEvent) -> RunFold | None:
    """The fold after `event`, or None when the event is a duplicate (already applied).

    A version gap raises services.common.sequencing.VersionGap: a view built over missing events
    would look plausible and be wrong, which is worse than no view.
    """
    stepped = step_run(fold, event)
    if stepped is None:
        return None
    after, entry = stepped
    return replace(after, history=(*after.history, entry))


def step_run(fold: RunFold | None, event: RunEvent) -> tuple[RunFold, dict[str, Any]] | None:
    """The fold after `event` with its history as it was, and the event's history entry; None
    for a duplicate. The view store keeps the entries apart from the fold (store.py), so that
    an event costs its own entry, not a re-rendering of the run's whole history."""
    after = step_fold(fold, event)
    return (after, history_entry(event)) if after is not None else None


def step_fold(fold: RunFold | None, event: RunEvent) -> RunFold | None:
    """The fold after `event` with its history as it was (None for a duplicate): `step_run`
    without the history entry, for a store that keeps the event's own bytes as its entry."""
    current = fold.state.version if fold is not None else 0
    if sequence(event.run_id, current, event.version) is Sequencing.DUPLICATE:
        return None
    if fold is None:
        if not isinstance(event, RunSubmitted):
            raise ValueError(
                f"{type(event).__name__} {event.event_id} arrived before run {event.run_id} exists"
            )
        labels = tuple(sorted(event.labels.items()))
        return RunFold(state=evolve(None, event), history=(), labels=labels)
    before = fold.state
    after = evolve(before, event)
    return replace(
        fold,
        state=after,
        status_reason=_status_reason(event, before, after, fold.status_reason),
        leases=_marked(fold.leases, event, before.lease, after.lease),
        stop=stop_after(event, fold.stop),
    )


def stop_after(event: RunEvent, current: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The last stop asked for after `event`."""
    if isinstance(event, RunCancelRequested) or (isinstance(event, DeadlineReached) and event.stop_requested):
        return {
            "kind": "cancel" if isinstance(event, RunCancelRequested) else "deadline",
            "requestedAt": event.occurred_at,
            "graceUntil": event.grace_until,
            "by": event.actor,
        }
    if isinstance(event, RunRetried):
        return None
    return current


def fold_run(events: Iterable[RunEvent]) -> RunFold | None:
    fold: RunFold | None = None
    for event in events:
        fold = apply_run_event(fold, event) or fold
    return fold


def _status_reason(event: RunEvent, before: RunState, after: RunState, current: str | None) -> str | None:
    """The status reason in words; which status the run is in is `evolve`'s to say."""
    if isinstance(event, RunCancelled):
        return event.reason or "cancelled by request"
    if isinstance(event, RunCancelRequested):
        return f"cancel requested: {event.reason or 'no reason given'}"
    if isinstance(event, DeadlineReached):
        if after.status is RunStatus.CANCELLING:
            return "DEADLINE_EXCEEDED: stop requested from the runner"
        return f"DEADLINE_EXCEEDED at {event.deadline_at}"
    if isinstance(event, RunInterrupted):
        return f"{event.reason}: {event.detail}"
    if isinstance(event, RunFailed):
        return f"{event.code}: {event.detail}"
    if isinstance(event, RunRetried):
        return f"retried by {event.actor} (repeated effects acknowledged): {event.reason}"
    if isinstance(event, InputRequested):
        return f"waiting for input: {event.prompt}"
    if isinstance(event, InputProvided):
        return f"answer {event.response_id} received; a continuation is queued"
    if isinstance(event, AttemptClaimed):
        return f"claimed by {event.holder}"
    if isinstance(event, LeaseRenewed):
        return None if after.status is not before.status else current
    if isinstance(event, LeaseExpired):
        return (
            f"LEASE_EXPIRED: lease {event.lease_id} expired at {event.expires_at}, "
            f"decided at {event.occurred_at}"
        )
    if isinstance(event, RunRequeued):
        return (
            f"requeued after {event.reason}: {event.attempts_used} attempt(s) used, "
            f"{event.attempts_remaining} left"
        )
    if isinstance(event, AttemptReported):
        return _reported_reason(event, before, after)
    return current


def _reported_reason(event: AttemptReported, before: RunState, after: RunState) -> str | None:
    if before.status is RunStatus.CANCELLING:
        if after.status is RunStatus.FAILED:
            return "DEADLINE_EXCEEDED: the runner confirmed the stop"
        if event.outcome == "succeeded":
            return (
                f"cancelled: the runner confirmed the stop (it reported {event.outcome}; "
                "a late success after a cancel is recorded, not applied)"
            )
        return "cancelled: the runner confirmed the stop"
    if event.outcome == "preparation_failed":
        return f"preparation failed: {event.error_code or event.detail}"
    return f"{event.error_code}: {event.detail}" if event.error_code else event.detail or None


def _marked(
    marks: tuple[LeaseMark, ...], event: RunEvent, before: LeaseState | None, after: LeaseState | None
) -> tuple[LeaseMark, ...]:
    """The lease marks after `event`, from how `evolve` changed the run's lease."""
    if after is None:
        return marks
    at = event.occurred_at
    if before is not None and after.epoch == before.epoch:
        mark = _remarked(marks[-1], after, at)
        return marks if mark is marks[-1] else (*marks[:-1], mark)
    assert isinstance(event, (AttemptClaimed, LeaseTakenOver)), event
    if before is not None:
        marks = (*marks[:-1], _remarked(marks[-1], superseded_lease(before), at))
    return (
        *marks,
        LeaseMark(
            after.epoch,
            holder_principal(event),
            after.certainty,
            at,
            attempt_id=event.attempt_id,
            lease_id=event.lease_id,
        ),
    )


def _remarked(mark: LeaseMark, lease: LeaseState, at: int) -> LeaseMark:
    assert mark.epoch == lease.epoch, (mark, lease)
    if lease.certainty is mark.certainty:
        return mark
    return replace(mark, certainty=lease.certainty, changed_at=at, ended_at=None if lease.held else at)


# --- rendering ----------------------------------------------------------------------------------


def render_run(fold: RunFold) -> dict[str, Any]:
    """The JSON-able view of one run (GET /runs/{runId}), sharing the fold's history entries."""
    state = fold.state
    facts = _Facts(fold.history)
    records = [
        _lease_record(state, grant, mark, facts)
        for grant, mark in zip(facts.grants, fold.leases, strict=True)
    ]
    view: dict[str, Any] = {
        "runId": state.run_id,
        "tenant": state.tenant,
        "status": state.status.value,
        "statusReason": fold.status_reason,
        "version": state.version,
        "idempotencyKey": state.idempotency_key,
        "executionSpec": jsonbytes.loads(state.execution_spec),
        "specDigest": state.spec_digest,
        "retrySafe": state.retry_safe,
        "timeoutSeconds": state.timeout_seconds,
        "maxAttempts": state.max_attempts,
        "labels": dict(fold.labels),
        "agentRevisionId": state.agent_revision_id,
        "parentRunId": state.parent_run_id,
        "deadlineAt": state.deadline_at,
        "stop": dict(fold.stop) if fold.stop is not None else None,
        "queueReservationId": state.queue_reservation_id,
        "attempts": [_attempt(grant, facts) for grant in facts.grants],
        "lease": records[-1] if records else None,
        "leaseHistory": records[:-1],
        "submittedAt": state.submitted_at,
        "updatedAt": fold.history[-1]["occurredAt"],
        "submittedBy": state.submitted_by,
        "history": list(fold.history),
    }
    # These appear once there is something to show, as they always have.
    if facts.upload_grants:
        view["uploadGrants"] = facts.upload_grants
    if facts.input is not None:
        view["input"] = facts.input
    if facts.manifest is not None:
        view["resultManifest"] = facts.manifest
    return view


class _Facts:
    """What the history recorded, gathered in one pass for rendering (no decision is made here:
    every entry is a fact the aggregate already accepted)."""

    def __init__(self, history: Iterable[dict[str, Any]]) -> None:
        self.grants: list[dict[str, Any]] = []
        self.renewals: dict[int, list[dict[str, Any]]] = {}
        self.intents: dict[int, list[dict[str, Any]]] = {}
        self.outcomes: dict[str, dict[str, Any]] = {}
        self.reported: dict[str, str] = {}
        self.upload_grants: list[dict[str, Any]] = []
        self.input: dict[str, Any] | None = None
        self.manifest: list[dict[str, Any]] | None = None
        for entry in history:
            kind = entry["type"]
            details: dict[str, Any] = entry.get("details") or {}
            if kind in _GRANTS:
                self.grants.append(entry)
            elif kind == "LeaseRenewed":
                self.renewals.setdefault(details["epoch"], []).append(
                    {
                        "sequence": details["sequence"],
                        "at": entry["occurredAt"],
                        "expiresAt": details["expiresAt"],
                    }
                )
            elif kind == "EffectIntentRecorded":
                self.intents.setdefault(details["epoch"], []).append(entry)
            elif kind == "EffectOutcomeRecorded":
                self.outcomes[details["effectId"]] = entry
            elif kind == "AttemptReported":
                self._reported(details)
            else:
                self._other(kind, entry)

    def _reported(self, details: dict[str, Any]) -> None:
        self.reported[details["attemptId"]] = details["outcome"]
        if details["manifest"]:
            self.manifest = [
                {
                    "artifactId": a["artifactId"],
                    "digest": a["digest"],
                    "sizeBytes": a["sizeBytes"],
                    "mediaType": a["mediaType"],
                }
                for a in details["manifest"]
            ]

    def _other(self, kind: str, entry: dict[str, Any]) -> None:
        details: dict[str, Any] = entry.get("details") or {}
        at = entry["occurredAt"]
        if kind == "InputRequested":
            self.input = {
                "requestId": details["requestId"],
                "prompt": details["prompt"],
                "inputSchema": jsonbytes.loads(details["inputSchema"]),
                "expiresAt": details["expiresAt"],
                "checkpointDigest": details["checkpointDigest"],
                "requestedAt": at,
                "attemptId": details["attemptId"],
                "response": None,
            }
        elif kind == "InputProvided":
            self.input = self.input or {}
            self.input["response"] = {
                "responseId": details["responseId"],
                "answer": jsonbytes.loads(details["answer"]),
                "at": at,
                "by": entry["actor"],
            }
        elif kind == "UploadGrantIssued":
            self.upload_grants.append({**{k: details[k] for k in _UPLOAD_GRANT_FIELDS}, "issuedAt": at})


def _attempt(grant: dict[str, Any], facts: _Facts) -> dict[str, Any]:
    details = grant["details"]
    attempt: dict[str, Any] = {
        "attemptId": details["attemptId"],
        # A takeover issues a new attempt id but uses none of the run's attempts (EXE-5).
        "attemptNumber": details.get("attemptNumber"),
        "epoch": details["epoch"],
        "holder": details["holder"],
        "claimedAt": grant["occurredAt"],
        "outcome": facts.reported.get(details["attemptId"]),
    }
    if grant["type"] == "LeaseTakenOver":
        attempt["takeover"] = True
    return attempt


def _lease_record(state: RunState, grant: dict[str, Any], mark: LeaseMark, facts: _Facts) -> dict[str, Any]:
    """The LEASE-2 record of one lease: what its grant recorded, its renewals and effects, and
    for the current lease its expiry and certainty as the state holds them."""
    details = grant["details"]
    epoch = details["epoch"]
    renewals = facts.renewals.get(epoch, [])
    current = state.lease if state.lease is not None and state.lease.epoch == epoch else None
    if current is not None:
        certainty, expires_at = current.certainty, current.expires_at
    else:
        certainty = mark.certainty
        expires_at = renewals[-1]["expiresAt"] if renewals else details["expiresAt"]
    outcomes = {effect.effect_id: effect.outcome for effect in state.effects if effect.epoch == epoch}
    taken_over = grant["type"] == "LeaseTakenOver"
    return {
        "leaseId": details["leaseId"],
        "workId": state.run_id,
        "attemptId": details["attemptId"],
        "holder": details["holder"],
        "holderKind": details["holderKind"],
        # Who may speak for the lease: the principal that claimed it, or the holder a takeover named.
        "holderPrincipal": mark.holder_principal,
        "epoch": epoch,
        "issuedAt": grant["occurredAt"],
        "expiresAt": expires_at,
        "expiryRule": {
            "leaseSeconds": details["leaseSeconds"],
            "heartbeatSeconds": details["heartbeatSeconds"],
            "atRiskAfterMs": details["atRiskAfterMs"],
            "clock": "coordinator",
        },
        "certainty": certainty.value,
        "certaintyChangedAt": mark.changed_at,
        "renewals": renewals,
        "takeoverReason": details["reason"] if taken_over else None,
        "takeoverEvidence": _evidence(grant) if taken_over else None,
        "endedAt": mark.ended_at,
        "effects": [_effect(intent, outcomes, facts) for intent in facts.intents.get(epoch, [])],
    }


def _evidence(grant: dict[str, Any]) -> dict[str, Any]:
    details = grant["details"]
    return {
        "previousHolder": details["previousHolder"],
        "previousEpoch": details["previousEpoch"],
        "previousLeaseId": details["previousLeaseId"],
        "lastRenewalAt": details["lastRenewalAt"],
        "lastSequence": details["lastSequence"],
        "effectsAttempted": list(details["effectsAttempted"]),
        "by": grant["actor"],
    }


def _effect(intent: dict[str, Any], outcomes: dict[str, str], facts: _Facts) -> dict[str, Any]:
    details = intent["details"]
    effect_id = details["effectId"]
    effect: dict[str, Any] = {
        "effectId": effect_id,
        "idempotencyKey": details["idempotencyKey"],
        "tool": details["tool"],
        "operation": details["operation"],
        "epoch": details["epoch"],
        "status": outcomes[effect_id],
        "recordedAt": intent["occurredAt"],
    }
    decided = facts.outcomes.get(effect_id)
    if decided is not None:
        effect["detail"], effect["decidedAt"] = decided["details"]["detail"], decided["occurredAt"]
    return effect


class RunView(dict[str, Any]):
    """A rendered view that remembers the fold it came from, so `apply_event` can go on from it."""

    __slots__ = ("fold",)

    def __init__(self, fold: RunFold) -> None:
        super().__init__(render_run(fold))
        self.fold = fold


def apply_event(view: Mapping[str, Any] | None, event: RunEvent) -> RunView | None:
    """The view after `event` (None for a duplicate), for callers that fold views one event at
    a time (replays, tests); it never changes the view it is given. The store folds RunFolds."""
    if view is not None and not isinstance(view, RunView):
        raise TypeError("apply_event continues from a view it returned; a stored view has no fold")
    after = apply_run_event(view.fold if view is not None else None, event)
    return RunView(after) if after is not None else None
