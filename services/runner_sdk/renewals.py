"""Batch renewal (issue 16): a runner host renews every lease it holds in one request.

`TenureClient.renew_leases([(lease, sequence), ...])` sends POST /leases:renew (at most
BATCH_RENEWAL_MAX leases a request; more are split) and returns one BatchRenewalResult per
lease, in the order given. Each lease is fenced and decided exactly as its own heartbeat would
be, so one lease's refusal (a stale or unknown epoch, another holder) says nothing about the
others: `result.ok` is the lease renewed (or the sequence already used, `replayed`), and
`result.error` is what the single heartbeat would have raised (LeaseConflict for a 409,
RequestRejected for another 4xx, TenureUnavailable when that item's outcome is unknown).

A `replayed` item (a retried batch) is read exactly as an accepted one: the API answers it with
the lease and the run as they stand now, so `result.answer` carries the lease's expiry
(LEASE-1), a stop requested since (EXE-7/EXE-10) and the intervention in force (WD-5, handed to
`on_intervention` as for any answer), with `answer.replayed` set. An older API answered a replay
with its ids and serverTime only; such an item is "no news": `answer` is None, nothing raised.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .errors import (
    LeaseConflict,
    RequestRejected,
    TenureRunnerError,
    TenureUnavailable,
    UnexpectedResponse,
)

if TYPE_CHECKING:
    from .client import Lease, RenewalAnswer

__all__ = ["BATCH_RENEWAL_MAX", "BatchRenewalResult", "RenewalStatus", "batch_results", "renewal_item"]

# The API's bound (services/command_api/lease_batch.py MAX_BATCH_RENEWALS).
BATCH_RENEWAL_MAX = 500
RenewalStatus = Literal["accepted", "replayed", "refused", "pending", "unavailable"]
_STATUSES: frozenset[str] = frozenset({"accepted", "replayed", "refused", "pending", "unavailable"})


@dataclass(frozen=True)
class BatchRenewalResult:
    """One lease's part of a batch renewal: `answer` when accepted or replayed (None for the
    replay of an older API, which said nothing of the lease), `error` when not renewed."""

    attempt_id: str
    status: RenewalStatus
    answer: RenewalAnswer | None = None
    error: TenureRunnerError | None = None
    server_time: int | None = None

    @property
    def ok(self) -> bool:
        return self.status in ("accepted", "replayed")


def renewal_item(lease: Lease, sequence: int) -> dict[str, Any]:
    return {"attemptId": lease.attempt_id, "leaseEpoch": lease.epoch, "sequence": sequence}


def batch_results(
    answer: Mapping[str, Any],
    sent: Sequence[tuple[Lease, int]],
    accepted: Callable[[Mapping[str, Any]], RenewalAnswer],
    notice: Callable[[Mapping[str, Any]], object],
) -> list[BatchRenewalResult]:
    """The API's per-item results, checked against what was sent (same leases, same order).

    `accepted` reads an item as the single heartbeat's answer (delivering its intervention);
    `notice` delivers the intervention of a replayed item that says nothing of the lease."""
    items = answer.get("results")
    if not isinstance(items, list) or len(items) != len(sent):
        raise UnexpectedResponse(f"batch renewal: expected {len(sent)} results, got {answer!r:.200}")
    results: list[BatchRenewalResult] = []
    for item, (lease, sequence) in zip(items, sent, strict=True):
        if not isinstance(item, dict) or item.get("attemptId") != lease.attempt_id:
            raise UnexpectedResponse(f"batch renewal: result {item!r:.200} is not for {lease.attempt_id}")
        status = item.get("status")
        if status not in _STATUSES:
            raise UnexpectedResponse(f"batch renewal: unknown status {status!r:.50}")
        if status == "replayed":
            results.append(_replayed(lease, sequence, item, accepted, notice))
        else:
            results.append(_result(lease.attempt_id, status, item, accepted))
    return results


# What an accepted item always carries and an older API's replayed item did not: without them
# there is no lease to report, so the replay is "no news" rather than a malformed answer.
_LEASE_FIELDS = ("expiresAt", "serverTime", "certainty", "runStatus")


def _replayed(
    lease: Lease,
    sequence: int,
    item: Mapping[str, Any],
    accepted: Callable[[Mapping[str, Any]], RenewalAnswer],
    notice: Callable[[Mapping[str, Any]], object],
) -> BatchRenewalResult:
    """A repeated sequence, read as an accepted renewal when the item says how the lease stands
    (this API: LEASE-1 expiry, EXE-7/EXE-10 stop flags, WD-5 intervention), else no news."""
    server_time = item.get("serverTime") if isinstance(item.get("serverTime"), int) else None
    if any(item.get(name) is None for name in _LEASE_FIELDS):
        # WD-5: an intervention is still handed on (this API leaves expiresAt null for a run its
        # instance has not folded yet, while the watchdog's is known); the inbox delivers once.
        notice(item)
        return BatchRenewalResult(lease.attempt_id, "replayed", server_time=server_time)
    # The ids are echoes of what was sent; an API that left them out still means these.
    echoed = {"epoch": lease.epoch, "sequence": sequence, **item, "replayed": True}
    return BatchRenewalResult(lease.attempt_id, "replayed", answer=accepted(echoed), server_time=server_time)


def _result(
    attempt_id: str,
    status: RenewalStatus,
    item: Mapping[str, Any],
    accepted: Callable[[Mapping[str, Any]], RenewalAnswer],
) -> BatchRenewalResult:
    server_time = item.get("serverTime") if isinstance(item.get("serverTime"), int) else None
    if status == "accepted":
        return BatchRenewalResult(attempt_id, status, answer=accepted(item), server_time=server_time)
    if status == "pending":
        pending = TenureUnavailable("heartbeat", "accepted, outcome still pending", 202)
        return BatchRenewalResult(attempt_id, status, error=pending)
    found = item.get("problem")
    problem: dict[str, Any] = found if isinstance(found, dict) else {}
    status_field = problem.get("status")
    code: int = status_field if isinstance(status_field, int) else 0
    raw_type = problem.get("type")
    slug = raw_type.rstrip("/").rsplit("/", 1)[-1] if isinstance(raw_type, str) and raw_type else ""
    detail = str(problem.get("detail") or problem.get("title") or status)
    error: TenureRunnerError
    if status == "unavailable" or code >= 500:
        error = TenureUnavailable("heartbeat", f"{slug or 'unavailable'}: {detail}", code or 503, slug)
    elif code == 409:
        error = LeaseConflict(code, slug or "conflict", detail, problem)
    else:
        error = RequestRejected(code, slug or "http-error", detail, problem)
    return BatchRenewalResult(attempt_id, status, error=error)
