"""The Run view store's bytes: views and history entries as JSON, a run's fold without its
history, and the brief (the few fields hot paths read), from views.py's fold."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from services.common import jsonbytes
from services.lease_coordinator.domain import LeaseCertainty, RunState
from services.lease_coordinator.state_codec import state_from_record
from services.projections.views import LeaseMark, RunFold

__all__ = ["brief_from", "brief_of", "decode_fold", "decode_view", "encode_fold", "encode_view"]


def encode_view(view: dict[str, Any]) -> bytes:
    return jsonbytes.dumps(view, sort_keys=True)


def decode_view(raw: bytes) -> dict[str, Any]:
    result: dict[str, Any] = jsonbytes.loads(raw)
    return result


def encode_fold(fold: RunFold) -> bytes:
    """Everything of the fold but its history, which the store keeps as one entry per event."""
    return jsonbytes.dumps(
        {
            "state": fold.state,  # the dataclass, encoded in C as state_record's document
            "statusReason": fold.status_reason,
            "labels": dict(fold.labels),
            "leases": [
                {
                    "epoch": m.epoch,
                    "holderPrincipal": m.holder_principal,
                    "certainty": m.certainty.value,
                    "changedAt": m.changed_at,
                    "endedAt": m.ended_at,
                    "attemptId": m.attempt_id,
                    "leaseId": m.lease_id,
                }
                for m in fold.leases
            ],
            "stop": dict(fold.stop) if fold.stop is not None else None,
        },
        sort_keys=True,
    )


def decode_fold(raw: bytes, history: Iterable[dict[str, Any]]) -> RunFold:
    data = jsonbytes.loads(raw)
    return RunFold(
        state=state_from_record(data["state"]),
        history=tuple(history),
        status_reason=data["statusReason"],
        labels=tuple(sorted(data["labels"].items())),
        leases=tuple(
            LeaseMark(
                epoch=int(m["epoch"]),
                holder_principal=m["holderPrincipal"],
                certainty=LeaseCertainty(m["certainty"]),
                changed_at=int(m["changedAt"]),
                ended_at=m["endedAt"],
                attempt_id=m["attemptId"],
                lease_id=m["leaseId"],
            )
            for m in data["leases"]
        ),
        stop=data["stop"],
    )


def brief_of(fold: RunFold) -> dict[str, Any]:
    """The few fields of the view that hot paths read (a heartbeat's holder check and its stop
    flags), from the fold alone: no history is read to answer them."""
    return brief_from(fold.state, fold.stop, fold.leases)


def brief_from(
    state: RunState, stop: Mapping[str, Any] | None, leases: Iterable[LeaseMark]
) -> dict[str, Any]:
    """`brief_of` from its parts: the state, the last stop asked for and the leases issued (only
    their attempt, lease id and principal are read), for a store that has no whole fold."""
    leases = tuple(leases)
    brief: dict[str, Any] = {
        "runId": state.run_id,
        "tenant": state.tenant,
        "status": state.status.value,
        "version": state.version,
        "stop": dict(stop) if stop is not None else None,
        # attempt id -> the principal who may speak for it (current and earlier leases)
        "holders": {m.attempt_id: m.holder_principal for m in leases},
        "leaseIds": {m.attempt_id: m.lease_id for m in leases},
    }
    known, current = _current_lease(state, leases)
    if known:
        brief["lease"] = current
    return brief


def _current_lease(state: RunState, leases: tuple[LeaseMark, ...]) -> tuple[bool, dict[str, Any] | None]:
    """Whether the brief can tell, and then what a holder check reads of the view's `lease`
    (views._lease_record of the last grant): its attempt, epoch, id, certainty and who may speak
    for it; None before the first grant.

    It can tell only while the state holds that lease, whose certainty is then the state's.
    Otherwise (and for a fold stored before its marks named their grant's attempt and lease)
    (False, None): the brief has no `lease`, and the holder check reads the whole view. A mark's
    own certainty is not trusted here, because a seeded rebuild writes marks whose certainty is
    a placeholder (seeded_rebuild._Run.note)."""
    if not leases:
        return True, None
    last = leases[-1]
    lease = state.lease
    if lease is None or lease.epoch != last.epoch or not last.attempt_id or not last.lease_id:
        return False, None
    return True, {
        "attemptId": last.attempt_id,
        "epoch": last.epoch,
        "leaseId": last.lease_id,
        "certainty": lease.certainty.value,
        "holderPrincipal": last.holder_principal,
    }
