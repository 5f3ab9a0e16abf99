"""LEASE-2's renewals kept off runs.events (issue 16), folded from runs.renewals.

The lease coordinator commits most renewals of an active lease to runs.renewals instead of
runs.events (services/common/aggregate/keepalives.py), so the Run view's lease holds only the
renewals on runs.events. This store holds the others, one small entry each, with no view to
re-render: a renewal costs a decode and a put, where a Run event re-renders its run's view.

Layout (in the same RocksDB as the views): renewal/<runId>/<epoch, 10 digits>/<sequence, 19
digits> = {"sequence", "at", "expiresAt"} (JSON); offset/runs.renewals/<partition> = the next
offset to read, written in the same write as the batch's entries. A renewal that is also on
runs.events (put there later, when the run's next other event came) has the same entry here and
in the view: `lease_record` shows it once. A read shows the renewals younger than the topic's
retention only (`retained_since`), so that every API instance gives the same answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from services.common import jsonbytes
from services.common.contracts import LeaseRenewed, full_name_of
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.store import KeyValueStore
from services.common.topics import RUNS_RENEWALS

__all__ = ["RenewalHistoryStore", "leased", "retained_since", "view_with_kept_renewals", "with_kept_renewals"]

_OFFSETS = f"offset/{RUNS_RENEWALS.name}/"
_LEASE_RENEWED = full_name_of(LeaseRenewed)


def _prefix(run_id: str) -> str:
    return f"renewal/{run_id}/"


class RenewalHistoryStore:
    def __init__(self, store: KeyValueStore, codec: MessageCodec) -> None:
        self._store = store
        self._codec = codec

    def offsets(self) -> dict[int, int]:
        return {int(k[len(_OFFSETS) :]): int(v) for k, v in self._store.scan(_OFFSETS)}

    def apply(
        self,
        records: Iterable[InboundRecord],
        on_undecodable: Callable[[InboundRecord, UndecodableRecord], None] | None = None,
    ) -> int:
        """Fold a batch of runs.renewals records; returns how many renewals it held."""
        puts: dict[str, bytes] = {}
        applied = 0
        for record in records:
            puts[f"{_OFFSETS}{record.partition}"] = str(record.offset + 1).encode()
            try:
                # The wire record, not the contract value: five fields are read, and building
                # the frozen LeaseRenewed was a third of a renewal's cost here (one per kept
                # renewal, in every API instance).
                full_name, renewed = self._codec.decode_record(record.value)
            except UndecodableRecord as exc:
                if on_undecodable is not None:
                    on_undecodable(record, exc)
                continue
            if full_name != _LEASE_RENEWED:
                continue
            key = f"{_prefix(renewed['runId'])}{renewed['epoch']:010d}/{renewed['sequence']:019d}"
            puts[key] = jsonbytes.dumps(
                {
                    "sequence": renewed["sequence"],
                    "at": renewed["occurredAt"],
                    "expiresAt": renewed["expiresAt"],
                }
            )
            applied += 1
        if puts:
            self._store.write(puts)
        return applied

    def of(self, run_id: str, not_before_ms: int = 0) -> dict[int, list[dict[str, Any]]]:
        """Epoch -> the run's kept renewals under it, by sequence; those renewed before
        `not_before_ms` left out (`retained_since`)."""
        renewals: dict[int, list[dict[str, Any]]] = {}
        prefix = _prefix(run_id)
        for key, raw in self._store.scan(prefix):
            entry = jsonbytes.loads(raw)
            if entry["at"] < not_before_ms:
                continue
            epoch = int(key[len(prefix) :].split("/", 1)[0])
            renewals.setdefault(epoch, []).append(entry)
        return renewals


def retained_since(now_ms: int) -> int:
    """The oldest renewal time every API instance can show: runs.renewals keeps every record
    younger than its retention, and may keep older ones until their segment goes. An instance
    that has followed the topic for longer holds renewals a newer one never read, so each shows
    only those younger than the retention, and any two give the same answer (issue 16)."""
    return now_ms - int(RUNS_RENEWALS.config["retention.ms"])


def with_kept_renewals(lease: dict[str, Any], kept: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """A LEASE-2 lease record (a Run view's `lease` or `leaseHistory` entry) with every renewal:
    those on runs.events it holds and the kept ones, once each, by sequence; its expiry the last
    renewal's while the lease is held."""
    extra = kept.get(int(lease.get("epoch", 0)), [])
    if not extra:
        return lease
    by_sequence = {int(r["sequence"]): r for r in extra}
    by_sequence.update({int(r["sequence"]): r for r in lease.get("renewals", [])})
    renewals = [by_sequence[s] for s in sorted(by_sequence)]
    merged = {**lease, "renewals": renewals}
    if lease.get("certainty") == "active" and renewals:
        merged["expiresAt"] = max(int(lease.get("expiresAt") or 0), int(renewals[-1]["expiresAt"]))
    return merged


def leased(view: dict[str, Any]) -> bool:
    """Whether a Run view has a lease record for kept renewals to merge into."""
    return bool(view.get("lease") or view.get("leaseHistory"))


def view_with_kept_renewals(view: dict[str, Any], kept: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """A Run view with `with_kept_renewals` applied to its lease and every earlier one."""
    if not kept:
        return view
    lease = view.get("lease")
    return {
        **view,
        "lease": with_kept_renewals(lease, kept) if lease else lease,
        "leaseHistory": [with_kept_renewals(old, kept) for old in view.get("leaseHistory", [])],
    }
